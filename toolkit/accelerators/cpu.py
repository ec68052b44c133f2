"""No accelerator (c5n, hpc7a, m5, ...): CPU ranks, gloo, Slurm's own CPU binding, nothing for the loader to find."""

from __future__ import annotations

from toolkit.accelerators.base import Family


class Cpu(Family):
    kind = "none"
    device = "cpu"
    label = "CPU"
    units = "CPUs"
    has = "no GPUs"
    torch_device, torch_device_why = "cpu", "no GPUs"
    collective, collective_why = "gloo", "gloo is the CPU collective backend"


CPU = Cpu()
