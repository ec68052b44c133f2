"""The run dir: everything needed to reproduce and report on one run, written and read here only (submit, jobs
and reports all go through RunDir).

    <runs root>/<recipe>-<UTC time>-<nonce>/
        metadata.json    Metadata: toolkit version, recipes' git commit, who/when, executor, queue, nodes, ranks,
                         job ids (a sweep's: its arrays; a sweep task's: its place in the sweep)
        plan.json        the plan the job was submitted with (what `--dry-run --json` prints)
        recipe.yaml      the resolved recipe (profile and --set applied)
        job.sbatch       the script `hpc recipes render` makes for the same spec (under the sbatch executor, the
                         very file sbatch was given)
        batch_script.sh  under submitit's executor: the batch script Slurm stored (scontrol write batch_script)
        submitit/        submitit's pickles and per-rank logs: <job>_<rank>_log.out / .err (a sweep task's are in
                         its sweep's submitit/, <array>_<task in array>_<rank>_log.*)
        <job>-<id>.out   the sbatch executor's one log: every rank's stdout and stderr (JobSpec.output)
        result.json      how the job ended (Slurm forgets finished jobs): submitit's rank 0's RankRecord when its
                         workload ends well; the rendered script's batch shell's, ok or not (rank null, the
                         ranks' step's exit status: toolkit.slurm.render.end_record_line)
        failures/        rank-N.json: RankRecord of each rank whose workload failed
        logs/train_log.jsonl  our trainer's log, when the recipe keeps its logs under the run (dirs.logs under: run)
        heartbeats/      rank-N.json: each rank's step and time; rank-N.stack: its Python stacks when asked
                         (toolkit.node.heartbeat)
        hang.json        what the hang watchdog found when it ended the job (HPC_HANG_TIMEOUT)
        restarts.jsonl   a job with spares (toolkit.node.spares): one line per restart on other nodes (when, which
                         nodes were left out and why, drained or not, the last step the heartbeats saw)
        task-000/ ...    a sweep's dir only: one run dir per grid point

The runs root is $HPC_RUNS_DIR, else <FSx mount>/hpc-runs/<user> where the cluster config has an FSx for Lustre
(toolkit.submit.runsroot), else ~/hpc-runs (home is shared with the compute nodes on ParallelCluster, but from the
head node's own EBS root volume, which also holds slurmctld's state: no place for many checkpoints).
Every rank imports this module (toolkit.slurm.rank_task writes result and failures): standard library only.
Readers tolerate run dirs written by older toolkits (missing keys, the old executor names).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from signal import SIGTERM
from typing import Any, Iterable, Iterator, Mapping

from toolkit.errors import HpcError
from toolkit.node import heartbeat  # standard library only
from toolkit.node.records import PREFLIGHTS, RESTARTS, append_record, batch_dir, read_records  # node-side
from toolkit.workloads.train_log import LOG_NAME  # standard library only

METADATA = "metadata.json"
PLAN = "plan.json"
RESULT = "result.json"
FAILURES = "failures"
SUBMITIT = "submitit"
TRAINER_LOG = f"logs/{LOG_NAME}"  # our trainer's log, when the recipe keeps its logs dir under the run
LOG_PATTERNS = ("*.out", "*.err", "*.log", "*.jsonl", "*.txt", "*.json")
RECORDS = (METADATA, PLAN, RESULT)  # the toolkit's own files: never logs
SWEEP, SWEEP_TASK = "sweep", "sweep-task"  # Metadata.kind of a sweep's dir and of its tasks' run dirs


class Executor(enum.StrEnum):
    """How a job is submitted (toolkit.slurm.executors): one vocabulary for --executor, plans, metadata, output."""

    SLURM = "slurm"  # submitit's SlurmExecutor: srun starts one RankTask per Slurm task
    LOCAL = "local"  # submitit's LocalExecutor: this machine, one node
    SBATCH = "sbatch"  # the rendered script itself (sbatch --parsable job.sbatch); MPI binaries always

    @classmethod
    def parse(cls, name: str | None) -> Executor | None:
        """The kind a name says, older run dirs' names included; None for none or an unknown name."""
        name = {"submitit-slurm": "slurm", "submitit-local": "local"}.get(name or "", name)
        return cls(name) if name is not None and name in cls._value2member_map_ else None


@dataclasses.dataclass(frozen=True)
class Array:
    """One Slurm job array of a sweep: its job id, its first task's index in the sweep, its task count."""

    job_id: str
    first: int
    count: int

    def task_job_id(self, index: int) -> str:
        """Slurm's id of task `index` of this array ("ID_N"; submitit sends a one-task batch as a plain job)."""
        return f"{self.job_id}_{index}" if self.count > 1 else self.job_id


class BadMetadata(ValueError):
    """metadata.json holds a value of the wrong type (the message names the key)."""


def _positive_int(data: Mapping[str, Any], key: str, strict: bool) -> int | None:
    value = data.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if strict:
        raise BadMetadata(f"{key} must be a positive integer, got {value!r}")
    return None


def _strings(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None


@dataclasses.dataclass(frozen=True)
class Metadata:
    """metadata.json. Every field may be missing in a run dir from an older toolkit (or another writer)."""

    recipe: str | None = None
    profile: str | None = None
    overrides: list[str] | None = None  # the request's --set
    toolkit_version: str | None = None
    recipe_file: str | None = None
    recipes_git_commit: str | None = None  # '+dirty' when the recipes' checkout had changes
    submitted_by: str | None = None
    submitted_from: str | None = None
    submitted_at: str | None = None
    executor: Executor | None = None
    queue: str | None = None
    instance_type: str | None = None
    fabric: str | None = None  # the queue's EFA stack (Queue.fabric): modern | legacy | none
    nodes: int | None = None
    ranks_per_node: int | None = None
    ranks: int | None = None
    gpus: int | None = None
    launcher_style: str | None = None
    job_ids: list[str] = dataclasses.field(default_factory=list)
    kind: str | None = None  # SWEEP, SWEEP_TASK, or None for a single run
    # a sweep's dir
    sweeps: list[str] | None = None  # the --sweep options
    tasks: int | None = None
    array_parallelism: int | None = None
    max_array_size: int | None = None
    arrays: list[Array] | None = None
    array_job_id: str | None = None  # its first array (a sweep dir from before sweeps were split: its only one)
    # a sweep task's run dir
    sweep_dir: str | None = None
    task_index: int | None = None  # in the sweep
    array_task: int | None = None  # in its array
    sweep_overrides: list[str] | None = None  # its grid point's --set
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # keys this toolkit does not know: kept

    @classmethod
    def from_json(cls, data: Mapping[str, Any], strict: bool = False) -> Metadata:
        """Read metadata.json's object. strict: a count that is not a positive integer raises BadMetadata (a
        report must not compute with it); else it reads as missing."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        fields: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        for key in ("nodes", "ranks_per_node", "ranks", "gpus"):
            fields[key] = _positive_int(data, key, strict)
        fields["executor"] = Executor.parse(data.get("executor"))
        fields["job_ids"] = _strings(data.get("job_ids")) or []
        for key in ("overrides", "sweeps", "sweep_overrides"):
            fields[key] = _strings(data.get(key))
        if data.get("array_job_id") is not None:
            fields["array_job_id"] = str(data["array_job_id"])
        if data.get("arrays") is not None:
            try:
                fields["arrays"] = [Array(str(a["job_id"]), int(a["first"]), int(a["count"])) for a in data["arrays"]]
            except (KeyError, TypeError, ValueError) as exc:
                if strict:
                    raise BadMetadata(
                        f"arrays must be a list of {{job_id, first, count}}, got {data['arrays']!r}") from exc
                fields["arrays"] = None
        return cls(**fields, extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """metadata.json's object: the fields that are set (and the unknown keys read with them)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        data["arrays"] = None if self.arrays is None else [dataclasses.asdict(a) for a in self.arrays]
        return {**self.extra, **{k: v for k, v in data.items() if v is not None}}

    @property
    def sweep_arrays(self) -> list[Array]:
        """A sweep's arrays in task order (a sweep dir from before sweeps were split: its one array_job_id)."""
        if self.arrays:
            return list(self.arrays)
        return [Array(self.array_job_id, 0, self.tasks or 0)] if self.array_job_id else []

    @property
    def task_ids(self) -> list[str]:
        """Slurm's id of every task of a sweep, by task index ("ARRAY_N", N counted within its array)."""
        return [a.task_job_id(n) for a in self.sweep_arrays for n in range(a.count)]


@dataclasses.dataclass(frozen=True)
class RankRecord:
    """What a rank's launcher records when its workload ends: result.json (rank 0, ok) or failures/rank-N.json."""

    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    argv0: str | None = None
    finished_at: str | None = None  # ISO 8601, UTC
    ok: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


RUNS_DIR_ENV = "HPC_RUNS_DIR"


def home_runs_root() -> Path:
    """~/hpc-runs: the runs root without $HPC_RUNS_DIR or a shared FSx (on the head node's root volume)."""
    try:
        return Path.home() / "hpc-runs"
    except RuntimeError:  # pathlib: no $HOME, and a uid without a passwd entry (a container's arbitrary uid)
        raise HpcError("there is no home directory here for the runs (~/hpc-runs): $HOME is not set and this "
                       "user has no passwd entry",
                       fix=f"set {RUNS_DIR_ENV} to a directory for the run dirs (on a shared file system for "
                           "multi-node jobs), or set HOME") from None


def shared_runs_root(mount: str) -> Path:
    """<mount>/hpc-runs/<user>: the runs root on a cluster's FSx (one dir per user: the file system is shared)."""
    return Path(mount) / "hpc-runs" / user_name()


def user_name() -> str:
    """Who submits: getpass's answer ($LOGNAME, $USER, ..., else the passwd entry), else the uid (a container's
    arbitrary uid has neither; getpass then raises KeyError, or OSError from Python 3.13)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def runs_root(shared_mount: str | None = None) -> Path:
    """$HPC_RUNS_DIR, else the shared file system's (shared_runs_root) when there is one, else home's."""
    explicit = os.environ.get(RUNS_DIR_ENV)
    if explicit:
        return Path(explicit)
    return shared_runs_root(shared_mount) if shared_mount else home_runs_root()


def run_dir_path(recipe_name: str, root: Path | None = None) -> Path:
    """A new run dir's path (not created yet: create() it once the job is known to be valid)."""
    root = root or runs_root()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in recipe_name)[:60] or "run"
    return root / f"{safe}-{stamp}-{secrets.token_hex(3)}"


def task_dir_name(index: int, count: int) -> str:
    """A sweep task's run dir, inside the sweep's dir."""
    return f"task-{index:0{max(3, len(str(count - 1)))}d}"


def base_metadata(recipe_name: str, recipe_path: Path | None) -> dict[str, Any]:
    """Who submitted which recipe (from which commit of it), when, with which toolkit."""
    import socket

    from toolkit import __version__

    return {
        "toolkit_version": __version__,
        "recipe": recipe_name,
        "recipe_file": str(recipe_path) if recipe_path else None,
        "recipes_git_commit": git_commit(recipe_path) if recipe_path else None,
        "submitted_by": user_name(),
        "submitted_from": socket.gethostname(),
        "submitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),  # the ledger's start
    }


def git_commit(path: Path) -> str | None:
    """The commit of the git checkout holding `path` (the recipes), if any; '+dirty' when it has changes."""
    import subprocess

    try:
        cwd = path if path.is_dir() else path.parent
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=cwd, capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


_created: dict[Path, list[Path]] = {}  # run dir -> the directories create() made for it (itself first)


@dataclasses.dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def name(self) -> str:
        return self.path.name

    # -- creating ---------------------------------------------------------------------------------------------

    def create(self) -> RunDir:
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True)
        except OSError as exc:
            raise HpcError(f"cannot create run dir {self.path}: {exc.strerror}",
                           fix="set HPC_RUNS_DIR to a writable directory shared with the compute nodes") from None
        _created[self.path] = missing
        return self

    def discard(self) -> None:
        """Remove a run dir whose job was never submitted, and the runs root too if create() made it for it."""
        shutil.rmtree(self.path, ignore_errors=True)
        for parent in _created.pop(self.path, [])[1:]:
            try:
                parent.rmdir()  # only while empty
            except OSError:
                break

    def write_inputs(self, recipe_yaml: str, script: str, plan: Mapping[str, Any]) -> None:
        """What the job was made from: the resolved recipe, the rendered script, the plan."""
        (self.path / "recipe.yaml").write_text(recipe_yaml)
        (self.path / "job.sbatch").write_text(script)
        self.write_plan(plan)

    def write_plan(self, plan: Mapping[str, Any]) -> None:
        (self.path / PLAN).write_text(json.dumps(plan, indent=2) + "\n")

    # -- records ----------------------------------------------------------------------------------------------

    def metadata(self) -> Metadata | None:
        """The run's metadata, None when it has none that reads (a status view shows what it can)."""
        data = read_json(self.path / METADATA)
        return None if data is None else Metadata.from_json(data)

    def read_metadata(self) -> Metadata:
        """The run's metadata, checked: one clear error for a path that is no run dir or a broken file."""
        path = self.path / METADATA
        if not self.path.is_dir():
            raise HpcError(f"no such run dir: {self.path}", fix="pass the run directory `hpc recipes submit` printed")
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise HpcError(f"{self.path} has no {METADATA}",
                           fix=f"pass a run dir made by the toolkit (it writes {METADATA})") from None
        except json.JSONDecodeError as exc:
            raise HpcError(f"{path} is not valid JSON: {exc}", fix="repair or regenerate the run's metadata") from None
        if not isinstance(data, dict):
            raise HpcError(f"{path} is not a JSON object", fix="repair or regenerate the run's metadata")
        try:
            return Metadata.from_json(data, strict=True)
        except BadMetadata as exc:
            raise HpcError(f"{self.path}: {exc}", fix=f"fix it in {METADATA}") from None

    def write_metadata(self, meta: Metadata) -> None:
        write_json(self.path / METADATA, meta.to_json())

    def result(self) -> RankRecord | None:
        data = read_json(self.path / RESULT)
        return None if data is None else RankRecord.from_json(data)

    def write_result(self, record: RankRecord) -> None:
        write_json(self.path / RESULT, record.to_json())

    @property
    def heartbeat_dir(self) -> Path:
        return self.path / "heartbeats"

    def heartbeats(self) -> list[heartbeat.Beat]:
        return heartbeat.read_beats(self.heartbeat_dir)

    def hang(self) -> dict[str, Any] | None:
        """What the hang watchdog recorded when it ended the job, None if it did not."""
        return read_json(self.path / heartbeat.HANG_FILE)

    def restarts(self) -> list[dict[str, Any]]:
        """The spares supervisor's records, oldest first (toolkit.node.spares)."""
        return read_records(self.path / RESTARTS)

    def add_restart(self, entry: Mapping[str, Any]) -> None:
        append_record(self.path / RESTARTS, entry)

    def preflights(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """The pre-flight's records, one per start of a job, oldest first (toolkit.node.preflight); only job
        `job_id`'s when given. A sweep task's are in its sweep's dir (batch_dir), with its array's other tasks'."""
        records = read_records(batch_dir(self.path) / PREFLIGHTS)
        return records if job_id is None else [r for r in records if str(r.get("job")) == str(job_id)]

    def add_preflight(self, entry: Mapping[str, Any]) -> None:
        append_record(self.path / PREFLIGHTS, entry)

    def failures(self) -> list[RankRecord]:
        """The failed ranks' records (unreadable ones left out)."""
        records = (read_json(p) for p in sorted((self.path / FAILURES).glob("rank-*.json")))
        return [RankRecord.from_json(r) for r in records if r is not None]

    def failed(self) -> bool:
        """Whether any rank recorded a failure (cheaper than failures(): for status polls of large sweeps)."""
        return any((self.path / FAILURES).glob("rank-*.json"))

    def outcome(self) -> bool | None:
        """How the run ended by its own records: rank 0's result (ok or not), else False where a rank recorded a
        failure, else None (not ended, or ended without a word)."""
        result = self.result()
        if result:
            return result.ok
        return False if self.failed() else None

    def write_failure(self, record: RankRecord) -> None:
        (self.path / FAILURES).mkdir(parents=True, exist_ok=True)
        write_json(self.path / FAILURES / f"rank-{record.rank}.json", record.to_json())

    def derived(self) -> list[dict[str, Any]]:
        """The plan's derived values as plan.json records them ({key, value, rule}), [] for a run without a plan."""
        plan = read_json(self.path / PLAN) or {}
        return [d for d in plan.get("derived") or [] if isinstance(d, dict)]

    def first_failed_rank(self, job_id: str | None = None) -> int | None:
        """The rank that failed first: first_failure()'s rank."""
        found = self.first_failure(job_id)
        return found[0] if found else None

    def first_failure(self, job_id: str | None = None) -> tuple[int, str | None] | None:
        """The rank that failed first and its node (None where unrecorded), or None. Ranks killed after it by srun
        --kill-on-bad-exit are not it. Records carry whole seconds: within one, a rank that ended on its own
        comes before one ended by SIGTERM, which is how srun ends the others once one fails (a slow rank 0 killed
        before it reached its own error). Without records (the rendered script's ranks write none), srun's own
        word in the job's one log (`job_id`)."""
        first = self.first_failed_record()
        if first is None or first.rank is None:
            log = self.job_output(job_id) if job_id else None
            return first_failed_task_on_node(_read(log).splitlines()) if log else None
        return first.rank, first.host

    def first_failed_record(self) -> RankRecord | None:
        """The record (failures/) of the rank that failed first, as first_failure() orders them; None without."""
        ranked = [f for f in self.failures() if isinstance(f.rank, int)]
        return min(ranked, key=lambda f: (f.finished_at or "", f.exit_code == -SIGTERM, f.rank or 0), default=None)

    # -- sweeps -----------------------------------------------------------------------------------------------

    def task(self, index: int, count: int) -> RunDir:
        """Task `index` of a sweep of `count` tasks (this is the sweep's dir)."""
        return RunDir(self.path / task_dir_name(index, count))

    # -- logs -------------------------------------------------------------------------------------------------

    def submitit_dir(self, meta: Metadata | None = None) -> Path:
        """Where submitit keeps this run's logs: its own submitit/, a sweep task's in its sweep's dir."""
        meta = meta or self.metadata() or Metadata()
        return Path(meta.sweep_dir) / SUBMITIT if meta.kind == SWEEP_TASK and meta.sweep_dir else self.path / SUBMITIT

    def job_output(self, job_id: str) -> Path | None:
        """The sbatch executor's log of a job (`#SBATCH --output <run dir>/<job name>-%j.out`, JobSpec.output)."""
        return next(iter(sorted(self.path.glob(f"*-{job_id}.out"))), None)

    def rank_log(self, job_id: str, rank: int, stream: str = "out") -> Path | None:
        """Where one rank's stdout ("out") or stderr ("err") is, whatever ran it; None while there is none.
        The sbatch executor writes one log for the whole job, every rank's stdout and stderr in it."""
        meta = self.metadata() or Metadata()
        if meta.executor == Executor.SBATCH:
            return self.job_output(job_id)
        # submitit names logs <job>_<rank>_log.out; an array task's <job> is "<array>_<task>"
        log = self.submitit_dir(meta) / f"{job_id}_{rank}_log.{stream}"
        if log.exists():
            return log
        return self.job_output(job_id) if meta.executor is None else None  # an older run dir: whichever it has

    def shares_log(self, job_id: str, path: Path) -> bool:
        """Whether `path` (a rank_log()) is the job's one log that every rank writes (srun --label lines)."""
        return path == self.job_output(job_id)

    def job_logs(self, job_id: str, stream: str = "out") -> list[Path]:
        """The logs there are of a job: submitit's per-rank `stream` logs, then the rendered script's one log."""
        meta = self.metadata() or Metadata()
        found = sorted(self.submitit_dir(meta).glob(f"{job_id}_*_log.{stream}"))
        output = self.job_output(job_id)
        return found + ([output] if output else [])

    def log_names(self, job_id: str, stream: str = "out") -> list[str]:
        """The logs there are of a job (for an error that says which ranks have one)."""
        return [p.name for p in self.job_logs(job_id, stream)]

    def torchrun_restarts(self, job_id: str) -> list[dict[str, Any]]:
        """torchrun's restarts of a node's workers, as the job's logs say them (TORCHRUN_RESTART, written by
        toolkit.job.user_main): {node, restart, of}, in the order they came, each once."""
        found: list[dict[str, Any]] = []
        for log in self.job_logs(job_id, "err"):  # stderr, where user_main writes (the one log holds both)
            try:
                with open(log, errors="replace") as lines:  # line by line: a long job's log can be large
                    for line in lines:
                        match = TORCHRUN_RESTART.search(line) if "hpc: torchrun restart" in line else None
                        entry = match and {"node": match["node"], "restart": int(match["restart"]),
                                           "of": match["of"]}
                        if entry and entry not in found:
                            found.append(entry)
            except OSError:
                continue  # a log being rotated or gone: what the others say still counts
        return found

    def failed_rank_log(self, job_id: str) -> Path | None:
        """The log of the rank that failed first, rank 0's when no rank recorded a failure (stderr where the
        executor keeps it apart)."""
        return self.rank_log(job_id, self.first_failed_rank(job_id) or 0, "err")

    def log_files(self) -> list[Path]:
        """The run's logs, the likeliest training log first: the trainer's train_log.jsonl, rank 0's submitit
        logs (newest job first, stdout first), then every other *.out, *.err, *.log, *.jsonl, *.txt and *.json
        (the sbatch executor's log among them; the toolkit's own records left out)."""
        meta = self.metadata() or Metadata()
        logs = self.submitit_dir(meta)
        if logs.parent == self.path:
            ranks = sorted(logs.glob("*_log.*"))
        else:  # a sweep task: its own job's logs among all the sweep's
            ranks = sorted(p for job_id in meta.job_ids for p in logs.glob(f"{job_id}_*_log.*"))
        rank0 = sorted((p for p in ranks if p.name.rsplit("_", 2)[-2] == "0"),
                       key=lambda p: (-_job_number(p), p.suffix != ".out"))
        preferred = [p for p in [self.path / TRAINER_LOG, *rank0] if p.is_file()]
        own = {p for pattern in LOG_PATTERNS for p in self.path.rglob(pattern)
               if p.is_file() and p.name not in RECORDS and p.parent.name != FAILURES}
        return preferred + sorted((own | set(ranks)) - set(preferred))

    def log_texts(self) -> dict[Path, str]:
        """log_files() with their text (an unreadable one raises: a report must not silently skip it)."""
        return {path: _read(path) for path in self.log_files()}


# srun --label's prefix: the task number, right-aligned to the width of the largest one, then ": " (Slurm's srun(1),
# -l/--label). The rendered script's ranks share one log, so its srun labels every line (toolkit.slurm.render).
_SRUN_LABEL = re.compile(r"^ *(\d+): ")


def task_lines(lines: Iterable[str], task: int) -> Iterator[str]:
    """Task `task`'s lines of an srun --label log without their label, and the lines no task wrote (the batch
    shell's and srun's own, such as `srun: error: ... task 3: Exited`), so that no error is hidden; the other
    tasks' lines are left out. A log without labels (a run dir from before labels) passes whole."""
    for line in lines:
        label = _SRUN_LABEL.match(line)
        if label is None:
            yield line
        elif int(label.group(1)) == task:
            yield line[label.end():]


# toolkit.job.user_main.announce_restart's line (after srun's label in the rendered script's one log)
TORCHRUN_RESTART = re.compile(r"hpc: torchrun restart (?P<restart>\d+) of (?P<of>\S+) on (?P<node>[^\s:]+):")


def first_failed_task_on_node(lines: Iterable[str]) -> tuple[int, str] | None:
    """The first task srun reports as ended badly in a job's log, and its node (`srun: error: c2: task 3: Exited
    with exit code 3`, toolkit.node.spares.TASK_FAILED, as Slurm 22.05 to 26.05 print it): the first that exited
    by itself, before any that srun killed (`tasks 0-2: Killed`) once one had failed; None where srun reported
    none. srun prints these from its _task_finish (SchedMD/slurm src/plugins/launch/slurm/launch_slurm.c): an exit
    as an error, a signal only while the step is not being cancelled, so the first error line is the first
    failure."""
    from toolkit.node.spares import TASK_EXITED, TASK_FAILED

    killed = None
    for line in lines:
        found = TASK_FAILED.match(line.strip())
        if not found:
            continue
        task = (int(re.findall(r"\d+", found["tasks"])[0]), found["node"])
        if TASK_EXITED.match(found["what"]):
            return task
        killed = task if killed is None else killed
    return killed


def _job_number(path: Path) -> int:
    head = path.name.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise HpcError(f"cannot read log {path}: {exc.strerror}", fix="check the run dir's permissions") from None


def list_runs(root: Path | Iterable[Path] | None = None) -> list[RunDir]:
    """The run dirs (single runs and sweeps) in the runs root (or in each of several), oldest first."""
    roots = [root or runs_root()] if root is None or isinstance(root, Path) else list(root)
    found = {p.parent for r in roots if r.is_dir() for p in r.glob(f"*/{METADATA}")}
    return [RunDir(p) for p in sorted(found, key=lambda p: p.stat().st_mtime)]


def find_run(job_id: str, root: Path | Iterable[Path] | None = None) -> RunDir | None:
    """The run dir whose metadata names this job id (an array task "ID_N" maps to its array's run); a sweep is
    also found by its dir's name. Newest first: the job asked about is nearly always a recent one (each metadata
    read is a round trip on a shared file system, and `--wait` asks on every poll), and where two runs name the
    same id (a rebuilt cluster's Slurm counts from 1 again), the newer run is this cluster's."""
    base = job_id.split("_")[0]
    for run in reversed(list_runs(root)):
        meta = run.metadata() or Metadata()
        if base in meta.job_ids or (run.name == job_id and meta.kind == SWEEP):
            return run
    return None
