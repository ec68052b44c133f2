"""Node health: facts gathered on each node (node_check), judged against the queue (evaluate), run by doctor."""

from importlib import resources


def standalone_source(name: str) -> str:
    """The source of one of this package's standard-library-only checks (node_check, loader_check), which the
    doctor and the pre-flight send to the nodes as `python3 -c SOURCE`: nodes need no toolkit install."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text()
