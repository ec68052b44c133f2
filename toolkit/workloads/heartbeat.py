"""`from toolkit.workloads.heartbeat import beat`, as scripts written before the node side was split out import it:
the heartbeat itself is toolkit.node.heartbeat (on a node without hpc installed: `from hpc_node.heartbeat import
beat`, the staged bundle every job puts on its ranks' PYTHONPATH)."""

from toolkit.node.heartbeat import Beat, beat

__all__ = ["Beat", "beat"]
