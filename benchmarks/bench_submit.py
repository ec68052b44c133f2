#!/usr/bin/env python3
"""`hpc recipes submit` vs hand-written sbatch scripts on the same cluster: start-up overhead and throughput.

1. Submit-to-joined. Each repeat times from starting the submitting command to the moment rank 0 of the payload
(benchmarks/payloads/joined.py: a torch.distributed gloo process group) had formed; the two ways alternate.
Prints the medians and the ratio (goal: hpc <= 1.10x the hand-written script).
2. Training throughput: the resnet50 smoke run through hpc vs benchmarks/hand/resnet-smoke.sbatch (the same
trainer and arguments, threads set by hand), steady images/s as the trainer logs it (goal: >= 0.95x).
Needs a Slurm cluster (SLURM_CONF and HPC_CLUSTER_CONFIG: `make bench` points them at the local one) and the
training environment (make train-env).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
HAND_RESNET = REPO / "benchmarks" / "hand" / "resnet-smoke.sbatch"
PAYLOAD = REPO / "benchmarks" / "payloads" / "joined.py"
HAND_SCRIPT = """#!/bin/bash
#SBATCH --partition={queue}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task=1
#SBATCH --time=5
#SBATCH --output={out}/hand-%j.out
echo "hand: job $SLURM_JOB_ID at $(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)"
NODES="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
export MASTER_ADDR="${{NODES%%$'\\n'*}}" MASTER_PORT=$(( 15000 + SLURM_JOB_ID % 16000 ))
srun --cpus-per-task=1 {payload} --out "$1"
"""


def wait_for(path: Path, timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no rendezvous within {timeout:.0f} s ({path} missing): is the cluster up?")
        time.sleep(0.02)
    return float(path.read_text())


def wait_idle(queue: str, env: dict[str, str], timeout: float = 120) -> None:
    """Until the partition runs no job (COMPLETING included): the ways take turns on the same nodes, and a timed
    submission must not wait for the previous way's job to end (each way's job outlives its marker: the payload's
    teardown, then Slurm's), which would charge one way's end to the next way's start."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-p", queue, "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i"],
                         env=env, capture_output=True, text=True, timeout=60).stdout.strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"partition {queue} still busy after {timeout:.0f} s: is another job running there?")
        time.sleep(0.1)
    time.sleep(0.5)  # slurmd's own end of the job (epilog, cgroup cleanup) past what squeue shows


# The job's first line, the hand-written script's and hpc's (toolkit/slurm/templates/setup.sh.j2): when it ran.
JOB_LINE = re.compile(r"^(?:hpc|hand): job (\d+) at (\S+Z)", re.M)


def job_started(logs: list[Path], job_id: str) -> float | None:
    """When the job's first line ran (its batch shell, after hpc's set-up), from the job's logs."""
    for log in logs:
        for found in JOB_LINE.finditer(log.read_text(errors="replace") if log.is_file() else ""):
            if found.group(1) == job_id:
                return dt.datetime.strptime(found.group(2), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    return None


def busy_cpu_seconds() -> float | None:
    """CPU time this machine's cores have spent busy since boot (user, nice, system, irq, softirq, steal: the
    first line of /proc/stat, in clock ticks), or None where there is no /proc/stat. Every process counts: the
    command, Slurm's daemons, the job's shells and ranks (the local nodes are this machine's processes)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Timing:
    total: float  # from starting the command to all ranks joined
    command: float  # the submitting command's own run (sbatch's; hpc's CLI)
    job: float | None  # from the job's first line to all ranks joined (None: the line was not found)
    # CPU-s the machine spent from starting the command to seeing all ranks joined (None: no /proc/stat). With
    # the ranks' start CPU-bound (4 imports of torch on this machine's 2 cores), CPU spent is time lost.
    cpu: float | None = None


def timed(argv: list[str], marker: Path, env: dict[str, str], queue: str) -> Timing:
    wait_idle(queue, env)
    cpu_before = busy_cpu_seconds()
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    command = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    joined = wait_for(marker)
    cpu_after = busy_cpu_seconds()
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    if argv[0] == "sbatch":  # "Submitted batch job N"; its log is --output=DIR/hand-N.out
        job_id = done.stdout.split()[-1]
        logs = [marker.parent / f"hand-{job_id}.out"]
    else:  # the --json envelope (toolkit.cli.output): the run dir holds the job's logs, whatever the executor
        data = json.loads(done.stdout)["data"]
        job_id, logs = str(data["job_id"]), sorted(Path(data["run_dir"]).rglob("*.out"))
    deadline = time.monotonic() + 10
    started = job_started(logs, job_id)
    while started is None and time.monotonic() < deadline:  # the file system's view of the log can lag a little
        time.sleep(0.1)
        started = job_started(logs, job_id)
    return Timing(joined - start, command, None if started is None else joined - started, cpu)


def steady_rate(log: Path, timeout: float = 600) -> float:
    from toolkit.workloads.train_log import read_log, steady_throughput

    deadline = time.monotonic() + timeout
    while not (log.exists() and any(r["event"] == "end" for r in read_log(log))):
        if time.monotonic() > deadline:
            raise SystemExit(f"the run writing {log} did not end within {timeout:.0f} s")
        time.sleep(1)
    rate = steady_throughput(read_log(log))
    if rate is None:
        raise SystemExit(f"{log} has too few steps for a steady rate")
    return rate


def throughput(work: Path, env: dict[str, str], repeats: int) -> None:
    from toolkit.workloads.smoke_data import ensure

    data, _made = ensure("images", work / "digits")
    env = dict(env, PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    ways: dict[str, list[float]] = {"hand-written sbatch": [], "hpc recipes submit": []}
    for i in range(repeats):
        out = work / f"hand-resnet-{i}"
        subprocess.run(["sbatch", f"--output={work}/hand-resnet-{i}.out", str(HAND_RESNET), str(data), str(out)],
                       env=env, check=True, capture_output=True, timeout=60)
        ways["hand-written sbatch"].append(steady_rate(out / "logs" / "train_log.jsonl"))
        done = subprocess.run([sys.executable, "-m", "toolkit", "recipes", "submit", "resnet50", "--profile", "smoke",
                               "--nodes", "2", "--set", f"dirs.data.dir={data}", "--wait", "--json"],
                              env=env, capture_output=True, text=True, timeout=900, cwd=work)
        if done.returncode != 0:
            raise SystemExit(f"hpc recipes submit resnet50 failed: {done.stderr.strip()}")
        run = Path(json.loads(done.stdout)["data"]["run_dir"])  # the --json envelope (toolkit.cli.output)
        ways["hpc recipes submit"].append(steady_rate(run / "logs" / "train_log.jsonl"))
        print(f"repeat {i + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.1f} img/s" for k, v in ways.items()),
              file=sys.stderr)
    ratio = compare(f"resnet50 smoke (resnet18, 64 px, 2 nodes x 2 ranks) steady images/s, median of {repeats}:",
                    ways, "img/s")
    print(f"goal hpc >= 0.95x hand-written: {'met' if ratio >= 0.95 else 'NOT met'} ({ratio:.2f}x)")


def compare(title: str, ways: dict[str, list[float]], unit: str) -> float:
    """Print the medians beside the first way (the hand-written baseline); the second's ratio to it."""
    medians = {k: statistics.median(v) for k, v in ways.items()}
    base, ours = list(medians.values())[:2]
    print(title)
    for name, value in medians.items():
        print(f"  {name:<44}{value:>8.2f} {unit:<6}{value / base:>6.2f}x")
    return ours / base


# The start-up part's baseline and the way the goal is about (hpc's default); its other ways are "hpc ... FLAGS".
HAND_WAY, HPC_WAY = "hand-written sbatch + srun", "hpc recipes submit"
# The ways whose differences say where hpc's time goes (docs/start-up.md): the pre-flight, submitit's per-rank
# Python (the sweeps' executor, and --executor slurm's), and what is left (the CLI, the batch shell's own lines).
BREAKDOWN = ("--no-preflight", "--executor slurm", "--executor slurm --no-preflight")


def cli_cache(work: Path, env: dict[str, str], queue: str, nodes: int, repeats: int) -> None:
    """The CLI alone (`--dry-run`: the plan and the rendered script, no sbatch), with the user's cache of the
    parsed catalog and the compiled templates (toolkit.cache) and with it off, taking turns."""
    recipe = work / "cli.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "joined", "description": "CLI timing", "source": "benchmarks",
        "launcher": {"kind": "binary", "program": "/bin/true"}, "resources": {"nodes": nodes, "exclusive": False}}))
    argv = [sys.executable, "-m", "toolkit", "recipes", "submit", str(recipe), "--nodes", str(nodes), "--queue",
            queue, "--dry-run", "--json"]
    ways: dict[str, list[float]] = {"no cache (HPC_CACHE_DIR=)": [], "the user's cache (toolkit.cache)": []}
    for i in range(repeats + 1):  # the first turn fills the cache, and is not counted
        for name, cache in zip(ways, ("", str(work / "cache")), strict=True):
            start = time.perf_counter()
            subprocess.run(argv, env=dict(env, HPC_CACHE_DIR=cache), capture_output=True, check=True, timeout=120)
            if i:
                ways[name].append(time.perf_counter() - start)
    ratio = compare(f"hpc recipes submit --dry-run (the CLI alone), median of {repeats}:", ways, "s")
    print(f"the cache's share of the CLI: {1 - ratio:.0%}")


def breakdown(medians: dict[str, float]) -> None:
    """hpc's overhead over the hand-written script, in parts, from the medians of the BREAKDOWN ways (each a
    difference of medians, so noisy to +-0.2 s here: read them across runs; the CPU-s are steadier)."""
    hand, default = medians[HAND_WAY], medians[HPC_WAY]
    names = [f"hpc ... {flags}" for flags in BREAKDOWN]
    if not all(name in medians for name in names):
        return
    bare, submitit, submitit_bare = (medians[name] for name in names)
    print(f"where hpc's {default - hand:+.2f} s go (differences of medians):")
    for part, seconds in (("the pre-flight: default - (--no-preflight)", default - bare),
                          ("the pre-flight under submitit: (--executor slurm) - (... --no-preflight)",
                           submitit - submitit_bare),
                          ("submitit's per-rank Python, were it the default: (--executor slurm) - default",
                           submitit - default),
                          ("the rest (CLI, batch shell): (--no-preflight) - hand", bare - hand)):
        print(f"  {part:<78}{seconds:+.2f} s")


def own_time(ways: dict[str, list[Timing]]) -> None:
    """The same runs without Slurm's own start of each job (0.06-2 s here, the most of the totals' spread): the
    submitting command's run plus the job's time from its first line to all ranks joined. hpc's own overhead is
    its sum less the hand-written script's."""
    print("without Slurm's start of the job: the command + the job from its first line to joined (medians):")
    sums: dict[str, float] = {}
    for name, timings in ways.items():
        pairs = [(t.command, t.job) for t in timings if t.job is not None]
        if not pairs:
            print(f"  {name:<44}(the job's first line was not found in its log)")
            continue
        command, job = statistics.median(c for c, _ in pairs), statistics.median(j for _, j in pairs)
        sums[name] = statistics.median(c + j for c, j in pairs)
        print(f"  {name:<44}{command:>6.2f} s + {job:>5.2f} s = {sums[name]:>5.2f} s")
    hand, default = sums.get(HAND_WAY), sums.get(HPC_WAY)
    if hand and default:
        print(f"hpc's own overhead: {default - hand:+.2f} s ({default / hand:.2f}x; goal < 0.5 s)")
    cpu_used(ways)


def cpu_used(ways: dict[str, list[Timing]]) -> None:
    """The machine's busy CPU-s from each way's command to all ranks joined (medians), and each way's extra over
    the hand-written script: on a machine whose cores the ranks' start keeps busy, this is where the time goes,
    and it is far steadier than the seconds."""
    cpus = {name: statistics.median(t.cpu for t in timings if t.cpu is not None)
            for name, timings in ways.items() if any(t.cpu is not None for t in timings)}
    if HAND_WAY not in cpus:
        return
    print(f"CPU-s this machine ({os.cpu_count()} cores) spent from the command to joined (medians):")
    for name, cpu in cpus.items():
        print(f"  {name:<44}{cpu:>6.2f} CPU-s  {cpu - cpus[HAND_WAY]:+.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queue", default="cpu")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks-per-node", type=int, default=2)
    parser.add_argument("--also", action="append", default=None, metavar="FLAGS",
                        help="also time `hpc recipes submit ... FLAGS`; repeatable (default: the three ways that "
                             f"say where the time goes: {', '.join(repr(w) for w in BREAKDOWN)}; '' for none)")
    parser.add_argument("--skip-throughput", action="store_true", help="only the submit-to-joined part")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    work = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    env = dict(os.environ, HPC_RUNS_DIR=str(work / "runs"), PYTHONPATH=str(REPO))
    # hpc as installed: pip compiles its bytecode at install time, so no timed run may compile hpc's modules from
    # source (a shell with PYTHONDONTWRITEBYTECODE=1 made every run do so: 0.18 s of each start, measured here)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "toolkit")], env=env, check=True,
                   capture_output=True, timeout=300)
    # One executable both ways: this Python (with torch) running the payload.
    payload = work / "joined"
    payload.write_text(f"#!/bin/sh\nexec {sys.executable} {PAYLOAD} \"$@\"\n")
    payload.chmod(0o755)
    hand = work / "hand.sbatch"
    hand.write_text(HAND_SCRIPT.format(queue=args.queue, nodes=args.nodes, tasks=args.tasks_per_node, out=work,
                                       payload=payload))
    # Each hpc way is `hpc recipes submit` plus its flags; the first is the one the goal is about (the default).
    also = [flags for flags in (BREAKDOWN if args.also is None else args.also) if flags.strip()]
    hpc_ways: dict[str, list[str]] = {HPC_WAY: []} | {f"hpc ... {f}": f.split() for f in also}
    ways: dict[str, list[Timing]] = {name: [] for name in [HAND_WAY, *hpc_ways]}
    for i in range(args.repeats):
        marker = work / f"hand-{i}"
        ways[HAND_WAY].append(timed(["sbatch", str(hand), str(marker)], marker, env,
                                                        args.queue))
        for w, (name, flags) in enumerate(hpc_ways.items()):
            marker = work / f"hpc-{i}-{w}"
            recipe = work / f"joined-{i}-{w}.yaml"
            recipe.write_text(yaml.safe_dump({
                "name": "joined", "description": "rendezvous timing payload", "source": "benchmarks",
                "launcher": {"kind": "binary", "program": str(payload)}, "args": {"--out": str(marker)},
                "resources": {"nodes": args.nodes, "time": "00:05:00", "exclusive": False}}))
            ways[name].append(timed(
                [sys.executable, "-m", "toolkit", "recipes", "submit", str(recipe), "--nodes", str(args.nodes),
                 "--queue", args.queue, "--json", *flags], marker, env, args.queue))
        print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1].total:.2f} s" for k, v in ways.items()),
              file=sys.stderr)
    cli_cache(work, env, args.queue, args.nodes, args.repeats)
    totals = {k: [t.total for t in v] for k, v in ways.items()}
    ratio = compare(f"submit -> all {args.nodes * args.tasks_per_node} ranks joined, median of {args.repeats}:",
                    totals, "s")
    print(f"goal hpc <= 1.10x hand-written: {'met' if ratio <= 1.10 else 'NOT met'} ({ratio:.2f}x)")
    breakdown({k: statistics.median(v) for k, v in totals.items()})
    own_time(ways)
    if not args.skip_throughput:
        throughput(work, env, max(1, args.repeats // 2))


if __name__ == "__main__":
    main()
