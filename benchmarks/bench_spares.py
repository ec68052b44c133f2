#!/usr/bin/env python3
"""Hot spares against a requeue, on the local Slurm, in one run: a node lost for real mid-run, again and again.

Each trial submits a job on 1 node + 1 spare (toolkit.node.spares), waits until it has made a random step (3..10)
past a checkpoint, then loses its node for real (testbench.faults.lost_node: slurmd, slurmstepd and ranks
SIGKILLed) and waits for the job's end. Workloads, --trials each:
  ddp     recipes/examples/ddp_train.py, the DDP tutorial's loop with checkpoints (`hpc run`, srun)
  resnet  the resnet50 recipe's smoke profile (our trainer, `hpc recipes submit`)
A trial recovered when the job completed with no action, one restart recorded, the resumed step at most the
checkpoint interval behind the last step made, and both rounds saw the same world (2 ranks). Its recovery time
runs from the fault to the first training step logged after it.

The baselines, the same ddp job without spares (the batch host is then its training node, which is lost):
  requeue (Slurm)      Slurm alone: the node is declared down at SlurmdTimeout (300 s here; ParallelCluster: 180),
                       the job requeued and rerun on the other node (--skip-slurm-requeue leaves it out)
  requeue (instant)    the node marked down at the moment of the fault (`scontrol update State=DOWN`, as a
                       perfect health check would): the best any requeue can do, queue wait aside
Prints a table per workload and the ratios, and draws the recovery times (--plot PNG). Heartbeats every second
(HPC_HEARTBEAT_INTERVAL=1: a lost node's ranks are silent after 3 s). Needs the local Slurm (make slurm-up) and
torch (make train-env); `make bench` runs it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbench.cluster import slurm_env  # noqa: E402
from testbench.faults import lost_node, restore_node  # noqa: E402
from testbench.layout import Layout  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402

DDP = REPO / "recipes" / "examples" / "ddp_train.py"
CHECKPOINT_EVERY, STEPS = 2, 16
JOB_ENV = ["--env", f"PYTHONPATH={REPO}", "--env", "HPC_HEARTBEAT_INTERVAL=1"]


def hpc(*args: str, env: dict) -> dict:
    res = subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, env=env,
                         timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"hpc {' '.join(args[:3])} failed: {res.stdout}{res.stderr}")
    return json.loads(res.stdout)["data"]


def submit(workload: str, spares: bool, env: dict, ckpt: Path) -> dict:
    # Without spares through sbatch too (the rendered script): one log, every rank's lines labelled, as with spares.
    more = ["--spares", "1"] if spares else ["--executor", "sbatch"]
    if workload == "ddp":
        return hpc("run", str(DDP), "--nodes", "1", *more, *JOB_ENV, "--json", "--", "--steps", str(STEPS),
                   "--step-seconds", "0.5", "--checkpoint-every", str(CHECKPOINT_EVERY), "--log-every", "1",
                   "--checkpoint-dir", str(ckpt), env=env)
    return hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "1", *more, *JOB_ENV,
               "--set", f"args.--max-steps={STEPS}", "--set", f"args.--checkpoint-every-steps={CHECKPOINT_EVERY}",
               "--set", "args.--log-every-steps=1", "--json", env=env)


def records(workload: str, run: RunDir, job_id: str) -> list[dict]:
    """The workload's own records, each with `time`: ddp's JSON lines (task-labelled) in the job log, or our
    trainer's train_log.jsonl; resumes as {"event": "resumed", "step": N}, steps as {"event": "train"}."""
    if workload == "resnet":
        path = run.path / "logs" / "train_log.jsonl"
        found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        out = []
        for r in found:
            if r["event"] == "start" and r.get("resumed_from_step"):
                out.append({"event": "resumed", "step": r["resumed_from_step"], "time": r["time"],
                            "world_size": r["world_size"]})
            elif r["event"] == "start":
                out.append({"event": "rank_env", "world_size": r["world_size"], "time": r["time"]})
            elif r["event"] in ("train", "end"):
                out.append({**r, "status": "completed" if r["event"] == "end" and r.get("status") in
                            ("completed", "max_steps") else r.get("status")})
        return out
    path = run.job_output(job_id)
    out = []
    for line in (path.read_text().splitlines() if path else []):
        task, _, text = line.partition(": ")
        if task.strip().isdigit() and text.startswith("{"):
            out.append(json.loads(text))
    return out


def queue_state(env: dict, job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, env=env)
    return res.stdout.strip()


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def trial(workload: str, spares: bool, node: str, env: dict, root: Path, kill_step: int,
          mark_down: bool = False) -> dict:
    """One job, one fault at `kill_step` on `node`; what happened."""
    ckpt = root / "ckpt"
    job = submit(workload, spares, env, ckpt)
    run, job_id = RunDir(job["run_dir"]), str(job["job_id"])
    outcome = {"workload": workload, "job_id": job_id, "kill_step": kill_step}
    try:
        wait(lambda: any((b.step or 0) >= kill_step for b in run.heartbeats()), 300, "the kill step")
        outcome["node"] = sorted({b.node for b in run.heartbeats()})
        fault = time.time()
        lost_node(node)
        if mark_down:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=bench: lost"], env=env)
        wait(lambda: any(r["event"] == "end" for r in records(workload, run, job_id)), 900, "the job's end")
        # Its batch script ends too (a lost node's part keeps it COMPLETING until the node is back).
        wait(lambda: queue_state(env, job_id) in ("", "COMPLETING"), 120, "the batch script's end")
        found = records(workload, run, job_id)
        resumed = [r for r in found if r["event"] == "resumed"]
        after = [r for r in found if r["event"] == "train" and r["time"] > fault]
        before = [r["step"] for r in found if r["event"] == "train" and r["time"] <= fault]
        worlds = {r.get("world_size") for r in found if r["event"] in ("rank_env", "resumed")} - {None}
        restarts = [r for r in run.restarts() if r.get("kind") == "restart"]
        outcome.update(
            recovery_s=round(after[0]["time"] - fault, 2) if after else None,
            resumed_from=resumed[-1]["step"] if resumed else None, last_step_before=max(before, default=0),
            completed=found[-1]["event"] == "end" and found[-1].get("status") == "completed",
            restarts=len(restarts), worlds=sorted(worlds))
        outcome["lost_steps"] = (outcome["last_step_before"] - outcome["resumed_from"]
                                 if outcome["resumed_from"] is not None else None)
        outcome["recovered"] = bool(outcome["completed"] and (restarts or not spares) and resumed
                                    and outcome["lost_steps"] <= CHECKPOINT_EVERY and worlds == {2})
    except TimeoutError as exc:
        outcome.update(recovered=False, error=f"timed out waiting for {exc}")
    finally:
        if outcome.get("error"):
            subprocess.run(["scancel", job_id], env=env)
        restore_node(node)
        wait(lambda: queue_state(env, job_id) == "", 120, "the job gone")
    return outcome


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def plot(results: dict, baselines: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (workload, outcomes) in enumerate(results.items()):
        times = [o["recovery_s"] for o in outcomes if o.get("recovery_s") is not None]
        ax.scatter([i + random.uniform(-0.15, 0.15) for _ in times], times, label=f"spares: {workload}", s=18)
    for j, (name, outcome) in enumerate(baselines.items()):
        if outcome.get("recovery_s") is not None:
            ax.axhline(outcome["recovery_s"], linestyle="--", color=f"C{j + 3}", label=name)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("seconds from the fault to the next training step")
    ax.set_yscale("log")
    ax.set_title("A lost node: restart on a spare vs requeue (local Slurm, 1 node + 1 spare)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="faults per workload (default 20)")
    parser.add_argument("--workloads", default="ddp,resnet")
    parser.add_argument("--skip-slurm-requeue", action="store_true", help="leave out the 5-minute baseline")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--plot", type=Path, default=Path("bench_spares.png"))
    parser.add_argument("--json", type=Path, help="write every trial here")
    args = parser.parse_args()
    random.seed(args.seed)
    layout = Layout.current()
    with tempfile.TemporaryDirectory(prefix="bench-spares-") as tmp:
        env = dict(slurm_env(layout), HPC_RUNS_DIR=f"{tmp}/runs", HPC_CLUSTER_CONFIG=str(layout.cluster_config))
        results: dict[str, list[dict]] = {}
        for workload in args.workloads.split(","):
            results[workload] = []
            for n in range(args.trials):
                outcome = trial(workload, True, "c2", env, Path(tmp) / f"{workload}-{n}", random.randint(3, 10))
                results[workload].append(outcome)
                print(f"{workload} trial {n + 1}/{args.trials}: {json.dumps(outcome)}", flush=True)
        baselines = {"requeue (instant)": trial("ddp", False, "c1", env, Path(tmp) / "instant", 5, mark_down=True)}
        print(f"requeue (instant): {json.dumps(baselines['requeue (instant)'])}", flush=True)
        if not args.skip_slurm_requeue:
            baselines["requeue (Slurm)"] = trial("ddp", False, "c1", env, Path(tmp) / "slurm", 5)
            print(f"requeue (Slurm): {json.dumps(baselines['requeue (Slurm)'])}", flush=True)
    rows = [("way", "recovered", "recovery s (median / max)", "lost steps (max)", "vs requeue (instant)",
             "vs requeue (Slurm)")]
    for workload, outcomes in results.items():
        times = [o["recovery_s"] for o in outcomes if o.get("recovery_s") is not None]
        median = statistics.median(times) if times else None
        ratios = [f"{b['recovery_s'] / median:.1f}x faster" if median and b.get("recovery_s") else "-"
                  for b in (baselines.get("requeue (instant)", {}), baselines.get("requeue (Slurm)", {}))]
        rows.append((f"spares: {workload}", f"{sum(o['recovered'] for o in outcomes)}/{len(outcomes)}",
                     f"{median:.1f} / {max(times):.1f}" if times else "-",
                     max((o.get("lost_steps") or 0) for o in outcomes), *ratios))
    for name, b in baselines.items():
        rows.append((name, "yes" if b.get("completed") else "no", f"{b.get('recovery_s')}",
                     b.get("lost_steps"), "", ""))
    print(table(rows))
    plot(results, baselines, args.plot)
    print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps({"trials": results, "baselines": baselines}, indent=1))
    return 0 if all(o["recovered"] for outcomes in results.values() for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
