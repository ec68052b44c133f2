"""Whether this cluster's srun has pyxis (NVIDIA's SPANK plugin adds --container-image to srun when Slurm loads it
through plugstack.conf; `srun --help` is the check pyxis's own guide gives: NVIDIA/pyxis wiki, Installation). The
Slurm targets refuse a containerized job before it is submitted where it has not (toolkit.slurm.targets)."""

from __future__ import annotations

from toolkit.errors import HpcError

PYXIS_OPTION = "--container-image"
ENABLE_FIX = ("enable pyxis: on ParallelCluster >= 3.11 write the config with `hpc cluster config ... --pyxis` (AWS's "
              "enable-pyxis custom actions; pyxis is installed but off by default), or load spank_pyxis.so in Slurm's "
              "plugstack.conf (NVIDIA/pyxis README); or drop software.container / --container to run on the host")


def pyxis_loaded() -> bool:
    """Whether this machine's srun lists pyxis's options (pyxis loaded through the cluster's plugstack.conf)."""
    from toolkit.slurm.commands import run

    res = run(["srun", "--help"], check=False)
    return PYXIS_OPTION in res.stdout


def require_pyxis() -> None:
    """Refuse a containerized job on a cluster whose srun has no pyxis."""
    if not pyxis_loaded():
        raise HpcError("this job runs in a container (software.container / --container), but this cluster's srun "
                       "has no --container-image: pyxis is not loaded, and the job would fail or run on the host",
                       fix=ENABLE_FIX)
