from tests.conftest import run_hpc


def test_help_lists_groups_and_exits_zero():
    res = run_hpc("--help")
    assert res.returncode == 0
    assert "cluster" in res.stdout and "recipes" in res.stdout


def test_unknown_command_is_a_usage_error():
    res = run_hpc("no-such-command")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
