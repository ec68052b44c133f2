"""The job spec's steps, each alone (toolkit.job.spec), and the line between the scheduler-neutral spec and what
only Slurm adds (on_slurm): Kubernetes builds from the first, `hpc recipes render`/submit from both."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import REPO
from tests.jobhelpers import CPU, MINIMAL_RECIPE, P3DN
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError
from toolkit.job.advice import advise
from toolkit.job.rank import RankVar
from toolkit.slurm.render import job_options
from toolkit.job.spec import arguments, dirs, dirs_root, job_spec, prepare_step, queue_target, rank_command, resources
from toolkit.launchers import launcher_for
from toolkit.slurm.materialize import build_job_spec
from toolkit.k8s.manifests import k8s_target
from toolkit.recipes.load import load_recipe

DL1 = load_queues(REPO / "jobs" / "dl1-cluster.yaml")["dl1"]
SLURM_ONLY = {"--wait-all-nodes", "software", "srun cpu binding", "--gpus-per-node", "pre-flight", "fleet ledger"}


def test_resources_of_a_cpu_queue_and_of_a_gpu_queue():
    cpu = resources(load_recipe("resnet50"), queue_target(CPU), 2)
    assert (cpu.device, cpu.tasks, cpu.cpus, cpu.threads, cpu.gpus, cpu.world) == ("cpu", 2, 1, 1, 0, 4)
    gpu = resources(load_recipe("roberta"), queue_target(P3DN), None)  # None: the recipe's resources.nodes
    assert (gpu.device, gpu.nodes, gpu.tasks, gpu.threads, gpu.gpus) == \
        ("gpu", load_recipe("roberta").resources.nodes, 8, None, 8)
    assert resources(load_recipe("resnet50"), queue_target(DL1), 1).gpus == 0  # HPUs: one rank each, no GRES
    assert [d.key for d in gpu.derived] == ["ranks per node", "world size", "cpus per task"]


def test_arguments_refuse_a_flag_the_toolkit_sets_and_scale_the_rest():
    recipe = load_recipe("roberta")
    target = queue_target(P3DN)
    args, derived = arguments(recipe, target, resources(recipe, target, 4))
    assert args["--update-freq"] == 16 and args["--distributed-world-size"] == 32  # 8192 / (16 x 32)
    assert [d.key for d in derived][:1] == ["--update-freq"]
    with pytest.raises(HpcError, match="args.--device-id is set by the toolkit"):
        taken = load_recipe("roberta", overrides=["args.--device-id=0"])
        arguments(taken, target, resources(taken, target, 4))


def test_dirs_resolve_under_the_root_or_the_given_run_dir():
    """Data is read by every run (the root); a run owns what it writes (its run dir), unless `under: root`."""
    recipe = load_recipe("resnet50", overrides=["dirs.root=/data/team"])
    root, why = dirs_root(recipe, queue_target(P3DN))
    assert (root, why.rule) == ("/data/team", "dirs.root of the recipe")
    placed = dirs(recipe, root, "resnet50", "/runs/r1")
    assert placed.paths == {"data": "/data/team/data/imagenet", "checkpoints": "/runs/r1/checkpoints/resnet50",
                            "logs": "/runs/r1/logs/resnet50"}
    assert "each run its own" in next(d.rule for d in placed.derived if d.key == "checkpoints dir")
    pinned = dirs(load_recipe("resnet50", overrides=["dirs.root=/data/team", "dirs.checkpoints.under=root"]), root,
                  "resnet50", "/runs/r1")
    assert pinned.paths["checkpoints"] == "/data/team/checkpoints/resnet50"  # continuing across runs: explicit
    assert placed.args == {"--data": placed.paths["data"], "--checkpoint-dir": placed.paths["checkpoints"],
                           "--log-dir": placed.paths["logs"]}
    assert dirs(recipe, root, "resnet50", None).run_dir == "/data/team/runs/resnet50"  # a target without runs root


def test_prepare_needs_the_data_dir():
    recipe = load_recipe("resnet50", overrides=["prepare=[make-data]"])
    assert prepare_step(recipe, "/d") == ("make-data", "/d")
    with pytest.raises(HpcError, match="dirs.data is not set"):
        prepare_step(recipe, None)


def test_rank_command_puts_the_program_positional_dirs_then_flags():
    recipe = load_recipe("mini", data=MINIMAL_RECIPE)
    command, derived = rank_command(recipe, "/root", 2, 8, ("/root/data",), {"--arch": "transformer", "--fp16": True})
    assert command[:5] == ["fairseq-train", "/root/data", "--arch", "transformer", "--fp16"]
    assert command[-6:-2] == ["--distributed-rank", RankVar.RANK, "--device-id", RankVar.LOCAL_RANK]
    assert derived == []


def test_advice_takes_values_not_an_argv():
    resnet = load_recipe("resnet50")
    derived, warnings = advise(launcher_for("python-module"), {"--batch-size": 256}, resnet.scaling, None, 256)
    assert derived == [] and "global batch 65536" in warnings[0]
    assert advise(launcher_for("python-module"), {"--batch-size": 256}, resnet.scaling, None, 8) == ([], [])
    derived, warnings = advise(launcher_for("fairseq"), {"--max-epoch": 2, "--max-update": 10, "--fp16": True}, {},
                               "/nowhere", 8)
    assert [(d.key, d.value) for d in derived] == [("run length", "unknown")] and warnings == []


@pytest.mark.parametrize("recipe,queue,nodes", [("roberta", P3DN, 2), ("resnet50", CPU, 2), ("bert-5b", DL1, 4),
                                                ("nccl-tests", P3DN, 2)])
def test_slurm_adds_its_part_to_the_neutral_spec_and_changes_nothing_else(recipe, queue, nodes):
    recipe = load_recipe(recipe)
    neutral = job_spec(recipe, queue_target(queue), nodes, run_dir="/r")
    slurm = build_job_spec(recipe, queue, nodes, run_dir="/r", slurm_options={"account": "ml", "qos": None})
    assert not SLURM_ONLY & {d.key for d in neutral.derived}
    assert neutral.slurm is None and slurm.slurm is not None  # the neutral spec has no Slurm part at all
    assert slurm.derived[:len(neutral.derived)] == neutral.derived
    assert {d.key for d in slurm.derived[len(neutral.derived):]} <= SLURM_ONLY
    assert slurm.slurm.options == {"account": "ml"} and job_options(slurm)["account"] == "ml"
    assert dataclasses.replace(slurm, derived=neutral.derived, slurm=None, software=neutral.software) == neutral
    # what the pre-flight checks each node against comes from the queue (neutral: whether to run it at all)
    assert bool(slurm.slurm.preflight_args) == neutral.preflight == recipe.resources.requeue


def test_slurm_options_are_checked_where_slurm_is_made():
    neutral = job_spec(load_recipe("resnet50"), queue_target(P3DN), 1, run_dir="/r un")  # no #SBATCH line here
    assert neutral.run_dir == "/r un"
    with pytest.raises(HpcError, match="run dir '/r un' cannot go into an #SBATCH line"):
        build_job_spec(load_recipe("resnet50"), P3DN, 1, run_dir="/r un")


def test_a_kubernetes_target_is_the_pods_share_of_the_instance():
    target, efa_devices = k8s_target("p4d.24xlarge", 3, None)
    assert (target.max_nodes, target.tasks_per_node, target.cpus_per_task, target.shared_root) == (3, 8, 10, "/fsx")
    assert (target.fabric, efa_devices) == ("modern", 4)
    assert k8s_target("p4d.24xlarge", 3, False)[0].fabric == "none"
    with pytest.raises(HpcError, match="has no EFA devices"):
        k8s_target("m5.xlarge", 1, True)
