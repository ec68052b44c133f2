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
    assert res.returncode == 1 and "error: no recipe named 'no-such-recipe'" in res.stderr
    doc = cli_envelope(res)
    assert (doc["ok"], doc["command"], doc["data"]) == (False, "recipes validate", None)
    assert doc["error"]["message"] == "no recipe named 'no-such-recipe'" and doc["error"]["fix"]
    usage = cli_envelope(run_hpc("recipes", "validate", "--bogus", "--json"))
    assert usage["error"]["exit_code"] == 2 and "--bogus" in usage["error"]["message"]
    assert run_hpc("recipes", "validate", "no-such-recipe").stdout == ""  # without --json: stderr only
