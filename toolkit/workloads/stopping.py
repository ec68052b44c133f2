"""Graceful stop for preemption: a signal only sets a flag; all ranks agree on it at a step boundary.

Slurm sends SIGUSR2 before the time limit (`--signal=B:USR2@N`; USR1 is NCCL's) and SIGTERM on scancel or
preemption. Any rank may get it first; an all-reduce of the flags makes every rank stop after the same step,
so the one checkpoint rank 0 writes matches every rank's state.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from toolkit.node.rank import EXIT_STOPPED  # noqa: F401  (the spares supervisor, on the node, reads it too)
from toolkit.node.stop import STOP_SIGNALS as STOP_SIGNAL_NAMES, signal_number

# The signals the job's stop policy sends a workload (toolkit.node.stop): the stop signal and Slurm's SIGTERM.
STOP_SIGNALS = tuple(signal_number(name) for name in STOP_SIGNAL_NAMES)


class StopFlag:
    """Remembers the first stop signal received; the training loop polls `requested`."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def install(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> StopFlag:
        for signum in signals:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


def ignore_stop_signals(_worker_id: int | None = None) -> None:
    """For child processes (DataLoader workers): the stop belongs to the rank, which shuts them down itself."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def all_reduce_step(values: Sequence[float], stop_requested: bool, device) -> tuple[list[float], bool]:
    """One all-reduce per step: sums `values` over ranks and tells whether any rank was asked to stop."""
    import torch
    import torch.distributed as dist

    from toolkit.workloads.devices import reduce_dtype

    packed = torch.tensor([*values, 1.0 if stop_requested else 0.0], dtype=reduce_dtype(torch, device), device=device)
    dist.all_reduce(packed)
    *sums, stops = packed.tolist()
    return sums, stops > 0
