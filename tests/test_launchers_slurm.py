"""The accelerate launcher end to end on the real local Slurm: `hpc run --launcher accelerate` on 2 nodes x 2 ranks
(CPU), one `accelerate launch` per node, the ranks joining one gloo group (an all_reduce over all four)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, cli_json
from tests.test_own_code_slurm import hpc_run, records

pytestmark = [pytest.mark.slurm, pytest.mark.training]
SCRIPT = REPO / "tests" / "payloads" / "accelerate_allreduce.py"


def test_accelerate_runs_one_launch_per_node_and_all_ranks_reduce_together(slurm_sandbox, tmp_path):
    res = hpc_run(slurm_sandbox, tmp_path, str(SCRIPT), "--launcher", "accelerate")
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    assert result["state"] == "COMPLETED" and result["ranks"] == 4
    run = Path(result["run_dir"])
    assert "--ntasks-per-node=1" in (run / "job.sbatch").read_text()  # one accelerate launch per node
    seen = {r["rank"]: r for r in records(run) if r.get("event") == "accelerate_allreduce"}
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, r in seen.items():
        assert r["world"] == 4 and r["sum"] == 10.0 and r["type"] == "DistributedType.MULTI_CPU"
        assert r["node"] == str(rank // 2) and r["host"] == f"c{rank // 2 + 1}"
