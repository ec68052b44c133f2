"""CPU counts and binding on a local Slurm shaped like ParallelCluster's (task/affinity + task/cgroup, nodes
declared CPUs=N): a job on the SMT-off queue plans and runs, its CPU ranks are bound each to its own CPU, and the
GPU ranks' binding (--cpu-bind=none) leaves them the job's CPUs. Each rank reads its own Cpus_allowed_list.

Runs on every lane (the `lane` fixture of the conformance tests); the shape comes from testbench/templates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO, run_hpc
from tests.jobhelpers import write_recipe
from tests import test_slurm_conformance
from tests.test_slurm_conformance import slurm
from toolkit.cluster.queues import Queue
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe

pytestmark = pytest.mark.slurm
AFFINITY = REPO / "tests" / "payloads" / "affinity.py"
lane = test_slurm_conformance.lane  # the conformance tests' fixture, parametrized over the Slurm versions


def affinity_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path, {
        "name": "affinity", "description": "records each rank's node and allowed CPUs", "source": "tests",
        "launcher": {"kind": "binary", "program": str(AFFINITY)},
        "resources": {"nodes": 2, "time": "00:05:00", "exclusive": False},
        "env": {"AFFINITY_OUT": str(tmp_path / "affinity")},
    }, "affinity.yaml")


def read_affinity(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}


def test_a_job_on_the_smt_off_queue_runs_with_one_core_per_rank_each_bound_to_its_own(lane, tmp_path):
    """m5.xlarge (4 vCPUs, 2 cores) with DisableSimultaneousMultithreading: 2 ranks x 1 CPU per node. Counted
    from vCPUs it asks 2 x 2 and Slurm refuses ("Requested node configuration is not available")."""
    env = lane.env() | {"HPC_RUNS_DIR": str(tmp_path / "runs")}
    res = run_hpc("recipes", "submit", str(affinity_recipe(tmp_path)), "--cluster", str(lane.cluster_config),
                  "--queue", "nosmt", "--wait", "--json", env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert cli_json(res)["state"] == "COMPLETED"
    ranks = read_affinity(tmp_path / "affinity")
    assert sorted(ranks) == [0, 1, 2, 3]
    for node in ("c1", "c2"):  # Slurm's automatic binding (task/affinity): one CPU each, not the same one
        cpus = sorted(r["cpus"] for r in ranks.values() if r["node"] == node)
        assert cpus == ["0", "1"], (node, cpus)


def test_gpu_ranks_binding_leaves_each_rank_every_cpu_of_the_job(lane, tmp_path):
    """The srun binding a p4d job renders (toolkit.job.spec.on_slurm), applied to 2 ranks x 1 CPU on a node of
    the local Slurm (a stand-in for the GPU node: same plugins, same CPUs=N declaration)."""
    p4d = Queue(name="p4d", instance_type="p4d.24xlarge", max_nodes=2, efa_enabled=True)
    binding = build_job_spec(load_recipe("roberta"), p4d, 1).slurm.srun_binding
    out = slurm(lane, "srun", "--partition=nosmt", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                *binding, "--label", "grep", "Cpus_allowed_list", "/proc/self/status", timeout=120).stdout
    allowed = sorted(line.split()[-1] for line in out.splitlines())
    assert allowed == ["0-1", "0-1"], out  # bound by Slurm: ["0", "1"]
