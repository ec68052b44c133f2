"""`hpc recipes list|show|validate|render` as users run them, and where the queue comes from."""

import os
import subprocess

import pytest

from tests.conftest import cli_json, REPO, run_hpc
from tests.jobhelpers import MINIMAL_RECIPE, write_cluster, write_recipe
from toolkit.cluster.queues import CLUSTER_CONFIG_ENV, default_queue, resolve_queue
from toolkit.errors import HpcError


@pytest.fixture
def env(tmp_path):
    """The user's environment without any cluster config discovery from this machine's own settings."""
    return {**os.environ, CLUSTER_CONFIG_ENV: ""}


def test_list_names_the_four_recipes(env):
    res = run_hpc("recipes", "list", "--json", env=env)
    assert res.returncode == 0
    assert {r["name"] for r in cli_json(res)} >= {"transformer", "roberta", "resnet50", "nccl-tests"}


def test_show_prints_every_derived_value_with_its_rule(env):
    res = run_hpc("recipes", "show", "roberta", "--nodes", "4", env=env)
    assert res.returncode == 0, res.stderr
    assert "--update-freq" in res.stdout and "8192 sequences per update / (--max-sentences 16 x 32 ranks)" in res.stdout
    assert "assumed the default queue p3dn" in res.stderr
    data = cli_json(run_hpc("recipes", "show", "resnet50", "--nodes", "2", "--json", env=env))
    assert {d["key"]: d["value"] for d in data["derived"]}["--workers"] == "11"  # 12 CPUs per rank on p3dn
    assert {d["key"]: d["value"] for d in data["derived"]}["--lr"] == "1.6"


def test_validate_ok_and_bad(env, tmp_path):
    ok = run_hpc("recipes", "validate", str(REPO / "recipes" / "roberta.yaml"), env=env)
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = write_recipe(tmp_path, {**MINIMAL_RECIPE, "launcher": {"kind": "torchrun"}})
    res = run_hpc("recipes", "validate", str(bad), env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "launcher.kind: 'torchrun' is not one of 'fairseq'" in res.stderr and "fix:" in res.stderr
    assert "Input should" not in res.stderr  # pydantic's phrasing, not the user's
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nargs: [\n")
    res = run_hpc("recipes", "validate", str(broken), env=env)
    assert res.returncode == 1 and "not valid YAML" in res.stderr and "line" in res.stderr


def test_validate_names_an_empty_file_and_one_that_is_not_a_file(env, tmp_path):
    """An empty recipe is called empty (it was "a YAML mapping ..., got NoneType"); /dev/null or a pipe is not a
    regular file (it was "does not exist")."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    res = run_hpc("recipes", "validate", str(empty), env=env)
    assert res.returncode == 1 and "the file is empty" in res.stderr and "NoneType" not in res.stderr, res.stderr
    res = run_hpc("recipes", "validate", os.devnull, env=env)
    assert res.returncode == 1 and f"{os.devnull} is not a regular file" in res.stderr, res.stderr


def test_validate_checks_every_profile(env, tmp_path):
    path = write_recipe(tmp_path, {**MINIMAL_RECIPE, "profiles": {"smoke": {"resources": {"nodes": -1}}}})
    res = run_hpc("recipes", "validate", str(path), env=env)
    assert res.returncode == 1 and "value from profile smoke" in res.stderr


def test_render_to_stdout_is_bash_and_to_a_file_needs_force(env, tmp_path):
    run_dir = ("--run-dir", str(tmp_path / "run"))  # a fixed run dir: else each render names a new one
    res = run_hpc("recipes", "render", "transformer", "--nodes", "4", *run_dir, env=env)
    assert res.returncode == 0 and res.stdout.startswith("#!/bin/bash")
    assert subprocess.run(["bash", "-n"], input=res.stdout, text=True).returncode == 0
    out = tmp_path / "job.sbatch"
    assert run_hpc("recipes", "render", "transformer", "-o", str(out), *run_dir, env=env).returncode == 0
    assert out.read_text() == res.stdout
    again = run_hpc("recipes", "render", "transformer", "-o", str(out), env=env)
    assert again.returncode == 1 and "--force" in again.stderr
    assert run_hpc("recipes", "render", "transformer", "-o", str(out), "--force", env=env).returncode == 0


def test_render_with_cluster_queue_profile_and_set(env, tmp_path):
    cluster = write_cluster(tmp_path)
    recipe = write_recipe(tmp_path, {**MINIMAL_RECIPE, "profiles": {"smoke": {"args": {"--max-sentences": 2}}}})
    res = run_hpc("recipes", "render", str(recipe), "--nodes", "2", "--cluster", str(cluster), "--queue", "cpu",
                  "--profile", "smoke", "--set", "args.--seed=7", env=env)
    assert res.returncode == 0, res.stderr
    assert "--partition=cpu" in res.stdout and "--ntasks-per-node=2" in res.stdout and "--seed 7" in res.stdout
    assert "--update-freq 8" in res.stdout and "--cpu" in res.stdout and "/shared/data" in res.stdout
    assert "from " + str(cluster) in res.stderr


@pytest.mark.parametrize("args,code,text", [
    (["transformer", "--queue", "gaudi"], 1, "runs on gpu or cpu only; queue gaudi (dl1.24xlarge) has Gaudi HPUs"),
    (["bert-5b", "--queue", "gaudi", "--nodes", "3"], 1, "use --nodes 1 | 2 | 4"),
    (["roberta", "--nodes", "3"], 1, "use --nodes 1 | 2 | 4 | 8 | 16"),
    (["nccl-tests", "--queue", "cpu"], 1, "runs on gpu only"),
    (["resnet50", "--queue", "nope"], 2, "use --queue cpu | gaudi | p3"),
    (["resnet50", "--set", "nokey"], 2, "is not KEY.PATH=VALUE"),
    (["resnet50", "--profile", "huge"], 2, "no profile 'huge'"),
    (["no-such-recipe"], 2, "use one of:"),
    (["resnet50", "--nodes", "1", "--account", "a b"], 1, "cannot go into an #SBATCH line"),
])
def test_render_errors_are_one_clear_line(env, tmp_path, args, code, text):
    cluster = [] if args[0] == "roberta" else ["--cluster", str(write_cluster(tmp_path))]
    res = run_hpc("recipes", "render", *args, *cluster, env=env)
    assert res.returncode == code and text in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_queue_from_the_cluster_config_env(tmp_path, monkeypatch):
    monkeypatch.setenv(CLUSTER_CONFIG_ENV, str(write_cluster(tmp_path)))
    queue, how = resolve_queue(None, None)
    assert queue.name == "cpu" and "this cluster's own config" in how  # the first queue is the default
    assert resolve_queue(None, "p3")[0].instance_type == "p3.16xlarge"
    monkeypatch.setenv(CLUSTER_CONFIG_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(HpcError, match="does not exist"):
        resolve_queue(None, None)


def test_default_queue_is_assumed_and_said(monkeypatch):
    monkeypatch.setenv(CLUSTER_CONFIG_ENV, "")
    monkeypatch.setattr("toolkit.cluster.queues.HEAD_NODE_CONFIG", REPO / "no-such-file")
    queue, how = resolve_queue(None, None)
    assert queue == default_queue() and how.startswith("assumed the default queue p3dn")
    with pytest.raises(HpcError, match="no cluster config"):
        resolve_queue(None, "cpu")


@pytest.mark.parametrize("recipe", ["resnet50", "roberta", "nccl-tests"])
def test_a_trainium_queue_is_refused_in_one_line(tmp_path, recipe):
    """trn1 (Neuron) queues get no job form: one error line and its fix, no internal error."""
    cluster = tmp_path / "trn1-cluster.yaml"
    cluster.write_text((REPO / "jobs" / "dl1-cluster.yaml").read_text().replace("dl1.24xlarge", "trn1.32xlarge")
                       .replace("Name: dl1\n", "Name: trn1\n"))
    res = run_hpc("recipes", "render", recipe, "--cluster", str(cluster), "--queue", "trn1")
    assert res.returncode == 1 and res.stdout == "" and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0] == ("error: queue trn1 (trn1.32xlarge) has Trainium (neuron) accelerators: hpc makes no jobs "
                        "for them (only GPU, Gaudi HPU and CPU jobs)"), res.stderr
    assert lines[1].startswith("  fix: ") and len(lines) == 2
