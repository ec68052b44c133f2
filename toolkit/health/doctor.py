"""`hpc cluster doctor`: one task on every node (or N nodes) of a queue gathers facts; each node's checks follow.

The task is toolkit.node.node_check's source run as `python3 -c SOURCE` under srun, so the nodes need no
toolkit install. Nodes Slurm cannot run on (down, drained, not responding) are reported, not waited for.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess

from toolkit.accelerators import family_or_none
from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError, UsageError
from toolkit.health.containers import ContainerCheck, pyxis_loaded, start_argv, started_check
from toolkit.node import standalone_source
from toolkit.node.evaluate import Check, evaluate
from toolkit.job.env import submit_env_allowlist

JOB_NAME = "hpc-doctor"
DEFAULT_TIMEOUT = 600.0  # ParallelCluster powers dynamic nodes up in about 5-7 minutes
# Slurm node states a job cannot start on (the base state, lower case, before flags like ~ or *)
UNUSABLE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "future", "inval", "maint",
                   "reboot_issued", "reboot_requested", "unknown")


@dataclasses.dataclass(frozen=True)
class NodeReport:
    node: str
    checks: tuple[Check, ...] = ()
    facts: dict | None = None
    error: str | None = None  # why there are no checks (node state, or no report came back)

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.status != "FAIL" for c in self.checks)


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    queue: Queue
    nodes: tuple[NodeReport, ...]
    job_error: str | None = None  # srun's own complaint when it failed
    slurm_version: str | None = None
    slurm_missing: tuple[str, ...] = ()  # what our rendered jobs for this queue use that this Slurm lacks
    containers: ContainerCheck | None = None  # pyxis here; with --container-image, a container on every node

    @property
    def ok(self) -> bool:
        containers_ok = self.containers is None or self.containers.image is None or (
            self.containers.pyxis and self.containers.error is None)
        return bool(self.nodes) and all(n.ok for n in self.nodes) and not self.slurm_missing and containers_ok

    def as_dict(self) -> dict:
        q = self.queue
        return {
            "ok": self.ok,
            "queue": {"name": q.name, "instance_type": q.instance_type, "efa_stack": q.efa_stack,
                      "gpus_per_node": q.gpus_per_node, "efa_interfaces": q.instance.efa_interfaces,
                      "fsx_mount": q.fsx_mount},
            "nodes": [{"node": n.node, "ok": n.ok, "error": n.error,
                       "checks": [dataclasses.asdict(c) for c in n.checks], "facts": n.facts} for n in self.nodes],
            "job_error": self.job_error,
            "slurm": {"version": self.slurm_version, "missing": list(self.slurm_missing)},
            "containers": self.containers.as_dict() if self.containers else None,
        }


def unusable(state: str) -> bool:
    """Whether Slurm cannot start a job on a node in this sinfo %T state (e.g. drained, down*, idle*)."""
    base = state.rstrip("*~#!%$@^-+").lower()
    return base in UNUSABLE_STATES or state.endswith("*")


def partition_nodes(partition: str) -> list[tuple[str, str]]:
    """(node, state) for every node of a Slurm partition."""
    from toolkit.slurm.commands import run

    out = run(["sinfo", "--noheader", "--Node", f"--partition={partition}", "--format=%N %T"]).stdout
    nodes = [(words[0], words[1]) for line in out.splitlines() if len(words := line.split()) >= 2]
    if not nodes:
        raise HpcError(f"Slurm has no partition {partition!r} (or it has no nodes)",
                       fix="check the queue name against `sinfo -s`, or pass the right --cluster/--queue")
    return nodes


def node_check_source() -> str:
    return standalone_source("node_check")


def srun_argv(queue: Queue, nodes: int, nodelist: list[str] | None, python: str = "python3") -> list[str]:
    """One task per node running the node check; GPU queues ask for every GPU so a cgroup hides none."""
    argv = ["srun", f"--partition={queue.name}", f"--nodes={nodes}", "--ntasks-per-node=1", "--time=5",
            f"--job-name={JOB_NAME}"]
    if nodelist:
        argv.append(f"--nodelist={','.join(nodelist)}")
    # the submitter variables a job gets, no more: the submitter's LD_LIBRARY_PATH would widen the library search
    argv.append(f"--export={','.join(submit_env_allowlist())}")
    accel = family_or_none(queue.instance)  # the doctor checks any queue, one with a refused family too
    if accel is not None and accel.slurm_gres:  # devices that are no Slurm GRES: asking for them would be refused
        argv.append(f"--gpus-per-node={queue.gpus_per_node}")
    argv += [python, "-c", node_check_source(), "--json"]
    if queue.fsx_mount:
        argv += ["--mount", queue.fsx_mount]
    return argv


def run_srun(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """srun with a deadline: on expiry SIGTERM (srun then cancels its job or pending request), not SIGKILL."""
    from toolkit.slurm.commands import find

    program = find("srun")
    if program is None:
        raise HpcError("Slurm's `srun` is not installed here",
                       fix="run on the cluster's head/login node (or put Slurm's client commands on PATH)")
    proc = subprocess.Popen([program, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise HpcError(f"the doctor job did not finish within {timeout:.0f} s",
                       fix="the nodes may be busy or powering up: see `squeue -p QUEUE`, then retry "
                           "(or raise --timeout)") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def parse_reports(stdout: str) -> dict[str, dict]:
    """Node name -> facts, from the node checks' JSON lines (anything else on stdout is ignored)."""
    reports = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            facts = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(facts, dict) and "node" in facts:
            reports[str(facts["node"])] = facts
    return reports


def slurm_facts(queue: Queue) -> tuple[str, tuple[str, ...]]:
    """The controller's Slurm version and what our rendered jobs for QUEUE need that it lacks."""
    from toolkit.slurm import version

    found = version.detect()
    return str(found), tuple(version.missing_for_rendered_jobs(found, version.show_config(), queue.gpus_per_node,
                                                               version.mpi_types()))


def check_containers(queue: Queue, count: int, nodelist: list[str] | None, image: str | None,
                     timeout: float) -> ContainerCheck:
    """pyxis on this node (srun --help); with IMAGE, whether a container of it starts on each node (enroot)."""
    if not pyxis_loaded():
        return ContainerCheck(False, image, error="pyxis is not loaded (srun --help has no --container-image)")
    if image is None:
        return ContainerCheck(True)
    return started_check(image, count, run_srun(start_argv(queue.name, count, nodelist, image), timeout))


def run_doctor(queue: Queue, nodes: int | None = None, timeout: float = DEFAULT_TIMEOUT,
               container_image: str | None = None) -> DoctorReport:
    """Check every usable node of the queue (or `nodes` of them); unusable nodes are reported as failures.
    Containers: whether pyxis is loaded, and with `container_image` whether that image starts on the nodes."""
    slurm = slurm_facts(queue)
    states = partition_nodes(queue.name)
    usable = [name for name, state in states if not unusable(state)]
    skipped = [] if nodes else [NodeReport(name, error=f"Slurm state {state}: not checked")
                                for name, state in states if unusable(state)]
    if nodes is not None and nodes > len(usable):
        raise UsageError(f"--nodes {nodes}: partition {queue.name} has {len(usable)} usable node(s) of {len(states)}",
                         fix=f"use --nodes 1..{len(usable)}" if usable else "resume the nodes first (sinfo -R)")
    if not usable:
        return DoctorReport(queue, tuple(skipped), "no node of the partition can run a job", *slurm)
    count = nodes or len(usable)
    res = run_srun(srun_argv(queue, count, None if nodes else usable), timeout)
    reports = parse_reports(res.stdout)
    job_error = None
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        job_error = lines[-1] if lines else f"srun exited {res.returncode}"
    promise = queue.promise()
    checked = [NodeReport(name, tuple(evaluate(facts, promise)), facts) for name, facts in sorted(reports.items())]
    expected = usable if not nodes else []
    missing = [NodeReport(name, error=f"no report: {job_error or 'the node check printed nothing'}")
               for name in expected if name not in reports]
    missing += [NodeReport(f"?{i + 1}", error=f"no report: {job_error or 'the node check printed nothing'}")
                for i in range(max(0, count - len(reports) - len(missing)))]
    containers = check_containers(queue, count, None if nodes else usable, container_image, timeout)
    return DoctorReport(queue, tuple(sorted(checked + missing + skipped, key=lambda n: n.node)), job_error, *slurm,
                        containers=containers)
