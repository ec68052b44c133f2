"""Hot spares without a cluster (toolkit.job.spares and what plans a job with spares): which nodes train, each
round's srun and rendezvous, the failures it reads from srun and the heartbeats, the rendered script, and the
refusals. The real thing on the local Slurm: tests/test_spares_slurm.py."""

from __future__ import annotations

import subprocess

import pytest

from tests.jobhelpers import CPU
from toolkit.cli.jobs import _restart_lines
from toolkit.errors import HpcError
from toolkit.job import spares
from toolkit.job.rank import master_port
from toolkit.job.render import render_script, sbatch_directives
from toolkit.job.spec import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.submit.executor import choose_executor
from toolkit.workloads.heartbeat import Beat


def test_the_batch_host_trains_last():
    assert spares.ordered_nodes(["c1", "c2", "c3"], "c1") == ["c2", "c3", "c1"]
    assert spares.ordered_nodes(["c1", "c2", "c3"], "c2") == ["c1", "c3", "c2"]


def test_each_round_has_its_nodes_and_a_fresh_rendezvous():
    srun = ["srun", "--label", "--nodes=2", "bash", "-c", "x"]
    assert spares.round_argv(srun, ["c2", "c3"], 0) == ["srun", "--nodelist=c2,c3", "--label", "--nodes=2",
                                                       "bash", "-c", "x"]
    assert spares.round_argv(srun, ["c3", "c1"], 1)[:3] == ["srun", "--nodelist=c3,c1", "--overlap"]
    script = spares.round_env({"PATH": "/bin"}, ["c2"], 859, 0)
    assert (script["MASTER_ADDR"], script["MASTER_PORT"]) == ("c2", str(master_port(859)))
    assert "PET_RDZV_ENDPOINT" not in script
    torchrun = spares.round_env({"PET_RDZV_ENDPOINT": "c1:15859"}, ["c3"], 859, 1)
    assert torchrun["PET_RDZV_ENDPOINT"] == f"c3:{master_port(859, 1)}" != f"c3:{master_port(859)}"


@pytest.mark.parametrize("line,found", [
    ("srun: error: c2: task 1: Killed", ("c2", "Killed")),
    ("srun: error: c1: tasks 0-1: Exited with exit code 1", ("c1", "Exited with exit code 1")),
    ("srun: error: p5-st-p5-1: tasks 0,3: Terminated\n", ("p5-st-p5-1", "Terminated")),
    ("srun: error: Node failure on c2", None),
    ("1: srun: error: c2: task 1: Killed", None),  # a rank's own output (labelled by srun --label)
    ("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.", None),
])
def test_srun_lines_naming_a_failed_task(line, found):
    assert spares.failed_task(line) == found


def beat(rank: int, node: str, written: float, interval: float = 1.0) -> Beat:
    return Beat(rank, node, 100 + rank, 5, written, written, interval)


def test_a_node_whose_heartbeats_stopped_is_silent_and_old_rounds_do_not_count():
    now = 1000.0
    beats = [beat(0, "c2", now - 3.5), beat(1, "c2", now - 3.2), beat(2, "c3", now - 0.5),
             beat(3, "c9", 500.0)]  # rank 3's file is from before this round started
    assert spares.silent_nodes(beats, since=900.0, now=now) == (["c2"], [0, 1])
    assert spares.silent_nodes(beats, since=900.0, now=now - 1) == ([], [])  # 2.5 s: under 3 intervals


def spec_with(*sets: str, nodes: int = 1):
    return build_job_spec(load_recipe("resnet50", profile="smoke", overrides=sets), CPU, nodes, run_dir="/runs/r")


def test_a_job_with_spares_holds_them_keeps_its_allocation_and_runs_the_supervisor(tmp_path):
    spec = spec_with("resources.spares=1", "resources.hang_timeout_s=60")
    assert spec.nodes == 1 and spec.spares == 1 and spec.world_size == 2
    directives = sbatch_directives(spec)
    assert "--nodes=2" in directives and "--no-kill" in directives and "--requeue" in directives
    script = render_script(spec)
    (tmp_path / "job.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    [line] = [l for l in script.splitlines() if "-m toolkit.job.spares" in l]
    assert ("--nodes 1 --spares 1 --run-dir /runs/r --heartbeat-dir /runs/r/heartbeats --hang-timeout 60 -- srun "
            "--label --export=ALL --nodes=1 --ntasks=2 --ntasks-per-node=2") in line
    # The supervisor watches for hangs and ends the step; rank 0's watchdog would end the whole job.
    assert "HPC_HANG_TIMEOUT" not in spec.program.script and "HPC_HEARTBEAT_DIR" in spec.program.script


def test_a_job_without_spares_is_unchanged():
    spec = spec_with("resources.hang_timeout_s=60")
    script = render_script(spec)
    assert "--no-kill" not in script and "toolkit.job.spares" not in script and "--ntasks=" not in script
    assert "HPC_HANG_TIMEOUT=60" in spec.program.script


def test_spares_count_against_the_queue():
    with pytest.raises(HpcError, match="2 nodes and 1 spare.*at most 2") as err:
        spec_with("resources.spares=1", nodes=2)
    assert "--nodes 1..1" in err.value.fix


@pytest.mark.parametrize("recipe,sets,why", [
    ("nccl-tests", ["resources.spares=1"], "benchmark"),
    ("resnet50", ["resources.spares=-1"], "resources.spares: must be at least 0, got -1"),
])
def test_spares_on_a_job_that_cannot_restart_are_refused(recipe, sets, why):
    with pytest.raises(HpcError, match=why):
        load_recipe(recipe, overrides=sets)


def test_spares_go_to_sbatch_and_nowhere_else(monkeypatch):
    monkeypatch.setattr("toolkit.slurm.commands.slurm_installed", lambda: True)
    assert choose_executor(None, spares=1)[0].value == "sbatch"
    assert choose_executor("sbatch", spares=1) == (choose_executor(None, spares=1)[0], None)
    with pytest.raises(HpcError, match="--spares 1"):
        choose_executor("slurm", spares=1)
    monkeypatch.setattr("toolkit.slurm.commands.slurm_installed", lambda: False)
    with pytest.raises(HpcError, match="no Slurm is installed here"):
        choose_executor(None, spares=1)


def test_restarts_are_told_in_words():
    lines = _restart_lines([
        {"time": 0, "round": 1, "nodes": ["c2"], "why": "c2: a probe step failed: ...", "trigger": "heartbeats "
         "silent: ranks 0-1 on c2", "last_step": 12, "drained": ["c2"], "not_drained": {}, "next_nodes": ["c1"]},
        {"time": 60, "round": 2, "gave_up": True, "why": "all 1 spare(s) used", "requeued": True}])
    assert lines[0] == ("  restart 1: at 00:00:00 UTC, c2 left out, drained (heartbeats silent: ranks 0-1 on c2); "
                        "last step 12; next on c1")
    assert lines[-1] == "  gave up at 00:01:00 UTC: all 1 spare(s) used; requeued"
