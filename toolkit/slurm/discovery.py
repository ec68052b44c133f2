"""Which Slurm this process talks to: the cluster's own, or the local test cluster while it runs."""

from __future__ import annotations

import os


def use_discovered_slurm() -> None:
    """Point Slurm commands (and submitit) at the local test cluster when it is up and SLURM_CONF is unset.

    On a real cluster nothing changes: Slurm's own default config applies.
    """
    if os.environ.get("SLURM_CONF"):
        return
    from toolkit.sandbox import use

    use()
