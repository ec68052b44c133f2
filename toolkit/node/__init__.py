"""The node side: everything hpc itself runs on a compute node, under the node-side contract.

A compute node shares nothing with the submitter but the shared file systems: not its Python, venv, home or
checkout (ParallelCluster's alinux2023 and rocky9 nodes have python3 3.9, ubuntu2204 3.10). So every module here:

  - runs on the node's own python3 >= 3.9 (MIN_PYTHON), with the standard library only;
  - imports nothing from the rest of the package: only its siblings, and those by relative import, so that the
    package also runs renamed, as the `hpc_node` bundle that each job stages in its run dir
    (toolkit.job.staging; the batch shell unpacks it, and the run dir keeps the exact code that ran);
  - is told what the planning side knows (the queue's promise, toolkit.node.promise) in its arguments, never by
    reading the catalog or the cluster config.

tests/test_node_contract.py holds the package to this, and runs it under Debian bullseye's python3 3.9.
"""

from __future__ import annotations

import os

MIN_PYTHON = (3, 9)
BUNDLE_PACKAGE = "hpc_node"  # the package's name inside the staged bundle (never shadows an installed toolkit)


def standalone_source(name: str) -> str:
    """A check's source (node_check, loader_check: standard library only, no imports at all), which the doctor and
    the pre-flight send to each node's python3 as `-c SOURCE`; read from the staged bundle (a zip) as from a dir."""
    # the package's own loader, as pkgutil.get_data does (a zipimporter in the bundle, a file loader in a checkout),
    # without importing pkgutil (and inspect, by it) into every node-side command's start
    loader = __spec__.loader if __spec__ else None
    if loader is None or not hasattr(loader, "get_data"):
        raise FileNotFoundError(name)
    return loader.get_data(os.path.join(os.path.dirname(__file__), name + ".py")).decode()
