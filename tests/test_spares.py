"""Hot spares without a cluster (toolkit.node.spares and what plans a job with spares): which nodes train, each
round's srun and rendezvous, the failures it reads from srun and the heartbeats, the rendered script, and the
refusals. The real thing on the local Slurm: tests/test_spares_slurm.py."""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import signal
import subprocess

import pytest

from tests.jobhelpers import CPU
from toolkit.cli.jobs import _restart_lines
from toolkit.errors import HpcError
from toolkit.node import spares
from toolkit.job.rank import master_port
from toolkit.job import staging
from toolkit.slurm.render import render_script, sbatch_directives
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.slurm.executors import choose_executor
from toolkit.node.heartbeat import Beat


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
    ("srun: error: Node failure on c2", ("c2", "Node failure")),  # at SlurmdTimeout; srun then exits 0
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


class Immediate(concurrent.futures.Executor):
    """Runs what is submitted at once: a Watch's probes, answered before its next check."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


class Slurm:
    """Stand-ins for the probe steps (no Slurm here): nodes in `dead` have no slurmd; every call is logged."""

    def __init__(self, *dead: str) -> None:
        self.dead, self.calls = set(dead), []

    def sweep(self, nodes, job_id):
        self.calls.append(("sweep", tuple(nodes)))
        return "a probe step failed: Communication connection failure" if self.dead & set(nodes) else None

    def probe(self, nodes, job_id):
        self.calls.append(("probe", tuple(nodes)))
        return {n: ("a probe step failed: Communication connection failure" if n in self.dead else None)
                for n in nodes}


def watch(slurm: Slurm, started: float = 1000.0, **kwargs) -> spares.Watch:
    return spares.Watch(["c2", "c3"], "77", started, Immediate(), sweep_fn=slurm.sweep, probe_fn=slurm.probe,
                        **kwargs)


def test_a_lost_node_under_a_workload_without_heartbeats_is_found_by_the_periodic_probe():
    slurm = Slurm("c3")
    w = watch(slurm, probe_every=10)
    assert w.check([], 1005.0) is None and slurm.calls == []  # not yet a period since the round started
    assert w.check([], 1010.0) is None and slurm.calls == [("sweep", ("c2", "c3"))]  # one step over all nodes
    found = w.check([], 1010.5)  # it failed: one probe per node names the lost one
    assert slurm.calls[-1] == ("probe", ("c2", "c3"))
    assert found is not None and found.lost and found.suspects == ["c3"] and found.trigger.startswith("probe: c3")
    assert "Communication connection failure" in found.why["c3"]


def test_healthy_nodes_are_probed_once_a_period_with_one_step():
    slurm = Slurm()
    w = watch(slurm, probe_every=10)
    for now in range(1000, 1041):
        assert w.check([beat(0, "c2", now - 0.5), beat(1, "c3", now - 0.5)], float(now)) is None
    assert slurm.calls == [("sweep", ("c2", "c3"))] * 4  # at 1010, 1020, 1030, 1040


@pytest.mark.parametrize("environ,argv,period", [({}, [], spares.PROBE_EVERY_S),
                                                ({spares.PROBE_EVERY_VAR: "2"}, [], 2.0),
                                                ({spares.PROBE_EVERY_VAR: "2"}, ["--probe-every", "5"], 5.0)])
def test_the_probe_period_comes_from_the_job_environment_unless_given(monkeypatch, environ, argv, period):
    monkeypatch.delenv(spares.PROBE_EVERY_VAR, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(spares, "allocation", lambda: ("7", ["c1", "c2"], "c1"))
    made = {}

    class Supervisor:
        def __init__(self, *args):
            made["probe_every"] = args[9]  # Supervisor(srun, nodes, spares, run_dir, beats, hang, job, nodes, host,
            #                                probe_every, silence_bound, stop)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(spares, "Supervisor", Supervisor)
    assert spares.main(["--nodes", "1", "--spares", "1", "--run-dir", "/tmp/run", *argv, "--", "srun", "true"]) == 0
    assert made["probe_every"] == period


def test_silent_heartbeats_drop_a_node_only_on_evidence():
    """Silence alone (a save holding the GIL looks the same) is probed first: a node whose probe fails is lost at
    once; one that answers stays until the silence outlasts the bound."""
    now = 1010.0
    silent_c2 = [beat(0, "c2", now - 3.5), beat(1, "c3", now - 0.2)]
    gone = watch(Slurm("c2"), probe_every=60).check(silent_c2, now)
    assert gone is not None and gone.lost and gone.suspects == ["c2"] and "probe failed" in gone.why["c2"]
    assert gone.trigger == "heartbeats silent: rank 0 on c2"

    slurm = Slurm()
    w = watch(slurm, probe_every=60, silence_bound=30)
    assert w.check(silent_c2, now) is None and w.check(silent_c2, now + 1) is None  # it answers: kept
    assert slurm.calls == [("probe", ("c2",))]  # probed once for this silence
    assert w.check(silent_c2, now - 3.5 + 30) is None  # 30 s of silence: not beyond the bound
    late = w.check(silent_c2, now - 3.5 + 31)
    assert late is not None and late.suspects == ["c2"] and "no heartbeat for 31 s (bound 30 s)" in late.why["c2"]


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
    [line] = [text for text in script.splitlines() if " spares --nodes" in text]
    assert line.startswith(f'"$HPC_PYTHON" -S /runs/r/.hpc/{staging.bundle_name()} spares ')  # the node's python3
    assert ("--nodes 1 --spares 1 --run-dir /runs/r --heartbeat-dir /runs/r/heartbeats --hang-timeout 60 "
            f"--stop {shlex.quote(spec.stop.to_json())} -- srun "
            "--label --export=ALL --nodes=1 --ntasks=2 --ntasks-per-node=2") in line
    # The supervisor watches for hangs and ends the step; rank 0's watchdog would end the whole job.
    assert "HPC_HANG_TIMEOUT" not in spec.program.script and "HPC_HEARTBEAT_DIR" in spec.program.script


def test_a_job_without_spares_is_unchanged():
    spec = spec_with("resources.hang_timeout_s=60")
    script = render_script(spec)
    assert "--no-kill" not in script and " spares --nodes" not in script and "--ntasks=" not in script
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
        {"kind": "restart", "time": 0, "round": 1, "nodes": ["c2"], "why": "c2: its ranks' heartbeats stopped",
         "trigger": "heartbeats silent: ranks 0-1 on c2", "last_step": 12, "next_nodes": ["c1"]},
        {"kind": "probe", "time": 11, "round": 1, "nodes": ["c2"], "why": "c2: a probe step failed: ...",
         "drained": ["c2"], "not_drained": {}},
        {"kind": "gave_up", "time": 60, "round": 2, "why": "all 1 spare(s) used", "requeued": True}])
    assert lines == [
        "  restart 1: at 00:00:00 UTC, c2 left out (heartbeats silent: ranks 0-1 on c2); last step 12; next on c1",
        "    why: c2: its ranks' heartbeats stopped",
        "  probe (restart 1): c2 failed it; drained c2",
        "    why: c2: a probe step failed: ...",
        "  gave up at 00:01:00 UTC: all 1 spare(s) used; requeued"]


# The supervisor's decisions, round after round, with stand-ins for Slurm's commands (no Slurm here): a stub srun
# that runs a round's command on the listed node only where STUB_FAILING does not name it (else it prints srun's
# own failure line and exits 1), answers probe steps (`... true`) except on STUB_DEAD nodes, and logs its calls;
# a stub scontrol that logs drains and requeues.
STUB_SRUN = r"""#!/usr/bin/env python3
import os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write("srun " + " ".join(args) + "\n")
node = next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist="))
if args[-1] == "true":  # a probe step
    if node in os.environ.get("STUB_DEAD", "").split(","):
        sys.stderr.write(f"srun: error: Task launch for StepId=1.9 failed on node {node}: "
                         "Communication connection failure\n")
        sys.exit(1)
    sys.exit(0)
if node in os.environ.get("STUB_FAILING", "").split(","):
    sys.stderr.write(f"srun: error: {node}: task 0: Exited with exit code 1\n")
    sys.exit(1)
if os.environ.get("STUB_STOPPABLE"):  # a workload that saves and exits 75 on the stop signal srun passes on
    import signal
    def stop(signum, frame):
        with open(os.environ["STUB_LOG"], "a") as log:
            log.write(f"srun got signal {signum}\n")
        sys.stderr.write(f"srun: error: {node}: task 0: Exited with exit code 75\n")
        sys.exit(75)
    signal.signal(signal.SIGUSR2, stop)
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write("round running\n")
    signal.pause()
sys.exit(subprocess.call(args[args.index("bash"):]))
"""
STUB_SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >> "$STUB_LOG"
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\n' c1 c2; fi
"""


@pytest.fixture
def stub_slurm(tmp_path, monkeypatch):
    from tests.stubs import write_executable

    write_executable(tmp_path / "bin" / "srun", STUB_SRUN)
    write_executable(tmp_path / "bin" / "scontrol", STUB_SCONTROL)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "calls.log"))
    return tmp_path


def supervise(tmp_path, nodes: int, spares_count: int, allocated: list[str]) -> tuple[int, list[dict], list[str]]:
    from toolkit.rundir import RunDir

    srun = ["srun", "--nodes=1", "bash", "-c", 'echo "ran on $MASTER_ADDR"']
    supervisor = spares.Supervisor(srun, nodes, spares_count, tmp_path, tmp_path / "heartbeats", None, "77",
                                   allocated, allocated[0])
    status = supervisor.run()
    return status, RunDir(tmp_path).restarts(), (tmp_path / "calls.log").read_text().splitlines()


def test_a_rank_failing_on_a_node_moves_the_job_to_the_spare(stub_slurm, monkeypatch):
    monkeypatch.setenv("STUB_FAILING", "c2")
    status, records, calls = supervise(stub_slurm, 1, 1, ["c1", "c2"])
    assert status == 0
    [restart] = records
    assert (restart["kind"], restart["nodes"], restart["next_nodes"], restart["trigger"]) == (
        "restart", ["c2"], ["c1"], "srun: c2: Exited with exit code 1")
    rounds = [c for c in calls if "bash" in c]
    assert rounds[0].startswith("srun --nodelist=c2 --nodes=1") and rounds[1].startswith("srun --nodelist=c1 --overlap")
    assert not [c for c in calls if c.startswith("scontrol")]  # c2 answered its probe: not drained


def test_a_node_failing_the_pre_flight_probe_never_gets_ranks_and_is_drained(stub_slurm, monkeypatch):
    monkeypatch.setenv("STUB_DEAD", "c3")
    status, records, calls = supervise(stub_slurm, 1, 2, ["c1", "c2", "c3"])
    assert status == 0
    assert [(r["kind"], r["nodes"]) for r in records] == [("pre-flight", ["c3"]), ("probe", ["c3"])]
    assert records[1]["drained"] == ["c3"]
    assert "scontrol update NodeName=c3 State=DRAIN Reason=hpc: job 77: a probe step failed: srun: error: Task " \
           "launch for StepId=1.9 failed on node c3: Communication connection failure" in calls
    assert [c.split()[1] for c in calls if "bash" in c] == ["--nodelist=c2"]


def test_out_of_spares_a_rank_failure_ends_the_job_and_a_lost_node_requeues_it(stub_slurm, monkeypatch):
    monkeypatch.setenv("STUB_FAILING", "c1,c2")
    status, records, calls = supervise(stub_slurm, 1, 1, ["c1", "c2"])
    assert status == 1 and [r["kind"] for r in records] == ["restart", "gave_up"] and not records[-1]["requeued"]
    assert records[-1]["why"] == "all 1 spare(s) used; the last round ended on srun: c1: Exited with exit code 1"
    assert not [c for c in calls if "requeue" in c]

    (stub_slurm / "restarts.jsonl").unlink()
    monkeypatch.setenv("STUB_DEAD", "c2")
    status, records, calls = supervise(stub_slurm, 1, 1, ["c1", "c2"])
    # c2 fails the pre-flight (drained), c1's rank fails: no healthy node left, and a node was lost: requeue.
    assert [r["kind"] for r in records] == ["pre-flight", "probe", "restart", "gave_up"]
    assert status == 0 and records[-1]["requeued"]
    assert calls[-1] == "scontrol requeue 77"


def test_the_stop_signal_reaches_the_round_and_nothing_restarts(stub_slurm, monkeypatch):
    """As the rendered script runs it (the staged bundle's `spares` under the node's own python3, with nothing of
    ours installed; its trap sending SIGUSR2): the signal goes on to srun, the round's exit 75 (saved and stopped)
    is no failure, and the supervisor exits with it."""
    import time

    from tests.test_node_contract import SYSTEM_PYTHON, unpack
    from toolkit.rundir import RunDir

    bundle = unpack(stub_slurm, stub_slurm / "run")
    monkeypatch.setenv("STUB_STOPPABLE", "1")
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_JOB_NODELIST="c[1-2]", SLURMD_NODENAME="c1")
    proc = subprocess.Popen([SYSTEM_PYTHON, "-I", str(bundle), "spares", "--nodes", "1", "--spares", "1",
                             "--run-dir", str(stub_slurm), "--", "srun", "--nodes=1", "bash", "-c", "exit 0"],
                            env=env, stderr=subprocess.PIPE, text=True, cwd="/")
    log = stub_slurm / "calls.log"
    deadline = time.monotonic() + 30
    while "round running" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(30) == 75, proc.stderr.read()
    calls = log.read_text().splitlines()
    assert f"srun got signal {int(signal.SIGUSR2)}" in calls
    assert [c.split()[1] for c in calls if "bash" in c] == ["--nodelist=c2"]  # one round, no restart
    assert RunDir(stub_slurm).restarts() == [] and not [c for c in calls if "requeue" in c or "DRAIN" in c]
