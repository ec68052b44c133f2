"""Heartbeats: each rank's step and time in the run dir, so a hung, frozen or lagging rank can be named.

The contract (every job hpc submits to Slurm sets the first two; any script may follow it):

    HPC_HEARTBEAT_DIR       <run dir>/heartbeats: each rank keeps rank-<RANK>.json there
    HPC_HANG_TIMEOUT        seconds without progress after which rank 0 ends the job with a diagnosis (unset: never)
    HPC_HEARTBEAT_INTERVAL  seconds between a rank's writes (default 10)

Two lines in a training script (our trainers call it too):

    from hpc_node.heartbeat import beat
    beat(step)                      # once per step, when the step is done

`hpc_node` is this package as every job hpc renders stages it (toolkit.job.staging) and puts first on its ranks'
PYTHONPATH: the node needs nothing of hpc installed. Where hpc is installed, `toolkit.workloads.heartbeat` (a
re-export) and `toolkit.node.heartbeat` are the same code.

A trainer that can time its step's phases passes them, in seconds: beat(step, data=..., compute=..., sync=...)
(our ResNet trainer: data = waiting for the loader, compute = the forward pass, which no collective holds back,
sync = backward with DDP's gradient all-reduce, the optimizer and the step's all-reduce, where ranks wait for
each other). The file keeps each phase's median over the recent steps: `hpc report run` finds the straggling
ranks from them (toolkit.reports.stragglers).

A script that saves checkpoints passes the save's seconds with the step it followed: beat(step, checkpoint=seconds)
(not a phase: a save is not part of every step). The file keeps the saves' count, total seconds and the last one
(`checkpoint`), which `hpc report goodput` counts as checkpoint time where the script's log has no record of it.

beat() stores the step in memory (about a microsecond) and wakes a daemon thread, which writes the file when the
step changed and WRITE_GAP_S passed since its last write, and every interval in any case. So the file carries the
step a rank really finished (within WRITE_GAP_S: a rank frozen after its step 7 says 7, not the step of the last
timer write), at most 1/WRITE_GAP_S small writes a second whatever the step rate. The thread keeps running while
the main thread waits in a collective, so a file whose `time` stops moving while the other ranks' go on says the
process itself is frozen or gone, and one whose `step` stops moving says it makes no progress.

The first beat also registers faulthandler on SIGWINCH (STACK_SIGNAL): `hpc jobs status --stacks` and the hang
watchdog send it to the job's steps (scancel --signal=WINCH), and every rank writes its Python stacks to
rank-<RANK>.stack. SIGWINCH because its default action is to ignore it: the job's other processes (bash, srun's
tasks that never beat, data-loader workers) are not killed by it, as they would be by SIGUSR1.

Read by `hpc jobs status` (toolkit.submit.runs), by the spares supervisor (toolkit.node.spares) and by the watchdog
here, through diagnose(): the ranks that stopped progressing, and among them the ones the others wait for. Node-side
code (toolkit.node's contract): standard library only, python3 >= 3.9, since every rank imports it.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import faulthandler
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

DIR_VAR, HANG_VAR, INTERVAL_VAR = "HPC_HEARTBEAT_DIR", "HPC_HANG_TIMEOUT", "HPC_HEARTBEAT_INTERVAL"
DEFAULT_INTERVAL_S = 10.0
TIMED_WINDOW = 200  # steps whose phase times the heartbeat keeps (their medians are written)
# A changed step is written at most this often (and at once when the last write is older): a fast loop costs at
# most 1/WRITE_GAP_S writes a second, and a frozen rank's file is at most this far behind its true last step.
WRITE_GAP_S = 0.5
STACK_SIGNAL = signal.SIGWINCH
HANG_FILE = "hang.json"  # in the run dir (the heartbeat dir's parent): what the watchdog found when it ended the job
# A heartbeat file older than this many intervals: its writer thread stopped, so the process is frozen or gone
# (what the spares supervisor drops a node on, after a probe).
SILENT_INTERVALS = 3
# What the hang diagnosis reads from a write's age (its writer thread writes at least every interval, so a live
# rank's file is at most one interval old, plus the shared file system's and a busy interpreter's delay):
# LATE past one interval and WRITE_SLACK_S: the rank may be frozen, the poll cannot yet tell (undecided);
# FROZEN past two intervals and WRITE_SLACK_S while the other ranks' writes go on: two timer writes missed in a
# row: its process stopped (frozen, gone, or holding the interpreter lock), and the others wait for it.
WRITE_SLACK_S = 1.0
FROZEN_INTERVALS = 2
# Frames of a main thread that is waiting for other ranks: a torch.distributed call, or DDP's gradient all-reduce
# (it runs in the autograd engine under loss.backward()).
WAITING_FRAME = re.compile(r"/torch/(distributed|autograd|nn/parallel)/|/torch/_tensor\.py")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclasses.dataclass(frozen=True)
class Beat:
    """One rank's heartbeat file, as read."""

    rank: int
    node: str
    pid: int
    step: int | None  # None: started, no step done yet
    progress: float  # epoch seconds of the last step done (of the start before the first)
    time: float  # epoch seconds of the last write
    interval: float
    # steps timed (the first step, start-up included, is not), and the median seconds per step over the last
    # TIMED_WINDOW steps: "step" (between beats) and each phase the rank passed to beat(). Medians: one step
    # stalled by a checkpoint save or the OS must not make a rank look slow.
    timed_steps: int = 0
    medians: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # beat(step, checkpoint=seconds): {"count", "total_s", "step", "seconds", "time"} of this process's saves
    checkpoint: Mapping[str, float] | None = None
    # The last TIMED_WINDOW timed steps one by one: their step numbers, and per phase ("step" and those passed to
    # beat()) the seconds each took (None where that step passed no such phase). Step numbers line the ranks up,
    # so the straggler test compares ranks window by window (toolkit.reports.stragglers).
    recent_steps: Sequence[int] = ()
    recent: Mapping[str, Sequence[float | None]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping) -> Beat:
        return cls(int(data["rank"]), str(data["node"]), int(data["pid"]),
                   None if data.get("step") is None else int(data["step"]), float(data["progress"]),
                   float(data["time"]), float(data.get("interval", DEFAULT_INTERVAL_S)),
                   int(data.get("timed_steps", 0)),
                   {str(k): float(v) for k, v in (data.get("medians") or {}).items()},
                   {str(k): float(v) for k, v in data["checkpoint"].items()} if data.get("checkpoint") else None,
                   [int(s) for s in data.get("recent_steps") or ()],
                   {str(k): [None if v is None else float(v) for v in values]
                    for k, values in (data.get("recent") or {}).items()})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Heartbeat:
    """This rank's heartbeat: beat(step) in the training loop, a writer thread, the stack-dump signal, and on
    rank 0 with a hang timeout, the watchdog."""

    def __init__(self, directory: Path, rank: int, interval: float = DEFAULT_INTERVAL_S,
                 hang_timeout: float | None = None, node: str | None = None) -> None:
        self.directory, self.rank, self.interval, self.hang_timeout = Path(directory), rank, interval, hang_timeout
        self.node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.step: int | None = None
        self.progress = time.time()
        self.timed_steps = 0
        self.recent: dict[str, collections.deque] = {}
        self.checkpoint: dict[str, float] | None = None
        self.history: collections.deque = collections.deque(maxlen=TIMED_WINDOW)  # (step, {phase: seconds})
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by beat(): a new step to write
        self._woken = False  # beat() already woke the writer for a step it has not written yet
        self._written = time.monotonic()
        self._write_error: str | None = None  # why this rank's last write failed; None once one succeeds
        self._stack_file: IO | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Heartbeat | None:
        """The heartbeat the job's environment asks for; None where HPC_HEARTBEAT_DIR is unset."""
        directory = environ.get(DIR_VAR)
        if not directory:
            return None
        hang = environ.get(HANG_VAR)
        return cls(Path(directory), int(environ.get("RANK", "0")),
                   float(environ.get(INTERVAL_VAR) or DEFAULT_INTERVAL_S), float(hang) if hang else None)

    @property
    def path(self) -> Path:
        return self.directory / f"rank-{self.rank}.json"

    @property
    def stack_path(self) -> Path:
        return self.directory / f"rank-{self.rank}.stack"

    def start(self) -> Heartbeat:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stack_file = open(self.stack_path, "a")  # appending: clear_stacks() can empty it under us
        faulthandler.register(STACK_SIGNAL, file=self._stack_file, all_threads=True, chain=False)
        self.write()
        atexit.register(self._write_quietly)  # the last steps, which the writer thread may not have written yet
        threading.Thread(target=self._write_every_interval, name="hpc-heartbeat", daemon=True).start()
        if self.rank == 0 and self.hang_timeout:
            threading.Thread(target=self._watch, name="hpc-hang-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def beat(self, step: int, checkpoint: float | None = None, **phases: float) -> None:
        now = time.time()
        if checkpoint is not None:  # the save's seconds, not a phase: kept apart from the step's medians
            saved = self.checkpoint or {"count": 0, "total_s": 0.0}
            self.checkpoint = {"count": saved["count"] + 1, "total_s": saved["total_s"] + checkpoint,
                               "step": step, "seconds": checkpoint, "time": now}
        if self.step is not None:  # the first step's time holds the start-up
            self.timed_steps += 1
            timed = {"step": now - self.progress, **phases}
            for name, seconds in timed.items():
                self.recent.setdefault(name, collections.deque(maxlen=TIMED_WINDOW)).append(seconds)
            self.history.append((step, timed))
        self.step, self.progress = step, now
        if not self._woken:  # one wake-up per write, however many steps come before it
            self._woken = True
            self._wake.set()

    def snapshot(self) -> Beat:
        """What the file says now."""
        medians = {name: statistics.median(list(values)) for name, values in list(self.recent.items()) if values}
        history = list(self.history)
        phases = sorted({name for _, timed in history for name in timed})
        recent = {name: [None if timed.get(name) is None else round(timed[name], 6) for _, timed in history]
                  for name in phases}
        return Beat(self.rank, self.node, os.getpid(), self.step, self.progress, time.time(), self.interval,
                    self.timed_steps, medians, self.checkpoint, [step for step, _ in history], recent)

    def write(self) -> None:
        beat = self.snapshot()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(beat.to_json()))
        os.replace(tmp, self.path)  # readers never see half a file
        self._written = time.monotonic()

    def _write_every_interval(self) -> None:
        """Write when beat() says a step is done (WRITE_GAP_S after the last write at the soonest), and every
        interval whatever happens: the timer is what tells a live rank that makes no progress from a frozen one."""
        gap = min(WRITE_GAP_S, self.interval)
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self._written + self.interval - time.monotonic()))
            self._wake.clear()
            wait = self._written + gap - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            if self._stop.is_set():
                break
            self._woken = False  # before the write: a step done during it wakes the next one
            self._write_quietly()

    def _write_quietly(self) -> None:
        try:
            self.write()
            self._write_error = None
        except OSError as exc:  # a shared file system's hiccup must not end the training
            self._written = time.monotonic()  # tried: the next try waits its turn, not a busy loop
            self._write_error = f"{type(exc).__name__}: {exc}"

    def _watch(self) -> None:
        """Rank 0: once a rank has made no progress for the hang timeout, collect stacks, record the diagnosis in
        the run dir, say it on stderr and end the job (scancel), instead of waiting for the time limit."""
        hang_timeout = self.hang_timeout
        if hang_timeout is None:  # started only with a timeout
            return
        said, judge_from = False, 0.0
        while not self._stop.wait(self.interval):
            if self._write_error:  # this rank goes on but cannot write its beats: the files are no evidence
                if not said:  # (a fault probe: the run dir made read-only, and every rank looked hung)
                    sys.stderr.write(f"hpc: hang: the heartbeats cannot be written in {self.directory} "
                                     f"({self._write_error}): no hang is judged until they can\n")
                    said = True
                # once they can again, the other ranks' next writes (each interval at the latest) come first
                judge_from = time.monotonic() + 2 * self.interval
                continue
            said = False
            if time.monotonic() < judge_from:
                continue
            found = diagnose(read_beats(self.directory), time.time(), hang_timeout)
            if found.stopped:
                break
        else:
            return
        job_id = os.environ.get("SLURM_JOB_ID")  # this job's own; None in a local run
        # This rank dumps its own stacks here, in ordinary code, and ignores the signal the others get (SIGWINCH's
        # default action): a dump from the signal handler while this thread runs Python can crash the process
        # (seen under load: rank 0 ended by SIGSEGV as it asked for stacks, and its diagnosis never written).
        faulthandler.unregister(STACK_SIGNAL)
        stack_file = self._stack_file
        collect_stacks(self.directory, read_beats(self.directory), max(2 * self.interval, 3.0), job_id,
                       own=(lambda: faulthandler.dump_traceback(stack_file, all_threads=True)) if stack_file else None)
        found = diagnose(read_beats(self.directory), time.time(), hang_timeout, read_stacks(self.directory))
        record = {"time": time.time(), "hang_timeout_s": self.hang_timeout, "lines": found.lines(),
                  **found.to_json()}
        try:
            (self.directory.parent / HANG_FILE).write_text(json.dumps(record, indent=1) + "\n")
        except OSError as exc:  # the job still ends: its log keeps the diagnosis
            sys.stderr.write(f"hpc: hang: could not record the diagnosis in {self.directory.parent / HANG_FILE}: "
                             f"{exc}\n")
        for line in found.lines():
            sys.stderr.write(f"hpc: hang: {line}\n")
        sys.stderr.write(f"hpc: hang: ending the job: no progress for {self.hang_timeout:g} s (HPC_HANG_TIMEOUT); "
                         f"the diagnosis is in {self.directory.parent / HANG_FILE}\n")
        sys.stderr.flush()
        record_hang(found, job_id)
        end_job(read_beats(self.directory), job_id)


def record_hang(found: Diagnosis, job_id: str | None) -> int:
    """The hang's finding in the fleet's node ledger (toolkit.node.ledger, where the job has one): a strike for the
    node of each rank the others waited for, named on evidence; none while undecided (a waiting rank is never the
    cause). A silent rank (its process frozen or gone) is the node's `lost` kind, one only behind the others is
    `performance`. Returns the findings recorded."""
    from . import ledger

    recorded = 0
    for stall in found.stalled:
        kind = ledger.LOST if stall.silent_s is not None else ledger.PERFORMANCE
        recorded += ledger.record_finding(stall.node, "hang", "frozen-rank" if stall.silent_s is not None
                                          else "behind", kind, stall.line() + (f"; {found.why}" if found.why else ""),
                                          job=job_id)
    return recorded


_current: Heartbeat | None = None
_lock = threading.Lock()


def beat(step: int, checkpoint: float | None = None, **phases: float) -> None:
    """Record that this rank finished `step` (with the seconds its phases took, where it timed them, and the seconds
    a checkpoint save after it took). Starts the rank's heartbeat on the first call; does nothing where the job set
    no HPC_HEARTBEAT_DIR."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = Heartbeat.from_env() or False  # type: ignore[assignment]
                if _current:
                    _current.start()
    if _current:
        _current.beat(step, checkpoint, **phases)


def read_beats(directory: Path) -> list[Beat]:
    """The heartbeat files in `directory`, by rank (unreadable or half-written ones are skipped)."""
    beats = []
    for path in Path(directory).glob("rank-*.json"):
        try:
            beats.append(Beat.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(beats, key=lambda b: b.rank)


def read_stacks(directory: Path) -> dict[int, str]:
    """Each rank's stack dump (rank-N.stack, emptied by clear_stacks before each request), by rank."""
    stacks = {}
    for path in Path(directory).glob("rank-*.stack"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            stacks[int(path.stem.split("-")[1])] = text
    return stacks


def clear_stacks(directory: Path) -> None:
    """Empty every stack file before asking for new dumps: the ranks append (O_APPEND), so the next dump starts
    the file again."""
    for path in Path(directory).glob("rank-*.stack"):
        try:
            os.truncate(path, 0)
        except OSError:
            pass


def main_thread_frames(stack: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the main thread's frames, innermost first. The main thread is the one whose
    outermost frame is not threading's bootstrap (every other Python thread starts there)."""
    for thread in re.split(r"(?m)^(?=Thread 0x|Current thread 0x)", stack):
        frames = [(m["file"], int(m["line"]), m["func"]) for m in map(FRAME.match, thread.splitlines()) if m]
        if frames and not frames[-1][0].endswith("threading.py"):
            return frames
    return []


@dataclasses.dataclass(frozen=True)
class Stall:
    """A rank that made no progress for `idle_s`; `where` its innermost frame, from its stack when one was read."""

    rank: int
    node: str
    step: int | None
    idle_s: float
    silent_s: float | None = None  # its heartbeat itself stopped this long ago: the process is frozen or gone
    where: str | None = None

    def line(self) -> str:
        step = "no step done" if self.step is None else f"step {self.step}"
        line = f"rank {self.rank} on node {self.node}: {step}, no progress for {self.idle_s:.0f} s"
        if self.silent_s is not None:
            line += f", no heartbeat for {self.silent_s:.0f} s (process frozen or gone)"
        if self.where:
            line += f", at {self.where}"
        return line


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    stalled: list[Stall]  # the ranks the others wait for: named only on evidence (empty while undecided)
    waiting: list[int]  # stalled ranks waiting for them (in a collective, or ahead of them)
    ranks: int
    steps: tuple[int, int] | None  # (slowest, fastest) rank's step
    why: str = ""  # how the stalled ranks were told from the waiting ones, or why none could be yet
    # Ranks that stopped progressing when nothing yet tells the one they wait for from the waiting ones: named as
    # undecided, never as the cause (a rank named here would be a false strike against its node).
    undecided: list[Stall] = dataclasses.field(default_factory=list)

    @property
    def stopped(self) -> bool:
        """Some rank made no progress for the threshold, named or not."""
        return bool(self.stalled or self.undecided)

    def lines(self) -> list[str]:
        if self.undecided:
            idle = max(s.idle_s for s in self.undecided)
            steps = sorted({s.step for s in self.undecided}, key=lambda step: -1 if step is None else step)
            at = ", ".join("no step done" if step is None else f"step {step}" for step in steps)
            return [f"{rank_ranges([s.rank for s in self.undecided])} made no progress for {idle:.0f} s ({at}); "
                    f"undecided which rank the others wait for: {self.why}"]
        lines = [s.line() for s in self.stalled]
        if self.waiting:
            lines.append(f"{rank_ranges(self.waiting)} wait for it: {self.why}")
        elif self.stalled and self.why:
            lines.append(self.why)
        return lines

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "steps": list(self.steps) if self.steps else None,
                "stalled": [dataclasses.asdict(s) for s in self.stalled], "waiting": self.waiting, "why": self.why,
                "undecided": [s.rank for s in self.undecided]}


def diagnose(beats: Sequence[Beat], now: float, after_s: float, stacks: Mapping[int, str] | None = None) -> Diagnosis:
    """Which ranks stopped making progress (no step done for `after_s`), and which of those the others wait for.

    In a collective every rank stops stepping, so a rank is named only on evidence that it, not the others, is the
    one stopped: its heartbeat went silent (FROZEN_INTERVALS timer writes missed while the others' go on: its
    process stopped), else it is behind the others' step, else its stack is outside communication while the
    others' are in it (torch.distributed, DDP's all-reduce under backward). While a rank's heartbeat is late but
    not yet silent, or where nothing tells them apart, no rank is named: the stopped ranks are `undecided`.
    `stacks`: None where none were asked for."""
    steps = [b.step for b in beats if b.step is not None]
    span = (min(steps), max(steps)) if steps else None
    frozen = [b for b in beats if now - b.time > FROZEN_INTERVALS * b.interval + WRITE_SLACK_S]
    late = [b for b in beats if now - b.time > b.interval + WRITE_SLACK_S and b not in frozen]
    # Idle as of the rank's last write, not as of now: it may have stepped since, which the next write says.
    # So a rank is called stalled at most one interval after the threshold, and never early.
    idle = [b for b in beats if (now if b in frozen or b in late else b.time) - b.progress >= after_s]
    if not idle:
        return Diagnosis([], [], len(beats), span)
    where = {rank: main_thread_frames(stack) for rank, stack in (stacks or {}).items()}

    def stall(b: Beat) -> Stall:
        return Stall(b.rank, b.node, b.step, now - b.progress, now - b.time if b in frozen else None,
                     _frame(where.get(b.rank)))

    newest = max(-1 if b.step is None else b.step for b in beats)
    behind = [b for b in idle if (-1 if b.step is None else b.step) < newest]
    outside = [b for b in idle if where.get(b.rank) and not WAITING_FRAME.search(where[b.rank][0][0])]
    if len(beats) == 1:  # no other rank it could wait for
        suspects, why = idle, ""
    elif any(b in idle for b in frozen) and len(frozen) < len(beats):
        suspects, why = [b for b in idle if b in frozen], "their heartbeats go on"
    elif late or frozen:  # a rank's write is overdue (or every rank's is): wait for the next poll to tell
        overdue = sorted(late or frozen, key=lambda b: b.rank)
        why = (f"{rank_ranges([b.rank for b in overdue])}'s heartbeat is {now - max(b.time for b in overdue):.0f} s "
               f"old (written every {overdue[0].interval:g} s): if it stays silent, that process is frozen or gone "
               "and the others wait for it" if len(overdue) < len(beats) else
               "no rank's heartbeat is fresh: every process is frozen or gone, or the file system stopped")
        return Diagnosis([], [], len(beats), span, why, [stall(b) for b in idle])
    elif behind:
        suspects, why = behind, f"the other ranks reached step {newest}"
    elif outside and len(outside) < len(idle):
        suspects, why = outside, "their stacks are in communication (torch.distributed or DDP's all-reduce)"
    else:
        why = ("no rank stands out: collect stacks with `hpc jobs status JOB --stacks`" if stacks is None else
               "no rank stands out by step, and no stack came (ranks that never called beat() register no "
               "stack dump)" if not stacks else "no rank stands out by step or stack: read the stacks")
        return Diagnosis([], [], len(beats), span, why, [stall(b) for b in idle])
    waiting = sorted(b.rank for b in idle if b not in suspects)
    return Diagnosis([stall(b) for b in suspects], waiting, len(beats), span, why)


def _frame(frames: list[tuple[str, int, str]] | None) -> str | None:
    if not frames:
        return None
    path, line, func = frames[0]
    return f"{os.path.basename(path)}:{line} in {func}"


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"."""
    parts, start = [], None
    for i, rank in enumerate(ranks):
        start = rank if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def collect_stacks(directory: Path, beats: Sequence[Beat], timeout: float, job_id: str | None,
                   own: Callable[[], None] | None = None) -> None:
    """Ask every rank for its Python stacks and wait until each wrote them (or `timeout` passed). With Slurm's
    `job_id`, scancel --signal=WINCH reaches every task of the job's steps on every node (not the batch shell);
    without one (a local run), the ranks' own pids on this machine. `own`: the asking rank's own dump, once the
    files are emptied."""
    clear_stacks(directory)
    if own is not None:
        own()
    if not _scancel(f"--signal={int(STACK_SIGNAL)}", job_id=job_id):
        _signal_local(beats, STACK_SIGNAL)
    deadline = time.time() + timeout
    paths = [Path(directory) / f"rank-{b.rank}.stack" for b in beats]
    while time.time() < deadline and not all(p.exists() and p.stat().st_size for p in paths):
        time.sleep(0.2)
    time.sleep(0.5)  # faulthandler writes a dump line by line: let the last ones finish


def end_job(beats: Sequence[Beat], job_id: str | None) -> None:
    """End the job: scancel `job_id` (every step and the batch shell, no requeue). Without Slurm, or where scancel
    is not there (a rank in a container image without Slurm's commands): SIGTERM to the ranks on this node, then
    this rank exits 1, which srun (--kill-on-bad-exit) turns into the end of the step."""
    if not _scancel(job_id=job_id):
        _signal_local(beats, signal.SIGTERM)
        os._exit(1)


def _scancel(*options: str, job_id: str | None) -> bool:
    """scancel OPTIONS JOB_ID; False where there is no job id or no scancel."""
    if not job_id:
        return False
    try:
        subprocess.run(["scancel", *options, job_id], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def _signal_local(beats: Sequence[Beat], signum: int) -> None:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    for b in sorted(beats, key=lambda b: b.pid == os.getpid()):  # this process last: the signal may end it
        if b.node == node:
            try:
                os.kill(b.pid, signum)
            except OSError:
                pass
