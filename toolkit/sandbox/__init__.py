"""The project's own local test cluster: a real Slurm (with accounting) on this machine.

Other modules need only discovery: `discover()` says whether it is up and where its configs are, `use()`
points this process's Slurm commands at it. Starting and stopping live in `toolkit.sandbox.cluster`.
"""

from toolkit.sandbox.discovery import Sandbox, discover, use

__all__ = ["Sandbox", "discover", "use"]
