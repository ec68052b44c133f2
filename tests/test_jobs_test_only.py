"""Every reviewed render in jobs/ (nccl-tests included) is a job the p3dn-shaped partition accepts:
sbatch --test-only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_hpc, slurm_env

pytestmark = pytest.mark.slurm
JOBS = sorted((REPO / "jobs").glob("*xp3dn.sbatch"))  # the sandbox has a p3dn-shaped partition, no dl1


@pytest.mark.parametrize("script", JOBS, ids=[p.stem for p in JOBS])
def test_reviewed_render_passes_sbatch_test_only(slurm_sandbox, script: Path):
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", script.read_text(), re.M).group(1))
    res = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                         env=slurm_env(slurm_sandbox), timeout=60)
    assert res.returncode == 0, res.stderr
    assert re.search(rf"to start at .* on nodes p3dn-st-p3dn-24xl-\[1-{nodes}\] in partition p3dn", res.stderr)


def test_too_many_nodes_is_refused_by_the_test_only_check(slurm_sandbox, tmp_path):
    script = tmp_path / "too-big.sbatch"
    res = run_hpc("recipes", "render", "roberta", "--nodes", "8", "--cluster", str(REPO / "jobs" / "p3dn-cluster.yaml"),
                  "--queue", "p3dn", "-o", str(script))
    assert res.returncode == 0, res.stderr
    script.write_text(script.read_text().replace("#SBATCH --nodes=8", "#SBATCH --nodes=9"))
    refused = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                             env=slurm_env(slurm_sandbox), timeout=60)
    assert refused.returncode != 0 and "node" in refused.stderr.lower()
