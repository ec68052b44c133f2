"""The job's environment: which submitter variables may enter a job, and what the job itself sets.

Nobody can see the nodes' aws-ofi-nccl at render time, so the EFA/NCCL set follows the instance's catalog
facts and the queue's fabric (toolkit.cluster.queues.Queue.fabric: modern | legacy | none, where none is any
queue without EFA enabled). Every variable carries a one-line
reason, printed as a comment above its `export` in the rendered script.

The dynamic loader's search path is explicit too: activating a venv sets no LD_LIBRARY_PATH, and the submitter's
never reaches a job (SUBMIT_ENV_ALLOWLIST), so libraries outside ldconfig's cache (the EFA installer's Open MPI
and aws-ofi-nccl, a separate NCCL, the HCCL OFI wrapper) are found only through library_path().
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from toolkit.catalog import InstanceType

# The only submitter variables a job receives (sbatch --export=<these names>; Slurm adds SLURM_*).
# Deliberately absent: AWS_* and other credentials/tokens, PYTHONPATH / LD_LIBRARY_PATH / VIRTUAL_ENV / CONDA_*
# (the nodes' own training environment sets them; leaking the submitter's breaks jobs in ways that differ per
# shell), and everything else: sbatch's default --export=ALL would copy the whole shell into every job.
SUBMIT_ENV_ALLOWLIST = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

# Variables whose values in effect the job prints at start (prefixes, for `env | grep`).
COMMUNICATION_PREFIXES = ("NCCL_", "FI_", "RDMAV_", "HCCL_", "OMP_NUM_THREADS", "LD_LIBRARY_PATH=")


# Library directories the EFA installer creates, in the order AWS's own nccl-tests job puts them before the
# nodes' LD_LIBRARY_PATH: libfabric, Open MPI, aws-ofi-nccl (aws-samples/awsome-distributed-training
# micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch); older AMIs had aws-ofi-nccl in /opt/aws-ofi-nccl/lib
# (the same file at commit 9b037bddcac7085c95ed3d2ca069206995aa8df6). A directory a node lacks costs nothing.
LIBFABRIC_DIR = "/opt/amazon/efa/lib"
OPENMPI_DIR = "/opt/amazon/openmpi/lib"
OFI_NCCL_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib")
# HCCL finds its libfabric wrapper (libhccl_ofi_wrapper.so) through the loader: HabanaAI/hccl_ofi_wrapper README.md
# installs it in /usr/lib/habanalabs and puts that on LD_LIBRARY_PATH; HabanaAI/Model-References 1.8.0
# PyTorch/nlp/pretraining/deepspeed-bert/README.md (DL1 multi-server) has it where it was built, /root/hccl_ofi_wrapper,
# then /opt/amazon/openmpi/lib and /opt/amazon/efa/lib.
HCCL_OFI_WRAPPER = "libhccl_ofi_wrapper.so"  # HabanaAI/hccl_ofi_wrapper README.md: the library HCCL loads
HCCL_OFI_WRAPPER_DIRS = ("/usr/lib/habanalabs", "/root/hccl_ofi_wrapper")
LIBRARY_PATH = "LD_LIBRARY_PATH"


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    doc: str
    # value is a path list put before the variable's value on the node at run time (what the nodes' modules and
    # venv set), not a replacement: `export NAME=VALUE${NAME:+:$NAME}`
    prepend: bool = False


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
                                                  "P3dn RoBERTa runs"),
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
    """What a Gaudi job exports: lazy mode always; the two peer-direct variables and HCCL's bootstrap interface
    when the queue uses EFA (sources: toolkit.job.gaudi's docstring; the loader path is library_path())."""
    env = [EnvVar("PT_HPU_LAZY_MODE", "1", "Habana PyTorch bridge in lazy mode (our workloads call "
                                           "htcore.mark_step()); newer Gaudi software defaults to eager")]
    if fabric != "none":  # Queue.fabric: EFA enabled on the queue
        env += [
            EnvVar("RDMAV_FORK_SAFE", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI}, EFA peer-direct: libibverbs keeps "
                                           "HPU memory registered with EFA safe when data-loader workers fork"),
            EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI} (libfabric >= 1.16.1, "
                                                  "kernel >= 5.12): HCCL sends straight from HPU memory over EFA; "
                                                  "without it 32-HPU all-reduce at 32 MB drops 21,136 -> 12,110 MB/s"),
            EnvVar("HCCL_SOCKET_IFNAME", "eth0", "HCCL's bootstrap sockets on the instance's primary interface, as "
                                                 "Model-References' DL1 set-up gives it (deepspeed-bert README); set "
                                                 "env.HCCL_SOCKET_IFNAME in the recipe where the AMI names it ens5"),
        ]
    return env


def library_path(instance: InstanceType, fabric: str, *, recipe_dirs: Sequence[str] = (),
                 nccl_home: str | None = None, recipe_name: str = "") -> EnvVar | None:
    """LD_LIBRARY_PATH put before the nodes' own: the recipe's directories (software.library_path), its NCCL
    (software.nccl_home/lib: nccl-tests built against a separate NCCL), then on EFA queues the EFA installer's
    libraries (GPU: libfabric, Open MPI, aws-ofi-nccl; Gaudi: the HCCL OFI wrapper, Open MPI, libfabric)."""
    dirs, why = list(recipe_dirs), []
    if recipe_dirs:
        why.append(f"recipe {recipe_name}'s software.library_path")
    if nccl_home:
        dirs.append(f"{nccl_home}/lib")
        why.append(f"recipe {recipe_name}'s NCCL (software.nccl_home {nccl_home})")
    if fabric != "none" and instance.is_gpu:
        dirs += [LIBFABRIC_DIR, OPENMPI_DIR, *OFI_NCCL_DIRS]
        why.append("the EFA installer's libfabric, Open MPI and aws-ofi-nccl (/opt/aws-ofi-nccl on older AMIs), "
                   "as AWS's nccl-tests jobs set it: NCCL_NET fails closed when the plugin is not found")
    elif fabric != "none" and instance.accelerator == "gaudi":
        dirs += [*HCCL_OFI_WRAPPER_DIRS, OPENMPI_DIR, LIBFABRIC_DIR]
        why.append("the HCCL OFI wrapper HCCL loads for EFA scale-out, Open MPI and libfabric, as Habana's DL1 "
                   "set-up gives them")
    if not dirs:
        return None
    return EnvVar(LIBRARY_PATH, ":".join(dict.fromkeys(dirs)),
                  "prepended to what the nodes' modules/venv set (a venv sets none; the submitter's never reaches "
                  "the job): " + "; ".join(why), prepend=True)


def heartbeat_env(run_dir: str, hang_timeout_s: int | None, bundle: str | None = None) -> list[EnvVar]:
    """Where the ranks keep their heartbeats (toolkit.node.heartbeat), the hang timeout if one is set, and the
    staged node-side code (`bundle`, toolkit.job.staging) first on PYTHONPATH: `from hpc_node.heartbeat import
    beat` then works in a rank on a node without hpc installed."""
    from toolkit.node import heartbeat

    env = [EnvVar(heartbeat.DIR_VAR, f"{run_dir}/heartbeats",
                  "each rank's step and time (toolkit.node.heartbeat): `hpc jobs status` names a rank that "
                  "stops progressing")]
    if hang_timeout_s:
        env.append(EnvVar(heartbeat.HANG_VAR, str(hang_timeout_s),
                          f"rank 0 ends the job once a rank has made no progress for {hang_timeout_s} s, naming it "
                          "(resources.hang_timeout_s)"))
    if bundle:
        env.append(EnvVar("PYTHONPATH", bundle, "hpc's node-side code, staged in the run dir: a script beats with "
                                                "`from hpc_node.heartbeat import beat`", prepend=True))
    return env


def job_env(instance: InstanceType, fabric: str, *, threads_per_rank: int | None, launcher_env: Sequence[EnvVar],
            recipe_env: Mapping[str, str], recipe_name: str, library_dirs: Sequence[str] = (),
            nccl_home: str | None = None) -> tuple[EnvVar, ...]:
    """The ordered variables a job exports: the loader path, communication, threads, launcher needs, then the
    recipe's own (a recipe's env.LD_LIBRARY_PATH replaces the computed one)."""
    env: list[EnvVar] = [EnvVar("PYTHONUNBUFFERED", "1", "rank logs reach the Slurm output as they happen")]
    loader = library_path(instance, fabric, recipe_dirs=library_dirs, nccl_home=nccl_home, recipe_name=recipe_name)
    if loader:
        env.append(loader)
    if instance.is_gpu:
        env += communication_env(instance, fabric)
    elif instance.accelerator == "gaudi":  # HCCL, not NCCL: no NCCL_* variables
        env += gaudi_env(instance, fabric)
    if threads_per_rank is not None:
        env.append(EnvVar("OMP_NUM_THREADS", str(threads_per_rank),
                          "one thread per CPU given to the rank: oversubscribed ranks run 2-3x slower"))
    env += launcher_env  # what the launcher's program needs (toolkit.launchers)
    merged = {var.name: var for var in env}
    for name, value in recipe_env.items():
        reason = RECIPE_ENV_REASONS.get(name)
        merged[name] = EnvVar(name, str(value), f"set by recipe {recipe_name} (env.{name})"
                                                + (f": {reason}" if reason else ""))
    return tuple(merged.values())
