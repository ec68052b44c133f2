"""`make test` runs on two xdist workers with each Slurm lane's tests in one xdist group (tests/conftest.py
lane_group): a lane's tests must run in order on one worker, since they share its nodes and some restart its
daemons. xdist 3.8.0 names a group by rewriting item._nodeid, which pytest 9.2 stopped reading, and then every
group is split over the workers without a word (pyproject.toml pins pytest below 9.2). This runs a small session
the way `make test` does and checks where each test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

TESTS = '''
import json, os, pytest

def record(name):
    with open(os.environ["WHERE_RAN"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.slurm
@pytest.mark.parametrize("n", range(6))
def test_on_the_default_lane(n):
    record("lane")

@pytest.mark.parametrize("n", range(12))
def test_a_unit(n):
    import time
    time.sleep(0.05)
    record("unit")
'''


def test_a_lanes_tests_run_on_one_worker_beside_the_unit_tests(tmp_path):
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: a lane's test\n")
    where = tmp_path / "where.jsonl"
    env = dict(os.environ, WHERE_RAN=str(where), PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
            str(tmp_path)]
    res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    ran = [json.loads(line) for line in where.read_text().splitlines()]
    lane_workers = {worker for name, worker in ran if name == "lane"}
    assert len([1 for name, _ in ran if name == "lane"]) == 6 and len(lane_workers) == 1, ran
    # and the other worker ran unit tests meanwhile: the point of the two workers
    assert {worker for name, worker in ran if name == "unit"} - lane_workers, ran
