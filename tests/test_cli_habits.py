"""Habits from other tools, each answered with one clear usage error (exit 2) and the command that works (issue 31)."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests.conftest import REPO, run_hpc

P5 = str(REPO / "cluster-configs" / "p5-reservation.yaml")  # queues p5 (p5.48xlarge, 8 GPUs) and cpu


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "HPC_CLUSTER_CONFIG"}, "HPC_RUNS_DIR": str(tmp_path)}


def _fix(res) -> str:
    return re.search(r"^  fix: (.*)$", res.stderr, re.MULTILINE).group(1)


def test_script_arguments_without_the_double_dash_get_the_corrected_command(tmp_path, env):
    """torchrun's habit: was `No such option: --epochs (Possible options: --qos)`."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc("run", "train.py", "--nodes", "2", "--epochs", "5", "--note", "it's", "--dry-run", env=env,
                  cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--epochs is not an option of `hpc run`: arguments for your script go after `--`" in res.stderr
    assert "--qos" not in res.stderr
    fixed = shlex.split(_fix(res))  # shell-quoted: the script's "it's" comes back as one word
    assert os.path.basename(fixed[0]) == "hpc"
    assert fixed[1:] == ["run", "train.py", "--nodes", "2", "--dry-run", "--", "--epochs", "5", "--note", "it's"]
    again = run_hpc(*fixed[1:], env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "train.py --epochs 5 --note" in again.stdout


def test_python_s_dash_m_names_a_module_as_k8s_render_does(tmp_path, env):
    """python's and torchrun's `-m MODULE` (and `hpc k8s render -m`): `hpc run -m pkg.train` was told to move
    `-m pkg.train` after `--`, a command that runs no module; `recipes new -m` was an unknown option."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("print('trained')\n")
    res = run_hpc("run", "-m", "pkg.train", "--nodes", "2", "--dry-run", "--", "--lr", "1", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "-m pkg.train --lr 1" in res.stdout  # as `python -m pkg.train --lr 1`: the words after it are its own
    res = run_hpc("recipes", "new", "mine", "-m", "pkg.train", "-o", "-", env=env, cwd=tmp_path)
    assert res.returncode == 0 and "kind: python-module" in res.stdout and "module: pkg.train" in res.stdout
    res = run_hpc("run", "-m", "train.py", "--dry-run", env=env, cwd=tmp_path)
    assert res.returncode == 2 and "-m 'train.py' is a file name" in res.stderr and "hpc run train.py" in _fix(res)
    res = run_hpc("run", "--dry-run", env=env, cwd=tmp_path)
    assert res.returncode == 2 and "missing argument SCRIPT_OR_MODULE" in res.stderr


def test_k8s_render_of_a_recipe_does_not_send_an_unknown_option_to_a_script(tmp_path, env):
    """`hpc k8s render RECIPE --name x`: was "arguments for your script go after `--`", for a recipe (which takes
    none: `hpc k8s render` refuses them); a script's own option still gets the corrected command."""
    res = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "g5.xlarge", "--name", "x", env=env)
    assert res.returncode == 2 and "No such option: --name" in res.stderr and "your script" not in res.stderr
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc("k8s", "render", "train.py", "--nodes", "2", "--instance", "g5.xlarge", "--epochs", "3", env=env,
                  cwd=tmp_path)
    assert res.returncode == 2 and shlex.split(_fix(res))[-3:] == ["--", "--epochs", "3"]


@pytest.mark.parametrize("name,text", [("job.sh", "echo hi\n"), ("runme", "#!/bin/bash\necho hi\n"), ("adir", None)])
def test_hpc_run_refuses_what_python_cannot_run(tmp_path, env, name, text):
    """A shell script (by its suffix or `#!` line) or a directory: accepted before, and each rank's python would
    have failed on it; a directory was said not to exist."""
    if text is None:
        (tmp_path / name).mkdir()
    else:
        (tmp_path / name).write_text(text)
    res = run_hpc("run", name, "--dry-run", env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert (f"{name} is a directory, not a script" if text is None else f"{name} is not a Python script") in res.stderr
    assert "does not exist" not in res.stderr


def test_a_script_or_a_directory_given_as_a_recipe_is_named_so(tmp_path, env):
    """`hpc recipes submit train.py` read the script as YAML ("expected '<document start>'"); a directory was
    "no recipe named"; a directory named like a recipe still leaves the recipe's name to the recipe."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc("recipes", "show", "train.py", env=env, cwd=tmp_path)
    assert res.returncode == 2 and "train.py is a Python script, not a recipe" in res.stderr
    assert "hpc run train.py" in _fix(res) and "YAML" not in res.stderr
    (tmp_path / "outd").mkdir()
    res = run_hpc("recipes", "validate", "outd", env=env, cwd=tmp_path)
    assert res.returncode == 1 and "recipe file outd is a directory" in res.stderr
    (tmp_path / "resnet50").mkdir()
    assert run_hpc("recipes", "validate", "resnet50", env=env, cwd=tmp_path).returncode == 0


def test_recipes_new_quotes_the_commands_it_prints(tmp_path, env):
    """A file name with a space was printed bare (`hpc recipes submit my recipe.yaml`: two words to a shell)."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc("recipes", "new", "mine", "--script", "train.py", "-o", "my recipe.yaml", env=env, cwd=tmp_path)
    assert res.returncode == 0 and "submit it: hpc recipes submit 'my recipe.yaml'" in res.stdout + res.stderr
    header = (tmp_path / "my recipe.yaml").read_text().splitlines()[1]
    assert shlex.split(header.split("`")[3]) == ["hpc", "recipes", "validate", "my recipe.yaml"]


def test_the_script_says_an_env_value_came_from_the_command_line(env):
    """`--env FOO=1` was labelled "set by recipe resnet50 (env.FOO)" in the rendered script."""
    res = run_hpc("recipes", "render", "resnet50", "--nodes", "1", "--env", "FOO=1", "--set", "env.BAR=2", env=env)
    lines = res.stdout.splitlines()
    for name in ("FOO=1", "BAR=2"):
        assert lines[lines.index(f"export {name}") - 1] == f"# set on the command line (env.{name.split('=')[0]})"


def test_a_fault_of_a_set_value_does_not_send_the_user_to_the_recipe_file(env):
    """Every --set fault said to run `hpc recipes validate .../recipes/resnet50.yaml`, a file that is valid."""
    res = run_hpc("recipes", "show", "resnet50", "--nodes", "1", "--set", "resources.time=forever", env=env)
    assert res.returncode == 1 and "(value from --set resources.time=forever)" in res.stderr
    assert _fix(res).startswith("change the --set / --sweep values named above") and "validate" not in _fix(res)


def test_a_runs_dir_with_a_space_is_named_with_the_variable_that_set_it(tmp_path, env):
    res = run_hpc("recipes", "submit", "resnet50", "--nodes", "1", "--dry-run",
                  env={**env, "HPC_RUNS_DIR": str(tmp_path / "my runs")})
    assert res.returncode == 1 and "cannot go into an #SBATCH line" in res.stderr
    assert "$HPC_RUNS_DIR" in _fix(res) and "--run-dir" in _fix(res)


def test_an_empty_output_name_is_refused(tmp_path, env):
    """`-o "$OUT"` with OUT unset wrote resnet50.sbatch into the current directory."""
    res = run_hpc("recipes", "render", "resnet50", "--nodes", "1", "-o", "", env=env, cwd=tmp_path)
    assert res.returncode == 2 and "-o '' names no file" in res.stderr and not list(tmp_path.iterdir())


def test_an_option_of_one_value_given_twice_is_a_usage_error(env):
    """Click kept the last: `--profile smoke --profile gpu-data` ran gpu-data alone without a word."""
    res = run_hpc("recipes", "show", "resnet50", "--profile", "smoke", "--profile", "gpu-data", env=env)
    assert res.returncode == 2 and "--profile given 2 times (smoke, gpu-data)" in res.stderr
    res = run_hpc("recipes", "show", "resnet50", "-N", "2", "--nodes=3", env=env)
    assert res.returncode == 2 and "--nodes given 2 times (2, 3)" in res.stderr
    same = run_hpc("recipes", "show", "resnet50", "--nodes", "2", "--nodes=2", "--set", "args.--seed=1", "--set",
                   "args.--seed=2", env=env)  # the same value twice, and a repeatable option: as before
    assert same.returncode == 0, same.stderr


def test_debug_keeps_a_usage_errors_exit_code(env):
    res = run_hpc("--debug", "recipes", "show", "robera", env=env)
    assert res.returncode == 2 and "Traceback" in res.stderr and "no recipe named 'robera'" in res.stderr


def test_a_typo_of_hpcs_own_option_gets_the_corrected_command_first(tmp_path, env):
    """The fix printed first keeps the dry run: `--dryrun` moved after `--` (as a script's argument) was the fix
    before, and run as printed it submitted a real job."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc("run", "train.py", "--nodes", "2", "--dryrun", env=env, cwd=tmp_path)
    assert res.returncode == 2 and "--dryrun is not an option of `hpc run`: did you mean --dry-run?" in res.stderr
    first, _, alternative = _fix(res).partition(" (or, if --dryrun is your script's: ")
    assert shlex.split(first)[1:] == ["run", "train.py", "--nodes", "2", "--dry-run"]
    assert shlex.split(alternative.rstrip(")"))[1:] == ["run", "train.py", "--nodes", "2", "--", "--dryrun"]
    again = run_hpc(*shlex.split(first)[1:], env=env, cwd=tmp_path)
    assert again.returncode == 0 and "the full plan and its scripts" in again.stdout, again.stdout
    res = run_hpc("run", "train.py", "--clutser=c.yaml", "--dry-run", env=env, cwd=tmp_path)
    assert shlex.split(_fix(res).partition(" (or")[0])[1:] == ["run", "train.py", "--cluster=c.yaml", "--dry-run"]


def test_an_args_key_without_dashes_names_the_recipes_flag(env):
    """Was exit 1, "'lr' is not a flag", with a fix pointing at the installed recipe file."""
    res = run_hpc("recipes", "show", "roberta", "--nodes", "2", "--set", "args.lr=0.1", env=env)
    assert res.returncode == 2 and "the recipe's flag is --lr" in res.stderr
    assert _fix(res) == "--set args.--lr=0.1" and "recipes validate" not in res.stderr
    res = run_hpc("recipes", "submit", "roberta", "--nodes", "2", "--dry-run", "--set", "args.max_update=10",
                  env=env)
    assert res.returncode == 2 and _fix(res) == "--set args.--max-update=10"


def test_gpus_per_node_names_the_instances_count(env):
    """Was exit 1, "resources.gpus_per_node: unknown key" with a fix pointing at the installed recipe file."""
    res = run_hpc("recipes", "submit", "roberta", "--cluster", P5, "--dry-run",
                  "--set", "resources.gpus_per_node=16", env=env)
    assert res.returncode == 2, res.stderr
    assert "p5.48xlarge (queue p5) has 8 GPUs" in res.stderr and "--nodes 2 gives 16 GPUs" in _fix(res)


@pytest.mark.parametrize("args", [
    ["recipes", "show", "robera"], ["recipes", "render", "robera"], ["recipes", "submit", "robera", "--dry-run"],
    ["recipes", "validate", "robera"], ["k8s", "render", "robera", "--nodes", "1", "--instance", "p5.48xlarge"],
])
def test_an_unknown_recipe_name_is_a_usage_error(args, env):
    res = run_hpc(*args, env=env)
    assert res.returncode == 2, res.stderr
    assert "no recipe named 'robera'; did you mean roberta?" in res.stderr and "resnet50" in _fix(res)


@pytest.mark.parametrize("args", [
    ["recipes", "show", "roberta", "--nodes", "2"], ["recipes", "render", "roberta", "--nodes", "2"],
    ["recipes", "submit", "roberta", "--nodes", "2", "--dry-run"], ["run", "train.py", "--dry-run"],
    ["cluster", "doctor"],
])
def test_an_unknown_queue_is_a_usage_error(args, env, tmp_path):
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc(*args, "--cluster", P5, "--queue", "p6", env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "has no queue 'p6'" in res.stderr and _fix(res) == "use --queue p5 | cpu"
    if args[0] != "cluster":  # a job's queue without any cluster config (the doctor needs one: exit 1 there)
        res = run_hpc(*args, "--queue", "p6", env=env, cwd=tmp_path)
        assert res.returncode == 2 and "no cluster config was given or found" in res.stderr


def test_an_unknown_queue_of_a_config_edit_is_a_usage_error(tmp_path):
    res = run_hpc("cluster", "queue", "set", P5, "p6", "--max", "2", "--dry-run")
    assert res.returncode == 2 and "no queue 'p6'" in res.stderr and "p5, cpu" in _fix(res)
