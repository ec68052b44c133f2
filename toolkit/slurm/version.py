"""Which Slurm answers, and whether it has what our rendered jobs use.

Our tests run on 22.05 (Debian bookworm), 24.11 (trixie, ParallelCluster 3.14) and 26.05 (forky); they bracket
the 25.11 of ParallelCluster 3.15-3.16. Code that must differ between versions asks `detect()` and writes the
difference down where it branches. What tests/test_slurm_conformance.py found across 22.05.8, 24.11.5 and
26.05.5 for what we use: the same sbatch/srun options, squeue/scontrol fields (array rows, Restarts, JobState),
sacct's "accounting storage is disabled" exit 1, `srun --mpi=list` layout and requeue/USR2 behaviour, so no
code here branches yet. Differences seen: 24.11's srun (not 22.05's) exports MPI launcher hints into every task
(OMPI_MCA_plm_slurm_args, PRTE_MCA_plm_slurm_args, HYDRA_BOOTSTRAP, I_MPI_HYDRA_BOOTSTRAP...), and its tasks
carry SLURM_TRES_PER_TASK (cpu=N from --cpus-per-task), SLURM_JOB_START_TIME/END_TIME, SLURM_OOM_KILL_STEP;
the pmix plugin is pmix_v5 (22.05: pmix_v4); 24.11 daemons check their own name (argv[0]) before loading
plugins; `sinfo --version`/`scontrol version` need a readable config on both.

What changed in 25.11 and 26.05 (SchedMD/slurm CHANGELOG/slurm-25.11.md, CHANGELOG/slurm-26.05.md,
doc/man/man1/sbatch.1; measured on 26.05.5); nothing we send is refused:
- `--requeue` takes a value since 25.11: `--requeue=expedite` (22.05 and 24.11 refuse any value as a usage
  error). 26.05.1 refuses any other value ("Invalid --requeue specification", src/common/slurm_opt.c
  arg_set_requeue), and `expedite` is refused at submission ("Requested operation not supported on this
  system") unless slurm.conf has SlurmctldParameters=enable_expedited_requeue. We render a bare `--requeue`,
  and `--requeue=expedite` where the cluster we plan on has both (expedited_requeue()).
- 26.05: `--gres=gpu:N` and `--gpus-per-node` are mutually exclusive (sbatch exits "fatal"); we render only
  --gpus-per-node.
- Since 25.05 a job whose login environment (`--get-user-env`, implied by the rendered script's --export=LIST)
  fails or times out (120 s) is requeued and held ("user env retrieval failed requeued held"), where older
  versions ran it: a wait for it ends with that reason (toolkit.slurm.status.held) instead of never.
- 25.11: sacct no longer subtracts 128 from exit codes above 128 (we show ExitCode as Slurm prints it).
- 26.05's `sbatch --test-only` line reads "to start at T a using N processors" (src/api/allocate.c) and may
  name the cluster; we read only its exit status.
- Debian forky's 26.05.5-1 has no mpi/pmix plugin (Debian's packaging: "Remove pmix", bug #1149781), so
  doctor reports it missing on that lane; ParallelCluster builds Slurm with pmix.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

from toolkit.errors import HpcError
from toolkit.slurm import commands


@dataclasses.dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"


def parse(text: str) -> SlurmVersion:
    """`scontrol version` / `sinfo --version` output ("slurm 22.05.8", "slurm-wlm 24.11.5") -> SlurmVersion."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        raise HpcError(f"cannot read a Slurm version from {text.strip()!r}",
                       fix="check that `scontrol version` prints e.g. `slurm 24.11.5`")
    return SlurmVersion(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def detect() -> SlurmVersion:
    """The version of the Slurm commands on PATH (both need a reachable config, not a running controller)."""
    return parse(commands.run(["scontrol", "version"]).stdout)


def show_config(timeout: float = commands.DEFAULT_TIMEOUT) -> dict[str, str]:
    """`scontrol show config` as KEY -> value."""
    out = commands.run(["scontrol", "show", "config"], timeout=timeout).stdout
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(\w+)\s+=\s?(.*)$", out, re.M)}


# sbatch --requeue=expedite (25.11): on node failure the job requeues at once, first in line, its nodes held for
# it (SchedMD/slurm CHANGELOG/slurm-25.11.md; sbatch(1) --requeue). Only where slurm.conf allows it.
EXPEDITED_REQUEUE = SlurmVersion(25, 11)
EXPEDITED_REQUEUE_PARAMETER = "enable_expedited_requeue"


def expedited_requeue() -> bool:
    """Whether the Slurm here takes `sbatch --requeue=expedite`: 25.11 or newer, with SlurmctldParameters=
    enable_expedited_requeue (else 26.05 refuses the job). False where Slurm is missing or does not answer: a
    bare --requeue runs everywhere. Asked once per cluster (SLURM_CONF) and Slurm install (PATH): a sweep plans
    every task."""
    return _expedited_requeue(os.environ.get("SLURM_CONF"), os.environ.get("PATH"))


@functools.cache
def _expedited_requeue(slurm_conf: str | None, path: str | None) -> bool:
    if not commands.slurm_installed():
        return False
    try:
        if detect() < EXPEDITED_REQUEUE:
            return False
        parameters = show_config(timeout=5).get("SlurmctldParameters", "")
    except HpcError:
        return False
    return EXPEDITED_REQUEUE_PARAMETER in parameters.split(",")


# The oldest Slurm whose sbatch/srun accept every option our rendered scripts use: --gpus-per-node (19.05),
# srun --cpus-per-task passed explicitly because srun stops inheriting it from sbatch in 22.05 (we always
# pass it, so older versions are fine there), `--signal=B:USR2@T`, `--wait-all-nodes`, `--open-mode=append`.
MIN_VERSION = SlurmVersion(20, 11)


def mpi_types() -> set[str]:
    """MPI plugins `srun --mpi=list` offers. 22.05 and 24.11 print the same tab-indented list under "MPI plugin
    types are..." (older releases wrote `srun: pmix` lines to stderr); only the pmix build differs (pmix_v4
    on bookworm's 22.05, pmix_v5 on trixie's 24.11), named on the "plugin versions available" line."""
    res = commands.run(["srun", "--mpi=list"])
    types = set()
    for line in (res.stdout + res.stderr).splitlines():
        if "plugin versions available" in line:
            types.update(line.split(":", 1)[1].replace(",", " ").split())
        elif line.startswith(("\t", "srun: ")) and "MPI" not in line:
            types.add(line.removeprefix("srun: ").strip())
    return types - {""}


def missing_for_rendered_jobs(version: SlurmVersion, config: dict[str, str], gpus_per_node: int,
                              mpi: set[str]) -> list[str]:
    """What this Slurm lacks that our rendered jobs for a queue use; empty when it has everything."""
    missing = []
    if "pmix" not in mpi:
        missing.append("no pmix MPI plugin (srun --mpi=list): MPI binaries such as nccl-tests run with "
                       "`srun --mpi=pmix`")
    if version < MIN_VERSION:
        missing.append(f"Slurm {version} is older than {MIN_VERSION.major}.{MIN_VERSION.minor:02d}: "
                       "--gpus-per-node and the requeue/signal options of our scripts may be refused")
    if gpus_per_node:
        if "select/cons_tres" not in config.get("SelectType", ""):
            missing.append(f"SelectType is {config.get('SelectType') or 'unset'}: --gpus-per-node needs "
                           "select/cons_tres")
        if "gpu" not in config.get("GresTypes", "").split(","):
            missing.append("GresTypes lacks gpu: GPU requests (--gpus-per-node) are refused")
    return missing
