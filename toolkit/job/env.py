"""The job's environment: which submitter variables may enter a job, and what the job itself sets.

Nobody can see the nodes' aws-ofi-nccl at render time, so the collective library's set (the instance's
accelerator family, toolkit.accelerators: NCCL/EFA, HCCL/EFA) follows its catalog facts and the queue's fabric
(toolkit.cluster.queues.Queue.fabric: modern | legacy | none, where none is any queue without EFA enabled). Every
variable carries a one-line reason, printed as a comment above its `export` in the rendered script.

The dynamic loader's search path is explicit too: activating a venv sets no LD_LIBRARY_PATH, and the submitter's
never reaches a job (SUBMIT_ENV_ALLOWLIST), so libraries outside ldconfig's cache (the EFA installer's Open MPI
and aws-ofi-nccl, a separate NCCL, the HCCL OFI wrapper) are found only through library_path().
"""

from __future__ import annotations

from typing import Mapping, Sequence

from toolkit.accelerators import family
from toolkit.accelerators.base import EnvVar
from toolkit.catalog import InstanceType

__all__ = ["EnvVar"]  # a job's variable, defined beside the families whose variables it carries

# The only submitter variables a job receives (sbatch --export=<these names>; Slurm adds SLURM_*).
# Deliberately absent: AWS_* and other credentials/tokens, PYTHONPATH / LD_LIBRARY_PATH / VIRTUAL_ENV / CONDA_*
# (the nodes' own training environment sets them; leaking the submitter's breaks jobs in ways that differ per
# shell), and everything else: sbatch's default --export=ALL would copy the whole shell into every job.
SUBMIT_ENV_ALLOWLIST = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

# Variables whose values in effect the job prints at start (prefixes, for `env | grep`).
COMMUNICATION_PREFIXES = ("NCCL_", "FI_", "RDMAV_", "HCCL_", "OMP_NUM_THREADS", "LD_LIBRARY_PATH=")

LIBRARY_PATH = "LD_LIBRARY_PATH"


def submit_env_allowlist() -> tuple[str, ...]:
    """Names of the submitter's variables that reach the job (everything else is dropped)."""
    return SUBMIT_ENV_ALLOWLIST


def filter_submit_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of a submitter's environment a job may see (for executors that pass values, not names)."""
    return {name: environ[name] for name in SUBMIT_ENV_ALLOWLIST if name in environ}


# Why a recipe sets a variable the toolkit leaves alone (printed beside the recipe's value in the render).
RECIPE_ENV_REASONS = {
    "FI_EFA_USE_HUGE_PAGE": "0 keeps the EFA provider's buffers out of huge pages, so forked data-loader workers "
                            "do not exhaust the huge-page pool (OSError: Cannot allocate memory), at a small cost "
                            "(libfabric fi_efa(7))",
}


def library_path(instance: InstanceType, fabric: str, *, recipe_dirs: Sequence[str] = (),
                 nccl_home: str | None = None, recipe_name: str = "") -> EnvVar | None:
    """LD_LIBRARY_PATH put before the nodes' own: the recipe's directories (software.library_path), its NCCL
    (software.nccl_home/lib: nccl-tests built against a separate NCCL), then on EFA queues the EFA installer's
    libraries its accelerator family's collective needs (Family.library_dirs)."""
    dirs, why = list(recipe_dirs), []
    if recipe_dirs:
        why.append(f"recipe {recipe_name}'s software.library_path")
    if nccl_home:
        dirs.append(f"{nccl_home}/lib")
        why.append(f"recipe {recipe_name}'s NCCL (software.nccl_home {nccl_home})")
    plugin_dirs, plugin_why = family(instance).library_dirs(instance, fabric)
    dirs += plugin_dirs
    why += [plugin_why] if plugin_why else []
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
            nccl_home: str | None = None, env_origins: Mapping[str, str] | None = None) -> tuple[EnvVar, ...]:
    """The ordered variables a job exports: the loader path, communication, threads, launcher needs, then the
    recipe's own (a recipe's env.LD_LIBRARY_PATH replaces the computed one). `env_origins`: where a recipe value
    came from when not the recipe file ("profile smoke", "--set env.X=1": --env and --set are the command line)."""
    env: list[EnvVar] = [EnvVar("PYTHONUNBUFFERED", "1", "rank logs reach the Slurm output as they happen")]
    loader = library_path(instance, fabric, recipe_dirs=library_dirs, nccl_home=nccl_home, recipe_name=recipe_name)
    if loader:
        env.append(loader)
    env += family(instance).job_env(instance, fabric)
    if threads_per_rank is not None:
        env.append(EnvVar("OMP_NUM_THREADS", str(threads_per_rank),
                          "one thread per CPU given to the rank: oversubscribed ranks run 2-3x slower"))
    env += launcher_env  # what the launcher's program needs (toolkit.launchers)
    merged = {var.name: var for var in env}
    for name, value in recipe_env.items():
        reason = RECIPE_ENV_REASONS.get(name)
        origin = (env_origins or {}).get(name, "")
        by = ("set on the command line" if origin.startswith("--") else
              f"set by recipe {recipe_name}'s {origin}" if origin else f"set by recipe {recipe_name}")
        merged[name] = EnvVar(name, str(value), f"{by} (env.{name})" + (f": {reason}" if reason else ""))
    return tuple(merged.values())
