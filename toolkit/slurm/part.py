"""What only Slurm needs of a job (toolkit.slurm.materialize makes it): the scheduler-neutral JobSpec carries it
as `spec.slurm`, None until the job is planned for a Slurm queue (a Kubernetes spec never has one)."""

from __future__ import annotations

import dataclasses
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class SlurmPart:
    tasks_per_node: int  # Slurm tasks per node: one per rank, or one torchrun per node
    cpus_per_task: int  # a torchrun task holds the CPUs of all its node's ranks
    output: str  # stdout/stderr file pattern (%j = job id)
    wait_all_nodes: bool = False  # the queue boots nodes on demand: start once every node is up
    srun_binding: tuple[str, ...] = ()  # srun CPU-binding options (toolkit.slurm.materialize)
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)  # account, qos, ... passed to sbatch
    preflight_args: tuple[str, ...] = ()  # the queue's promises, as toolkit.node.preflight's arguments
    node_bundle: str | None = None  # the staged node-side code (toolkit.job.staging), first on ranks' PYTHONPATH
    expedited_requeue: bool = False  # sbatch --requeue=expedite (toolkit.slurm.version)
    # the queue's nodes in network order (its hpc:topology file): the ranks' srun follows it (toolkit.slurm.hostfile)
    network_order: tuple[str, ...] = ()
    topology_file: str | None = None
    # the cluster's node ledger (toolkit.node.ledger): the batch shell exports it as HPC_FLEET_DIR, so the pre-flight,
    # the spares supervisor and the hang watchdog record there
    fleet_dir: str | None = None
