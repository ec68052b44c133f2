from tests.conftest import cli_envelope, run_hpc


def test_help_lists_groups_and_exits_zero():
    res = run_hpc("--help")
    assert res.returncode == 0
    assert "cluster" in res.stdout and "recipes" in res.stdout


def test_unknown_command_is_a_usage_error():
    res = run_hpc("no-such-command")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_an_error_under_json_is_the_failure_envelope_on_stdout_too():
    res = run_hpc("recipes", "validate", "no-such-recipe", "--json")
    assert res.returncode == 2 and "error: no recipe named 'no-such-recipe'" in res.stderr  # a usage error
    doc = cli_envelope(res)
    assert (doc["ok"], doc["command"], doc["data"]) == (False, "recipes validate", None)
    assert doc["error"]["message"] == "no recipe named 'no-such-recipe'" and doc["error"]["fix"]
    usage = cli_envelope(run_hpc("recipes", "validate", "--bogus", "--json"))
    assert usage["error"]["exit_code"] == 2 and "--bogus" in usage["error"]["message"]
    assert run_hpc("recipes", "validate", "no-such-recipe").stdout == ""  # without --json: stderr only


def test_version_prints_hpcs_version_and_exits_zero():
    """`hpc --version` was "No such option: --version" (the root options were declared after the command was
    built from the app)."""
    from toolkit import __version__

    res = run_hpc("--version")
    assert (res.returncode, res.stdout) == (0, f"hpc {__version__}\n"), res.stderr
    for args in (("--version", "--json"), ("--json", "--version")):
        doc = cli_envelope(run_hpc(*args))
        assert doc["ok"] and doc["data"] == {"version": __version__}
    misplaced = run_hpc("--json", "recipes", "list")
    assert misplaced.returncode == 2 and "--json goes after the command" in misplaced.stderr


def test_an_internal_errors_printed_fix_shows_the_traceback(monkeypatch):
    """The fix an internal error prints is a command that works as printed and shows the traceback."""
    import re
    import shlex

    def broken():
        raise RuntimeError("a fault of hpc's own")

    monkeypatch.setattr("toolkit.recipes.load.list_recipe_files", broken)
    res = run_hpc("recipes", "list", "--json")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "internal error: RuntimeError: a fault of hpc's own" in res.stderr
    again = shlex.split(re.search(r"fix: re-run as `([^`]+)`", res.stderr).group(1))
    assert again[1:] == ["--debug", "recipes", "list", "--json"]
    res = run_hpc(*again[1:])
    assert res.returncode == 1 and "Traceback (most recent call last)" in res.stderr, res.stderr
    assert "RuntimeError: a fault of hpc's own" in res.stderr and "No such option" not in res.stderr
