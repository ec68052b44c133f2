"""CPUs per rank and their binding as ParallelCluster's Slurm sees them: `DisableSimultaneousMultithreading` on a
compute resource halves the CPUs a node declares (CPUs=N, aws-parallelcluster-cookbook), GPU ranks go unbound
(--cpu-bind=none) and HPU ranks get explicit per-core masks, on both submission paths; the local test cluster's
configs have the same shape (task/affinity + task/cgroup, CPUs=N only, an SMT-off queue)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import write_cluster
from testbench import cluster
from testbench.layout import Layout
from toolkit.cluster.queues import queues_from_config
from toolkit.accelerators.gaudi import core_masks
from toolkit.slurm.render import render_script, srun_options
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe


def config(instance: str, smt_off: bool | None, ranks: int | None = None) -> dict:
    resource = {"Name": "cr", "Instances": [{"InstanceType": instance}], "MaxCount": 4}
    if smt_off is not None:
        resource["DisableSimultaneousMultithreading"] = smt_off
    queue = {"Name": "q", "ComputeResources": [resource]}
    if ranks:
        queue["Tags"] = [{"Key": "hpc:ranks-per-node", "Value": str(ranks)}]
    return {"Scheduling": {"Scheduler": "slurm", "SlurmQueues": [queue]}}


def queue(instance: str, smt_off: bool | None, ranks: int | None = None):
    return queues_from_config(config(instance, smt_off, ranks))["q"]


@pytest.mark.parametrize(("smt_off", "cpus", "rule"), [
    (True, 6, "48 cores (SMT off) / 8 ranks"), (False, 12, "96 vCPUs / 8 ranks"), (None, 12, "96 vCPUs / 8 ranks")])
def test_p4d_cpus_per_task_come_from_cores_when_smt_is_off(smt_off, cpus, rule):
    q = queue("p4d.24xlarge", smt_off)
    assert (q.cpus_per_node, q.cpus_per_task, q.cpus_rule) == (48 if smt_off else 96, cpus, rule)
    spec = build_job_spec(load_recipe("roberta"), q, 2)
    assert next(d for d in spec.derived if d.key == "cpus per task").rule == rule
    script = render_script(spec)
    assert f"#SBATCH --cpus-per-task={cpus}\n" in script
    assert f" --cpus-per-task={cpus} " in next(line for line in script.splitlines() if line.startswith("srun "))


def test_the_key_means_nothing_on_one_thread_per_core():
    """ParallelCluster disables SMT only where there is some (disable_simultaneous_multithreading_manually)."""
    q = queue("hpc6a.48xlarge", True, ranks=96)
    assert (q.smt_off, q.cpus_per_node, q.cpus_per_task) == (False, 96, 1)


def test_one_smt_off_compute_resource_bounds_the_queue():
    data = config("c5n.18xlarge", None, ranks=36)
    resources = data["Scheduling"]["SlurmQueues"][0]["ComputeResources"]
    resources.append({"Name": "cr2", "Instances": [{"InstanceType": "c5n.18xlarge"}], "MaxCount": 2,
                      "DisableSimultaneousMultithreading": True})
    q = queues_from_config(data)["q"]
    assert (q.cpus_per_node, q.cpus_per_task) == (36, 1)


def test_gpu_ranks_are_unbound_on_both_submission_paths(tmp_path):
    from toolkit.slurm.executors import slurm_parameters, submitit_batch_script

    spec = build_job_spec(load_recipe("roberta"), queue("p4d.24xlarge", True), 2)
    assert spec.slurm.srun_binding == ("--cpu-bind=none",)
    assert "--cpu-bind=none" in srun_options(spec)
    srun_line = next(line for line in render_script(spec).splitlines() if line.startswith("srun "))
    assert " --cpu-bind=none " in srun_line
    params = slurm_parameters(spec)
    assert params["srun_args"] == srun_options(spec) and params["additional_parameters"]["cpus_per_task"] == 6
    submitit_srun = next(line for line in submitit_batch_script(spec, tmp_path).splitlines()
                         if line.startswith("srun "))
    assert "--cpu-bind=none" in submitit_srun and "--cpus-per-task=6" in submitit_srun


def test_cpu_ranks_keep_slurms_own_binding():
    spec = build_job_spec(load_recipe("collectives"), queue("c5n.18xlarge", True, ranks=2), 1)
    assert spec.slurm.srun_binding == () and not any(o.startswith("--cpu-bind") for o in srun_options(spec))


def test_dl1_masks_give_each_hpu_rank_six_cores_socket_0_first():
    def cpus(mask: str) -> list[int]:
        value = int(mask, 16)
        return [i for i in range(value.bit_length()) if value >> i & 1]

    on = core_masks(48, 2, 8)
    assert cpus(on[0]) == [*range(0, 6), *range(48, 54)]  # cores 0-5 and their siblings
    assert cpus(on[4]) == [*range(24, 30), *range(72, 78)]  # rank 4 starts socket 1 (cores 24-47)
    assert sorted(c for m in on for c in cpus(m)) == list(range(96))  # disjoint, every CPU used
    assert [cpus(m) for m in core_masks(48, 1, 8)] == [list(range(6 * r, 6 * r + 6)) for r in range(8)]


@pytest.mark.parametrize(("smt_off", "cpus_per_task", "first"), [(False, 12, "0x3f00000000003f"), (True, 6, "0x3f")])
def test_dl1_job_binds_hpu_ranks_by_mask(smt_off, cpus_per_task, first):
    spec = build_job_spec(load_recipe("bert-5b"), queue("dl1.24xlarge", smt_off), 2)
    assert spec.cpus_per_task == cpus_per_task
    (binding,) = spec.slurm.srun_binding
    assert binding.startswith(f"--cpu-bind=mask_cpu:{first},") and binding.count(",") == 7


def test_hpu_torchrun_task_holds_the_node_unpinned():
    q = queue("dl1.24xlarge", False)
    spec = build_job_spec(load_recipe("resnet50", overrides=["launcher.style=torchrun"]), q, 1)
    assert spec.slurm.srun_binding == ("--cpu-bind=none",)


def test_cluster_show_says_cpus_per_node_and_smt(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(config("p4d.24xlarge", True)))
    row = cli_json(run_hpc("cluster", "show", str(path), "--json"))[0]
    assert (row["cpus_per_node"], row["smt_off"], row["cpus_per_task"]) == (48, True, 6)
    assert "48 (SMT off)" in run_hpc("cluster", "show", str(path)).stdout
    plain = cli_json(run_hpc("cluster", "show", str(write_cluster(tmp_path)), "--json"))
    assert {r["queue"]: r["smt_off"] for r in plain} == {"cpu": False, "gaudi": False, "p3": False}


def test_local_slurm_is_shaped_like_parallelclusters(tmp_path):
    layout = Layout(tmp_path / "state")
    files = cluster.render_configs(layout)
    lines = [line for line in files[layout.slurm_conf].splitlines() if line and not line.startswith("#")]
    settings = dict(line.split("=", 1) for line in lines if " " not in line)
    assert settings["TaskPlugin"] == "task/affinity,task/cgroup"
    assert "ConstrainCores=yes" in files[layout.cgroup_conf].splitlines()
    nodes = {row["NodeName"]: row for row in (dict(w.split("=", 1) for w in line.split()) for line in lines)
             if "NodeName" in row}
    assert all(not {"Sockets", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "Boards"} & set(n)
               for n in nodes.values())
    # The SMT-off queue's CPUs come from the config alone and match the nodes Slurm declares.
    layout.root.mkdir(parents=True)
    layout.cluster_config.write_text(files[layout.cluster_config])
    from toolkit.cluster.queues import load_queues

    nosmt = load_queues(layout.cluster_config)["nosmt"]
    assert (nosmt.smt_off, nosmt.cpus_per_task_override,
            nosmt.cpus_per_node, nosmt.tasks_per_node, nosmt.cpus_per_task) == (True, None, 2, 2, 1)
    assert nosmt.cpus_per_node == int(nodes["c1"]["CPUs"])
    partitions = {line.split()[0].split("=")[1]: line for line in lines if line.startswith("PartitionName=")}
    assert "Nodes=c1,c2" in partitions["nosmt"]
