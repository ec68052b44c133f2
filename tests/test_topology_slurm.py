"""Issue 35, on the local Slurm: a job on the `wide` partition (w1..w16) of a cluster config whose queue names a
topology file (tag hpc:topology) starts its ranks in that file's network order, not in node-name order: rank r's
SLURMD_NODENAME is the r-th of the job's nodes in the order the fixture's EC2 topology gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, cli_json, run_hpc, slurm_env
from toolkit.cluster import topology as t

pytestmark = pytest.mark.slurm
DATA = REPO / "tests" / "data"
RANK_NODE = """\
import os, sys
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"]), "w") as out:
    out.write(os.environ["SLURMD_NODENAME"])
"""


def test_a_jobs_ranks_follow_the_queues_network_order(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    conf = tmp_path / "wide-topology.conf"
    res = run_hpc("cluster", "topology", str(DATA / "ec2-instance-topology-16.json"), "--queue", "wide",
                  "--nodes-map", str(DATA / "ec2-instance-topology-16.wide.nodes"), "-o", str(conf), env=env)
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(Path(env["HPC_CLUSTER_CONFIG"]).read_text())
    [wide] = [q for q in config["Scheduling"]["SlurmQueues"] if q["Name"] == "wide"]
    wide["Tags"].append({"Key": "hpc:topology", "Value": conf.name})  # relative: beside the config
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    script, seen = tmp_path / "rank_node.py", tmp_path / "seen"
    script.write_text(RANK_NODE)
    seen.mkdir()

    res = run_hpc("run", str(script), "--nodes", "4", "--queue", "wide", "--cluster", str(tmp_path / "cluster.yaml"),
                  "--executor", "sbatch", "--time", "5", "--wait", "--json", "--", str(seen),
                  env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    job = cli_json(res)
    by_rank = [(seen / f"rank-{r}").read_text() for r in range(4)]
    expected = [n for n in t.order_from_conf(conf.read_text()) if n in by_rank]
    assert by_rank == expected and sorted(by_rank) == sorted(set(by_rank))
    assert by_rank != sorted(by_rank, key=lambda n: int(n[1:]))  # not Slurm's name order
    log = "".join(p.read_text() for p in Path(job["run_dir"]).glob("*.out"))
    assert f"hpc: ranks ordered by network node from {conf}: {' '.join(by_rank)}" in log, log[-2000:]
