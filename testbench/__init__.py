"""The project's own local test cluster: a real Slurm (with accounting) on this machine. Dev and test only.

The toolkit never imports this package: it finds the local cluster the way it finds any other, through Slurm's
SLURM_CONF and its own HPC_CLUSTER_CONFIG, which `python -m testbench env` prints. `discover()` says whether
the cluster is up and where its configs are (tests use it); starting and stopping live in `testbench.cluster`.
"""

from testbench.discovery import Sandbox, discover

__all__ = ["Sandbox", "discover"]
