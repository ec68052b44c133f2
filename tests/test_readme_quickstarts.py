"""Issue 31: the README starts where users start, and its quickstarts run as printed.

The first screen of README.md holds both quickstarts (admin, researcher). Their commands run here, in order, in one
temp dir, in-process (tests.conftest.run_hpc) with HPC_RUNS_DIR in that dir and no live Slurm or cluster config
from the environment:

- ran fully: every admin command (`hpc cluster config` writes the cluster.yaml the rest use, `validate` runs
  ParallelCluster's own schema and validators offline, `cp`, `queue set`, `diff` runs pcluster's update rules
  offline), and the researcher's `recipes list`, `recipes render` and `recipes submit --dry-run`, which plan for
  the admin's cluster.yaml without asking a Slurm;
- ran as a dry run: `hpc recipes submit` without `--dry-run` (sending the job needs a live Slurm: it runs with
  `--dry-run` added, which plans the same job and sends nothing);
- parsed only: `hpc jobs status JOB_ID`, `hpc report run RUN_DIR` and `hpc report goodput RUN_DIR` need a job
  that a live Slurm ran (their `--help` must exit 0 and name the argument the README shows);
- not run: `pip install ...` (the tests run this checkout's code, which is what that installs).

Also: every relative link in README.md and docs/*.md points at a file that exists, and README links every docs page.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

from tests.conftest import REPO, run_hpc

README = REPO / "README.md"
QUICKSTARTS = ("## Quickstart: HPC admins", "## Quickstart: ML researchers")
FIRST_SCREEN = 40  # lines: a terminal's or a repository page's first view
NEED_A_LIVE_JOB = (("jobs", "status"), ("report", "run"), ("report", "goodput"))


def _section(text: str, heading: str) -> str:
    return heading + text.split(heading, 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[str]:
    """The section's code block (4-space indented lines), continuation lines joined, comments dropped."""
    block = "\n".join(line[4:] for line in section.splitlines() if line.startswith("    "))
    block = re.sub(r"\\\n\s*", "", block)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_first_screen_holds_both_quickstarts():
    text = README.read_text()
    first_screen = "\n".join(text.splitlines()[:FIRST_SCREEN])
    for heading in QUICKSTARTS:
        section = _section(text, heading).rstrip("\n")
        assert section in first_screen, f"{heading} does not end within the first {FIRST_SCREEN} lines"
        assert len(section.splitlines()) - 1 < 15, heading  # under 15 lines under its heading
    admin, researcher = (_commands(_section(text, h)) for h in QUICKSTARTS)
    assert [c.split()[:3] for c in admin if c.startswith("hpc ")] == [
        ["hpc", "cluster", "config"], ["hpc", "cluster", "validate"], ["hpc", "cluster", "queue"],
        ["hpc", "cluster", "diff"]]
    assert [c.split()[:3] for c in researcher if c.startswith("hpc ")] == [
        ["hpc", "recipes", "list"], ["hpc", "recipes", "render"], ["hpc", "recipes", "submit"],
        ["hpc", "recipes", "submit"], ["hpc", "jobs", "status"], ["hpc", "report", "run"],
        ["hpc", "report", "goodput"]]
    assert any("--dry-run" in c for c in researcher)


def test_the_quickstart_commands_run_as_printed(tmp_path):
    text = README.read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "HPC_CLUSTER_CONFIG")}
    env["HPC_RUNS_DIR"] = str(tmp_path / "runs")
    ran = []
    for command in (c for heading in QUICKSTARTS for c in _commands(_section(text, heading))):
        words = shlex.split(command)
        if words[0] == "pip":
            assert words[1] == "install" and words[2].split("[")[0] == ".", command
            continue
        if words[0] == "cp":
            shutil.copyfile(tmp_path / words[1], tmp_path / words[2])
            continue
        assert words[0] == "hpc", command
        args = words[1:]
        if tuple(args[:2]) in NEED_A_LIVE_JOB:
            res = run_hpc(*args[:2], "--help", env=env, cwd=tmp_path)
            named = re.search(r"\{[^}]*\b" + re.escape(args[2]) + r"\b", res.stdout)  # {RUN_DIR} or {RUN_DIR|JOB_ID...}
            assert res.returncode == 0 and named, (command, res.stdout, res.stderr)
            ran.append(" ".join(args[:2]) + " --help")
            continue
        if args[:2] == ["recipes", "submit"] and "--dry-run" not in args:
            args.append("--dry-run")
        res = run_hpc(*args, env=env, cwd=tmp_path)
        assert res.returncode == 0, (command, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr, command
        ran.append(" ".join(args[:2]))
        if args[:2] == ["cluster", "config"]:  # the admin's own first command wrote the file the rest read
            assert (tmp_path / "cluster.yaml").is_file()
    assert ran == ["cluster config", "cluster validate", "cluster queue", "cluster diff", "recipes list",
                   "recipes render", "recipes submit", "recipes submit", "jobs status --help", "report run --help",
                   "report goodput --help"]
    assert not (tmp_path / "runs").exists()  # dry runs and renders write no run dir


def _links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", path.read_text())  # a link shown as code is no link
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_relative_link_points_at_a_file():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in _links(page):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same page
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
    linked = {(REPO / t.split("#", 1)[0]).resolve() for t in _links(README)}
    assert {p.resolve() for p in pages[1:]} <= linked, "README.md does not link every docs/ page"
