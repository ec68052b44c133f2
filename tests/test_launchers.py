"""Launcher kinds as modules (toolkit.launchers): the registry, each launcher's contract (argv, device flags, own
parser, resume rule, advice, Kubernetes form)."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from tests.conftest import REPO
from tests.jobhelpers import P3DN
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError
from toolkit.job.rank import RankVar
from toolkit.job.spec import arguments, queue_target, resources
from toolkit.launchers import all_launchers, kubernetes_forms, launcher_for, launcher_of, registry
from toolkit.launchers.base import MPI_JOB, PYTORCH_JOB, Launcher
from toolkit.recipes.load import list_recipe_files, load_recipe
from toolkit.recipes.schema import Launcher as LauncherSection
from toolkit.slurm.materialize import build_job_spec

DL1 = load_queues(REPO / "jobs" / "dl1-cluster.yaml")["dl1"]


def test_every_recipe_kind_has_a_launcher_module_and_the_registry_picks_it():
    kinds = typing.get_args(LauncherSection.model_fields["kind"].annotation)
    assert set(registry()) == set(kinds)  # a module per kind, found in toolkit/launchers
    for kind in kinds:
        launcher = launcher_for(kind)
        assert isinstance(launcher, Launcher) and launcher.kind == kind
    assert type(launcher_for("python-module", "toolkit.workloads.resnet")).__name__ == "Trainer"
    assert type(launcher_for("python-module", "mypkg.train")).__name__ == "Module"
    assert launcher_for("fairseq") is launcher_for("fairseq")  # one instance per kind, loaded once
    with pytest.raises(HpcError, match="launcher kind 'torchrun' is not one of binary, deepspeed, fairseq, "):
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
    with pytest.raises(HpcError, match="fairseq has no Habana HPU support"):
        fairseq.device_args({}, "hpu", None, 8)
    assert RankVar.MASTER_ADDR in fairseq.trailer()[-1]
    assert [var.name for var in fairseq.env()] == ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]
    assert fairseq.resume_script(None) == "" and "checkpoint_last.pt" in fairseq.resume_script("/ck")
    derived, _ = fairseq.advice({"--max-epoch": 2, "--max-update": 10}, "/nowhere", 8)
    assert [(d.key, d.value) for d in derived] == [("run length", "unknown")]
    assert fairseq.kubernetes_kind(load_recipe("roberta")) == PYTORCH_JOB


def test_launchers_without_a_rule_keep_the_defaults():
    for kind in ("python-script", "binary", "deepspeed"):
        launcher = launcher_for(kind)
        assert launcher.resume_script("/ck") == "" and launcher.advice({"--max-epoch": 1}, None, 8) == ([], [])
        assert launcher.device_args({"--fp16": True}, "cpu", 2, 4) == ({"--fp16": True}, [])
    assert not launcher_for("binary").python and all(launcher.python for launcher in all_launchers()
                                                      if launcher.kind != "binary")


def test_the_kubernetes_form_is_the_launchers_and_the_refusal_lists_the_forms():
    assert launcher_for("binary").kubernetes_kind(load_recipe("nccl-tests")) == MPI_JOB
    with pytest.raises(HpcError, match="launcher kind binary without `mpi` has no Kubernetes form") as err:
        launcher_for("binary").kubernetes_kind(load_recipe("nccl-tests", overrides=["launcher.mpi=null"]))
    assert err.value.fix.startswith(f"Kubernetes forms exist for {kubernetes_forms()}")
    assert "fairseq, python-module launchers (PyTorchJob)" in kubernetes_forms()
    with pytest.raises(HpcError, match="launcher kind deepspeed has no Kubernetes form"):
        launcher_for("deepspeed").kubernetes_kind(load_recipe("bert-5b"))
