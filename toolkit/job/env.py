"""The job's environment: which submitter variables may enter a job, and what the job itself sets.

Nobody can see the nodes' aws-ofi-nccl at render time, so the EFA/NCCL set follows the instance's catalog
facts and the queue's fabric (toolkit.cluster.queues.Queue.fabric: modern | legacy | none, where none is any
queue without EFA enabled). Every variable carries a one-line
reason, printed as a comment above its `export` in the rendered script.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from toolkit.catalog import InstanceType

# The only submitter variables a job receives (sbatch --export=<these names>; Slurm adds SLURM_*).
# Deliberately absent: AWS_* and other credentials/tokens, PYTHONPATH / LD_LIBRARY_PATH / VIRTUAL_ENV / CONDA_*
# (the nodes' own training environment sets them; leaking the submitter's breaks jobs in ways that differ per
# shell), and everything else: sbatch's default --export=ALL would copy the whole shell into every job.
SUBMIT_ENV_ALLOWLIST = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

# Variables whose values in effect the job prints at start (prefixes, for `env | grep`).
COMMUNICATION_PREFIXES = ("NCCL_", "FI_", "RDMAV_", "OMP_NUM_THREADS")


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    doc: str


def submit_env_allowlist() -> tuple[str, ...]:
    """Names of the submitter's variables that reach the job (everything else is dropped)."""
    return SUBMIT_ENV_ALLOWLIST


def filter_submit_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of a submitter's environment a job may see (for executors that pass values, not names)."""
    return {name: environ[name] for name in SUBMIT_ENV_ALLOWLIST if name in environ}


def communication_env(instance: InstanceType, fabric: str) -> list[EnvVar]:
    """NCCL/EFA variables for a GPU instance type and the queue's fabric (Queue.fabric)."""
    env = [EnvVar("NCCL_DEBUG", "INFO", "bring-up: NCCL logs its version and the transport it picked "
                                        "(NET/OFI = EFA, NET/Socket = TCP); set WARN in the recipe's env once healthy"),
           EnvVar("NCCL_DEBUG_SUBSYS", "INIT,NET", "only NCCL's start-up and network lines: what `hpc jobs status` "
                                                   "and `hpc report run` read to tell which transport ran")]
    if fabric != "none":
        env.append(EnvVar("NCCL_NET", "AWS Libfabric", "fail closed: NCCL must use the aws-ofi-nccl plugin (EFA); a "
                                                       "missing plugin stops the job ('network AWS Libfabric not "
                                                       "found') instead of falling back to TCP sockets at a fraction "
                                                       "of the speed. Every plugin release answers to this name"))
    if fabric == "legacy":
        env += [
            EnvVar("FI_PROVIDER", "efa", "aws-ofi-nccl <= 1.5 does not pick the EFA libfabric provider itself"),
            EnvVar("FI_EFA_TX_MIN_CREDITS", "64", "older libfabric EFA provider: more send credits, as in the "
                                                  "P3dn fairseq/RoBERTa runs"),
            EnvVar("NCCL_SOCKET_IFNAME", "^lo,docker", "bootstrap on the instance's network interface (eth0 or "
                                                       "ens5 by AMI), never loopback or docker"),
            EnvVar("NCCL_PROTO", "simple", "aws-ofi-nccl <= 1.5 over EFA: its maintainers require the Simple protocol "
                                           "(LL/LL128 can corrupt data there); newer plugins must not get it, it "
                                           "bypasses their tuner"),
        ]
        if instance.gpudirect_rdma:
            env.append(EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"{instance.name} has GPUDirect RDMA over EFA; old "
                                                             "libfabric leaves it off unless asked"))
    elif fabric == "none":
        env += [
            EnvVar("NCCL_SOCKET_NTHREADS", "4", "TCP only: more socket threads per connection (threads x sockets "
                                                "<= 64); 4x4 doubled bus bandwidth above ~1 MB on 25 Gb/s"),
            EnvVar("NCCL_NSOCKS_PERTHREAD", "4", "TCP only: sockets per thread (see NCCL_SOCKET_NTHREADS)"),
        ]
    # modern: aws-ofi-nccl >= 1.7 / libfabric >= 1.18 set the provider, RDMA and protocol defaults themselves;
    # setting the old knobs by hand overrides tuned, version-gated values.
    return env


# Why a recipe sets a variable the toolkit leaves alone (printed beside the recipe's value in the render).
RECIPE_ENV_REASONS = {
    "FI_EFA_USE_HUGE_PAGE": "0 keeps the EFA provider's buffers out of huge pages, so forked data-loader workers "
                            "do not exhaust the huge-page pool (OSError: Cannot allocate memory), at a small cost "
                            "(libfabric fi_efa(7))",
}


# The SynapseAI release that brought EFA peer-direct (Host NIC Gaudi Direct) to DL1.
PEER_DIRECT_SYNAPSEAI = "1.8.0"


def gaudi_env(instance: InstanceType, fabric: str) -> list[EnvVar]:
    """What a Gaudi job exports: lazy mode always; the two peer-direct variables when the queue uses EFA
    (sources: toolkit.job.gaudi's docstring)."""
    env = [EnvVar("PT_HPU_LAZY_MODE", "1", "Habana PyTorch bridge in lazy mode (our workloads call "
                                           "htcore.mark_step()); newer Gaudi software defaults to eager")]
    if fabric != "none":  # Queue.fabric: EFA enabled on the queue
        env += [
            EnvVar("RDMAV_FORK_SAFE", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI}, EFA peer-direct: libibverbs keeps "
                                           "HPU memory registered with EFA safe when data-loader workers fork"),
            EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI} (libfabric >= 1.16.1, "
                                                  "kernel >= 5.12): HCCL sends straight from HPU memory over EFA; "
                                                  "without it 32-HPU all-reduce at 32 MB drops 21,136 -> 12,110 MB/s"),
        ]
    return env


def job_env(instance: InstanceType, fabric: str, *, threads_per_rank: int | None, launcher_kind: str,
            recipe_env: Mapping[str, str], recipe_name: str) -> tuple[EnvVar, ...]:
    """The ordered variables a job exports: communication, threads, launcher needs, then the recipe's own."""
    env: list[EnvVar] = [EnvVar("PYTHONUNBUFFERED", "1", "rank logs reach the Slurm output as they happen")]
    if instance.is_gpu:
        env += communication_env(instance, fabric)
    elif instance.accelerator == "gaudi":  # HCCL, not NCCL: no NCCL_* variables
        env += gaudi_env(instance, fabric)
    if threads_per_rank is not None:
        env.append(EnvVar("OMP_NUM_THREADS", str(threads_per_rank),
                          "one thread per CPU given to the rank: oversubscribed ranks run 2-3x slower"))
    if launcher_kind == "fairseq":
        env.append(EnvVar("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1",
                          "torch >= 2.6 refuses fairseq's own checkpoints (resume, generate) without it"))
    merged = {var.name: var for var in env}
    for name, value in recipe_env.items():
        reason = RECIPE_ENV_REASONS.get(name)
        merged[name] = EnvVar(name, str(value), f"set by recipe {recipe_name} (env.{name})"
                                                + (f": {reason}" if reason else ""))
    return tuple(merged.values())
