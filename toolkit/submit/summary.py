"""A dry run for people: what a planned job will do, in a screenful (`hpc recipes submit --dry-run`, `hpc run
--dry-run`).

summary() reads a Plan (toolkit.submit.plan) into plain fields: nodes x devices, ranks, the queue and the cluster
config with where each came from, the time limit, the job's environment (secret values hidden), the command rank 0
runs; sweep_summary() adds a sweep's arrays (and where their size limit comes from) and one entry per point.
lines() writes either as short text. Nothing here plans: every value is the plan's, or says where the plan's came
from. The full scripts stay the plan's own view (toolkit.submit.plan.describe, --verbose); --json carries both.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from toolkit.target import target_for

VERBOSE_HINT = "the full plan and its scripts: add --verbose (or --json)"
# A variable whose name has one of these words (between underscores) holds a credential: its value is never shown.
SECRET_WORDS = {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "KEY", "APIKEY",
                "AUTH", "PRIVATE"}


def is_secret(name: str) -> bool:
    """HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY: yes; TOKENIZERS_PARALLELISM, NCCL_DEBUG: no."""
    return any(word in SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", name.upper()))


def _hide_secret(override: str) -> str:
    """A sweep point's KEY.PATH=VALUE, its value hidden where the key names a secret (env.HF_TOKEN=...)."""
    key, _, _ = override.partition("=")
    return f"{key}=<hidden>" if is_secret(key.rpartition(".")[2]) else override


def cluster_source(request: Any) -> tuple[str | None, str]:
    """The cluster config a request's queue was read from (None: none, the built-in default queue) and where that
    came from, in resolve_queue's order (toolkit.cluster.queues): --cluster, else the first existing of
    cluster_config_candidates() ($HPC_CLUSTER_CONFIG, the head node's copy), else the built-in default."""
    from toolkit.cluster.queues import CLUSTER_CONFIG_ENV, cluster_config_candidates, default_queue

    if request.cluster is not None:
        return str(request.cluster), "--cluster"
    candidates = cluster_config_candidates()
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        default = default_queue()
        # resolve_queue refuses a $HPC_CLUSTER_CONFIG naming no file, so here it is unset
        return None, (f"the built-in default (one {default.instance_type} queue): no --cluster, ${CLUSTER_CONFIG_ENV} "
                      f"unset, no {' or '.join(str(p) for p in candidates)}")
    if str(found) == os.environ.get(CLUSTER_CONFIG_ENV):
        return str(found), f"${CLUSTER_CONFIG_ENV}"
    return str(found), "this cluster's own config (ParallelCluster's copy on the head node)"


def queue_source(request: Any, config: str | None) -> str:
    if request.queue is not None:
        return "from --queue"
    if config is not None:
        return "the config's first queue (ParallelCluster's default partition)"
    return "the built-in default queue"


def summary(p: Any) -> dict[str, Any]:
    """A plan (toolkit.submit.plan.Plan) in the fields a person checks before a job starts."""
    from toolkit.accelerators import family

    spec, queue = p.spec, p.queue
    device = family(queue.instance).device
    config, config_source = cluster_source(p.request)
    return {
        "job": spec.job_name, "nodes": spec.nodes, "spares": spec.spares, "device": device,
        "devices_per_node": queue.instance.gpus if device != "cpu" else queue.cpus_per_node,
        "instance_type": spec.instance_type, "ranks": spec.world_size, "ranks_per_node": spec.tasks_per_node,
        "launcher_style": spec.style,
        "queue": {"name": queue.name, "source": queue_source(p.request, config)},
        "cluster": {"config": config, "source": config_source},
        "time_limit": spec.time_limit, "executor": p.executor.value, "run_dir": str(p.run_dir),
        "env": [{"name": v.name, "value": None if is_secret(v.name) else v.value, "prepend": v.prepend,
                 "secret": is_secret(v.name)} for v in spec.env],
        "rank0_argv": list(p.rank0_argv),
        "container": _container(spec.software.container),
        "rank_order": _rank_order(spec, p.executor.value),
    }


def _rank_order(spec: Any, executor: str) -> str | None:
    """How the ranks are placed where the queue has a topology file (toolkit.slurm.hostfile); None where not."""
    rule = next((d.rule for d in spec.derived if d.key == "rank order"), None)
    if rule is None or executor == "sbatch" or not (spec.slurm and spec.slurm.network_order):
        return rule
    # submitit writes its own srun line: the hostfile is the rendered script's
    return f"Slurm's (submitit's srun); --executor sbatch: {rule}"


def _container(container: Any) -> dict[str, Any] | None:
    """The image every rank runs in and what is mounted into it (toolkit.job.container.ContainerEnv)."""
    if container is None:
        return None
    return {"image": container.image, "mounts": list(container.mounts), "workdir": container.workdir}


def sweep_summary(sp: Any) -> dict[str, Any]:
    """A sweep (toolkit.submit.sweep.SweepPlan): its first task's summary, the arrays, one entry per point."""
    data = summary(sp.tasks[0])
    data["run_dir"] = str(sp.sweep_dir)
    data["sweep"] = {
        "tasks": len(sp.tasks), "arrays": [{"first": c.start, "count": len(c)} for c in sp.chunks],
        "max_array_size": sp.max_array_size, "max_array_size_source": sp.max_array_size_source,
        "array_parallelism": sp.parallelism,
        "points": [{"label": str(point.index), "differs": [_hide_secret(o) for o in point.overrides],
                    "run_dir": str(task.run_dir)}
                   for point, task in zip(sp.points, sp.tasks, strict=True)],
    }
    return data


def arrays_text(arrays: list[dict]) -> str:
    """"one job array", or "3 job arrays (tasks 0-100, 101-201, 202-249)"."""
    if len(arrays) == 1:
        return "one job array"
    spans = ", ".join(f"{a['first']}-{a['first'] + a['count'] - 1}" for a in arrays)
    return f"{len(arrays)} job arrays (tasks {spans})"


def _env_line(var: dict) -> str:
    if var["secret"]:
        return f"{var['name']}=<hidden>"
    value = shlex.quote(var["value"])
    return f"{var['name']}={value}:${var['name']}" if var["prepend"] else f"{var['name']}={value}"


def readable_argv(argv: list[str]) -> str:
    """A command as a person reads it: the toolkit's own `python -c` programs (torchrun with its settings, each
    Python rank's first code, toolkit.job.user_main) named instead of written out; --verbose shows them."""
    from toolkit.job.spec import TORCHRUN, USER_MAIN

    def word(previous: str, arg: str) -> str:
        if previous != "-c" or len(arg) < 80:
            return shlex.quote(arg)
        if arg == TORCHRUN:
            return "<torchrun>"
        if arg in USER_MAIN.read_text():
            return "<toolkit/job/user_main.py>"
        return f"<{arg.count(chr(10)) + 1} lines of Python>"

    # each word with the one before it: the list of previous words is one longer, its last one unused
    return " ".join(word(previous, arg) for previous, arg in zip(["", *argv], argv, strict=False))


def lines(s: dict[str, Any]) -> list[str]:
    """A summary (or sweep summary) as text: one line per fact, the environment one variable a line."""
    from toolkit.accelerators import of_device

    torchrun = ", one torchrun per node starts them" if s["launcher_style"] == "torchrun" else ""
    cluster = s["cluster"]
    out = [f"{s['job']}: {s['nodes']} node{'s' * (s['nodes'] != 1)} x {s['devices_per_node']} "
           f"{of_device(s['device']).units} ({s['instance_type']}), {s['ranks']} ranks ({s['ranks_per_node']} per "
           f"node{torchrun})" + (f"; {s['spares']} spare node(s) to restart on" if s.get("spares") else ""),
           f"queue:       {s['queue']['name']}, {s['queue']['source']}",
           f"cluster:     {cluster['config'] + ', from ' if cluster['config'] else ''}{cluster['source']}; "
           "--cluster FILE picks another",
           f"time limit:  {s['time_limit']}",
           f"submit with: {target_for(s['executor']).summary}",
           f"{'sweep dir:' if 'sweep' in s else 'run dir:':13}{s['run_dir']}"]
    if container := s.get("container"):
        out.append(f"container:   {container['image']} (pyxis, every rank)"
                   + (f", workdir {container['workdir']}" if container["workdir"] else ""))
        mounts = container["mounts"] or ["(none)"]
        out += [f"mounts:      {mounts[0]}", *(f"             {mount}" for mount in mounts[1:])]
    if s.get("rank_order"):
        out.append(f"rank order:  {s['rank_order']}")
    env = [_env_line(v) for v in s["env"]] or ["(none set by the job)"]
    out += [f"environment: {env[0]}", *(f"             {line}" for line in env[1:])]
    out.append(f"rank 0 runs: {readable_argv(s['rank0_argv'])}" + (" (point 0)" if "sweep" in s else ""))
    if "sweep" in s:
        sweep = s["sweep"]
        limit = f"at most {sweep['max_array_size']} tasks per array: {sweep['max_array_size_source']}"
        out.append(f"sweep:       {sweep['tasks']} points as {arrays_text(sweep['arrays'])}, {limit}")
        out += [f"  {p['label']}: {' '.join(p['differs'])}  {p['run_dir']}" for p in sweep["points"]]
    return out


def dry_run_json(p: Any) -> dict[str, Any]:
    """--json of a dry run: the plan's own fields (its scripts and parameters) and the summary."""
    from toolkit.submit.sweep import SweepPlan

    return {**p.to_json(), "summary": sweep_summary(p) if isinstance(p, SweepPlan) else summary(p)}


def dry_run_text(p: Any, verbose: bool = False) -> str:
    """The dry run for people: the summary, and with `verbose` the plan in full (the scripts) after it."""
    from toolkit.submit.plan import describe
    from toolkit.submit.sweep import SweepPlan

    sweep = isinstance(p, SweepPlan)
    text = lines(sweep_summary(p) if sweep else summary(p))
    if not verbose:
        return "\n".join([*text, VERBOSE_HINT])
    return "\n".join([*text, "", sweep_describe(p) if sweep else describe(p)])


def sweep_describe(sp: Any) -> str:
    """A sweep in full: each task's submitit parameters, every point, the batch script of its first array."""
    data = sp.to_json()
    return "\n".join(
        [f"would submit {data['tasks']} tasks as {arrays_text(data['arrays'])} to queue {data['queue']} (at most "
         f"{data['max_array_size']} tasks per array; sweep dir {data['run_dir']}), each task:"]
        + [f"  {k}: {v}" for k, v in data["parameters"].items() if k != "setup"]
        + ["points:"] + [f"  {i}: {' '.join(point)}" for i, point in enumerate(data["points"])]
        + ["", "batch script submitit sends to sbatch:", data["batch_script"]])
