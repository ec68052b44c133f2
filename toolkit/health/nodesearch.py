"""`hpc cluster find-bad-nodes` from the login node: the search job, made like a collectives job of the queue
(one rank per accelerator of every node; the collectives recipe's software or --venv; the queue's EFA/NCCL
environment), submitted, followed round by round, and its answer read. The search itself (group testing with
short all_reduce runs, 2 to 5 rounds where all pairs would take N(N-1)/2 runs) runs inside the job with only the
nodes' python3: toolkit.node.nodesearch, whose docstring describes the rounds.

On the nodes, the collective runs under the job's python (the venv's, never the python running hpc); a node whose
torch does not import, or whose NCCL does not load, is named so (`software`), with the fix.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from toolkit.node.nodesearch import (RESULT_FILE, ROUNDS_FILE, SOFTWARE_FIX, GroupRun, SearchResult,  # noqa: F401
                                     first_groups, max_rounds, search)

if TYPE_CHECKING:
    from toolkit.cluster.queues import Queue

RECIPE = "collectives"  # the job whose software and environment the search's ranks run in


def drain_commands(bad: dict[str, str], by: str = "hpc find-bad-nodes") -> list[list[str]]:
    """The drain plan: one `scontrol update` per bad node, its reason naming the measurement (`by`: who drains)."""
    return [["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={by}: {why}"[:250]]
            for node, why in sorted(bad.items())]


@dataclasses.dataclass(frozen=True)
class SearchEnv:
    """What the search job is made of: each group step's shape on a node, the job's python, and the set-up lines
    (software activation, then the job's exports) its batch shell runs before the search."""

    device: str  # the collective's --device: the accelerator family's torch device (Family.torch_device)
    ranks_per_node: int
    cpus_per_task: int  # 0: the whole node to its one rank (CPU queues)
    gpus_per_node: int
    binding: tuple[str, ...]  # srun's CPU binding options
    python: str  # the job's python on the nodes
    setup: tuple[str, ...]

    def node_args(self) -> list[str]:
        """toolkit.node.nodesearch's arguments for this shape."""
        return ["--python", self.python, "--device", self.device, "--ranks-per-node", str(self.ranks_per_node),
                "--cpus-per-task", str(self.cpus_per_task), "--gpus-per-node", str(self.gpus_per_node),
                *(f"--srun-option={option}" for option in self.binding)]


def search_env(queue: Queue, nodes: int, venv: str | None = None) -> SearchEnv:
    """The collectives job of `queue` on `nodes` nodes, as `hpc run collectives` would plan it (toolkit.job.spec:
    ranks, GPUs, CPUs, binding; toolkit.job.env: EFA/NCCL and loader variables), with `venv` (a path every node
    sees) instead of the recipe's software. CPU queues keep one rank per node holding all of its CPUs."""
    from toolkit.errors import UsageError
    from toolkit.slurm.render import environment_lines
    from toolkit.accelerators import family
    from toolkit.job.spec import SoftwareEnv
    from toolkit.slurm.materialize import build_job_spec
    from toolkit.slurm.render import slurm_part
    from toolkit.recipes.load import load_recipe

    recipe = load_recipe(RECIPE)
    spec = build_job_spec(recipe, queue, nodes)
    if venv:
        spec = dataclasses.replace(spec, software=SoftwareEnv(venv=os.path.abspath(venv)))
    elif recipe.software.venv and not recipe.software.venv.startswith("/") and not queue.fsx_mount:
        raise UsageError(f"queue {queue.name} has no FSx mount, under which recipe {RECIPE}'s venv "
                         f"({recipe.software.venv}) would be: no python with torch to run the search's ranks on",
                         fix="pass --venv PATH: a venv with torch and this toolkit, on a file system every node "
                             "mounts")
    software = spec.software
    python = f"{software.venv}/bin/python" if software.venv else "python"  # modules / conda: first on PATH
    accel = family(queue.instance)
    if accel.device == "cpu":  # one rank per node with every CPU: its threads share the node (no OMP limit)
        spec = dataclasses.replace(spec, env=tuple(v for v in spec.env if v.name != "OMP_NUM_THREADS"))
        shape: tuple[int, int, int, tuple[str, ...]] = (1, 0, 0, ("--cpu-bind=none",))
    else:
        shape = (spec.tasks_per_node, spec.cpus_per_task, spec.gpus_per_node, slurm_part(spec).srun_binding)
    return SearchEnv(accel.torch_device, *shape, python=python, setup=tuple(environment_lines(spec)))


def script_text(env: SearchEnv, run_dir: Path, options: Sequence[str]) -> str:
    """The search job's batch script: the job's environment, the node-side bundle, then the search."""
    from toolkit.job.staging import node_command, unpack_lines

    command = node_command(run_dir, "nodesearch", "--run-dir", str(run_dir), *env.node_args(), *options)
    lines = ["#!/bin/bash", "# hpc cluster find-bad-nodes: written by toolkit.health.nodesearch", "set -euo pipefail",
             "", "# The collectives job's environment: its software, then its variables (toolkit.job.env).",
             *env.setup, "", "# hpc's node-side code (toolkit/node), which runs the search with the node's python3.",
             *unpack_lines(run_dir), "", f"exec {command}"]
    return "\n".join(lines) + "\n"


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


def sbatch_argv(env: SearchEnv, partition: str | None, nodes: Sequence[str], run_dir: Path, script: Path,
                time_limit: str = "30") -> list[str]:
    """sbatch of the search job on exactly `nodes` (whole nodes: --exclusive), shaped as its group steps."""
    from toolkit.job.env import submit_env_allowlist

    return ["sbatch", "--parsable", "--job-name=hpc-find-bad-nodes", f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}", f"--ntasks-per-node={env.ranks_per_node}",
            *([f"--gpus-per-node={env.gpus_per_node}"] if env.gpus_per_node else []), "--exclusive",
            f"--time={time_limit}", "--no-requeue", f"--output={run_dir}/search-%j.out",
            f"--export={','.join(submit_env_allowlist())}", *([f"--partition={partition}"] if partition else []),
            str(script)]


def submit(queue: Queue, partition: str | None, nodelist: str | None, run_dir: Path, options: Sequence[str],
           venv: str | None = None, time_limit: str = "30") -> SearchJob:
    """sbatch the search job (in `queue`'s collectives job environment) on the chosen nodes, in a new run dir."""
    from toolkit.slurm.commands import run
    from toolkit.slurm.env import clean_sbatch_env

    nodes, skipped = usable_nodes(partition, nodelist)
    env = search_env(queue, len(nodes), venv)
    run_dir.mkdir(parents=True)
    script = run_dir / "search.sbatch"
    script.write_text(script_text(env, run_dir, options))
    res = run(sbatch_argv(env, partition, nodes, run_dir, script, time_limit), env=clean_sbatch_env(dict(os.environ)))
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
