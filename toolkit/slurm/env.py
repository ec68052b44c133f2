"""The environment Slurm's submitting commands (sbatch) run with: what a job may inherit from its submitter."""

from __future__ import annotations

from typing import Mapping

from toolkit.job.env import filter_submit_env


def clean_sbatch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """All sbatch may see: the allow-listed variables, and SLURM_CONF to find the cluster (never other SLURM_*:
    submitting from inside a job would otherwise pass that job's options on)."""
    env = filter_submit_env(environ)
    if "SLURM_CONF" in environ:
        env["SLURM_CONF"] = environ["SLURM_CONF"]
    return env
