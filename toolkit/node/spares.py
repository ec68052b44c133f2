"""Hot spares: a job holds N + K nodes, runs its ranks on N, and when a node or a rank is lost runs them again on N
healthy nodes of the same allocation, resuming from the last checkpoint, instead of ending and waiting in the queue.

    "$HPC_PYTHON" BUNDLE spares --nodes N --spares K --run-dir DIR [--hang-timeout S] [--stop POLICY]
        -- srun OPTIONS... PROGRAM...

The rendered script runs this in place of its srun line (the batch shell's stop trap signals it as it would srun):
the job's stop policy (toolkit.node.stop, `--stop` its JSON) says which signals it passes on to the round's srun
and which rank exit says "saved and stopped", no failure; a stop ends the rounds, nothing restarts.
It rests on Slurm's own rules (sbatch(1), srun(1)):

  - `sbatch --no-kill` keeps the allocation when a node fails; the job "assumes all responsibilities for
    fault-tolerance" and later steps run on the nodes left.
  - A node whose slurmd is gone is not known as lost until SlurmdTimeout (ParallelCluster: 180 s); meanwhile srun
    waits for its tasks, and the step keeps its CPUs on every node. So a lost node is found here, not by Slurm:
      * srun's own line for a rank that died (`srun: error: c2: task 1: Killed`; the same on 22.05 and 26.05);
        a probe step on each of the round's nodes (`srun --overlap -w NODE true`; a node without a slurmd fails
        it after MessageTimeout) then tells a lost node (drained) from one whose rank failed (only left out);
      * every workload, beating or not: one probe step over all of the round's nodes every --probe-every
        seconds (one step, whatever the node count: slurmctld creates one step per period, not one per node);
        where it fails, the per-node probe names the nodes without a slurmd, which are lost;
      * heartbeats (toolkit.node.heartbeat) that stopped while srun heard nothing of those ranks: their nodes are
        probed at once, and are lost when the probe fails. Silence alone is no evidence (a process holding the
        GIL through a checkpoint's save writes no heartbeat either): a node whose ranks are silent but which
        answers its probe is dropped only once the silence outlasts --silence-bound (SILENCE_BOUND_S);
      * with --hang-timeout, ranks that made no step for that long (the supervisor is then the watchdog, and
        ends the step, not the job).
    The failed step is ended (srun's abort, then SIGKILL: a lost node's part never ends) and the next one started
    with `--overlap`: the old step holds its CPUs until the lost node is declared down (measured on 22.05:
    without --overlap the next step waits).
  - Before the first round the same probe is the pre-flight: a node that fails it never gets ranks.

Which nodes train: the first N healthy ones, the batch host last. It runs this supervisor, so its loss ends the
job whatever happens (Slurm requeues it on node failure, as today); kept out of training while a spare is left, it
is also kept out of what breaks training nodes. Drains carry a reason and need root, SlurmUser or an operator;
where refused, the record says so. Each restart, probe and giving up is a line of <run dir>/restarts.jsonl
(records.RESTARTS: when, which nodes, why, the last step the heartbeats saw). After K restarts, or with fewer than
N healthy nodes, a job that lost a node is requeued as Slurm would (`scontrol requeue`); one whose rank failed on
a healthy node ends with that rank's status, as today.

Each round gets a fresh rendezvous: the first chosen node and toolkit.node.rank.master_port(job, round), exported
to srun as MASTER_ADDR/MASTER_PORT (and torchrun's PET_RDZV_ENDPOINT), so the rank contract is the same in every
round. Node-side code (toolkit.node's contract): the batch shell runs it from the staged bundle with the node's
own python3 (toolkit.job.staging.node_command).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from . import heartbeat, ledger, records
from .rank import master_port
from .stop import StopPolicy, signal_number

# A probe step (`true`) ends within about a second on a node whose slurmd answers (0.3-1 s here). On a node without
# one, srun 22.05 fails it after MessageTimeout (Slurm's default 10 s), but srun 20.11 under a 22.05 controller
# (the node lane) waits on: measured past 60 s. So a probe that has not ended in this time is itself evidence.
PROBE_TIMEOUT_S = 15
# The round's nodes are probed this often: a node lost under a workload that writes no heartbeats is found within
# PROBE_EVERY_S + 2 x PROBE_TIMEOUT_S (the step over all nodes fails, then the per-node probes name it), 40 s,
# instead of at SlurmdTimeout (ParallelCluster: 180 s).
PROBE_EVERY_S = 10.0
# The job's environment may set the period (`--env HPC_SPARES_PROBE_EVERY=S`), as HPC_HEARTBEAT_INTERVAL sets the
# heartbeats'; an explicit --probe-every wins. The test suite shortens it where its wait is what a test pays for.
PROBE_EVERY_VAR = "HPC_SPARES_PROBE_EVERY"
# Heartbeat silence on a node that answers its probe: its ranks' processes are held whole (the writer thread is
# a daemon thread, so only a process that holds the GIL or is stopped stops it). The longest such hold a healthy
# job makes is a checkpoint's save that pickles under the GIL: a 7B-parameter model's full training state (fp32
# weights and Adam's two moments, ~84 GB) written by one client at 100-200 MB/s takes 7-14 minutes. Past 15
# minutes of silence the ranks are taken for frozen; --silence-bound sets it for a job whose saves take longer.
SILENCE_BOUND_S = 900.0
END_STEP_GRACE_S = 5  # after srun is told to end the step, before it is killed
POLL_S = 0.5
# srun's line for a task that ended badly, as 22.05 and 26.05 print it: `srun: error: c2: task 1: Killed`,
# `srun: error: c1: tasks 0-1: Exited with exit code 1`.
TASK_FAILED = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-\[\]]+): (?P<what>.+)$")
# Once Slurm declares a node of the step down (SlurmdTimeout), srun says so and ends, with status 0 on 22.05.
NODE_FAILED = re.compile(r"^srun: error: (?P<what>Node failure) on (?P<node>\S+)$")
TASK_EXITED = re.compile(r"^Exited with exit code (?P<code>\d+)$")  # TASK_FAILED's `what` for a task's own exit
# Without --stop: a recipe's defaults (the signals passed on and the stopped exit are every policy's).
DEFAULT_STOP = StopPolicy()


@dataclasses.dataclass
class Failure:
    """Why a round ended early: what noticed it, and the nodes it points at (before probing). `lost`: the
    evidence says the nodes are gone (their probe failed, or their ranks' silence outlasted the bound), so the
    restart need not wait for another probe; `why` says so per node."""

    trigger: str
    suspects: list[str]
    lost: bool = False
    why: dict[str, str] = dataclasses.field(default_factory=dict)
    probed: dict[str, str] = dataclasses.field(default_factory=dict)  # the failed probes that found them lost


@dataclasses.dataclass
class Round:
    number: int
    nodes: list[str]
    started: float
    proc: subprocess.Popen | None = None
    failure: Failure | None = None


def ordered_nodes(allocated: Sequence[str], batch_host: str) -> list[str]:
    """The allocation's nodes in the order they take ranks: the batch host last."""
    return [n for n in allocated if n != batch_host] + [n for n in allocated if n == batch_host]


def round_env(environ: dict[str, str], chosen: Sequence[str], job_id: int, number: int) -> dict[str, str]:
    """The environment of a round's srun: a fresh rendezvous on its first node."""
    env = dict(environ, MASTER_ADDR=chosen[0], MASTER_PORT=str(master_port(job_id, number)))
    if "PET_RDZV_ENDPOINT" in env:  # torchrun (templates/setup.sh.j2)
        env["PET_RDZV_ENDPOINT"] = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return env


def round_argv(srun: Sequence[str], chosen: Sequence[str], number: int) -> list[str]:
    """The round's srun: on the chosen nodes; after a restart --overlap, since the lost step keeps its CPUs
    until Slurm declares the lost node down."""
    return [srun[0], f"--nodelist={','.join(chosen)}", *(["--overlap"] if number else []), *srun[1:]]


def failed_task(line: str) -> tuple[str, str] | None:
    """(node, what) of an srun line reporting a task that ended badly or a node that failed, else None."""
    found = TASK_FAILED.match(line.strip()) or NODE_FAILED.match(line.strip())
    return (found["node"], found["what"]) if found else None


def exit_code(what: str) -> int | None:
    """The exit status in failed_task()'s `what`, when the task exited by itself (not killed, not a lost node)."""
    found = TASK_EXITED.match(what)
    return int(found["code"]) if found else None


def silent_nodes(beats: Sequence[heartbeat.Beat], since: float, now: float) -> tuple[list[str], list[int]]:
    """Nodes and ranks whose heartbeat (written this round) stopped: the writer thread writes every interval
    whatever the training does, so a file older than SILENT_INTERVALS intervals means the process is gone or
    frozen."""
    silent = [b for b in beats if b.time >= since and now - b.time > heartbeat.SILENT_INTERVALS * b.interval]
    return sorted({b.node for b in silent}), [b.rank for b in silent]


def probe_step(nodes: Sequence[str], job_id: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """One probe step (`true` on each of `nodes`, inside the job): None when every node ran it, else why not."""
    argv = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            f"--nodelist={','.join(nodes)}", "--cpus-per-task=1", "--export=ALL", "true"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"a probe step did not end within {timeout:g} s"
    if res.returncode == 0:
        return None
    lines = [line for line in res.stderr.splitlines() if "error" in line.lower()] or res.stderr.splitlines()
    return f"a probe step failed: {lines[0].strip() if lines else f'exit {res.returncode}'}"


def sweep(nodes: Sequence[str], job_id: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """One probe step over all `nodes` at once: one step per period, whatever the node count."""
    return probe_step(nodes, job_id, timeout)


def probe(nodes: Sequence[str], job_id: str, timeout: float = PROBE_TIMEOUT_S) -> dict[str, str | None]:
    """One step per node, all at once: None for a node that ran it, else why it did not."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(zip(nodes, pool.map(lambda node: probe_step([node], job_id, timeout), nodes)))


class Watch:
    """A round's evidence about its nodes, besides srun's lines: the periodic probe of all its nodes, and the
    probe of nodes whose ranks' heartbeats stopped. check() says, poll after poll, whether a node is lost; it
    never decides on silence alone before silence_bound. The probes run in `pool`: check() never waits."""

    def __init__(self, nodes: Sequence[str], job_id: str, started: float, pool: concurrent.futures.Executor,
                 probe_every: float = PROBE_EVERY_S, silence_bound: float = SILENCE_BOUND_S,
                 sweep_fn=sweep, probe_fn=probe) -> None:
        self.nodes, self.job_id, self.started, self.pool = list(nodes), job_id, started, pool
        self.probe_every, self.silence_bound = probe_every, silence_bound
        self.sweep_fn, self.probe_fn = sweep_fn, probe_fn
        self.last_sweep = started
        self.sweeping: concurrent.futures.Future | None = None
        self.confirming: concurrent.futures.Future | None = None  # per node, after a failed sweep
        self.silence_probes: dict[str, concurrent.futures.Future] = {}  # node -> its probe, once its ranks went silent
        self.answered: set[str] = set()  # silent nodes whose probe passed: only the bound drops them

    def check(self, beats: Sequence[heartbeat.Beat], now: float) -> Failure | None:
        found = self._periodic(now)
        return found or self._silence(beats, now)

    def _periodic(self, now: float) -> Failure | None:
        if self.sweeping is not None and self.sweeping.done():
            failed = self.sweeping.result()
            self.sweeping = None
            if failed and self.confirming is None:  # which node: one probe step each
                say(f"the probe of {','.join(self.nodes)} failed ({failed}): probing each node")
                self.confirming = self.pool.submit(self.probe_fn, self.nodes, self.job_id)
        if self.confirming is not None and self.confirming.done():
            dead = {n: why for n, why in self.confirming.result().items() if why}
            self.confirming = None
            if dead:
                return Failure(f"probe: {','.join(sorted(dead))}: no slurmd answered", sorted(dead), lost=True,
                               why={n: f"its probe failed ({why})" for n, why in dead.items()}, probed=dead)
        if self.sweeping is None and self.confirming is None and now - self.last_sweep >= self.probe_every:
            self.last_sweep = now
            self.sweeping = self.pool.submit(self.sweep_fn, self.nodes, self.job_id)
        return None

    def _silence(self, beats: Sequence[heartbeat.Beat], now: float) -> Failure | None:
        nodes, ranks = silent_nodes(beats, self.started, now)
        for node in nodes:
            if node not in self.silence_probes:
                self.silence_probes[node] = self.pool.submit(self.probe_fn, [node], self.job_id)
        dead: dict[str, str] = {}
        probed: dict[str, str] = {}
        for node, probing in self.silence_probes.items():
            if node in nodes and probing.done() and node not in self.answered:
                why = probing.result().get(node)
                if why:
                    dead[node], probed[node] = f"its ranks' heartbeats stopped and its probe failed ({why})", why
                else:
                    self.answered.add(node)
                    say(f"{node}: its ranks' heartbeats stopped but it answers its probe: kept until "
                        f"{self.silence_bound:g} s of silence (a save holding the GIL looks the same)")
        for node in nodes:
            silence = now - max(b.time for b in beats if b.node == node and b.time >= self.started)
            if node not in dead and silence > self.silence_bound:
                dead[node] = f"its ranks wrote no heartbeat for {silence:.0f} s (bound {self.silence_bound:g} s)"
        for node in list(self.silence_probes):  # beating again: a later silence is probed afresh
            if node not in nodes:
                del self.silence_probes[node]
                self.answered.discard(node)
        if not dead:
            return None
        silent = [b.rank for b in beats if b.node in dead and b.rank in ranks]
        return Failure(f"heartbeats silent: {heartbeat.rank_ranges(silent)} on {','.join(sorted(dead))}",
                       sorted(dead), lost=True, why=dead, probed=probed)


def done_probe(failure: Failure, chosen: Sequence[str]) -> concurrent.futures.Future:
    """What the probes that found a failure's nodes lost said, as a finished probe of the round's nodes."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result({node: failure.probed.get(node) for node in chosen})
    return future


def drain(node: str, reason: str) -> str | None:
    """Drain a node with a reason; None when done, else why not (only root, SlurmUser and operators may)."""
    try:
        res = subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if res.returncode == 0 else (res.stderr or res.stdout).strip() or f"exit {res.returncode}"


def last_step(directory: Path) -> int | None:
    steps = [b.step for b in heartbeat.read_beats(directory) if b.step is not None]
    return max(steps) if steps else None


class Supervisor:
    def __init__(self, srun: Sequence[str], nodes: int, spares: int, run_dir: Path, heartbeat_dir: Path,
                 hang_timeout: float | None, job_id: str, allocated: Sequence[str], batch_host: str,
                 probe_every: float = PROBE_EVERY_S, silence_bound: float = SILENCE_BOUND_S,
                 stop: StopPolicy = DEFAULT_STOP) -> None:
        self.srun, self.n, self.spares, self.run_dir, self.stop = list(srun), nodes, spares, run_dir, stop
        self.probe_every, self.silence_bound = probe_every, silence_bound
        self.heartbeat_dir, self.hang_timeout, self.job_id = heartbeat_dir, hang_timeout, job_id
        self.order = ordered_nodes(allocated, batch_host)
        self.excluded: dict[str, str] = {}  # node -> why
        self.stopping = False
        self.current: Round | None = None
        self.probes = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self.pending: list[tuple[int, concurrent.futures.Future]] = []  # probes of nodes already left out

    # -- the loop ---------------------------------------------------------------------------------------------

    def run(self) -> int:
        for name in self.stop.forwarded_signals:  # the batch shell's stop trap (save and requeue), Slurm's SIGTERM
            signal.signal(signal_number(name), self._forward)
        try:
            return self._rounds()
        finally:
            self.finish_probes(wait=True)

    def _rounds(self) -> int:
        self.preflight()
        number, status = 0, 1
        while True:
            healthy = [n for n in self.order if n not in self.excluded]
            if len(healthy) < self.n:
                return self.give_up(number, f"{len(healthy)} healthy node(s) left of {len(self.order)}, "
                                            f"{self.n} needed", status)
            chosen = healthy[:self.n]
            status, failure, probing = self.run_round(number, chosen)
            if status == 0 and failure is None:
                return 0
            if self.stopping:
                return status
            failure = failure or Failure(f"srun exited {status}", [])
            probing = probing or self.probes.submit(probe, chosen, self.job_id)
            if number >= self.spares:  # no restart left: drain what the probe finds, then requeue or fail
                self.drain_failed(number + 1, {n: why for n, why in probing.result().items() if why})
                return self.give_up(number + 1, f"all {self.spares} spare(s) used; the last round ended on "
                                                f"{failure.trigger}", status)
            self.restart(number + 1, chosen, failure, probing)
            number += 1

    def preflight(self) -> None:
        """The nodes the job's pre-flight failed (toolkit.node.preflight, run before this), then a probe step on
        the others: neither gets ranks."""
        checked = records.job_records(records.batch_dir(self.run_dir) / records.PREFLIGHTS, self.job_id)
        failed = (checked[-1].get("failed") or {}) if checked else {}
        if failed:
            self.exclude({node: "; ".join(f"{c['name']}: {c['detail']}" for c in checks)
                          for node, checks in failed.items()}, "pre-flight", 0, "pre-flight checks", None)
        left = [n for n in self.order if n not in self.excluded]
        bad = {node: why for node, why in probe(left, self.job_id).items() if why}
        if bad:
            self.exclude(bad, "pre-flight", 0, "pre-flight probe", None)
            self.drain_failed(0, bad)

    def run_round(self, number: int, chosen: list[str]) -> tuple[int, Failure | None, concurrent.futures.Future | None]:
        """Run one round's srun to its end: (its status, why it failed, the probe of its nodes started as it
        failed)."""
        for path in self.heartbeat_dir.glob("rank-*.json"):  # this round's ranks write their own
            path.unlink(missing_ok=True)
        env = round_env(dict(os.environ), chosen, int(self.job_id), number)
        spare = [n for n in self.order if n not in self.excluded and n not in chosen]
        say(f"round {number}: {self.n} node(s) {','.join(chosen)}, spare {','.join(spare) or 'none'}, "
            f"rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}")
        current = Round(number, chosen, time.time())
        current.proc = subprocess.Popen(round_argv(self.srun, chosen, number), env=env, stderr=subprocess.PIPE,
                                        text=True, errors="replace", bufsize=1)
        self.current = current
        reader = threading.Thread(target=self._read_stderr, args=(current,), daemon=True)
        reader.start()
        probing = None
        watch = Watch(chosen, self.job_id, current.started, self.probes, self.probe_every, self.silence_bound)
        while current.proc.poll() is None:
            self.finish_probes(wait=False)
            if current.failure is None and not self.stopping:
                current.failure = self._watched_failure(current, watch)
            if current.failure is not None and not self.stopping:
                # Probe while the step ends: a lost node's part never ends, and its probe takes MessageTimeout.
                # Unless a probe already found the lost nodes: the others need not wait for another.
                probing = done_probe(current.failure, chosen) if current.failure.probed else \
                    self.probes.submit(probe, chosen, self.job_id)
                self._end_step(current)
                break
            time.sleep(POLL_S)
        reader.join(timeout=5)
        return current.proc.returncode, (None if self.stopping else current.failure), probing

    def restart(self, number: int, chosen: list[str], failure: Failure, probing: concurrent.futures.Future) -> None:
        """Leave out the round's lost nodes and record the restart. Lost by the evidence: at once, the probe
        deciding the drain when it ends. Otherwise the probe decides: the nodes that fail it (drained), else
        those the failure points at (a rank died on a node that answers: left out, not drained)."""
        last = last_step(self.heartbeat_dir)
        if failure.lost:
            self.exclude({n: failure.why.get(n, "lost") for n in failure.suspects}, "restart", number,
                         failure.trigger, last)
            self.pending.append((number, probing))
            return
        dead = {node: why for node, why in probing.result().items() if why}
        suspects = dead or {n: "its rank failed; the node passed the probe" for n in failure.suspects if n in chosen}
        self.exclude(suspects, "restart", number, failure.trigger, last)
        self.drain_failed(number, dead)

    def exclude(self, nodes: dict[str, str], kind: str, number: int, trigger: str, last: int | None) -> None:
        self.excluded.update(nodes)
        healthy = [n for n in self.order if n not in self.excluded]
        self.record({"kind": kind, "round": number, "nodes": sorted(nodes),
                     "why": "; ".join(f"{n}: {w}" for n, w in sorted(nodes.items())) or "no node failed the probe",
                     "trigger": trigger, "last_step": last, "next_nodes": healthy[:self.n],
                     "spares_left": max(0, len(healthy) - self.n)})

    def drain_failed(self, number: int, failed: dict[str, str]) -> None:
        """Drain the nodes that failed a probe, with its reason (where Slurm lets this user), and record it."""
        if not failed:
            return
        drained, not_drained = [], {}
        for node, why in sorted(failed.items()):
            error = drain(node, f"hpc: job {self.job_id}: {why}"[:200])
            if error is None:
                drained.append(node)
            else:
                not_drained[node] = error
        self.record({"kind": "probe", "round": number, "nodes": sorted(failed),
                     "why": "; ".join(f"{n}: {w}" for n, w in sorted(failed.items())), "drained": drained,
                     "not_drained": not_drained})

    def finish_probes(self, wait: bool) -> None:
        """Drain the nodes of finished probes (all of them, waiting, when the job ends)."""
        for entry in list(self.pending):
            number, probing = entry
            if wait or probing.done():
                self.pending.remove(entry)
                self.drain_failed(number, {n: why for n, why in probing.result().items() if why})

    def give_up(self, number: int, why: str, status: int) -> int:
        self.finish_probes(wait=True)
        lost_node = any(e.get("kind") == "probe" for e in self.own_records())
        self.record({"kind": "gave_up", "round": number, "why": why, "requeued": lost_node})
        if lost_node:  # as Slurm would after a node failure: the rerun gets a fresh allocation
            say(f"giving up: {why}; requeueing job {self.job_id}")
            subprocess.run(["scontrol", "requeue", self.job_id], check=False)
            return 0
        say(f"giving up: {why}")
        return status if status > 0 else 1  # srun ended by a signal (negative) is a failure too

    # -- what a round watches ---------------------------------------------------------------------------------

    def _read_stderr(self, current: Round) -> None:
        assert current.proc is not None and current.proc.stderr is not None
        for line in current.proc.stderr:
            sys.stderr.write(line)
            found = failed_task(line)
            # A rank that saved and stopped on request (Slurm's SIGTERM of a requeue, the stop signal) did not fail.
            if found and not self.stop.stopped(exit_code(found[1])) and current.failure is None \
                    and not self.stopping:
                node, what = found
                current.failure = Failure(f"srun: {node}: {what}", [node])
        sys.stderr.flush()

    def _watched_failure(self, current: Round, watch: Watch) -> Failure | None:
        beats = heartbeat.read_beats(self.heartbeat_dir)
        now = time.time()
        found = watch.check(beats, now)
        if found is not None:
            return found
        if self.hang_timeout:
            hang = heartbeat.diagnose([b for b in beats if b.time >= current.started], now, self.hang_timeout)
            if hang.stopped:
                for line in hang.lines():
                    say(f"hang: {line}")
                # Undecided: no rank named, so no node suspected (the probe still finds a lost one).
                return Failure(f"no progress for {self.hang_timeout:g} s: "
                               f"{heartbeat.rank_ranges([s.rank for s in hang.stalled or hang.undecided])}",
                               sorted({s.node for s in hang.stalled}))
        return None

    def _end_step(self, current: Round) -> None:
        """End a failed round's step: srun's own abort (SIGINT twice), then SIGKILL; the lost node's part of the
        step cannot answer, so srun may never end by itself."""
        proc = current.proc
        assert proc is not None and current.failure is not None
        say(f"round {current.number} failed ({current.failure.trigger}): ending its step")
        for _ in range(2):
            with_ignored(proc.send_signal, signal.SIGINT)
            time.sleep(0.2)
        try:
            proc.wait(END_STEP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _forward(self, signum, frame) -> None:
        self.stopping = True
        if self.current is not None and self.current.proc is not None:
            with_ignored(self.current.proc.send_signal, signum)

    # -- the record -------------------------------------------------------------------------------------------

    def record(self, entry: dict) -> None:
        entry = {"time": time.time(), "job_id": self.job_id, **entry}
        records.append_record(self.run_dir / records.RESTARTS, entry)
        say(f"{entry['kind']}: {json.dumps(entry)}")
        ledger.record_spares(entry)  # lost nodes and failed probes, for the fleet ($HPC_FLEET_DIR)

    def own_records(self) -> list[dict]:
        return [e for e in records.read_records(self.run_dir / records.RESTARTS) if str(e.get("job_id")) == self.job_id]


def with_ignored(call, *args) -> None:
    try:
        call(*args)
    except OSError:
        pass


def say(text: str) -> None:
    sys.stderr.write(f"hpc: spares: {text}\n")
    sys.stderr.flush()


def allocation() -> tuple[str, list[str], str]:
    """(job id, the allocation's nodes, the batch host) from the batch shell's environment."""
    job_id = os.environ["SLURM_JOB_ID"]
    res = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True,
                         text=True, check=True, timeout=30)
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return job_id, res.stdout.split(), host


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 BUNDLE spares", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, required=True, help="nodes the ranks run on")
    parser.add_argument("--spares", type=int, required=True, help="nodes held beyond them")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--heartbeat-dir", type=Path, help="default: RUN_DIR/heartbeats")
    parser.add_argument("--hang-timeout", type=float, help="end a round whose ranks made no progress this long")
    parser.add_argument("--probe-every", type=float, default=float(os.environ.get(PROBE_EVERY_VAR) or PROBE_EVERY_S),
                        help=f"seconds between probes of the round's nodes (default %(default)g: ${PROBE_EVERY_VAR} "
                             f"or {PROBE_EVERY_S:g})")
    parser.add_argument("--silence-bound", type=float, default=SILENCE_BOUND_S,
                        help="seconds of heartbeat silence after which a node that answers its probe is dropped "
                             "(default %(default)g: longer than a large checkpoint's save)")
    parser.add_argument("--stop", type=StopPolicy.from_json, default=DEFAULT_STOP, metavar="POLICY",
                        help="the job's stop policy as JSON (toolkit.node.stop.StopPolicy.to_json; default: a "
                             "recipe's defaults)")
    parser.add_argument("srun", nargs=argparse.REMAINDER, help="-- srun OPTIONS... PROGRAM...")
    args = parser.parse_args(argv)
    srun = args.srun[1:] if args.srun[:1] == ["--"] else args.srun
    if not srun:
        parser.error("give the srun command line after --")
    job_id, allocated, host = allocation()
    supervisor = Supervisor(srun, args.nodes, args.spares, args.run_dir,
                            args.heartbeat_dir or args.run_dir / "heartbeats", args.hang_timeout, job_id, allocated,
                            host, args.probe_every, args.silence_bound, args.stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
