"""Pre-flight: before any rank starts, one task on every node of the job checks that the node has what its queue
promises, and a node that does not stops the job there, named with the check, instead of hanging the ranks.

    python3 BUNDLE preflight --run-dir DIR --promise JSON [--spares K] [--requeue] [--helper-partition Q]
                             [--loader=ARG]...

BUNDLE is the node-side package staged in the run dir (toolkit.node's contract: the node's own python3 >= 3.9,
standard library only); JSON is the queue's promise (toolkit.node.promise), resolved when the job was planned.

The job's set-up runs this in its batch shell (toolkit/slurm/templates/setup.sh.j2), never in a Slurm prolog: a
check that hangs there hangs the node (aws-parallelcluster#6777, the DCGM prolog on p4d/p5). It runs beside the
ranks' step, whose ranks wait at the gate until it has passed (--gate, toolkit.node.gate); with spares it runs
first, alone, since the supervisor starts its rounds from the verdict.
The step is `srun` with one task per node and the job's environment (its modules, venv and exports). Each task runs
node_check's and (where the queue's family names loader checks) loader_check's source with `python3 -c`, as
`hpc cluster doctor` does, so a node needs only a python3, and reports facts; this process judges them:

  - evaluate's checks against the queue's promise (GPU count and memory health, other accelerators, EFA devices,
    ib_uverbs, the FSx mount, NCCL and aws-ofi-nccl, the EFA stack), with the catalog's numbers for the instance
    type (in the promise);
  - the run dir (on the shared file system) written and read back from the node;
  - free memory (MemAvailable) and free disk where the job writes (the run dir, TMPDIR);
  - the dynamic loader's answer, in the job's environment, for the NCCL, net plugin or HCCL wrapper it loads.

Only FAIL counts. A node that fails stops the job with one line naming the node and the check, and a record in
<run dir>/preflight.jsonl (`hpc jobs status` shows it). Then:

  - with spares (toolkit.node.spares) and no more failed nodes than spares: the job goes on, its supervisor leaves
    them out;
  - with requeue on (training jobs), some nodes passing and fewer than MAX_REQUEUES requeues so far: the job is
    requeued with the failed nodes excluded. Slurm lets a job's ExcNodeList change only while it is pending
    (`scontrol update` on a running job: "Job is no longer pending execution"), and a requeue ends every process
    of the job. So the job is requeued held (`scontrol requeuehold`) and a one-task job of the user's,
    hpc-exclude-<job id> (on --helper-partition: the cluster's smallest queue, never an exclusive GPU node
    when a CPU queue exists), adds the nodes to its ExcNodeList and releases it. Nobody needs to be an operator; an
    admin drains the node with the line printed (ParallelCluster then replaces it);
  - otherwise (a benchmark, or every node failing the same way: the job's environment or the queue's, not a node)
    the job ends with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from . import gate, slurm, standalone_source
from .promise import Promise

# What judges the facts, records them and remembers them (evaluate imports node_check, and its imports) is
# imported once the step runs: the ranks wait at their gate for this process, and every node waits for its
# step to start (main).
if TYPE_CHECKING:
    from .evaluate import Check

STEP_TIMEOUT_S = 120  # the whole step; a node whose task did not report by then fails the "report" check
MIN_FREE_DISK = 1 << 30  # bytes free where the job writes (run dir, TMPDIR): less fails the node
MIN_AVAILABLE_MEMORY = 0.05  # of MemTotal: less means another job's (or a leak's) memory is still held
MAX_REQUEUES = 3  # requeues for failed pre-flights, per job: beyond, the failure is not one bad node's
EXCLUDE_WAIT_S = 300  # how long hpc-exclude-<job> retries until the held job is pending (KillWait, epilogs)


def _check(name: str, status: str, detail: str, fix: Optional[str] = None) -> Check:
    from .evaluate import Check

    return Check(name, status, detail, fix)  # type: ignore[arg-type]  # status is one of evaluate.Status


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def host_checks(facts: dict, run_dir: str) -> list:
    """What every job needs of a node whatever its queue: the run dir, memory and disk."""
    checks = []
    probe = facts.get("probe") or {}
    if probe.get("writable"):
        checks.append(_check("shared-fs", "ok", f"{run_dir} written and read back"))
    else:
        checks.append(_check("shared-fs", "FAIL", f"the run dir {run_dir} cannot be written from this node "
                                                  f"({probe.get('error') or 'no answer'})",
                             "the shared file system is not mounted here (or mounted read-only): check the node's "
                             "mounts (`findmnt`) against the others' and drain it until it is fixed"))
    memory = facts.get("memory") or {}
    total, available = memory.get("total"), memory.get("available")
    if total and available is not None:
        ok = available >= MIN_AVAILABLE_MEMORY * total
        checks.append(_check("memory", "ok" if ok else "FAIL", f"{_gib(available)} of {_gib(total)} available",
                             None if ok else "memory is held by something else on the node (a process left by an "
                                             "earlier job?): `ps aux --sort=-rss | head` there, or drain it"))
    for path, free in sorted((facts.get("disk") or {}).items()):
        if free is None:
            continue  # a missing run dir is shared-fs's failure
        ok = free >= MIN_FREE_DISK
        checks.append(_check("disk", "ok" if ok else "FAIL", f"{_gib(free)} free at {path}",
                             None if ok else f"free space at {path} (`df -h {path}`): the job writes logs, "
                                             "checkpoints and temporary files there"))
    return checks


def loader_checks(facts: dict | None) -> list:
    """The loader's answers for what the job loads (toolkit.node.loader_check facts)."""
    if facts is None:
        return []
    checks = []
    for lib in facts.get("libraries", []):
        if lib["resolves"] is None:
            continue
        if lib["library"] == "program":  # the job's program itself is missing: no library's fault
            checks.append(_check("program", "FAIL", lib.get("detail") or "the job's program is missing",
                                 "the recipe's launcher.program (or the program you ran) must be a file every node "
                                 "sees: a path on the shared file system, spelled as it is there"))
            continue
        where = f" ({lib['path']})" if lib.get("path") else ""
        checks.append(_check(
            f"loader:{lib['library']}", "ok" if lib["resolves"] else "FAIL",
            f"{lib['library']} {'resolves' if lib['resolves'] else 'does not resolve'}{where}"
            + (f": {lib['detail']}" if lib.get("detail") and not lib["resolves"] else ""),
            None if lib["resolves"] else "`hpc cluster doctor --recipe RECIPE` names the directory the job's "
                                         "environment lacks (software.library_path in the recipe)"))
    return checks


def judge(facts: dict, loader: Optional[dict], promise: Promise, run_dir: str) -> list:
    """Every check of one node, in the order printed."""
    from .evaluate import evaluate

    return [*evaluate(facts, promise), *host_checks(facts, run_dir), *loader_checks(loader)]


def parse_reports(stdout: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """(node -> node_check facts, node -> loader_check facts) from the step's JSON lines."""
    facts: dict[str, dict] = {}
    loaders: dict[str, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("node"):
            (loaders if "libraries" in report else facts)[report["node"]] = report
    return facts, loaders


def failures(reports: dict[str, dict], loaders: dict[str, dict], nodes: Sequence[str], promise: Promise,
             run_dir: str, step_error: Optional[str]) -> dict[str, list[dict]]:
    """Node -> its failed checks (as dicts); a node with no report fails the "report" check."""
    failed = {}
    for node in nodes:
        if node not in reports:
            failed[node] = [{"name": "report", "status": "FAIL",
                             "detail": f"no report from the node's task ({step_error or 'it printed nothing'})",
                             "fix": "the node cannot run a step or python3: see its slurmd log, or drain it"}]
            continue
        bad = [dataclasses.asdict(c) for c in judge(reports[node], loaders.get(node), promise, run_dir)
               if c.status == "FAIL"]
        if bad:
            failed[node] = bad
    return failed


def one_line(failed: dict[str, list[dict]]) -> str:
    """`c2: shared-fs: the run dir ... cannot be written ...; c5: gpus: 7 of 8 GPUs visible`."""
    return "; ".join(f"{node}: " + ", ".join(f"{c['name']}: {c['detail']}" for c in checks)
                     for node, checks in sorted(failed.items()))


def step_argv(nodes: int, run_dir: str, promise: Promise, loader_args: Sequence[str],
              job_python3: str = "", job_cpus: Sequence[int] = ()) -> List[str]:
    """One task per node: the node check, then (where the job loads NCCL or HCCL) the loader check, each one JSON
    line; in the job's environment (--export=ALL), never in a container (the node's own devices and mounts).
    `job_python3`: the interpreter behind the job's python3, where the batch shell's finder found it (else "").
    `job_cpus`: the job's CPUs on each node (slurm.cpus_per_node; empty where unknown)."""
    node_args = ["--json", "--probe", run_dir, "--disk", run_dir, "--disk", os.environ.get("TMPDIR") or "/tmp"]
    if promise.fsx_mount:
        node_args += ["--mount", promise.fsx_mount]
    # The node check runs on this interpreter (the batch shell's HPC_PYTHON: its own path, not a shim's; where a
    # node lacks that path, its python3). The loader check runs on the job's own python3, as the job's processes
    # load libraries (an interpreter's RPATH, a conda env's, takes part in dlopen's search): with -S (no
    # site-packages and their start-up) unless it asks where the job's torch is, which only site-packages say.
    # Both standard library only. The loader check runs beside the node check (a process substitution, read
    # after it): the ranks wait at their gate for the slower of the two, not for the sum. Where the finder's
    # interpreter is the job's python3 (`job_python3`), the loader check starts it by its own path: a pyenv or
    # asdf shim's start cost 0.1 CPU-s per node here, and the ranks wait for it (docs/start-up.md).
    loader = '"$lp" -c "$loader"' if "--torch-nccl" in loader_args else '"$lp" -S -c "$loader"'
    script = ('node="$1" loader="$2" count="$3" py="$4" lp="$5"; shift 5; [ -x "$py" ] || py=python3; '
              '[ -n "$lp" ] && [ -x "$lp" ] || lp=python3; ')
    if loader_args:
        script += f'exec 3< <({loader} --json "${{@:count+1}}"); '
    script += '"$py" -S -c "$node" "${@:1:count}"'
    if loader_args:  # the step's status stays the node check's (its report is the one a node cannot lack)
        script += '; status=$?; cat <&3; exit "$status"'
    words = [standalone_source("node_check"), standalone_source("loader_check"), str(len(node_args)),
             sys.executable or "python3", job_python3, *node_args, *loader_args]
    # --overlap: beside the ranks' step, which the batch shell starts at the same time and which holds every CPU
    # (and GPU) of the nodes; its ranks wait at the gate (toolkit.node.gate). Without it, whichever step comes
    # second waits for the first: a deadlock when the ranks' step is first. --overlap shares memory and GRES too
    # only from Slurm 22.05: with an older srun the batch shell runs this step first, alone (render.gate_lines).
    # Two CPUs where both checks run and every node of the job has two: under ParallelCluster's ConstrainCores
    # (cgroup.conf) a step's tasks run on the CPUs the step asked for, and on one CPU the two checks, meant to run
    # at once, took turns (the pre-flight's step took 0.37-0.41 s here instead of ~0.2 s). Never more than the job
    # has on a node: a step that asks for more is refused.
    cpus = 2 if loader_args and job_cpus and min(job_cpus) >= 2 else 1
    argv = ["srun", "--export=ALL", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}", "--kill-on-bad-exit=0", "--job-name=hpc-preflight"]
    if promise.is_gpu:  # every GPU, as the doctor asks: a step without them sees none (ConstrainDevices)
        argv.append(f"--gpus-per-node={promise.gpus}")
    return [*argv, "bash", "-c", script, "preflight", *words]


def start_step(argv: list[str]) -> subprocess.Popen | str:
    """The step, started (its output read by step_result), or why it could not start."""
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return str(exc)


def step_result(step: subprocess.Popen | str, timeout: float = STEP_TIMEOUT_S) -> tuple[str, str | None]:
    """(stdout, srun's complaint or None) of a started step."""
    if isinstance(step, str):
        return "", step
    try:
        out, err = step.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        step.kill()
        out, _ = step.communicate()
        return out or "", f"the step did not end within {timeout:.0f} s"
    lines = [line for line in err.splitlines() if line.strip()]
    return out, (lines[-1] if lines else f"srun exited {step.returncode}") if step.returncode else None


def excluded_now(job_id: str) -> list[str]:
    """The job's ExcNodeList (the user's --exclude and earlier pre-flights'), expanded."""
    match = re.search(r"\bExcNodeList=(\S+)", slurm.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout)
    return slurm.hostnames(match.group(1)) if match and match.group(1) != "(null)" else []


def exclude_job_argv(job_id: str, exclude: Sequence[str], partition: str | None, account: str | None) -> list[str]:
    """sbatch of hpc-exclude-<job>: once the held job is pending, add `exclude` to its ExcNodeList and release it.
    Its own output goes nowhere and it starts in /: it may run on the very node whose file system is missing."""
    import shutil

    scontrol = shutil.which("scontrol") or "scontrol"
    update = shlex.join([scontrol, "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}"])
    release = shlex.join([scontrol, "release", job_id])
    wrap = (f"for i in $(seq {EXCLUDE_WAIT_S}); do if {update} 2>/dev/null; then exec {release}; fi; sleep 1; "
            f"done; exit 1")
    argv = ["sbatch", "--parsable", f"--job-name=hpc-exclude-{job_id}", "--nodes=1", "--ntasks=1", "--time=10",
            "--chdir=/", "--output=/dev/null", "--no-requeue",
            "--export=" + ("SLURM_CONF" if os.environ.get("SLURM_CONF") else "NONE")]
    if partition:
        argv.append(f"--partition={partition}")
    if account:
        argv.append(f"--account={account}")
    return [*argv, "--wrap", wrap]


def requeue_excluding(job_id: str, failed: Sequence[str], helper_partition: str | None = None) -> str:
    """Requeue held, then hpc-exclude-<job> excludes `failed` and releases the job; returns what was done.
    `helper_partition`: where the helper goes (the cluster's smallest queue, chosen at plan time); None: the
    job's own partition."""
    exclude = sorted(set(excluded_now(job_id)) | set(failed))
    # The helper first: if it cannot be submitted, the job is not left held with nobody to release it.
    env = slurm.submit_env(os.environ)  # never this job's SLURM_* (sbatch would take its options)
    partition = helper_partition or os.environ.get("SLURM_JOB_PARTITION")
    helper = subprocess.run(exclude_job_argv(job_id, exclude, partition, os.environ.get("SLURM_JOB_ACCOUNT")),
                            capture_output=True, text=True, timeout=60, env=env)
    if helper.returncode != 0:
        raise RuntimeError(f"sbatch of hpc-exclude-{job_id} failed: {(helper.stderr or helper.stdout).strip()}")
    held = subprocess.run(["scontrol", "requeuehold", job_id], capture_output=True, text=True, timeout=60)
    if held.returncode != 0:
        subprocess.run(["scancel", helper.stdout.strip().split(";")[0]], capture_output=True, timeout=60)
        raise RuntimeError(f"scontrol requeuehold {job_id} failed: {(held.stderr or held.stdout).strip()}")
    return f"requeued, excluding {','.join(exclude)} (job {helper.stdout.strip()} excludes them and releases it)"


def awaiting_release(records: Sequence[dict], now: float | None = None) -> dict | None:
    """The record of a pre-flight that requeued its job held moments ago (hpc-exclude-<job> is about to release
    it), from that job's records (RunDir.preflights(job)), else None: a waiter should not take that hold for one
    that lasts."""
    last = records[-1] if records else None
    if last and str(last.get("action", "")).startswith("requeued") and \
            (now or time.time()) - float(last.get("time", 0)) < EXCLUDE_WAIT_S + 60:
        return last
    return None


def failure_line(record: dict) -> str:
    """`pre-flight FAILED on w2: shared-fs: ...; requeued, excluding w2 (...)`: a failed record in one line."""
    return f"pre-flight FAILED on {one_line(record['failed'])}; {record.get('action')}"


def summary_lines(records: Sequence[dict]) -> list[str]:
    """`hpc jobs status`'s lines for a job's pre-flights, one per start of the job."""
    lines = []
    for r in records:
        if not r.get("failed"):
            lines.append(f"  pre-flight: passed on {len(r.get('nodes') or [])} node(s) in {r.get('seconds', 0):.1f} s")
        else:
            lines.append(f"  pre-flight: FAILED on {one_line(r['failed'])}")
            lines.append(f"    then: {r.get('action')}")
    return lines


def say(text: str) -> None:
    print(f"hpc: pre-flight: {text}", flush=True)


def decide(failed: dict[str, list[dict]], nodes: Sequence[str], spares: int, requeue: bool,
           requeues_so_far: int, room: int | None = None) -> tuple[str, str]:
    """(what to do, why): "go" (all passed, or spares cover the failed nodes), "requeue" or "stop". `room`: the
    nodes the partition would have left for the job once the failed ones are excluded (None: not known)."""
    if not failed:
        return "go", "every node passed"
    if spares and len(failed) <= spares:
        return "go", f"the spares supervisor leaves {', '.join(sorted(failed))} out"
    if len(nodes) > 1 and len(failed) == len(nodes):
        # the job's environment or the queue's, which no other node fixes
        return "stop", "every node fails: the job's environment or the queue's, not a node's"
    if len(failed) == len(nodes) and all(c["name"].startswith("loader:") or c["name"] == "program"
                                         for cs in failed.values() for c in cs):
        return "stop", "what the job runs or loads is missing in its environment (its set-up's doing on any node)"
    if not requeue:
        return "stop", "a benchmark is not requeued"
    if room is not None and room < len(nodes):
        return "stop", f"excluding {', '.join(sorted(failed))} would leave the partition {room} node(s) for it"
    if requeues_so_far >= MAX_REQUEUES:
        return "stop", f"{requeues_so_far} requeue(s) for failed pre-flights already"
    return "requeue", "requeue without the failed nodes"


def job_reference() -> str:
    """The id scontrol takes for this job: ARRAY_TASK for a task of a job array (a sweep), whose SLURM_JOB_ID may
    be the array's own id, else SLURM_JOB_ID."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]


def room_after_excluding(job_id: str, partition: str, failed: Sequence[str]) -> int | None:
    """The partition's nodes that the job could still get once `failed` and its ExcNodeList are excluded."""
    try:
        res = subprocess.run(["scontrol", "show", "partition", "-o", partition], capture_output=True, text=True,
                             timeout=30)
        match = re.search(r"\bNodes=(\S+)", res.stdout)
        if not match:
            return None
        return len(set(slurm.hostnames(match.group(1))) - set(excluded_now(job_id)) - set(failed))
    except (OSError, subprocess.SubprocessError, slurm.SlurmCommandError):  # a slow controller: decide without it
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 BUNDLE preflight", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--promise", required=True, type=Promise.from_json, help="the queue's promise (JSON)")
    parser.add_argument("--partition", default=os.environ.get("SLURM_JOB_PARTITION"))
    parser.add_argument("--helper-partition", default=None,
                        help="where hpc-exclude-<job> goes (default: the job's partition)")
    parser.add_argument("--spares", type=int, default=0)
    parser.add_argument("--requeue", action="store_true", help="requeue excluding failed nodes (training jobs)")
    parser.add_argument("--loader", action="append", default=[], help="a loader_check argument (repeatable)")
    parser.add_argument("--job-python3", default="",
                        help="the interpreter behind the job's python3, where the batch shell's finder found it")
    parser.add_argument("--gate", default=None,
                        help="the gate file the ranks wait on (toolkit.node.gate): GO is written there once every "
                             "node passed and the records are written")
    args = parser.parse_args(argv)
    start = time.monotonic()
    promise: Promise = args.promise
    # the step first (its node count is Slurm's own; the names follow while it runs), then the rest of the work
    count = int(os.environ.get("SLURM_JOB_NUM_NODES") or 0)
    job_cpus = slurm.cpus_per_node(os.environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    step = start_step(step_argv(count, args.run_dir, promise, args.loader, args.job_python3, job_cpus)) \
        if count else None
    nodes = slurm.hostnames(os.environ["SLURM_JOB_NODELIST"])
    if step is None or count != len(nodes):  # no SLURM_JOB_NUM_NODES (or one that disagrees): from the names
        if isinstance(step, subprocess.Popen):
            step.kill()
            step.wait()
        step = start_step(step_argv(len(nodes), args.run_dir, promise, args.loader, args.job_python3, job_cpus))
    from . import ledger
    from .records import PREFLIGHTS, append_record, job_records

    job_id = job_reference()
    partition = args.partition or promise.queue
    stdout, step_error = step_result(step)
    reports, loaders = parse_reports(stdout)
    failed = failures(reports, loaders, nodes, promise, args.run_dir, step_error)
    records = Path(args.run_dir) / PREFLIGHTS
    earlier = [r for r in job_records(records, job_id) if str(r.get("action", "")).startswith("requeued")]
    room = room_after_excluding(job_id, partition, sorted(failed)) if failed and args.requeue else None
    action, why = decide(failed, nodes, args.spares, args.requeue, len(earlier), room)
    seconds = round(time.monotonic() - start, 2)
    record = {"job": job_id, "time": time.time(), "seconds": seconds, "nodes": nodes, "failed": failed,
              "left_out": sorted(failed) if action == "go" else []}
    if not failed:
        say(f"{len(nodes)} node(s) passed in {seconds:.1f} s")
        record["action"] = "passed"
    elif action == "go":
        say(f"FAILED on {one_line(failed)}; {why}")
        record["action"] = "left out for spares"
    elif action == "requeue":
        try:
            record["action"] = requeue_excluding(job_id, sorted(failed), args.helper_partition)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            record["action"] = f"stopped: the requeue failed: {exc}"
            action = "stop"
        say(f"FAILED on {one_line(failed)}; job {job_id} {record['action']}")
    else:
        record["action"] = f"stopped: {why}"
        say(f"FAILED on {one_line(failed)}; job {job_id} stops ({why})")
    if failed:
        for node, checks in sorted(failed.items()):
            for check in checks:
                if check.get("fix"):
                    say(f"{node}: {check['name']}: fix: {check['fix']}")
        say("an admin takes a node out with: scontrol update NodeName=NODE State=DRAIN Reason='hpc pre-flight'")
    try:
        append_record(records, record)
    except OSError as exc:  # e.g. the batch host is the node without the shared file system
        say(f"could not record in {args.run_dir}: {exc}")
    # after the run's records (a rank that starts finds the records of the pre-flight it passed), before the
    # fleet's ledger, which no rank reads
    if action == "go" and args.gate:
        try:
            gate.open_gate(args.gate)
        except OSError as exc:
            say(f"could not open the ranks' gate {args.gate}: {exc}; job {job_id} stops")
            action = "stop"
    ledger.record_preflight(record, promise.instance_type)  # the fleet's memory across jobs ($HPC_FLEET_DIR)
    return 0 if action == "go" else 1


if __name__ == "__main__":
    sys.exit(main())
