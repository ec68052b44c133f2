"""The fleet's memory on the planning side: where the node ledger is (toolkit.node.ledger writes it), each node's
record, the quarantine policy, what a new job leaves out, and the drain plan of `hpc cluster nodes --apply`.

The ledger is <fleet dir>/ledger/*.jsonl; the fleet dir is $HPC_FLEET_DIR, else <the cluster config's FSx mount, or
its first SharedStorage MountDir>/hpc-fleet: one place per cluster, on storage every node and the login node share.

The policy is <fleet dir>/policy.yaml (an admin's; every key optional, DEFAULT_POLICY otherwise):

    strikes: 2            # a node is suspected at this many strikes ...
    window_hours: 24      # ... within this many hours
    kinds: [hardware, lost, performance]   # the strikes that count (software: the job's doing as often as not)

A strike is a failed verdict (a failed pre-flight check, a lost node, a failed probe, a straggler or hang finding,
a bad-node-search verdict). Once suspected, a node stays so until it passes a fresh pre-flight or search, or an
admin clears it (`hpc cluster nodes --clear NODE`): passes before that are ordinary healthy runs, so a node that
fails now and then between good runs still collects its strikes.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from toolkit.errors import HpcError
from toolkit.node import ledger

POLICY_FILE = "policy.yaml"


@dataclasses.dataclass(frozen=True)
class Policy:
    strikes: int = 2
    window_hours: float = 24.0
    kinds: tuple[str, ...] = (ledger.HARDWARE, ledger.LOST, ledger.PERFORMANCE)

    def describe(self) -> str:
        return f"{self.strikes} strike(s) of kind {'/'.join(self.kinds)} within {self.window_hours:g} h"


DEFAULT_POLICY = Policy()


def fleet_dir(queue: Any = None) -> Path | None:
    """$HPC_FLEET_DIR, else <shared storage>/hpc-fleet of `queue`'s cluster config (toolkit.cluster.queues.Queue read
    from one), else of this cluster's config (cluster_config_candidates), else None: no ledger."""
    if os.environ.get(ledger.FLEET_DIR_ENV):
        return Path(os.environ[ledger.FLEET_DIR_ENV])
    if queue is None:
        from toolkit.cluster.queues import cluster_config_candidates, load_queues

        path = next((p for p in cluster_config_candidates() if p.is_file()), None)
        if path is None:
            return None
        try:
            queue = next(iter(load_queues(path).values()), None)
        except HpcError:
            return None
    where = ledger.planned_fleet_dir(os.environ, shared_mount(queue))
    return Path(where) if where else None


def shared_mount(queue: Any) -> str | None:
    """The shared storage of a queue read from a cluster config: its FSx, else its first SharedStorage MountDir."""
    if queue is None or not queue.from_config:
        return None
    return queue.fsx_mount or next(iter(queue.shared_mounts), None)


def load_policy(fleet: Path | None) -> Policy:
    """The fleet dir's policy.yaml over the defaults; a bad file is one clear error."""
    path = fleet / POLICY_FILE if fleet else None
    if path is None or not path.is_file():
        return DEFAULT_POLICY
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HpcError(f"cannot read the quarantine policy {path}: {exc}", fix="fix or remove the file") from None
    known = {f.name for f in dataclasses.fields(Policy)}
    if not isinstance(data, dict) or set(data) - known:
        raise HpcError(f"{path}: unknown keys {sorted(set(data) - known) if isinstance(data, dict) else data!r}",
                       fix=f"use only {', '.join(sorted(known))}")
    try:
        kinds = tuple(data.get("kinds", DEFAULT_POLICY.kinds))
        policy = Policy(strikes=int(data.get("strikes", DEFAULT_POLICY.strikes)),
                        window_hours=float(data.get("window_hours", DEFAULT_POLICY.window_hours)), kinds=kinds)
    except (TypeError, ValueError) as exc:
        raise HpcError(f"{path}: {exc}", fix="strikes: a whole number, window_hours: hours, kinds: a list") from None
    if policy.strikes < 1 or policy.window_hours <= 0 or set(kinds) - set(ledger.KINDS):
        raise HpcError(f"{path}: strikes >= 1, window_hours > 0 and kinds of {', '.join(ledger.KINDS)}",
                       fix="correct the policy file")
    return policy


@dataclasses.dataclass
class NodeRecord:
    node: str
    passes: int = 0  # healthy verdicts (pre-flights passed, search verdicts)
    strikes: list[dict] = dataclasses.field(default_factory=list)  # counted strikes since the last clearing
    last_seen: float | None = None
    suspect: bool = False
    cleared: float | None = None  # when a fresh pass or an admin last cleared it
    slurm_state: str = "unknown"

    def to_json(self, policy: Policy, now: float) -> dict:
        window = [s for s in self.strikes if now - s["time"] <= policy.window_hours * 3600]
        return {"node": self.node, "healthy_runs": self.passes, "strikes": len(window),
                "strikes_total": len(self.strikes), "suspect": self.suspect, "last_seen": self.last_seen,
                "cleared": self.cleared, "slurm_state": self.slurm_state,
                "evidence": [{k: s.get(k) for k in ("time", "job", "source", "check", "kind", "evidence")}
                             for s in window]}


def run_fleet_dir(run_dir: Path) -> Path | None:
    """The fleet ledger a run's job recorded in (its plan's `fleet ledger`, toolkit.slurm.materialize), else
    fleet_dir(): a report made elsewhere still records where the job's own findings went."""
    from toolkit.rundir import RunDir

    found = next((d.get("value") for d in RunDir(Path(run_dir)).derived() if d.get("key") == "fleet ledger"), None)
    return Path(found) if found else fleet_dir()


def record_stragglers(stragglers: Mapping[str, Any], job: str | None, where: Path | None) -> list[str]:
    """A straggler verdict's findings in the fleet's ledger: a `performance` strike for the node of each slow rank
    (once per job and node: node_records counts a finding reported again once). The nodes recorded."""
    if where is None or not job:
        return []
    slow: dict[str, list[Mapping[str, Any]]] = {}
    for rank in stragglers.get("ranks") or []:
        if rank.get("slow"):
            slow.setdefault(str(rank["node"]), []).append(rank)
    recorded = []
    for node, ranks in sorted(slow.items()):
        evidence = "; ".join(f"rank {r['rank']}: own work {r['vs_baseline']:.2f}x the faster ranks' "
                             f"({r.get('cause') or '?'}), over the line in {r.get('windows_over')} of "
                             f"{r.get('windows')} windows" for r in ranks)
        cause = next((str(r["cause"]) for r in ranks if r.get("cause")), "own-work")
        if ledger.record_finding(node, "straggler", cause, ledger.PERFORMANCE, evidence, job=job, fleet=where):
            recorded.append(node)
    return recorded


def node_records(records: Iterable[Mapping[str, Any]], policy: Policy,
                 now: float | None = None) -> dict[str, NodeRecord]:
    """Each node's record from the ledger, oldest record first (ledger.read's order)."""
    now = time.time() if now is None else now
    window = policy.window_hours * 3600
    nodes: dict[str, NodeRecord] = {}
    for r in records:
        if r.get("type") != "node" or not r.get("node"):
            continue
        n = nodes.setdefault(str(r["node"]), NodeRecord(str(r["node"])))
        when = float(r["time"])
        n.last_seen = max(n.last_seen or when, when)
        if r.get("verdict") == ledger.PASS:
            n.passes += 1
            if r.get("source") in ledger.CLEARING_SOURCES and (n.suspect or r.get("source") == "admin"):
                n.strikes, n.suspect, n.cleared = [], False, when
        elif r.get("verdict") == ledger.FAIL and r.get("kind") in policy.kinds:
            if r.get("job") is not None and any((s.get("job"), s.get("source"), s.get("check")) ==
                                                (r.get("job"), r.get("source"), r.get("check")) for s in n.strikes):
                continue  # one strike per job and check: a finding reported again (hpc report run twice) is one
            n.strikes.append(dict(r))
            recent = [s for s in n.strikes if when - s["time"] <= window]
            n.suspect = n.suspect or len(recent) >= policy.strikes
    for n in nodes.values():  # a suspicion whose strikes all aged out of the window lapses
        if n.suspect and not any(now - s["time"] <= window for s in n.strikes):
            n.suspect = False
    return nodes


def suspects(fleet: Path | None, now: float | None = None) -> dict[str, str]:
    """node -> why, for every node the policy names (empty without a ledger)."""
    if fleet is None:
        return {}
    policy = load_policy(fleet)
    return {name: evidence_line(n) for name, n in sorted(node_records(ledger.read(fleet), policy, now).items())
            if n.suspect}


def evidence_line(n: NodeRecord) -> str:
    """`2 strikes: job 12 preflight shared-fs: ...; job 13 straggler compute: ...` (Slurm's drain reason)."""
    parts = [f"job {s.get('job')} {s.get('source')} {s.get('check')}: {s.get('evidence')}" for s in n.strikes[-3:]]
    return f"{len(n.strikes)} strike(s): " + "; ".join(parts)


def slurm_states() -> dict[str, str]:
    """node -> its Slurm state (sinfo %T), or empty where Slurm is not here or does not answer."""
    from toolkit.slurm.commands import run, slurm_installed

    if not slurm_installed():
        return {}
    try:
        out = run(["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=20).stdout
    except HpcError:
        return {}
    return dict(tuple(line.split()[:2]) for line in out.splitlines() if len(line.split()) >= 2)


def drain_plan(found: Mapping[str, str]) -> list[list[str]]:
    """`scontrol update ... State=DRAIN Reason=...` per suspected node, as find-bad-nodes --apply does."""
    from toolkit.health.nodesearch import drain_commands

    return drain_commands(dict(found), by="hpc cluster nodes")


@dataclasses.dataclass(frozen=True)
class Avoidance:
    excluded: tuple[str, ...]  # what the job's --exclude gets
    kept: tuple[str, ...]  # suspects left in: excluding them would leave too few nodes
    why: dict[str, str]


def avoidance(found: Mapping[str, str], partition: str, needed: int,
              states: Mapping[str, str] | None = None) -> Avoidance:
    """Which suspects a job of `needed` nodes on `partition` leaves out: those of the partition, never so many that
    fewer than `needed` usable nodes remain (the worst, by strike count in their evidence, go first)."""
    from toolkit.health.doctor import partition_nodes, unusable

    if not found:
        return Avoidance((), (), {})
    if states is None:
        try:
            states = dict(partition_nodes(partition))
        except HpcError:  # no Slurm here (a plan made off the cluster): exclude what the ledger names
            return Avoidance(tuple(sorted(found)), (), dict(found))
    usable = [n for n, s in states.items() if not unusable(s)]
    mine = [n for n in found if n in usable]
    room = max(0, len(usable) - needed)

    def strikes(node: str) -> int:
        return int(found[node].split(" ", 1)[0]) if found[node][:1].isdigit() else 0

    ordered = sorted(mine, key=lambda n: (-strikes(n), n))
    return Avoidance(tuple(sorted(ordered[:room])), tuple(sorted(ordered[room:])), {n: found[n] for n in mine})


def clear_record(node: str, who: str = "admin") -> dict:
    return ledger.node_record(node, "admin", ledger.PASS, "cleared", None, f"cleared by {who}")


def merge_exclude(options: Mapping[str, str | None], nodes: Sequence[str]) -> dict[str, str | None]:
    """sbatch options with `nodes` added to --exclude."""
    have = [n for n in (options.get("exclude") or "").split(",") if n]
    return {**options, "exclude": ",".join(dict.fromkeys([*have, *nodes]))}


def nodes_report(where: Path | None, states: Mapping[str, str] | None = None, now: float | None = None) -> dict:
    """`hpc cluster nodes`' answer: every node the ledger or Slurm knows, its record and Slurm state, the
    policy, the suspects and their drain plan."""
    if where is None:
        raise HpcError("no fleet dir: the node ledger lives on the cluster's shared storage",
                       fix=f"set {ledger.FLEET_DIR_ENV}=DIR, or give a cluster config with SharedStorage (--cluster)")
    now = time.time() if now is None else now
    policy = load_policy(where)
    records = node_records(ledger.read(where), policy, now)
    states = slurm_states() if states is None else states
    for name in states:
        records.setdefault(name, NodeRecord(name))
    for name, n in records.items():
        n.slurm_state = states.get(name, "unknown")
    found = {name: evidence_line(n) for name, n in records.items() if n.suspect}
    return {"fleet_dir": str(where), "policy": dataclasses.asdict(policy),
            "nodes": [records[name].to_json(policy, now) for name in sorted(records)],
            "suspects": found, "drain_plan": [shlex.join(c) for c in drain_plan(found)], "applied": False}


def search_records(rows: Sequence[Mapping[str, Any]], bad: Mapping[str, str], job: str | None) -> list[dict]:
    """The ledger's records of a bad-node search (toolkit.health.nodesearch.node_rows): a strike per bad node,
    a pass per node that ran at full speed (it clears a suspected node); unresolved and software verdicts say
    nothing about the node itself."""
    out = []
    for row in rows:
        node, verdict = str(row["node"]), row.get("verdict")
        if node in bad:
            out.append(ledger.node_record(node, "nodesearch", ledger.FAIL, "all_reduce", ledger.PERFORMANCE,
                                          str(bad[node]), job))
        elif verdict == "ok":
            busbw = row.get("busbw")
            out.append(ledger.node_record(node, "nodesearch", ledger.PASS, "all_reduce", None,
                                          f"busbw {busbw:.3g} GB/s" if busbw is not None else "passed", job))
    return out
