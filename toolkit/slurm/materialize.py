"""The Slurm materializer: a scheduler-neutral JobSpec (toolkit.job.spec.job_spec) on a Slurm queue becomes a job
with its Slurm part (toolkit.slurm.part.SlurmPart): values safe in #SBATCH lines, --wait-all-nodes, the ranks' CPU
binding, the pre-flight's arguments and the staged node-side bundle. The script renderer (toolkit.slurm.render)
and the submitit executor (toolkit.slurm.executors) read it; Kubernetes (toolkit.k8s) never does."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Mapping

from toolkit.accelerators import family
from toolkit.catalog import instance
from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError
from toolkit.job.scaling import Derived
from toolkit.job.spec import JobSpec, job_spec, queue_target, time_seconds
from toolkit.launchers import launcher_for
from toolkit.job.staging import bundle_path
from toolkit.node.ledger import FLEET_DIR_ENV, FLEET_SUBDIR, planned_fleet_dir
from toolkit.recipes.schema import Recipe
from toolkit.slurm.part import SlurmPart

# Values that reach `#SBATCH` lines, which sbatch (not the shell) parses: no quoting can make a newline safe
# there (it would end the comment and start a shell command), so such values are restricted instead.
DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_.:,+=@%/?-]+$")


# Where each such value comes from, for the fix: the option or variable the user set
_GIVEN_BY = {"run dir": "give --run-dir DIR (or $HPC_RUNS_DIR, where runs go)",
             "partition": "rename the queue in the cluster config"}


def _check_directive(what: str, value: str | None) -> None:
    if value is not None and not DIRECTIVE_SAFE.match(value):
        raise HpcError(f"{what} {value!r} cannot go into an #SBATCH line: only letters, digits and _.:,+=@%/?- "
                       "are allowed there",
                       fix=f"{_GIVEN_BY.get(what, f'give --{what}')} without spaces, quotes or shell characters")


def build_job_spec(recipe: Recipe, queue: Queue, nodes: int | None = None, *, profile: str | None = None,
                   slurm_options: Mapping[str, str | None] = {}, run_dir: str | None = None) -> JobSpec:
    """The job for `recipe` on `nodes` nodes of Slurm queue `queue` (recipe's resources.nodes when None), with
    `slurm_options` (account, qos, reservation, dependency) passed through to sbatch."""
    return on_slurm(job_spec(recipe, queue_target(queue), nodes, profile=profile, run_dir=run_dir), queue,
                    slurm_options)


# sbatch(1), --signal: "Due to the resolution of event handling by Slurm, the signal may be sent up to 60 seconds
# earlier than specified."
SIGNAL_RESOLUTION_S = 60


def check_stop_signal(spec: JobSpec) -> None:
    """A job that Slurm asks to stop before its time limit (--signal, then it requeues itself) needs a limit
    longer than the signal's lead and Slurm's slack in sending it: else it is told to stop at its start, and
    requeues itself again and again."""
    if not spec.stop.requeue:
        return  # no signal asked for
    limit_s, lead_s = time_seconds(spec.time_limit), spec.stop.before_s
    if limit_s <= lead_s + SIGNAL_RESOLUTION_S:
        least = -(-(lead_s + SIGNAL_RESOLUTION_S + 1) // 60)
        raise HpcError(f"time limit {spec.time_limit} ({limit_s} s) is too short for the stop signal {lead_s} s "
                       f"before it (Slurm may send it up to {SIGNAL_RESOLUTION_S} s early): the job would be told to "
                       "stop at its start and requeue itself again and again",
                       fix=f"give --time {least} or more; or --set resources.requeue=false for a run that just ends at "
                           f"its limit; or --set resources.signal_before_s=N with N under the limit by over "
                           f"{SIGNAL_RESOLUTION_S} s")


def on_slurm(spec: JobSpec, queue: Queue, slurm_options: Mapping[str, str | None] = {}) -> JobSpec:
    """What only Slurm needs of a job: values safe in #SBATCH lines, --wait-all-nodes on queues that boot
    nodes on demand, the ranks' CPU binding (their accelerator family's), and the nodes' Python where the recipe
    names no software."""
    options = {name: value for name, value in slurm_options.items() if value is not None}
    check_stop_signal(spec)
    # one Slurm task per rank, or one torchrun per node holding the CPUs of all its node's ranks
    tasks = 1 if spec.style == "torchrun" else spec.tasks_per_node
    cpus = spec.cpus_per_task * (spec.tasks_per_node if spec.style == "torchrun" else 1)
    for what, value in (("run dir", spec.run_dir), ("partition", queue.name), *options.items()):
        _check_directive(what, value)
    if spec.spares and spec.nodes + spec.spares > queue.max_nodes:  # the allocation holds the spares too
        room = queue.max_nodes - spec.spares
        fix = f"use --nodes 1..{room} or fewer --spares" if room >= 1 else f"use at most --spares {queue.max_nodes - 1}"
        raise HpcError(f"{spec.nodes} nodes and {spec.spares} spare(s) requested; queue {queue.name} has at most "
                       f"{queue.max_nodes}", fix=f"{fix}, or a bigger queue")
    derived = [Derived("--wait-all-nodes", "1" if queue.has_dynamic_nodes else "not set",
                       f"queue {queue.name} starts nodes on demand: run only once every node has booted"
                       if queue.has_dynamic_nodes
                       else f"queue {queue.name}'s nodes are all static (MinCount = MaxCount)")]
    # the ranks' CPU binding is their accelerator family's (toolkit.accelerators)
    holds_node = tasks * cpus >= queue.cpus_per_node
    binding, notes = family(queue.instance).srun_binding(queue.instance, tasks, queue.smt_off, holds_node)
    derived += [Derived(*note) for note in notes]
    software = spec.software
    if software.container:
        derived.append(Derived("container", software.container.image,
                               "software.container: every rank runs in it (srun --container-image, NVIDIA pyxis); "
                               "the batch script stays on the host"))
    elif (launcher_for(spec.launcher).python and not (software.venv or software.conda_root or software.modules)
            and sys.prefix != sys.base_prefix):
        software = dataclasses.replace(software, venv=sys.prefix)  # same Python on every node, as submitit's
        derived.append(Derived("software", sys.prefix, "the recipe names no software: the nodes use the venv "
                                                       "this toolkit runs in (it must be on a shared filesystem)"))
    spec = dataclasses.replace(spec, software=software)
    part = SlurmPart(tasks_per_node=tasks, cpus_per_task=cpus, output=f"{spec.run_dir}/{spec.job_name}-%j.out",
                     wait_all_nodes=queue.has_dynamic_nodes, srun_binding=binding, options=options)
    preflight = preflight_args(spec, queue) if spec.preflight else ()
    derived.append(Derived("pre-flight", "on" if spec.preflight else "off",
                           "every node is checked against the queue before the ranks start; a failed node stops "
                           "the job" + (", which is requeued without it" if spec.requeue else "")
                           if spec.preflight else "resources.preflight (training jobs outside containers: on)"))
    # Every Slurm job runs node-side code of ours (its ranks' heartbeats; the pre-flight, the spares supervisor):
    # the batch shell stages it before the ranks start (templates/setup.sh.j2).
    part = dataclasses.replace(part, preflight_args=preflight, node_bundle=bundle_path(spec.run_dir))
    if queue.topology:
        order, why = network_order(spec, queue.topology)
        part = dataclasses.replace(part, network_order=order, topology_file=queue.topology)
        derived.append(Derived("rank order", "by network node" if order else "Slurm's", why))
    # The node ledger (toolkit.node.ledger): the pre-flight, the spares supervisor and the hang watchdog record
    # there, on the cluster's shared storage; a cluster config's queue only (default_queue() merely assumes an FSx).
    # Slurm's part, not the job's env: the neutral spec (and a Kubernetes form of it) stays as it was.
    mount = (queue.fsx_mount or next(iter(queue.shared_mounts), None)) if queue.from_config else None
    fleet = spec.environ.get(FLEET_DIR_ENV) or planned_fleet_dir(os.environ, mount)
    if fleet:
        part = dataclasses.replace(part, fleet_dir=fleet)
        derived.append(Derived("fleet ledger", fleet, "$HPC_FLEET_DIR, else <the cluster's shared storage>/"
                                                      f"{FLEET_SUBDIR} (hpc cluster nodes reads it)"))
    return dataclasses.replace(spec, slurm=part, derived=(*spec.derived, *derived))


def network_order(spec: JobSpec, topology_file: str) -> tuple[tuple[str, ...], str]:
    """The queue's nodes in network order for this job (empty where its ranks cannot follow it), and why."""
    if spec.style == "torchrun":
        return (), (f"queue's topology {topology_file} not used: torchrun numbers the ranks by its own "
                    "rendezvous, not by srun's task order")
    if spec.spares:
        return (), f"queue's topology {topology_file} not used: with spares the supervisor chooses each round's nodes"
    from toolkit.cluster.topology import order_from_conf
    from toolkit.textfile import read_text

    text = read_text(Path(topology_file), "topology file",
                     fix="write it with `hpc cluster topology`, or fix the queue's hpc:topology tag")
    return tuple(order_from_conf(text, topology_file)), f"ranks ordered by network node from {topology_file}"


def preflight_args(spec: JobSpec, queue: Queue) -> tuple[str, ...]:
    """What toolkit.node.preflight checks each node against: the queue's promise (instance type's devices, EFA,
    FSx, resolved here from the catalog: the node reads no catalog), and what the job loads (loader_check_arguments)."""
    args = ["--promise", queue.promise().to_json(), "--partition", queue.name]
    # the requeue's one-task helper: the config's smallest queue, not an exclusive node of the job's own
    helper = queue.helper_partition
    args += ["--helper-partition", helper] if spec.requeue and helper not in (None, queue.name) else []
    args += ["--spares", str(spec.spares)] if spec.spares else []
    args += ["--requeue"] if spec.requeue else []
    return (*args, *(f"--loader={a}" for a in loader_check_arguments(spec, queue.fabric)))


def loader_check_arguments(spec: JobSpec, fabric: str) -> list[str]:
    """What the job loads, as toolkit.node.loader_check's arguments (`fabric`: its queue's,
    toolkit.cluster.queues.Queue.fabric): the pre-flight's and `hpc cluster doctor --recipe`'s question."""
    args: list[str] = []
    python = launcher_for(spec.launcher).python
    if not python:  # a binary: what it links
        args += ["--program", str(spec.command[0])]
    # the collective library's own (Family.loader_checks: torch's NCCL and NCCL's net plugin, HCCL's OFI wrapper)
    return args + family(instance(spec.instance_type)).loader_checks(
        fabric=fabric, python_ranks=python, gpus_per_node=spec.gpus_per_node, environ=spec.environ)
