"""Launcher kinds as modules (toolkit.launchers): the registry, each launcher's contract (argv, device flags, own
parser, resume rule, advice, Kubernetes form), and the accelerate kind, added as one module: its argv read by
accelerate's own parser, its Slurm form (one task per node, rendezvous from the job's set-up) and its PyTorchJob."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing

import pytest

from tests.conftest import REPO, cli_json, run_hpc
from tests.jobhelpers import CPU, P3DN, kubelet_expand
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError
from toolkit.job.rank import RankVar, preview_argv
from toolkit.job.spec import arguments, queue_target, resources
from toolkit.k8s.manifests import TRAINER_V2, V1, Storage, render
from toolkit.k8s.validate import validate_text
from toolkit.launchers import all_launchers, check_arguments, kubernetes_forms, launcher_for, launcher_of, registry
from toolkit.launchers.base import MPI_JOB, PYTORCH_JOB, Launcher, log_readers
from toolkit.recipes.load import list_recipe_files, load_recipe
from toolkit.recipes.schema import Launcher as LauncherSection
from toolkit.recipes.user import user_recipe
from toolkit.slurm.materialize import build_job_spec
from toolkit.slurm.render import render_script

DL1 = load_queues(REPO / "jobs" / "dl1-cluster.yaml")["dl1"]
ACCELERATE_RECIPE = {
    "name": "acc", "description": "a script under accelerate", "source": "tests",
    "launcher": {"kind": "accelerate", "module": "mypkg.train", "argv": ["--epochs", "1"], "max_restarts": 2},
    "args": {"--lr": 0.1},
    "resources": {"nodes": 2, "runs_on": ["gpu", "cpu"]},
}
# Prints its argv as JSON: stands in for `python` where a test runs the rank program / the pod's command in bash
ARGV_STUB = "import json, sys; print(json.dumps(sys.argv[1:]))"


def accelerate_recipe(**launcher):
    data = {**ACCELERATE_RECIPE, "launcher": {**ACCELERATE_RECIPE["launcher"], **launcher}}
    return load_recipe("acc", data=data)


def test_every_recipe_kind_has_a_launcher_module_and_the_registry_picks_it():
    kinds = typing.get_args(LauncherSection.model_fields["kind"].annotation)
    assert set(registry()) == set(kinds)  # a module per kind, found in toolkit/launchers
    for kind in kinds:
        launcher = launcher_for(kind)
        assert isinstance(launcher, Launcher) and launcher.kind == kind
    assert type(launcher_for("python-module", "toolkit.workloads.resnet")).__name__ == "Trainer"
    assert type(launcher_for("python-module", "mypkg.train")).__name__ == "Module"
    assert launcher_for("fairseq") is launcher_for("fairseq")  # one instance per kind, loaded once
    with pytest.raises(HpcError, match="launcher kind 'torchrun' is not one of accelerate, binary, deepspeed, "):
        launcher_for("torchrun")


def test_the_registry_imports_no_launcher_until_asked():
    """`import toolkit.launchers` loads only the base: the kinds (and fairseq, accelerate, DeepSpeed) when asked."""
    code = ("import sys, toolkit.launchers as l; before = sorted(m for m in sys.modules if m.startswith("
            "('toolkit.launchers.', 'fairseq', 'accelerate', 'deepspeed'))); l.launcher_for('fairseq'); "
            "print(before, 'toolkit.launchers.fairseq' in sys.modules, 'fairseq' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["['toolkit.launchers.base']", "True", "False"], res.stdout + res.stderr


@pytest.mark.parametrize("path", list_recipe_files(), ids=lambda p: p.stem)
def test_each_builtin_recipe_gets_its_argv_from_its_launcher(path):
    recipe = load_recipe(path)
    launcher = launcher_of(recipe.launcher)
    device, queue = ("gpu", P3DN) if "gpu" in recipe.resources.runs_on else ("hpu", DL1)
    spec = build_job_spec(recipe, queue, 2)
    program, _ = launcher.program(recipe.launcher, spec.root, 2, spec.tasks_per_node, device, None)
    assert list(spec.command[:len(program)]) == program
    assert list(spec.command[len(spec.command) - len(launcher.trailer()):]) == launcher.trailer()
    assert spec.style == launcher.style(recipe.launcher)
    assert {var.name for var in launcher.env()} <= set(spec.environ)


def test_a_flag_a_launcher_owns_is_refused_in_the_recipe():
    for name, flag in (("roberta", "--distributed-world-size"), ("resnet50", "--device")):
        assert flag in launcher_of(load_recipe(name).launcher).owned_flags
        recipe = load_recipe(name, overrides=[f"args.{flag}=2"])
        target = queue_target(P3DN)
        with pytest.raises(HpcError, match=f"args.{flag} is set by the toolkit from the queue"):
            arguments(recipe, target, resources(recipe, target, 1))


def test_fairseq_owns_its_device_forms_rendezvous_environment_resume_and_advice():
    fairseq = launcher_for("fairseq")
    args, derived = fairseq.device_args({"--fp16": True, "--lr": 1}, "cpu", 4, 8)
    assert args == {"--lr": 1, "--cpu": True, "--distributed-backend": "gloo", "--ddp-backend": "legacy_ddp",
                    "--distributed-world-size": 8, "--distributed-no-spawn": True}
    assert ("--fp16", "removed") in [(d.key, d.value) for d in derived]
    assert fairseq.device_args({}, "gpu", None, 16)[0]["--distributed-backend"] == "nccl"
    with pytest.raises(HpcError, match="fairseq has no Gaudi HPU support here"):
        fairseq.device_args({}, "hpu", None, 8)
    assert RankVar.MASTER_ADDR in fairseq.trailer()[-1]
    assert [var.name for var in fairseq.env()] == ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]
    assert fairseq.resume_script(None) == "" and "checkpoint_last.pt" in fairseq.resume_script("/ck")
    derived, _ = fairseq.advice({"--max-epoch": 2, "--max-update": 10}, "/nowhere", 8)
    assert [(d.key, d.value) for d in derived] == [("run length", "unknown")]
    assert fairseq.kubernetes_kind(load_recipe("roberta")) == PYTORCH_JOB


def test_fairseq_reads_its_own_training_log_and_the_reports_ask_its_launcher():
    """The reports know no program's log format: they try each launcher's reader (toolkit.launchers.fairseq.log)."""
    from toolkit.reports.training_logs import parse_training_text, throughput, unreadable_fix

    reader = launcher_for("fairseq").log_reader()
    assert reader is not None and (reader.name, reader.unit, reader.loss_base) == ("fairseq", "words/s", "2")
    assert log_readers() == [reader]  # the other kinds' programs write no log hpc reads
    text = (REPO / "tests/fixtures/training/fairseq_translation.sample.txt").read_text()
    points = reader.points(text)
    assert [p.kind for p in points] == ["train_inner"] * 3 + ["valid", "train"]
    log = parse_training_text(text)
    assert log is not None and log.format == "fairseq" and log.step_kind == reader.step_kind
    assert throughput(log) == reader.throughput(log.points, 1) and throughput(log)[0] == pytest.approx(600.0)
    assert reader.recognises(text) and unreadable_fix(["2024 | INFO | fairseq_cli.train | done"]) == reader.fix
    assert unreadable_fix(['{"event": "start"}']) is None and not reader.points('{"event": "train", "loss": 1}')


def test_launchers_without_a_rule_keep_the_defaults():
    for kind in ("python-script", "binary", "deepspeed", "accelerate"):
        launcher = launcher_for(kind)
        assert launcher.log_reader() is None
        assert launcher.resume_script("/ck") == "" and launcher.advice({"--max-epoch": 1}, None, 8) == ([], [])
        assert launcher.device_args({"--fp16": True}, "cpu", 2, 4) == ({"--fp16": True}, [])
    assert not launcher_for("binary").python and all(launcher.python for launcher in all_launchers()
                                                      if launcher.kind != "binary")


def test_the_kubernetes_form_is_the_launchers_and_the_refusal_lists_the_forms():
    assert launcher_for("binary").kubernetes_kind(load_recipe("nccl-tests")) == MPI_JOB
    with pytest.raises(HpcError, match="launcher kind binary without `mpi` has no Kubernetes form") as err:
        launcher_for("binary").kubernetes_kind(load_recipe("nccl-tests", overrides=["launcher.mpi=null"]))
    assert err.value.fix.startswith(f"Kubernetes forms exist for {kubernetes_forms()}")
    assert "accelerate" in kubernetes_forms() and "(PyTorchJob)" in kubernetes_forms()
    with pytest.raises(HpcError, match="launcher kind deepspeed has no Kubernetes form"):
        launcher_for("deepspeed").kubernetes_kind(load_recipe("bert-5b"))


# accelerate: one module (toolkit/launchers/accelerate.py) and its name in the schema's launcher.kind


def test_accelerate_runs_one_agent_per_node_with_the_jobs_rendezvous():
    spec = build_job_spec(accelerate_recipe(), CPU, 2)
    assert spec.style == "torchrun" and spec.slurm.tasks_per_node == 1 and spec.slurm.cpus_per_task == 2
    argv = preview_argv(spec.command)
    assert argv[:2] == ["python", "-c"] and "from accelerate.commands.launch import main" in argv[2]
    assert "'ACCELERATE_USE_CPU': 'true'" in argv[2] and "'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1'" in argv[2]
    assert argv[-6:] == ["-m", "mypkg.train", "--epochs", "1", "--lr", "0.1"]
    script = render_script(spec)
    assert 'export PET_RDZV_ENDPOINT="$MASTER_ADDR:$MASTER_PORT" PET_RDZV_ID="$SLURM_JOB_ID"' in script
    assert 'NODE_RANK="$SLURM_NODEID"' in spec.program.script
    on_gpu = preview_argv(build_job_spec(accelerate_recipe(), P3DN, 2).command)
    assert "ACCELERATE_USE_CPU" not in on_gpu[2] and "--multi_gpu" in on_gpu
    with pytest.raises(HpcError, match="accelerate has no Gaudi HPU support here"):
        launcher_for("accelerate").program(accelerate_recipe().launcher, "/r", 1, 8, "hpu", None)


def _run_stubbed(argv: tuple[str, ...], env: dict[str, str], tmp_path) -> list[str]:
    """Run a `bash -c SCRIPT python WORDS...` program with `python` replaced by a stub that prints its argv."""
    stub = tmp_path / "python"
    stub.write_text(f"#!{sys.executable}\n{ARGV_STUB}\n")
    stub.chmod(0o755)
    assert argv[3] == "python"
    res = subprocess.run([*argv[:3], str(stub), *argv[4:]], env={"PATH": os.environ["PATH"], **env},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)[2:]  # after `-c CODE`


@pytest.mark.training
def test_accelerates_own_parser_reads_each_nodes_argv(tmp_path):
    """Each Slurm task's bash expands the node's values; accelerate 1.15's launch_command_parser (huggingface/
    accelerate src/accelerate/commands/launch.py) reads what hpc meant."""
    from accelerate.commands.launch import launch_command_parser

    spec = build_job_spec(accelerate_recipe(), CPU, 2)
    words = _run_stubbed(spec.program.argv, {"SLURM_NODEID": "1", "MASTER_ADDR": "10.0.0.7",
                                             "MASTER_PORT": "29512"}, tmp_path)
    args = launch_command_parser().parse_args(words)
    assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 4, 1)
    assert (args.main_process_ip, args.main_process_port, args.rdzv_backend) == ("10.0.0.7", 29512, "c10d")
    assert args.rdzv_conf == "join_timeout=300" and args.max_restarts == 2
    assert args.multi_gpu and args.no_python and not args.cpu
    assert args.training_script == "python"
    assert args.training_script_args[0] == "-c" and args.training_script_args[2:] == [
        "300", "-m", "mypkg.train", "--epochs", "1", "--lr", "0.1"]
    assert check_arguments(accelerate_recipe(), spec) == [
        "arguments: the module mypkg.train's own arguments were not checked: hpc has no parser for them"]


@pytest.mark.training
def test_accelerates_parser_refuses_what_it_would_refuse_at_start():
    spec = build_job_spec(accelerate_recipe(), CPU, 2)
    command = list(spec.command)
    command[command.index("--num_machines") + 1] = "two"
    with pytest.raises(HpcError, match=r"--num_machines two .*is not a value accelerate launch \(accelerate "
                                       r"1\.15\.0\) accepts: it wants a whole number"):
        check_arguments(accelerate_recipe(), dataclasses.replace(spec, command=tuple(command)))
    command[command.index("--num_machines")] = "--num_machine"
    with pytest.raises(HpcError, match="accelerate launch .* has no such option; did you mean --num_machines"):
        check_arguments(accelerate_recipe(), dataclasses.replace(spec, command=tuple(command)))


def test_where_accelerate_is_not_installed_the_plan_says_so(monkeypatch):
    from toolkit.launchers import accelerate

    accelerate._parser.cache_clear()
    monkeypatch.setitem(sys.modules, "accelerate", None)
    try:
        notes = check_arguments(accelerate_recipe(), build_job_spec(accelerate_recipe(), CPU, 2))
    finally:
        accelerate._parser.cache_clear()
    assert notes == ["arguments: not checked: accelerate is not installed where hpc runs, so neither accelerate "
                     "launch's options nor the module mypkg.train's own arguments were not checked: hpc has no "
                     "parser for them"]


def test_accelerate_renders_a_pytorchjob_whose_pods_run_accelerate_launch(tmp_path):
    rendered = render(accelerate_recipe(), "p4d.24xlarge", 2, storage=Storage(storage_class="fsx-lustre"),
                      image="img:1", api=V1)
    report = validate_text(rendered.text)
    assert report["valid"], report["findings"]
    job = rendered.documents[-1]
    assert job["kind"] == "PyTorchJob" and job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["bash"]
    env = {var["name"]: var["value"] for var in container["env"]}
    # the pod's command as the kubelet expands it, with the Training Operator's c10d endpoint (elastic.go)
    argv = ("bash", *(kubelet_expand(arg, env) for arg in container["args"]))
    words = _run_stubbed(argv, {"PET_RDZV_ENDPOINT": "acc-worker-0:23456"}, tmp_path)
    flags = dict(zip(words, words[1:], strict=False))
    assert (flags["--num_machines"], flags["--num_processes"]) == ("2", "16")
    assert (flags["--main_process_ip"], flags["--main_process_port"], flags["--machine_rank"]) == (
        "acc-worker-0", "23456", "0")
    with pytest.raises(HpcError, match="its Kubernetes form is the v1 PyTorchJob"):
        render(accelerate_recipe(), "p4d.24xlarge", 2, image="img:1", api=TRAINER_V2)


def test_hpc_run_takes_accelerate_as_a_launcher(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    data = user_recipe(str(script), ["--epochs", "1"], nodes=2, style="accelerate", max_restarts=1)
    assert data["launcher"] == {"kind": "accelerate", "script": str(script), "argv": ["--epochs", "1"],
                                "max_restarts": 1}
    res = run_hpc("run", str(script), "--launcher", "accelerate", "--dry-run", "--json", "--", "--epochs", "1")
    assert res.returncode == 0, res.stderr
    plan = cli_json(res)
    assert "from accelerate.commands.launch import main" in plan["rank0_argv"][2]
    assert "#SBATCH --ntasks-per-node=1" in plan["script"]  # one accelerate launch per node


@pytest.mark.parametrize("launcher,message", [
    ({"kind": "accelerate"}, "launcher kind accelerate needs `script` (a .py file) or `module`, not both"),
    ({"kind": "accelerate", "module": "m", "script": "s.py"}, "needs `script` (a .py file) or `module`, not both"),
    ({"kind": "accelerate", "module": "m", "style": "torchrun"}, "starts one accelerate launch per node itself"),
    ({"kind": "accelerate", "module": "m", "program": "/bin/x"}, "`program` and `mpi` are only for launcher kind"),
])
def test_the_recipe_schema_takes_the_accelerate_kind_with_its_fields(launcher, message):
    with pytest.raises(HpcError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("acc", data={**ACCELERATE_RECIPE, "launcher": launcher})
