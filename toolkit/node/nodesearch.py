"""The bad-node search inside its batch job (`hpc cluster find-bad-nodes`, toolkit.health.nodesearch submits it):
group testing with short collectives instead of all pairs (16 nodes: 120 pair runs; here 2 to 5 rounds of
concurrent runs).

    "$HPC_PYTHON" BUNDLE nodesearch --run-dir DIR --python PY --ranks-per-node R [--gpus-per-node G] ...

runs in the batch shell of a job holding the nodes, in the collectives job's environment (its software activated,
its EFA/NCCL variables exported: toolkit.health.nodesearch renders it), with only the node's python3. Each round
runs one short all_reduce (toolkit.workloads.collectives, nccl-tests' table and bus bandwidth, under the job's
own python PY) per group of nodes, with one rank per device of each node as a collectives job has them, every
group of the round at once as its own job step on its own nodes:

  1. the nodes in groups of G (default 2: pairs);
  2. each group that failed, or whose bus bandwidth is below (1 - T) x the round's best, is split in halves, and
     every half is filled up to the round's group size with nodes already found healthy (a half of one node could
     not run a collective alone; the same size keeps bus bandwidths comparable); a group of healthy nodes of
     that size runs beside them as the round's control;
  3. until the slow groups are single nodes (with healthy partners): those are the bad nodes.

One bad node among N takes 1 + ceil(log2 G) rounds: 2 with pairs, ceil(log2 N) with G = N/2 (plain
bisection); then one more round runs each node found bad with another healthy partner, so that one noisy run is
no verdict. The goal is ceil(log2 N) + 2. Slowness is relative to the best group of the same round, so a cluster
slow everywhere looks healthy: --min-busbw sets an absolute floor.

Each rank first imports torch (and, on GPUs, loads NCCL) and says on one line (IMPORT_MARK, JSON) when it cannot:
such a node is named at once (`software`: "torch does not import on c3: ..."), left out of the later rounds and
not counted bad, since a wrong or missing venv on the nodes is no hardware fault to drain. Each round is a line
of <run dir>/rounds.jsonl as it ends, the answer <run dir>/search.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import records, slurm

ROUNDS_FILE = "rounds.jsonl"
RESULT_FILE = "search.json"
PORT_BASE, PORT_SPAN = 21000, 20000  # each group's rendezvous port: concurrent groups share one network here
COLLECTIVE_MODULE = "toolkit.workloads.collectives"
IMPORT_MARK = "hpc-find-bad-nodes: import failed:"  # a rank's line: this mark, then JSON (node, kind, python, error)
# what each kind of import failure is called in the answer
IMPORT_WHAT = {"torch": "torch does not import", "nccl": "NCCL (torch's) does not load",
               "toolkit": f"the toolkit's {COLLECTIVE_MODULE} does not import"}
SOFTWARE_FIX = ("the nodes' python must have torch (with NCCL on GPU queues) and this toolkit: install them in the "
                "venv the nodes use, on a file system every node mounts, or point --venv at one that has them")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)", re.MULTILINE)  # nccl-tests' footer line

# Each rank's first code, under the job's python (`python -c PROBE DEVICE ARGS...`): torch, NCCL on GPUs and the
# collectives module's package must import, else one IMPORT_MARK line and exit 3; then the collective. Python 3.8
# syntax: an accelerator vendor's venv may be that old.
PROBE = """\
import json, os, socket, sys, time
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]  # Slurm's name, as the search's
def failed(kind, exc):
    sys.stderr.write(%(mark)r + " " + json.dumps({"node": node, "kind": kind,
                     "python": sys.executable, "error": "%%s: %%s" %% (type(exc).__name__, exc)}) + "\\n")
    sys.stderr.flush()
    time.sleep(3)  # srun --kill-on-bad-exit ends the step at the first exit: the other nodes' ranks report first
    os._exit(3)
device = sys.argv[1]
try:
    import torch
    import torch.distributed
except BaseException as exc:
    failed("nccl" if "nccl" in str(exc).lower() else "torch", exc)
if device == "cuda":
    try:
        if not torch.distributed.is_nccl_available():
            raise ImportError("this torch was built without the NCCL backend")
        torch.cuda.nccl.version()
    except BaseException as exc:
        failed("nccl", exc)
try:
    import importlib.util
    if importlib.util.find_spec(%(module)r) is None:
        raise ImportError("No module named %(module)r in this python")
except BaseException as exc:
    failed("toolkit", exc)
import runpy
sys.argv = [%(module)r] + sys.argv[2:]
runpy.run_module(%(module)r, run_name="__main__", alter_sys=True)
""" % {"mark": IMPORT_MARK, "module": COLLECTIVE_MODULE}


@dataclasses.dataclass(frozen=True)
class GroupRun:
    """One collective over `nodes`: its bus bandwidth (GB/s), or why it gave none."""

    nodes: tuple[str, ...]
    busbw: float | None
    error: str | None = None
    seconds: float = 0.0
    software: Tuple[Tuple[str, str], ...] = ()  # (node, why): its ranks could not import torch / load NCCL


Measure = Callable[[int, List[Tuple[str, ...]]], List[GroupRun]]  # (round, groups) -> one run per group


@dataclasses.dataclass
class SearchResult:
    nodes: list[str]
    rounds: list[dict]
    bad: dict[str, str]  # node -> why
    unresolved: list[str]  # suspects the rounds could not tell apart (no healthy node left to pair with)
    per_node: dict[str, dict]  # node -> {"busbw", "group", "round", "verdict", "error"}
    # node -> why its ranks could not import torch or load NCCL (verdict "software"): not bad, not unresolved
    software: dict[str, str] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def first_groups(nodes: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """The nodes in groups of `size`, at most half of them (slow is slower than another group of the round); a
    remainder of one joins the last group (a collective needs two)."""
    size = max(2, min(size, len(nodes) // 2))
    groups = [tuple(nodes[i:i + size]) for i in range(0, len(nodes), size)]
    if len(groups) > 1 and len(groups[-1]) < 2:
        last = groups.pop()
        groups[-1] += last
    return groups


def max_rounds(nodes: int) -> int:
    """The goal: ceil(log2 N) + 2 rounds."""
    return math.ceil(math.log2(max(nodes, 2))) + 2


def is_slow(run: GroupRun, reference: float | None, threshold: float, min_busbw: float | None) -> bool:
    if run.error is not None or run.busbw is None:
        return True
    if min_busbw is not None and run.busbw < min_busbw:
        return True
    return reference is not None and run.busbw < (1 - threshold) * reference


class _Search:
    """The state of one search: the nodes found healthy, each node's last run, the rounds so far."""

    def __init__(self, nodes: Sequence[str], measure: Measure, threshold: float, min_busbw: float | None,
                 on_round: Callable[[dict], None]) -> None:
        self.nodes, self.measure, self.threshold, self.min_busbw = list(nodes), measure, threshold, min_busbw
        self.on_round = on_round
        self.good: list[str] = []
        self.per_node: dict[str, dict] = {}
        self.rounds: list[dict] = []
        self.reference: float | None = None  # the last round's best bus bandwidth
        self.software: dict[str, str] = {}  # node -> why its ranks could not import torch / load NCCL

    def run_round(self, tested: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> list[tuple[tuple[str, ...], GroupRun,
                                                                                             bool]]:
        """Run (suspects, group) pairs at once; returns (suspects, run, slow) per group, and records the round.
        A node whose ranks named their import failure is settled (self.software) and leaves its part: the rest of
        the part stays a suspect, its group having failed for that node."""
        number = len(self.rounds) + 1
        runs = self.measure(number, [group for _, group in tested])
        reference = max((r.busbw for r in runs if r.error is None and r.busbw is not None), default=None)
        judged = [(part, run, is_slow(run, reference, self.threshold, self.min_busbw))
                  for (part, _), run in zip(tested, runs)]
        for part, run, slow in judged:
            for node in part:
                self.per_node[node] = {"busbw": run.busbw, "group": list(run.nodes), "round": number,
                                       "verdict": "slow" if slow else "ok", "error": run.error}
            for node, why in run.software:
                if node in run.nodes:
                    self.software[node] = why
                    self.per_node[node] = {"busbw": None, "group": list(run.nodes), "round": number,
                                           "verdict": "software", "error": why}
            if not slow:
                self.good += [n for n in part if n not in self.good]
        entry = {"round": number, "reference_busbw": reference,
                 "groups": [{**dataclasses.asdict(run), "suspects": list(part), "slow": slow}
                            for part, run, slow in judged]}
        self.rounds.append(entry)
        self.on_round(entry)
        self.reference = reference
        return [(tuple(n for n in part if n not in self.software), run, slow) for part, run, slow in judged]

    def filled(self, parts: Sequence[tuple[str, ...]], avoid: dict[str, set[str]] | None = None):
        """Each part filled up to the parts' size (at least 2) with distinct healthy nodes (not those in
        `avoid[part's node]`, where others are left), then a control group of healthy nodes if enough are left."""
        size = max(2, max(len(p) for p in parts))
        spare = list(self.good)
        tested = []
        for part in parts:
            fill = []
            for _ in range(size - len(part)):
                shunned = set().union(*((avoid or {}).get(n, set()) for n in part))
                pick = next((g for g in spare if g not in shunned), spare[0] if spare else None)
                if pick is None:
                    break
                spare.remove(pick)
                fill.append(pick)
            tested.append((part, (*part, *fill)))
        if len(spare) >= size:
            tested.append(((), tuple(spare[:size])))  # the control: healthy nodes only
        return tested


def search(nodes: Sequence[str], measure: Measure, group_size: int = 2, threshold: float = 0.5,
           min_busbw: float | None = None, on_round: Callable[[dict], None] = lambda _r: None) -> SearchResult:
    """The bad nodes among `nodes` (module docstring); `measure` runs one round's groups at once. A node found
    bad runs once more with another healthy partner, where the round budget allows: one noisy run is no verdict."""
    state = _Search(nodes, measure, threshold, min_busbw, on_round)
    budget = max_rounds(len(state.nodes))
    bad: dict[str, str] = {}
    judged = state.run_round([(g, g) for g in first_groups(state.nodes, group_size)])
    suspects = [part for part, _, slow in judged if slow and part]
    waiting: list[tuple[str, ...]] = []  # lone suspects with no healthy partner free yet: the next round's
    while (suspects or waiting) and len(state.rounds) < budget:
        parts = [*waiting, *(half for g in suspects for half in ((g[:len(g) // 2], g[len(g) // 2:]) if len(g) > 1
                                                                 else (g,)))]
        tested = state.filled(parts)
        waiting = [part for part, group in tested if len(group) < 2]
        runnable = [(part, group) for part, group in tested if len(group) >= 2]
        if not runnable:
            break  # no healthy node to pair a suspect with
        suspects = []
        for part, run, slow in state.run_round(runnable):
            if slow and len(part) == 1 and not run.software:  # (a partner whose ranks failed to import: again)
                bad[part[0]] = (run.error or f"all_reduce bus bandwidth {run.busbw:.3g} GB/s with "
                                f"{','.join(n for n in run.nodes if n != part[0])}, against {state.reference:.3g} "
                                "GB/s for the round's best group")
            elif slow and part:
                suspects.append(part)
    if bad and len(state.rounds) < budget:  # confirm, each with a partner it has not run with
        avoid = {node: set(state.per_node[node]["group"]) for node in bad}
        tested = [t for t in state.filled([(n,) for n in sorted(bad)], avoid) if len(t[1]) >= 2]
        for part, _run, slow in state.run_round(tested) if tested else []:
            if part and not slow:
                del bad[part[0]]  # it kept pace this time: the first slow run was not the node's
    unresolved = sorted({n for g in (*suspects, *waiting) for n in g} - set(bad))
    for node in state.nodes:
        if node in bad or node in unresolved:
            state.per_node.setdefault(node, {"busbw": None, "group": [], "round": None, "error": None})
            state.per_node[node]["verdict"] = "bad" if node in bad else "unresolved"
    return SearchResult(state.nodes, state.rounds, bad, unresolved, state.per_node, state.software)


# -- inside the search job ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    """A group's job step on each of its nodes, as a collectives job's (toolkit.job.spec via
    toolkit.health.nodesearch): `ranks` per node, each with `cpus` CPUs, `gpus` GPUs per node; srun's binding."""

    ranks: int = 1
    cpus: int = 1
    gpus: int = 0
    binding: Tuple[str, ...] = ("--cpu-bind=none",)


def group_argv(group: Sequence[str], port: int, python: str, device: str, collective: Sequence[str],
               shape: Shape) -> List[str]:
    """One job step over `group`: `shape.ranks` ranks per node (one per device), the rank contract from
    Slurm's task ids, rendezvous on the group's first node; each rank runs PROBE under the job's `python`, then
    the collective."""
    program = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
               'GROUP_RANK="$SLURM_NODEID" LOCAL_WORLD_SIZE=%d; exec "$@"' % shape.ranks)
    return ["srun", "--export=ALL,MASTER_ADDR=%s,MASTER_PORT=%d" % (group[0], port), "--nodes=%d" % len(group),
            "--ntasks=%d" % (len(group) * shape.ranks), "--ntasks-per-node=%d" % shape.ranks,
            "--nodelist=" + ",".join(group), "--cpus-per-task=%d" % shape.cpus,
            *(["--gpus-per-node=%d" % shape.gpus] if shape.gpus else []), *shape.binding,
            "--kill-on-bad-exit=1", "--job-name=hpc-find-bad-nodes",
            "bash", "-c", program, "group", python, "-c", PROBE, device, *collective]


def import_failures(text: str) -> Dict[str, str]:
    """node -> why, from the ranks' IMPORT_MARK lines (a node's first one: its ranks fail alike)."""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        head, mark, payload = line.partition(IMPORT_MARK)
        if not mark:
            continue
        try:
            report = json.loads(payload)
            node, kind = str(report["node"]), str(report["kind"])
        except (ValueError, KeyError, TypeError):
            continue
        what = IMPORT_WHAT.get(kind, kind + " does not import")
        found.setdefault(node, "%s on %s: %s (python %s)" % (what, node, report.get("error"), report.get("python")))
    return found


def run_group(argv: List[str], group: Tuple[str, ...], timeout: float) -> GroupRun:
    start = time.monotonic()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return GroupRun(group, None, "no result within %.0f s (a hung collective)" % timeout, timeout)
    seconds = round(time.monotonic() - start, 2)
    footer = _AVG_BUSBW.search(res.stdout)
    try:
        busbw = float(footer.group(1)) if footer else None
    except ValueError:
        busbw = None
    if res.returncode != 0 or busbw is None:
        broken = import_failures(res.stderr + "\n" + res.stdout)
        if broken:
            return GroupRun(group, None, "; ".join(broken[n] for n in group if n in broken)[:300], seconds,
                            tuple((n, broken[n]) for n in group if n in broken))
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        # the rank's own words (python: No such file...), not Slurm's about ending the step because of them
        own = [line for line in errors if not re.match(r"(srun|slurmstepd[\w-]*): ", line)]
        why = (own or errors or ["exit %d" % res.returncode])[-1]
        return GroupRun(group, None, ("the collective failed: " + why)[:300], seconds)
    return GroupRun(group, busbw, None, seconds)


def slurm_measure(job_id: int, python: str, device: str, collective: Sequence[str], timeout: float, shape: Shape,
                  concurrency: int = 0) -> Measure:
    """A round's groups at once (`concurrency` 0), or that many at a time: nodes that share hardware (simulated
    nodes on one machine) would otherwise slow each other's runs."""
    def measure(number: int, groups: List[Tuple[str, ...]]) -> List[GroupRun]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency or len(groups)) as pool:
            futures = [pool.submit(run_group, group_argv(g, PORT_BASE + (job_id * 131 + number * 17 + i) % PORT_SPAN,
                                                         python, device, collective, shape), g, timeout)
                       for i, g in enumerate(groups)]
            return [f.result() for f in futures]
    return measure


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 BUNDLE nodesearch", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--python", required=True, help="the job's python (its venv's), which has torch")
    # the queue's accelerator family's torch device, as the planner resolved it (toolkit.health.nodesearch): the
    # collective's --device, which checks it; cuda also gets the NCCL probe
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--cpus-per-task", type=int, default=0, help="0: every CPU of the node (one rank)")
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--srun-option", action="append", default=None, help="srun's CPU binding (repeat)")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--min-busbw", type=float)
    parser.add_argument("--size", default="64M", help="the all_reduce's message size")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300, help="per group run")
    parser.add_argument("--concurrency", type=int, default=0, help="group runs at a time (0: a round's all)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    nodes = slurm.hostnames(os.environ["SLURM_JOB_NODELIST"])
    collective = ["--ops", "all_reduce", "-b", args.size, "-e", args.size, "-n", str(args.iters), "-w", "3",
                  "--device", args.device]
    # 0: the whole node to its one rank (the job holds it --exclusive), SLURM_CPUS_ON_NODE of the batch host, as
    # nodes of one partition (CPU queues: NCCL is not there to pin threads, gloo's share the node)
    cpus = args.cpus_per_task or int(os.environ.get("SLURM_CPUS_ON_NODE") or 1)
    binding = tuple(args.srun_option) if args.srun_option is not None else ("--cpu-bind=none",)
    shape = Shape(args.ranks_per_node, cpus, args.gpus_per_node, binding)
    measure = slurm_measure(int(os.environ["SLURM_JOB_ID"]), args.python, args.device, collective, args.timeout,
                            shape, args.concurrency)

    def on_round(entry: dict) -> None:
        records.append_record(args.run_dir / ROUNDS_FILE, entry)
        slow = [g for g in entry["groups"] if g["slow"]]
        print("hpc: find-bad-nodes: round %d: %d group(s), best %.3g GB/s; slow: %s"
              % (entry["round"], len(entry["groups"]), entry["reference_busbw"] or 0,
                 ", ".join(",".join(g["nodes"]) for g in slow) or "none"), flush=True)

    result = search(nodes, measure, args.group_size, args.threshold, args.min_busbw, on_round)
    for why in result.software.values():
        print("hpc: find-bad-nodes: " + why, flush=True)
    partial = args.run_dir / (RESULT_FILE + ".partial")
    partial.write_text(json.dumps(result.as_dict(), indent=1) + "\n")
    partial.replace(args.run_dir / RESULT_FILE)  # the login side polls for it: never half a file
    return 0
