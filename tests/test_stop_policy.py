"""One stop policy (toolkit.node.stop.StopPolicy), every path made from it: for each job kind (requeue x saves on
the signal) the rendered script (its #SBATCH lines, and its trap run with stub srun/scontrol), submitit (its
parameters and batch script, and RankTask's checkpoint protocol run against a real workload), the spares
supervisor (the policy the script passes it, the signals it passes on, the exit it counts as a stop) and the
workload side are observed, and each must be what the one policy says. A path that decides on its own and drifts
fails here."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from tests.jobhelpers import CPU, submitits_stop_signal
from tests.stubs import JOB_ID, PASSING_PREFLIGHT, write_executable
from toolkit.job.spec import TORCHRUN, JobSpec
from toolkit.slurm.materialize import build_job_spec
from toolkit.node import spares
from toolkit.node.stop import StopPolicy, signal_number
from toolkit.recipes.load import load_recipe
from toolkit.slurm.executors import slurm_parameters, submitit_batch_script
from toolkit.slurm.render import render_script

POLICIES = [StopPolicy(requeue=requeue, saves_on_signal=saves, before_s=300)
            for requeue, saves in itertools.product((True, False), repeat=2)]
# Signals the supervisor is watched for: the stop signals and others it must leave alone.
CANDIDATE_SIGNALS = ("HUP", "INT", "USR1", "USR2", "TERM")


def test_the_policy_is_the_one_the_paths_carried_out_before_it_existed():
    """The table (toolkit/node/stop.py's docstring) as the four copies decided it before: the job kinds are
    trainers (save, then requeue), fairseq and the like (requeue at once) and benchmarks (never requeued)."""
    table = {(p.requeue, p.saves_on_signal): (p.requeue_option, p.batch_signal, p.step_signal, p.trap_action,
                                              p.requeue_after_step, p.checkpoint_requeues, p.checkpoint_ends_workload,
                                              p.workload_ignores_signal) for p in POLICIES}
    assert table == {
        (True, True): ("requeue", "B:USR2@300", "USR2@300", "forward", True, True, False, False),
        (True, False): ("requeue", "B:USR2@300", "USR2@300", "requeue", False, True, True, True),
        (False, True): ("no-requeue", None, "USR2@300", "none", False, False, False, True),
        (False, False): ("no-requeue", None, "USR2@300", "none", False, False, False, True),
    }
    assert all(p.forwarded_signals == ("USR2", "TERM") and p.stopped(75) and not p.stopped(1) for p in POLICIES)


def test_a_recipes_defaults_are_the_policys_defaults():
    from toolkit.recipes.schema import Launcher, Resources

    assert StopPolicy() == StopPolicy(requeue=Resources.model_fields["requeue"].default,
                                      saves_on_signal=Launcher.model_fields["stops_on_signal"].default,
                                      before_s=Resources.model_fields["signal_before_s"].default)


def test_the_policy_reaches_the_node_as_json_and_nothing_else_is_taken():
    for policy in POLICIES:
        assert StopPolicy.from_json(policy.to_json()) == policy
    for wrong in ('{"requeue": true}', '{"before_s": 1, "requeue": 1, "saves_on_signal": true}',
                  '{"before_s": "1", "requeue": true, "saves_on_signal": true}', "[]",
                  '{"before_s": 1, "requeue": true, "saves_on_signal": true, "signal": "USR1"}'):
        with pytest.raises(ValueError):
            StopPolicy.from_json(wrong)


# -- what each path does, observed -------------------------------------------------------------------------------


def job(tmp_path: Path, policy: StopPolicy, spares_count: int = 0) -> JobSpec:
    """A fairseq job on a CPU queue with the policy's settings (the spec's own fields, as a recipe sets them)."""
    root = tmp_path / "root"
    write_executable(root / "envs" / "train" / "bin" / "activate", "# stub venv\n")
    spec = build_job_spec(load_recipe(REPO / "recipes" / "transformer.yaml", overrides=[f"dirs.root={root}"]), CPU, 2,
                          run_dir=str(tmp_path / "run"))
    spec = dataclasses.replace(spec, requeue=policy.requeue, stops_on_signal=policy.saves_on_signal,
                               signal_before_s=policy.before_s, spares=spares_count)
    assert spec.stop == policy
    return spec


def sbatch_options(script: str) -> dict[str, str | bool]:
    found = (re.match(r"#SBATCH --([a-z-]+)(?:=(.*))?$", line) for line in script.splitlines())
    return {m[1]: True if m[2] is None else m[2] for m in found if m}


def requeue_option(options: dict[str, str | bool]) -> str:
    [option] = [name for name in ("requeue", "no-requeue") if name in options]
    return option


# A step that saves and exits 75 on the stop signal (logging it), else runs 2 s; scontrol logs what it is asked.
STEP = r"""#!/bin/bash
if [[ $1 == --version ]]; then echo "slurm 22.05.8"; exit 0; fi  # asked by the batch shell (render.gate_lines)
echo "srun started" >> "$STUB_LOG"
trap 'echo "srun got USR2" >> "$STUB_LOG"; exit 75' USR2
for i in $(seq 20); do sleep 0.1; done
echo "srun ended" >> "$STUB_LOG"
"""
SCONTROL = r"""#!/bin/bash
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\n' node-a node-b; exit 0; fi
echo "scontrol $*" >> "$STUB_LOG"
"""


def run_the_trap(script: str, workdir: Path) -> tuple[str, bool]:
    """Run the rendered script as its batch shell, send it the stop signal while the step runs, and tell what its
    trap did: ("forward" | "requeue" | "none", whether it requeued after the step)."""
    bin_dir = workdir / "bin"
    write_executable(bin_dir / "srun", STEP)
    write_executable(bin_dir / "scontrol", SCONTROL)
    write_executable(bin_dir / "python3", PASSING_PREFLIGHT)  # the pre-flight's python (tested elsewhere)
    log = workdir / "events.log"
    (workdir / "job.sbatch").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(workdir), "STUB_LOG": str(log),
           "SLURM_JOB_ID": str(JOB_ID), "SLURM_JOB_NODELIST": "node-[a-b]"}
    proc = subprocess.Popen(["bash", str(workdir / "job.sbatch")], cwd=workdir, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while "srun started" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
        time.sleep(0.2)  # the batch shell has noted srun's pid
        proc.send_signal(signal.SIGUSR2)
        status = proc.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a step left running by a batch shell the signal ended
    events = log.read_text().splitlines()
    # where the step ended (else it still ran when the batch shell ended)
    step_end = next((i for i, e in enumerate(events) if e in ("srun got USR2", "srun ended")), len(events))
    requeues = [i for i, e in enumerate(events) if e == f"scontrol requeue {JOB_ID}"]
    action = "forward" if "srun got USR2" in events else "requeue" if any(i < step_end for i in requeues) else "none"
    if action != "none":
        assert status == 0, proc.stderr and proc.stderr.read()
    return action, any(i > step_end for i in requeues)


# A workload that saves and exits 75 on SIGUSR2 unless it was started with SIGUSR2 ignored; else runs 2 s.
WORKLOAD = ("import signal, sys, time; "
            "signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN or "
            "signal.signal(signal.SIGUSR2, lambda *_: (time.sleep(0.2), sys.exit(75))); time.sleep(2)")


def run_submitits_checkpoint(spec: JobSpec, tmp_path: Path, monkeypatch) -> tuple[bool, str]:
    """Rank 0 of the job's submitit task when Slurm's stop signal comes: submitit's handler calls checkpoint()
    (stood in for here as in tests/test_plan.py) and Slurm signals the workload too. Returns (checkpoint()
    requeued, what became of the workload: "saved" | "ended" | "ran on")."""
    from toolkit import __version__
    from toolkit.job.rank import rank_program
    from toolkit.slurm import rank_task

    program = rank_program((sys.executable, "-c", WORKLOAD), 1, 1, contract=True)
    task = dataclasses.replace(rank_task.RankTask.for_spec(spec, tmp_path, __version__), argv=program.argv)
    for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):
        monkeypatch.setenv(name, "0")
    with submitits_stop_signal(task) as answers:
        try:
            outcome = {"stopped": "saved", "completed": "ran on"}[task()]
        except rank_task.RankFailed:
            outcome = "ended"
    [answer] = answers
    if answer is not None:
        assert answer.function is task
    return answer is not None, outcome


def supervisor_forwarding(policy: StopPolicy, tmp_path: Path) -> dict[str, int | None]:
    """Run the spares supervisor with the policy, its rounds replaced by a child standing for the round's srun:
    each candidate signal for which the supervisor installed its forwarding is sent to it, and the child's exit
    (the signal it got, else None) noted."""
    supervisor = spares.Supervisor(["srun"], 1, 1, tmp_path, tmp_path / "heartbeats", None, "77", ["c1", "c2"], "c1",
                                   stop=policy)
    got: dict[str, int | None] = {}
    child_code = ("import signal, sys, time; [signal.signal(s, lambda n, f: sys.exit(n)) for s in (%s)]; "
                  "print('ready', flush=True); time.sleep(10)"
                  % ", ".join(f"signal.SIG{n}" for n in CANDIDATE_SIGNALS))

    def rounds() -> int:
        for name in CANDIDATE_SIGNALS:
            if signal.getsignal(signal_number(name)) != supervisor._forward:
                got[name] = None
                continue
            child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            supervisor.current = spares.Round(0, ["c1"], time.time(), proc=child)
            os.kill(os.getpid(), signal_number(name))  # the batch shell's trap, or Slurm
            got[name] = child.wait(10)
        return 0

    previous = {name: signal.getsignal(signal_number(name)) for name in CANDIDATE_SIGNALS}
    supervisor._rounds = rounds  # type: ignore[method-assign]
    try:
        assert supervisor.run() == 0
    finally:
        for name, handler in previous.items():
            signal.signal(signal_number(name), handler)
    return got


def supervisor_counts_as_stopped(policy: StopPolicy, tmp_path: Path) -> set[int]:
    """The rank exits that the supervisor reads from srun without calling the round failed."""
    stopped = set()
    for code in (1, 2, 75, 124, 137):
        supervisor = spares.Supervisor(["srun"], 1, 1, tmp_path, tmp_path, None, "77", ["c1", "c2"], "c1", stop=policy)
        line = f"srun: error: c1: task 0: Exited with exit code {code}\n"
        current = spares.Round(0, ["c1"], time.time(), proc=SimpleNamespace(stderr=iter([line])))  # type: ignore
        supervisor._read_stderr(current)
        if current.failure is None:
            stopped.add(code)
    return stopped


def spares_stop_argument(script: str) -> StopPolicy:
    """The policy the rendered script passes to the spares supervisor (`--stop`), as the node reads it."""
    [line] = [line for line in script.splitlines() if " spares " in line and "srun" in line]
    words = shlex.split(line)
    return StopPolicy.from_json(words[words.index("--stop") + 1])


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"requeue={p.requeue},saves={p.saves_on_signal}")
def test_every_path_does_what_the_one_policy_says(tmp_path, monkeypatch, policy):
    expected = {
        "script: requeue option": policy.requeue_option,
        "script: signal": policy.batch_signal,
        "script: trap": policy.trap_action,
        "script: requeues after the step": policy.requeue_after_step,
        "script: the policy passed to the spares supervisor": policy,
        "submitit: requeue option": policy.requeue_option,
        "submitit: signal": policy.step_signal,
        "submitit: signal of its handler": policy.signal,
        "submitit: checkpoint() requeues": policy.checkpoint_requeues,
        "submitit: the workload": ("ended" if policy.checkpoint_ends_workload else
                                   "ran on" if policy.workload_ignores_signal else "saved"),
        "supervisor: signals passed on to srun": {name: int(signal_number(name)) if name in policy.forwarded_signals
                                                  else None for name in CANDIDATE_SIGNALS},
        "supervisor: rank exits counted as a stop": {policy.exit_stopped},
        "workload: the signals it stops on": [signal_number(name) for name in policy.forwarded_signals],
        "torchrun: ignores": f"signal.signal(signal.SIG{policy.signal}, signal.SIG_IGN)",
    }
    from submitit.slurm.slurm import SlurmJobEnvironment

    from toolkit.workloads.stopping import STOP_SIGNALS as WORKLOAD_STOP_SIGNALS

    spec = job(tmp_path, policy)
    script = render_script(spec)
    options = sbatch_options(script)
    trap, requeued_after = run_the_trap(script, tmp_path)
    submitit_options = sbatch_options(submitit_batch_script(spec, tmp_path / "submitit"))
    assert slurm_parameters(spec)["additional_parameters"]["signal"] == submitit_options["signal"]
    checkpoint_requeues, workload = run_submitits_checkpoint(spec, tmp_path, monkeypatch)
    observed = {
        "script: requeue option": requeue_option(options),
        "script: signal": options.get("signal"),
        "script: trap": trap,
        "script: requeues after the step": requeued_after,
        "script: the policy passed to the spares supervisor": spares_stop_argument(
            render_script(job(tmp_path, policy, spares_count=1))),
        "submitit: requeue option": requeue_option(submitit_options),
        "submitit: signal": submitit_options["signal"],
        "submitit: signal of its handler": SlurmJobEnvironment.USR_SIG,
        "submitit: checkpoint() requeues": checkpoint_requeues,
        "submitit: the workload": workload,
        "supervisor: signals passed on to srun": supervisor_forwarding(policy, tmp_path),
        "supervisor: rank exits counted as a stop": supervisor_counts_as_stopped(policy, tmp_path),
        "workload: the signals it stops on": list(WORKLOAD_STOP_SIGNALS),
        "torchrun: ignores": next(part.strip() for part in TORCHRUN.split(";") if "SIG_IGN" in part),
    }
    assert observed == expected


# -- a time limit the stop signal fits in --------------------------------------------------------------------------

@pytest.mark.parametrize(("time", "requeue", "before_s", "refused"), [
    ("00:01:00", True, 120, True),  # a probe found it: told to stop at its start, it requeued itself forever
    ("00:03:00", True, 120, True),  # 180 s: Slurm may send the signal 60 s early (sbatch(1), --signal), so at the start
    ("00:04:00", True, 120, False),
    ("00:01:00", False, 120, False),  # no requeue: no signal asked for
    ("00:01:00", True, 10, True),  # 60 s <= 10 + 60
    ("00:01:30", True, 20, False),
])
def test_a_requeueing_job_needs_a_limit_longer_than_its_stop_signal(tmp_path, time, requeue, before_s, refused):
    from toolkit.errors import HpcError

    root = tmp_path / "root"
    write_executable(root / "envs" / "train" / "bin" / "activate", "# stub venv\n")
    recipe = load_recipe(REPO / "recipes" / "transformer.yaml", overrides=[
        f"dirs.root={root}", f"resources.time={time}", f"resources.requeue={str(requeue).lower()}",
        f"resources.signal_before_s={before_s}"])
    if not refused:
        assert build_job_spec(recipe, CPU, 2, run_dir=str(tmp_path / "run")).time_limit == time
        return
    with pytest.raises(HpcError, match="too short for the stop signal") as found:
        build_job_spec(recipe, CPU, 2, run_dir=str(tmp_path / "run"))
    assert "requeue itself again and again" in str(found.value) and "resources.requeue=false" in found.value.fix
