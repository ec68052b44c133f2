"""Progress on slow steps (issue 31): a step over SLOW_S says what it is doing while it runs and how long it took;
a quick one says nothing."""

from __future__ import annotations

import contextlib
import io
import time

from toolkit.progress import step


def test_a_slow_step_says_what_it_does_while_it_runs_and_how_long_it_took():
    err = io.StringIO()
    with step("loading the parser", after_s=0.05, stream=err):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not err.getvalue():
            time.sleep(0.01)
        said_while_running = err.getvalue()
    assert said_while_running == "loading the parser ...\n"
    first, last = err.getvalue().splitlines()
    assert first == "loading the parser ..." and last.startswith("loading the parser: ") and last.endswith(" s")


def test_a_quick_step_says_nothing_and_nothing_comes_later():
    err = io.StringIO()
    with step("reading", after_s=0.2, stream=err):
        pass
    time.sleep(0.4)  # the cancelled timer never fires
    assert err.getvalue() == ""


def test_a_body_that_redirects_stderr_does_not_swallow_the_progress(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with step("importing fairseq", after_s=0.05), contextlib.redirect_stderr(io.StringIO()):
        time.sleep(0.3)  # as argcheck.quiet() does around a program's noisy imports
    assert err.getvalue().splitlines()[0] == "importing fairseq ..."


def test_a_plans_argument_check_by_the_programs_own_parser_shows_progress(hpc, monkeypatch):
    from toolkit import progress

    monkeypatch.setattr(progress, "SLOW_S", 0.0)  # every step is "slow": what the plan's steps say, in order
    res = hpc("recipes", "render", "resnet50", "--nodes", "1", "--profile", "smoke", "--json")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("checking the arguments with ")]
    assert len(lines) == 2 and lines[0].endswith("'s own parser ...") and lines[1].endswith(" s"), res.stderr
