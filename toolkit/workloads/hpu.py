"""Habana Gaudi (HPU) support for our workloads: the Habana PyTorch bridge, imported only for `--device hpu`. The
Gaudi family's runtime module (toolkit.accelerators.gaudi's workload_runtime), which the workloads reach through
toolkit.workloads.devices: the one module of them that knows Gaudi.

The bridge runs in lazy mode (PT_HPU_LAZY_MODE=1, set by the job): ops accumulate into a graph that runs at
htcore.mark_step(). Habana's rule for training: mark a step after loss.backward() and after
optimizer.step(). Importing habana_frameworks.torch.distributed.hccl registers the `hccl` backend with
torch.distributed; the bridge picks the HPU whose module id equals LOCAL_RANK.
Gaudi has no float64: values reduced across ranks go as float32 there.
"""

from __future__ import annotations

import os
from types import ModuleType

from toolkit.errors import HpcError

BRIDGE_PACKAGE = "habana_frameworks"
DEVICE = "hpu"  # torch's device type for Gaudi
LABEL = "HPU"  # in the collectives' device table
NEEDS = "needs the Habana PyTorch bridge"
AMP_DTYPE, AMP_NAME = "bfloat16", "bf16"  # Gaudi's mixed precision is bf16, which needs no loss scaling
LAZY = True  # lazy mode only queues the graph: the host clock sees no compute


def load_bridge(local_rank: int) -> ModuleType:
    """habana_frameworks.torch.core (for mark_step) with the hccl backend registered; one clear error without it."""
    os.environ.setdefault("LOCAL_RANK", str(local_rank))  # the bridge maps rank -> HPU module id from it
    try:
        import habana_frameworks.torch.core as htcore
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the hccl backend)
    except ImportError as exc:
        raise HpcError(f"--device hpu needs the Habana PyTorch bridge, package {BRIDGE_PACKAGE} "
                       f"(habana-torch-plugin, part of SynapseAI), which this Python cannot import ({exc})",
                       fix="run in the Habana environment (a SynapseAI container or venv with habana-torch-plugin "
                           "as the recipe's software), or use --device cpu / cuda") from None
    return htcore


def synchronize() -> None:
    """Wait for the HPU to finish what was launched (timing)."""
    import habana_frameworks.torch.hpu as hthpu

    hthpu.synchronize()


def reduce_dtype(torch, device):
    """The dtype for statistics all-reduced on `device`: float64, except float32 on HPUs (no float64)."""
    return torch.float32 if device.type == DEVICE else torch.float64
