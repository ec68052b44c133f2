"""The node ledger: what every job learned about the cluster's nodes, kept on the cluster's shared file system
across jobs (pre-flight verdicts, lost nodes and probes under spares, straggler and hang findings, bad-node-search
verdicts), and the fleet's own collective bandwidth samples. `hpc cluster nodes` reads it; the planner leaves the
nodes its policy names out of new jobs (toolkit.health.fleet).

Where: $HPC_FLEET_DIR. The planner resolves it (toolkit.health.fleet.fleet_dir: $HPC_FLEET_DIR, else
<the cluster config's FSx, or its first SharedStorage MountDir>/hpc-fleet) and exports it to the job's environment;
without it nothing is recorded. Node-side code (standard library, Python 3.9: toolkit.node's contract).

Safe for many writers on many nodes, NFS and Lustre included, where O_APPEND from several clients to one file is
not atomic: every writing process has a file of its own, <fleet>/ledger/<host>-<pid>-<job>.jsonl, and writes each
record as one complete line in one write(). Readers merge every file, oldest record first, and skip a line that
does not parse (a torn last line of a writer that died mid-write). Nothing is ever rewritten: clearing a node is a
record too. Records carry job, time, node, check, kind and evidence: no credentials, no account.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

FLEET_DIR_ENV = "HPC_FLEET_DIR"
FLEET_SUBDIR = "hpc-fleet"  # under the cluster's shared storage, where no $HPC_FLEET_DIR says otherwise
LEDGER = "ledger"  # <fleet>/ledger/*.jsonl: one file per writing process
VERSION = 1

# What a record says about a node. A strike is a "fail"; a "pass" of a clearing source vouches for the node.
PASS, FAIL = "pass", "fail"
# kinds: what the evidence points at (the quarantine policy counts some of them)
HARDWARE, SOFTWARE, PERFORMANCE, LOST = "hardware", "software", "performance", "lost"
KINDS = (HARDWARE, SOFTWARE, PERFORMANCE, LOST)
# sources whose pass clears a suspected node: the pre-flight checks the node whole, the search measures it, an
# admin's `hpc cluster nodes --clear` says it was repaired
CLEARING_SOURCES = ("preflight", "nodesearch", "admin")


def fleet_dir(environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The ledger's fleet dir for this job ($HPC_FLEET_DIR), or None: nothing is recorded."""
    value = (os.environ if environ is None else environ).get(FLEET_DIR_ENV)
    return Path(value) if value else None


def planned_fleet_dir(environ: Mapping[str, str], shared_mount: Optional[str]) -> Optional[str]:
    """Where a job's ledger is, decided when it is planned: $HPC_FLEET_DIR, else <shared_mount>/hpc-fleet (the
    cluster config's FSx, or its first SharedStorage MountDir), else None."""
    if environ.get(FLEET_DIR_ENV):
        return environ[FLEET_DIR_ENV]
    return shared_mount.rstrip("/") + "/" + FLEET_SUBDIR if shared_mount else None


def _writer_name(job: Optional[str]) -> str:
    """This process's own file: no other process on any node ever appends to it."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{socket.gethostname()}-{os.getpid()}-{job or 'nojob'}")
    return f"{tag}.jsonl"


def ledger_dir(fleet: Path) -> Path:
    return Path(fleet) / LEDGER


def write(fleet: Path, entries: Iterable[Mapping[str, Any]], job: Optional[str] = None) -> int:
    """Append `entries` to this process's file of the ledger, each one line in one write(); returns how many.
    The dirs are made world-writable with the sticky bit (as /tmp): every user's jobs write their own files."""
    lines = [json.dumps({"v": VERSION, **entry}, sort_keys=True, separators=(",", ":")) + "\n" for entry in entries]
    if not lines:
        return 0
    where = ledger_dir(fleet)
    for path in (Path(fleet), where):
        if not path.is_dir():
            try:
                path.mkdir(mode=0o1777)
                os.chmod(path, 0o1777)  # mkdir's mode passes through the umask
            except FileExistsError:  # another writer made it first
                pass
    fd = os.open(str(where / _writer_name(job)), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for line in lines:
            data = line.encode()
            while data:  # a regular file takes it whole; a short write is still this writer's own, in order
                data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return len(lines)


def read(fleet: Path) -> List[Dict[str, Any]]:
    """Every record of every writer, oldest first; torn or foreign lines skipped."""
    found: List[Dict[str, Any]] = []
    for path in sorted(ledger_dir(fleet).glob("*.jsonl")):
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        lines = text.split("\n")
        for line in lines[:-1]:  # the last piece is "" after a complete line, else a torn line: skipped
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("time"), (int, float)):
                found.append(entry)
    found.sort(key=lambda e: e["time"])
    return found


def node_record(node: str, source: str, verdict: str, check: str, kind: Optional[str], evidence: str,
                job: Optional[str] = None, when: Optional[float] = None, **extra: Any) -> Dict[str, Any]:
    """One record about one node."""
    if verdict not in (PASS, FAIL):
        raise ValueError(f"verdict {verdict!r}: {PASS} or {FAIL}")
    if verdict == FAIL and kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    return {"type": "node", "time": time.time() if when is None else when, "job": job, "node": node,
            "source": source, "verdict": verdict, "check": check, "kind": kind, "evidence": evidence[:500], **extra}


def record_finding(node: str, source: str, check: str, kind: str, evidence: str, job: Optional[str] = None,
                   fleet: Optional[Path] = None, verdict: str = FAIL, **extra: Any) -> bool:
    """The one call for any code that found something about a node (stragglers, the hang diagnosis, ...):
    e.g. record_finding("c2", "straggler", "compute", "performance", "ranks 2-3 1.8x the others' compute",
    job="1234"). `fleet`: default $HPC_FLEET_DIR. Returns False (and records nothing) without a fleet dir or when
    it cannot be written: a job never fails for its ledger."""
    fleet = fleet if fleet is not None else fleet_dir()
    if fleet is None:
        return False
    try:
        write(fleet, [node_record(node, source, verdict, check, kind, evidence, job, **extra)], job)
    except OSError:
        return False
    return True


def preflight_kind(check: str) -> str:
    """What a failed pre-flight check points at: what the job loads is software, the rest is the node's own."""
    # the job's own program missing is the job's doing, as what it loads is: never a strike against the node
    return SOFTWARE if check.startswith("loader:") or check == "program" else LOST if check == "report" else HARDWARE


def preflight_records(record: Mapping[str, Any], instance_type: Optional[str] = None) -> List[Dict[str, Any]]:
    """The ledger's records of one pre-flight (toolkit.node.preflight's record): a pass per passing node, a strike
    per failed check. A job where every node failed (its environment, not a node) strikes no node."""
    job, when = record.get("job"), float(record.get("time") or time.time())
    failed: Mapping[str, Sequence[Mapping[str, Any]]] = record.get("failed") or {}
    nodes = list(record.get("nodes") or [])
    everyone = len(nodes) > 1 and set(failed) >= set(nodes)
    out = []
    for node in nodes:
        if node not in failed:
            out.append(node_record(node, "preflight", PASS, "preflight", None, "every check passed", job, when,
                                   instance_type=instance_type))
        elif not everyone:
            for check in failed[node]:
                name = str(check.get("name"))
                out.append(node_record(node, "preflight", FAIL, name, preflight_kind(name),
                                       str(check.get("detail") or ""), job, when, instance_type=instance_type))
    return out


def record_preflight(record: Mapping[str, Any], instance_type: Optional[str] = None,
                     fleet: Optional[Path] = None) -> int:
    """The pre-flight's hook: its verdicts per node into the ledger (nothing without a fleet dir)."""
    fleet = fleet if fleet is not None else fleet_dir()
    if fleet is None:
        return 0
    try:
        return write(fleet, preflight_records(record, instance_type), str(record.get("job")))
    except OSError:
        return 0


def spares_records(entry: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The ledger's records of a spares supervisor's restarts.jsonl entry: a node lost under spares (a restart
    whose node's probe failed or whose ranks went silent) and a failed probe."""
    job, when, kind = entry.get("job_id"), float(entry.get("time") or time.time()), entry.get("kind")
    if kind == "probe":
        return [node_record(n, "probe", FAIL, "probe", LOST, str(entry.get("why") or ""), job, when)
                for n in entry.get("nodes") or []]
    if kind == "restart":
        why = str(entry.get("why") or "")
        return [node_record(n, "spares", FAIL, "lost", LOST, f"{why} ({entry.get('trigger')})", job, when)
                for n in entry.get("nodes") or []]
    return []


def record_spares(entry: Mapping[str, Any], fleet: Optional[Path] = None) -> int:
    """The spares supervisor's hook (toolkit.node.spares: each restart and probe record)."""
    fleet = fleet if fleet is not None else fleet_dir()
    if fleet is None:
        return 0
    try:
        return write(fleet, spares_records(entry), str(entry.get("job_id")))
    except OSError:
        return 0


def baseline_record(instance_type: str, nodes: int, test: str, size: int, busbw_gbs: float,
                    job: Optional[str] = None, source: str = "collectives", hosts: Sequence[str] = (),
                    when: Optional[float] = None) -> Dict[str, Any]:
    """One collective run's bus bandwidth at one message size, for the fleet's baseline of its instance type and
    node count (toolkit.health.fleet.baseline)."""
    return {"type": "baseline", "time": time.time() if when is None else when, "job": job, "source": source,
            "instance_type": instance_type, "nodes": nodes, "test": test, "size": size, "busbw_gbs": busbw_gbs,
            "hosts": list(hosts)}
