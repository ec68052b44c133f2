#!/usr/bin/env python3
"""hpc's straggler finding beside nvidia-resiliency-ext's straggler Detector, on CPU, in one run.

4 local ranks (gloo), a small DDP model, rank 2 doing three times the forward work of the others
(benchmarks/payloads/straggler_ddp.py), run three ways, --repeats times each, alternated:
  none   no detector (the baseline)
  hpc    toolkit.workloads.heartbeat beat(step, data=, compute=, sync=), judged by toolkit.reports.stragglers
  nvrx   nvidia-resiliency-ext 0.4.1 (the newest release for Python 3.11) Detector.detection_section("forward",
         profile_cuda=False), judged by its Report.identify_stragglers() (default thresholds)
Prints, per way: the ranks flagged and the median step time against the baseline's. NVRx needs CUPTI 12
(nvidia-cuda-cupti-cu12) to initialise even when it times on the host, and its report calls
torch.cuda.synchronize() and reads CUPTI's kernel statistics: the payload stands in for both (a no-op and no
kernels: no GPU here, nothing was queued on one).
`make bench` installs both (make bench-deps).

With --slurm-clean N --slurm-slowed M (issue 35: evidence worth a strike), on the local Slurm instead: N clean
runs and M runs with node c2 slowed for real (testbench.faults.slow_node: 0.4 of a CPU for c2 and every step it
runs, from every rank's first step on) of the resnet50 recipe's smoke profile, 2 nodes x 2 ranks, --max-steps
steps; each run's heartbeats judged by the new verdict (toolkit.reports.stragglers: a sign test across step
windows) and by the old one (one ratio of whole-run medians, +50%: old_fixed_ratio below), on the same records.
Prints the false-alarm rate (clean runs with any rank flagged) and the detection rate (slowed runs with c2's
ranks flagged and no other) of each. Holds the local Slurm: run it under the shared lock.

With --hang-polls (on the local Slurm too): a DDP job (recipes/examples/ddp_train.py, 2 nodes x 2 ranks, the
default heartbeat interval of 10 s) whose rank 3 is frozen for real (SIGSTOP) at a random step, then read the
way `hpc jobs status --stall-after 3` reads it (toolkit.submit.runs.progress) every 0.5 s for 40 s; each poll
counted as naming the frozen rank, undecided, naming a wrong rank, or no stall yet, by the new diagnosis and by
the old one (old_named below) on the same files; and the frozen rank's heartbeat step against the waiting ranks'.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PAYLOAD = REPO / "benchmarks" / "payloads" / "straggler_ddp.py"
RANKS, SLOW_RANK = 4, 2


BENCH_SITE = Path(sys.prefix) / "bench-site"  # make bench-deps: NVRx and CUPTI 12, apart from the venv
CUPTI_LIB = BENCH_SITE / "nvidia" / "cuda_cupti" / "lib"


def run(mode: str, steps: int) -> tuple[float, list[int]]:
    """(median step seconds over ranks and steps past the first 5, ranks flagged) of one run."""
    from toolkit.reports.stragglers import find_stragglers
    from toolkit.node import heartbeat

    out = Path(tempfile.mkdtemp(prefix=f"bench-stragglers-{mode}-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(RANKS), OMP_NUM_THREADS="1")
    env.pop(heartbeat.DIR_VAR, None)
    if mode == "hpc":
        env.update({heartbeat.DIR_VAR: str(out / "heartbeats"), heartbeat.INTERVAL_VAR: "1"})
    if mode == "nvrx":
        env["PYTHONPATH"] = f"{REPO}:{BENCH_SITE}"
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(CUPTI_LIB), env.get("LD_LIBRARY_PATH")]))
    ranks = [subprocess.Popen([sys.executable, str(PAYLOAD), mode, str(SLOW_RANK), str(steps), str(out)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(RANKS)]
    if any(r.wait(timeout=600) for r in ranks):
        raise SystemExit(f"a {mode} rank failed")
    seconds = [s for r in range(RANKS) for s in json.loads((out / f"steps-{r}.json").read_text())[5:]]
    if mode == "hpc":
        flagged = [r.rank for r in find_stragglers(heartbeat.read_beats(out / "heartbeats")).ranks if r.slow]
    elif mode == "nvrx":
        found = json.loads((out / "nvrx.json").read_text())
        flagged = sorted({r for ranks in found["straggler_sections_relative"].values() for r in ranks})
    else:
        flagged = []
    return statistics.median(seconds), flagged


def old_fixed_ratio(beats: list, threshold: float = 0.5) -> list[int]:
    """The verdict before issue 35 (the baseline): each rank's whole-run median own work (data + compute) against
    the lower quartile of the ranks', flagged above it by `threshold`, from 10 timed steps."""
    timed = [b for b in beats if b.timed_steps and "data" in b.medians and "compute" in b.medians]
    if len(timed) < 2 or min(b.timed_steps for b in timed) < 10:
        return []
    own = {b.rank: b.medians["data"] + b.medians["compute"] for b in timed}
    baseline = statistics.quantiles(own.values(), n=4, method="inclusive")[0]
    return sorted(rank for rank, seconds in own.items() if seconds > (1 + threshold) * baseline)


def old_named(beats: list, now: float, after_s: float) -> list[int] | None:
    """The hang diagnosis before issue 35 (the baseline), without stacks: the ranks it named as the ones the
    others wait for (None: no rank stalled): silent for 3 intervals, else behind, else every stalled rank."""
    silent = [b for b in beats if now - b.time > 3 * b.interval]
    idle = [b for b in beats if (now if b in silent else b.time) - b.progress >= after_s]
    if not idle:
        return None
    newest = max(-1 if b.step is None else b.step for b in beats)
    behind = [b for b in idle if (-1 if b.step is None else b.step) < newest]
    return sorted(b.rank for b in ([b for b in idle if b in silent] or behind or idle))


def slurm_env_for(tmp: Path) -> dict:
    from testbench.cluster import slurm_env
    from testbench.layout import Layout

    layout = Layout.current()
    return dict(slurm_env(layout), HPC_RUNS_DIR=str(tmp / "runs"), HPC_CLUSTER_CONFIG=str(layout.cluster_config))


def hpc_json(*args: str, env: dict) -> dict:
    args = args if "--json" in args else (*args, "--json")
    res = subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                         env=dict(env, PYTHONPATH=str(REPO)), timeout=600, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(f"hpc {' '.join(args[:3])} failed: {res.stdout}{res.stderr}")
    return json.loads(res.stdout)["data"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what}")


def job_gone(job_id: str, env: dict) -> bool:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, env=env,
                         timeout=60)
    return res.stdout.strip() == ""


def slurm_run(slowed: bool, steps: int, tmp: Path) -> dict:
    """One resnet50 smoke run on 2 nodes x 2 ranks (c2 limited to 0.4 CPU from every rank's first step where
    `slowed`): the ranks each verdict flags."""
    from testbench.faults import slow_node
    from toolkit.reports.stragglers import find_stragglers
    from toolkit.rundir import RunDir

    env = slurm_env_for(tmp)
    job = hpc_json("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--set",
                   f"args.--max-steps={steps}", "--set", "args.--checkpoint-every-steps=0", "--env",
                   f"PYTHONPATH={REPO}", "--env", "HPC_HEARTBEAT_INTERVAL=1", env=env)
    run = RunDir(Path(job["run_dir"]))
    wait_for(lambda: len([b for b in run.heartbeats() if b.step]) == 4, 600, "every rank's first step")
    if slowed:
        with slow_node("c2", 0.4):
            wait_for(lambda: job_gone(job["job_id"], env), 900, "the job's end")
    else:
        wait_for(lambda: job_gone(job["job_id"], env), 900, "the job's end")
    beats = run.heartbeats()
    found = find_stragglers(beats)
    return {"job_id": job["job_id"], "slowed": slowed, "new": [r.rank for r in found.ranks if r.slow],
            "old": old_fixed_ratio(beats), "note": found.note,
            "windows_over": {r.rank: f"{r.windows_over}/{r.windows}" for r in found.ranks},
            "own_vs_baseline": {r.rank: round(r.vs_baseline, 2) for r in found.ranks}}


def slurm_stragglers(clean: int, slowed: int, steps: int) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-slurm-") as tmp:
        for n, is_slowed in enumerate([False] * clean + [True] * slowed):
            runs.append(slurm_run(is_slowed, steps, Path(tmp) / str(n)))
            print(f"run {n + 1}/{clean + slowed}: {json.dumps(runs[-1])}", flush=True)
    out: dict = {"runs": runs, "steps": steps}
    print(f"\n{clean} clean runs, {slowed} with node c2 at 0.4 CPU; resnet50 smoke, 2 nodes x 2 ranks, {steps} steps")
    print(f"{'verdict':<34} {'false alarms (clean)':>22} {'detected (slowed)':>20}")
    for way, label in (("old", "old: whole-run medians, +50%"), ("new", "new: sign test over windows, +30%")):
        alarms = sum(1 for r in runs if not r["slowed"] and r[way])
        detected = sum(1 for r in runs if r["slowed"] and r[way] == [2, 3])
        out[way] = {"false_alarms": alarms, "clean": clean, "detected": detected, "slowed": slowed}
        print(f"{label:<34} {f'{alarms}/{clean}':>22} {f'{detected}/{slowed}':>20}")
    return out


def hang_polls(trials: int) -> dict:
    """Frozen-rank runs polled as `hpc jobs status --stall-after 3` reads them: new vs old per poll."""
    import random

    from toolkit.node import heartbeat
    from toolkit.rundir import RunDir
    from toolkit.submit.runs import progress

    counts = {way: {"frozen": 0, "undecided": 0, "wrong": 0, "none": 0} for way in ("new", "old")}
    steps_seen = []
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        for trial in range(trials):
            env = slurm_env_for(Path(tmp) / str(trial))
            job = hpc_json("run", str(REPO / "recipes" / "examples" / "ddp_train.py"), "--nodes", "2", "--queue",
                           "cpu", "--time", "00:15:00", "--env", f"PYTHONPATH={REPO}", "--json", "--", "--steps",
                           "1000", "--step-seconds", "0.3", "--checkpoint-dir", f"{tmp}/ckpt-{trial}", env=env)
            run = RunDir(Path(job["run_dir"]))
            at = random.Random(trial).randint(4, 9)
            frozen = wait_for(lambda run=run, at=at: [b for b in run.heartbeats()
                                                      if b.rank == 3 and (b.step or 0) >= at], 600, "rank 3's step")[0]
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                for _ in range(80):
                    time.sleep(0.5)
                    beats = run.heartbeats()
                    found = progress(run, job["job_id"], True, 3.0)
                    diagnosis = found["diagnosis"] if found else None
                    new = None if not diagnosis or not (diagnosis["stalled"] or diagnosis["undecided"]) else \
                        [s["rank"] for s in diagnosis["stalled"]]
                    old = old_named(beats, time.time(), 3.0)
                    for way, named in (("new", new), ("old", old)):
                        counts[way]["none" if named is None else "undecided" if named == [] else
                                    "frozen" if named == [3] else "wrong"] += 1
                steps = {b.rank: b.step for b in run.heartbeats()}
                steps_seen.append(steps)
                print(f"trial {trial + 1}/{trials}: rank 3 frozen at heartbeat step {steps[3]}, the waiting ranks "
                      f"at {[steps[r] for r in range(3)]}; polls {json.dumps(counts)}", flush=True)
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
                subprocess.run(["scancel", job["job_id"]], env=env, check=False)
                wait_for(lambda job=job, env=env: job_gone(job["job_id"], env), 120, "the job's end")
    print(f"\n{trials} frozen-rank runs (rank 3 SIGSTOPped), polled every 0.5 s for 40 s, --stall-after 3, "
          f"heartbeat interval {heartbeat.DEFAULT_INTERVAL_S:g} s")
    print(f"{'diagnosis':<10} {'names rank 3':>13} {'undecided':>10} {'names another':>14} {'no stall yet':>13}")
    for way in ("old", "new"):
        c = counts[way]
        print(f"{way:<10} {c['frozen']:>13} {c['undecided']:>10} {c['wrong']:>14} {c['none']:>13}")
    return {"counts": counts, "steps": steps_seen}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--slurm-clean", type=int, default=0, help="clean resnet50 smoke runs on the local Slurm")
    p.add_argument("--slurm-slowed", type=int, default=0, help="runs with node c2 at 0.4 CPU on the local Slurm")
    p.add_argument("--slurm-steps", type=int, default=20, help="--max-steps of each local Slurm run")
    p.add_argument("--hang-polls", type=int, default=0, metavar="TRIALS", help="frozen-rank runs, polled")
    args = p.parse_args()
    if args.slurm_clean or args.slurm_slowed or args.hang_polls:
        out = {}
        if args.slurm_clean or args.slurm_slowed:
            out["stragglers"] = slurm_stragglers(args.slurm_clean, args.slurm_slowed, args.slurm_steps)
        if args.hang_polls:
            out["hang"] = hang_polls(args.hang_polls)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
        return
    if (BENCH_SITE / "nvidia_resiliency_ext").is_dir():
        modes: tuple[str, ...] = ("none", "hpc", "nvrx")
    else:
        print(f"nvidia-resiliency-ext is not in {BENCH_SITE} (make bench-deps): comparing hpc with no detector only")
        modes = ("none", "hpc")
    results: dict[str, dict] = {m: {"step_s": [], "flagged": []} for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            print(f"repeat {repeat + 1}/{args.repeats}: {mode}...", flush=True)
            seconds, flagged = run(mode, args.steps)
            results[mode]["step_s"].append(seconds)
            results[mode]["flagged"].append(flagged)
    base = statistics.median(results["none"]["step_s"])
    print(f"\nrank {SLOW_RANK} of {RANKS} does 3x the forward work; {args.steps} steps, {args.repeats} runs each")
    print(f"{'detector':<8} {'ranks flagged (each run)':<28} {'median step':>12} {'vs none':>8}")
    for mode in modes:
        step = statistics.median(results[mode]["step_s"])
        flagged = " ".join(str(f) for f in results[mode]["flagged"]) if mode != "none" else "-"
        print(f"{mode:<8} {flagged:<28} {step * 1e3:>10.2f}ms {step / base:>7.3f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
