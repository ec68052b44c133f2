"""`hpc cluster find-bad-nodes`: the slow or failing nodes of a partition, found by group testing with short
collectives instead of all pairs (16 nodes: 120 pair runs; here 2 to 5 rounds of concurrent runs).

    python -m toolkit.health.nodesearch --run-dir DIR [--group-size G] [--threshold T] [--size 64M] ...

runs as a batch job holding the nodes (one task per node); `hpc` submits it, follows its rounds and prints the
result. Each round runs one short all_reduce (toolkit.workloads.collectives, nccl-tests' table and bus bandwidth)
per group of nodes, every group of the round at once as its own job step on its own nodes:

  1. the nodes in groups of G (default 2: pairs);
  2. each group that failed, or whose bus bandwidth is below (1 - T) x the round's best, is split in halves, and
     every half is filled up to the round's group size with nodes already found healthy (a half of one node could
     not run a collective alone; the same size keeps bus bandwidths comparable); a group of healthy nodes of
     that size runs beside them as the round's control;
  3. until the slow groups are single nodes (with healthy partners): those are the bad nodes.

One bad node among N takes 1 + ceil(log2 G) rounds: 2 with pairs, ceil(log2 N) with G = N/2 (plain
bisection); then one more round runs each node found bad with another healthy partner, so that one noisy run is
no verdict. The goal is ceil(log2 N) + 2. Slowness is relative to the best group of the same round, so a cluster
slow everywhere looks healthy: --min-busbw sets an absolute floor. Each round is a line of
<run dir>/rounds.jsonl as it ends, the answer <run dir>/search.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

ROUNDS_FILE = "rounds.jsonl"
RESULT_FILE = "search.json"
PORT_BASE, PORT_SPAN = 21000, 20000  # each group's rendezvous port: concurrent groups share one network here


@dataclasses.dataclass(frozen=True)
class GroupRun:
    """One collective over `nodes`: its bus bandwidth (GB/s), or why it gave none."""

    nodes: tuple[str, ...]
    busbw: float | None
    error: str | None = None
    seconds: float = 0.0


Measure = Callable[[int, list[tuple[str, ...]]], list[GroupRun]]  # (round, groups) -> one run per group


@dataclasses.dataclass
class SearchResult:
    nodes: list[str]
    rounds: list[dict]
    bad: dict[str, str]  # node -> why
    unresolved: list[str]  # suspects the rounds could not tell apart (no healthy node left to pair with)
    per_node: dict[str, dict]  # node -> {"busbw", "group", "round", "verdict"}

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

    def run_round(self, tested: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> list[tuple[tuple[str, ...], GroupRun,
                                                                                             bool]]:
        """Run (suspects, group) pairs at once; returns (suspects, run, slow) per group, and records the round."""
        number = len(self.rounds) + 1
        runs = self.measure(number, [group for _, group in tested])
        reference = max((r.busbw for r in runs if r.error is None and r.busbw is not None), default=None)
        judged = [(part, run, is_slow(run, reference, self.threshold, self.min_busbw))
                  for (part, _), run in zip(tested, runs, strict=True)]
        for part, run, slow in judged:
            for node in part:
                self.per_node[node] = {"busbw": run.busbw, "group": list(run.nodes), "round": number,
                                       "verdict": "slow" if slow else "ok", "error": run.error}
            if not slow:
                self.good += [n for n in part if n not in self.good]
        entry = {"round": number, "reference_busbw": reference,
                 "groups": [{**dataclasses.asdict(run), "suspects": list(part), "slow": slow}
                            for part, run, slow in judged]}
        self.rounds.append(entry)
        self.on_round(entry)
        self.reference = reference
        return judged

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
    suspects = [part for part, _, slow in judged if slow]
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
            if slow and len(part) == 1:
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
    return SearchResult(state.nodes, state.rounds, bad, unresolved, state.per_node)


def drain_commands(bad: dict[str, str]) -> list[list[str]]:
    """The drain plan: one `scontrol update` per bad node, its reason naming the measurement."""
    return [["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason=hpc find-bad-nodes: {why}"[:250]]
            for node, why in sorted(bad.items())]


# -- from the login node: submit the search job, follow it, read its answer -----------------------------------


@dataclasses.dataclass(frozen=True)
class SearchJob:
    job_id: str
    run_dir: Path
    nodes: list[str]
    skipped: dict[str, str]  # node -> its Slurm state: not tested (down, drained: no job can run there)


def usable_nodes(partition: str | None, nodelist: str | None) -> tuple[list[str], dict[str, str]]:
    """The nodes to test (a hostlist, or all of the partition's) and those left out for their Slurm state."""
    from toolkit.errors import UsageError
    from toolkit.health.doctor import partition_nodes, unusable
    from toolkit.slurm.commands import hostnames, run

    if partition:
        states = dict(partition_nodes(partition))
    else:
        out = run(["sinfo", "--noheader", "--Node", "--format=%N %T"]).stdout
        states = dict(tuple(line.split()[:2]) for line in out.splitlines() if len(line.split()) >= 2)
    wanted = hostnames(nodelist) if nodelist else sorted(states)
    unknown = [n for n in wanted if n not in states]
    if unknown:
        raise UsageError(f"not in {'partition ' + partition if partition else 'this cluster'}: {', '.join(unknown)}",
                         fix="list nodes with `sinfo -N -p QUEUE`")
    skipped = {n: states[n] for n in wanted if unusable(states[n])}
    chosen = [n for n in wanted if n not in skipped]
    if len(chosen) < 2:
        raise UsageError(f"{len(chosen)} usable node(s) to test ({len(skipped)} down or drained): the search runs "
                         "collectives between nodes", fix="give at least two nodes that can run jobs")
    return chosen, skipped


def submit(partition: str | None, nodelist: str | None, run_dir: Path, options: Sequence[str],
           time_limit: str = "30") -> SearchJob:
    """sbatch the search job on exactly the chosen nodes (whole nodes: --exclusive), in a new run dir."""
    from toolkit.job.env import submit_env_allowlist
    from toolkit.slurm.commands import run
    from toolkit.slurm.env import clean_sbatch_env

    nodes, skipped = usable_nodes(partition, nodelist)
    run_dir.mkdir(parents=True)
    argv = ["sbatch", "--parsable", "--job-name=hpc-find-bad-nodes", f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}", "--ntasks-per-node=1", "--exclusive", f"--time={time_limit}",
            "--no-requeue", f"--output={run_dir}/search-%j.out", f"--export={','.join(submit_env_allowlist())}",
            *([f"--partition={partition}"] if partition else []),
            "--wrap", shlex.join([sys.executable, "-m", "toolkit.health.nodesearch", "--run-dir", str(run_dir),
                                  *options])]
    res = run(argv, env=clean_sbatch_env(dict(os.environ)))
    return SearchJob(res.stdout.strip().split(";")[0], run_dir, nodes, skipped)


def wait(job: SearchJob, progress: Callable[[str], None], timeout: float, poll_s: float = 1.0) -> dict:
    """Follow the search job's rounds until its answer is written; its log's last line if it ends without one."""
    from toolkit.errors import HpcError
    from toolkit.rundir import read_json, read_records
    from toolkit.slurm.status import query

    start, shown = time.monotonic(), 0
    while True:
        rounds = read_records(job.run_dir / ROUNDS_FILE)
        for entry in rounds[shown:]:
            progress(round_line(entry))
        shown = len(rounds)
        result = read_json(job.run_dir / RESULT_FILE)
        if result is not None:
            return result
        status = query([job.job_id]).get(job.job_id)
        if status is not None and status.done and read_json(job.run_dir / RESULT_FILE) is None:
            log = sorted(job.run_dir.glob("search-*.out"))
            lines = [line for line in (log[0].read_text().splitlines() if log else []) if line.strip()]
            raise HpcError(f"the search job {job.job_id} ended without an answer"
                           + (f": {lines[-1]}" if lines else ""), fix=f"see its log in {job.run_dir}")
        if time.monotonic() - start > timeout:
            raise HpcError(f"the search job {job.job_id} gave no answer within {timeout:.0f} s",
                           fix=f"its nodes may be busy (`squeue -j {job.job_id}`): wait and read {job.run_dir}, or "
                               f"`scancel {job.job_id}` and raise --timeout")
        time.sleep(poll_s)


def round_line(entry: dict) -> str:
    slow = [g for g in entry["groups"] if g["slow"]]
    slow_nodes = ", ".join(",".join(g["nodes"]) for g in slow) or "none"
    return (f"round {entry['round']}: {len(entry['groups'])} group(s) at once, best "
            f"{entry['reference_busbw'] or 0:.3g} GB/s; slow or failed: {slow_nodes}")


def node_rows(result: dict) -> list[dict]:
    """One row per node tested: its bus bandwidth in the last group it ran in, and the verdict."""
    return [{"node": n, **result["per_node"].get(n, {"busbw": None, "group": [], "round": None, "error": None,
                                                      "verdict": "ok"})}
            for n in result["nodes"]]


# -- on Slurm, inside the search job ---------------------------------------------------------------------------


def group_argv(group: Sequence[str], port: int, python: str, collective: Sequence[str], cpus: int) -> list[str]:
    """One job step over `group`: a rank per node with all of its `cpus` unbound (NCCL pins its own threads near
    the GPU; gloo's threads share the node), the rank contract from Slurm's task ids, rendezvous on the group's
    first node."""
    program = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1; '
               'exec "$@"')
    return ["srun", f"--export=ALL,MASTER_ADDR={group[0]},MASTER_PORT={port}", f"--nodes={len(group)}",
            f"--ntasks={len(group)}", "--ntasks-per-node=1", f"--nodelist={','.join(group)}",
            f"--cpus-per-task={cpus}", "--cpu-bind=none", "--kill-on-bad-exit=1", "--job-name=hpc-find-bad-nodes",
            "bash", "-c", program, "group",
            python, "-m", "toolkit.workloads.collectives", *collective]


def run_group(argv: list[str], group: tuple[str, ...], timeout: float) -> GroupRun:
    from toolkit.reports.nccl import parse_text

    start = time.monotonic()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return GroupRun(group, None, f"no result within {timeout:.0f} s (a hung collective)", timeout)
    seconds = round(time.monotonic() - start, 2)
    tests = parse_text(res.stdout)
    busbw = tests[0].avg_busbw_gbs if tests else None
    if res.returncode != 0 or busbw is None:
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        # the rank's own words (python: No such file...), not Slurm's about ending the step because of them
        own = [line for line in errors if not re.match(r"(srun|slurmstepd[\w-]*): ", line)]
        why = (own or errors or [f"exit {res.returncode}"])[-1]
        return GroupRun(group, None, f"the collective failed: {why}"[:300], seconds)
    return GroupRun(group, busbw, None, seconds)


def slurm_measure(job_id: int, python: str, collective: Sequence[str], timeout: float, cpus: int,
                  concurrency: int = 0) -> Measure:
    """A round's groups at once (`concurrency` 0), or that many at a time: nodes that share hardware (simulated
    nodes on one machine) would otherwise slow each other's runs."""
    def measure(number: int, groups: list[tuple[str, ...]]) -> list[GroupRun]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency or len(groups)) as pool:
            futures = [pool.submit(run_group, group_argv(g, PORT_BASE + (job_id * 131 + number * 17 + i) % PORT_SPAN,
                                                         python, collective, cpus), g, timeout)
                       for i, g in enumerate(groups)]
            return [f.result() for f in futures]
    return measure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.health.nodesearch", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--min-busbw", type=float)
    parser.add_argument("--size", default="64M", help="the all_reduce's message size")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--timeout", type=float, default=300, help="per group run")
    parser.add_argument("--concurrency", type=int, default=0, help="group runs at a time (0: a round's all)")
    args = parser.parse_args(argv)
    from toolkit.rundir import append_record, write_json
    from toolkit.slurm.commands import hostnames

    nodes = hostnames(os.environ["SLURM_JOB_NODELIST"])
    collective = ["--ops", "all_reduce", "-b", args.size, "-e", args.size, "-n", str(args.iters), "-w", "3",
                  "--device", args.device]
    # the whole node (the job holds it --exclusive): SLURM_CPUS_ON_NODE of the batch host, as nodes of one partition
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or 1)
    measure = slurm_measure(int(os.environ["SLURM_JOB_ID"]), sys.executable, collective, args.timeout, cpus,
                            args.concurrency)

    def on_round(entry: dict) -> None:
        append_record(args.run_dir / ROUNDS_FILE, entry)
        slow = [g for g in entry["groups"] if g["slow"]]
        print(f"hpc: find-bad-nodes: round {entry['round']}: {len(entry['groups'])} group(s), best "
              f"{entry['reference_busbw'] or 0:.3g} GB/s; slow: "
              + (", ".join(",".join(g["nodes"]) for g in slow) or "none"), flush=True)

    result = search(nodes, measure, args.group_size, args.threshold, args.min_busbw, on_round)
    write_json(args.run_dir / RESULT_FILE, result.as_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
