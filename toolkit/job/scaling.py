"""Scaling rules: how a recipe's flags follow the world size (nodes x ranks per node) and the CPUs per rank.

Each rule derives one flag's value and says why, so `hpc recipes show` can print the arithmetic. A result
that cannot be honoured exactly (a fractional gradient-accumulation factor) is an error listing the node
counts that work, never a silent rounding that changes the published global batch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

from toolkit.errors import HpcError
from toolkit.recipes.schema import ScalingRule

SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


@dataclasses.dataclass(frozen=True)
class Derived:
    """One value the toolkit computed for a job, and the rule behind it (printed by `hpc recipes show`)."""

    key: str
    value: str
    rule: str


def accumulation(global_batch: int, per_rank: int | float, world_size: int) -> int | None:
    """Steps per update that keep `global_batch` exactly, or None when no integer does."""
    steps, remainder = divmod(global_batch, per_rank * world_size)
    return int(steps) if steps >= 1 and remainder == 0 else None


def exact_accumulation(what: str, global_batch: int, per_rank: int | float, per_rank_name: str, unit: str, *,
                       nodes: int, ranks_per_node: int, max_nodes: int) -> int:
    """accumulation() for `nodes`, or an error naming the node counts (up to max_nodes) that keep the batch."""
    world = nodes * ranks_per_node
    steps = accumulation(global_batch, per_rank, world)
    if steps is None:
        valid = [n for n in range(1, max_nodes + 1)
                 if accumulation(global_batch, per_rank, n * ranks_per_node) is not None]
        raise HpcError(
            f"{what} = {global_batch} {unit} / ({per_rank_name} {per_rank} x world size {world})"
            f" is not a whole number on {nodes} nodes x {ranks_per_node} ranks",
            fix=f"use --nodes {' | '.join(map(str, valid))}" if valid else
                f"no node count up to {max_nodes} keeps the global batch: change {per_rank_name}")
    return steps


def linear(base: float, per: float, per_rank: float, world_size: int) -> float:
    return base * per_rank * world_size / per


def format_number(value: float) -> str:
    """Derived numbers: integers without a dot, others in at most 6 significant digits (0.1 x 3 = 0.3)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)", str(text))
    if not match:
        raise HpcError(f"size {text!r} is not a number with an optional K/M/G suffix", fix="write e.g. 8192M")
    return int(match[1]) * SIZE_UNITS[match[2]]


def format_size(size: int) -> str:
    """A byte size in MiB when whole (nccl-tests' own spelling, e.g. 4096M), else in bytes."""
    return f"{size // 2**20}M" if size % 2**20 == 0 else str(size)


def memory_cap(gpu_memory_gib: float, buffers: int, usable_fraction: float) -> int:
    """The largest power-of-two size such that `buffers` of them fit in the usable part of one GPU."""
    usable = gpu_memory_gib * 2**30 * usable_fraction / buffers
    return 2 ** int(math.log2(usable))


def _per_rank(args: Mapping[str, Any], flag: str, rule_key: str) -> int | float:
    value = args.get(flag)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HpcError(f"scaling.{rule_key} needs args.{flag} to be a positive number, got {value!r}",
                       fix=f"set args.{flag} to the per-rank batch (e.g. --set args.{flag}=16)")
    return value


def apply_scaling(scaling: Mapping[str, ScalingRule], args: Mapping[str, Any], *, nodes: int, ranks_per_node: int,
                  max_nodes: int, gpu_memory_gib: float | None,
                  cpus_per_rank: int) -> tuple[dict[str, Any], list[Derived]]:
    """The recipe's args with every scaling rule applied for `nodes`, and what each rule derived."""
    world = nodes * ranks_per_node
    args = dict(args)
    derived = []
    for flag, rule in scaling.items():
        if rule.rule == "accumulate":
            # ScalingRule's own validator (_fields_match_rule) made sure the rule has what it needs
            assert rule.per_rank_arg is not None and rule.global_batch is not None
            per_rank = _per_rank(args, rule.per_rank_arg, flag)
            steps = exact_accumulation(flag, rule.global_batch, per_rank, rule.per_rank_arg, rule.unit, nodes=nodes,
                                       ranks_per_node=ranks_per_node, max_nodes=max_nodes)
            args[flag] = steps
            derived.append(Derived(flag, str(steps), f"{rule.global_batch} {rule.unit} per update / "
                                   f"({rule.per_rank_arg} {per_rank} x {world} ranks): {rule.why}"))
        elif rule.rule == "linear":
            assert rule.per_rank_arg is not None and rule.base is not None and rule.per is not None  # as above
            per_rank = _per_rank(args, rule.per_rank_arg, flag)
            value = format_number(linear(rule.base, rule.per, per_rank, world))
            args[flag] = value
            derived.append(Derived(flag, value, f"{format_number(rule.base)} per {format_number(rule.per)} x "
                                   f"global batch {format_number(per_rank * world)} ({rule.per_rank_arg} "
                                   f"{format_number(per_rank)} x {world} ranks): {rule.why}"))
        elif rule.rule == "cpus-per-rank":
            # torch's DataLoader warns above the CPUs the process may run on (os.sched_getaffinity): one worker
            # per CPU of the rank, less the rank's own
            workers = max(cpus_per_rank - rule.reserve, 0)
            args[flag] = workers
            derived.append(Derived(flag, str(workers), f"{cpus_per_rank} CPUs per rank - {rule.reserve} for the rank's "
                                   f"own process: {rule.why}"))
        else:  # gpu-memory-cap
            wanted = parse_size(args[flag])
            if gpu_memory_gib is None:
                if rule.cpu_cap is None:
                    raise HpcError(f"scaling.{flag} needs a GPU's memory: the queue has no GPUs",
                                   fix="use a GPU queue (--cluster FILE --queue Q)")
                cap = parse_size(rule.cpu_cap)
                value = str(args[flag]) if wanted <= cap else rule.cpu_cap
                verdict = "fits" if wanted <= cap else f"capped from {format_size(wanted)}"
                args[flag] = value
                derived.append(Derived(flag, value, f"{verdict}: at most {rule.cpu_cap} on a queue without GPUs "
                                       f"(scaling.{flag}.cpu_cap): {rule.why}"))
                continue
            cap = memory_cap(gpu_memory_gib, rule.buffers, rule.usable_fraction)
            value = str(args[flag]) if wanted <= cap else format_size(cap)
            args[flag] = value
            verdict = "fits" if wanted <= cap else f"capped from {format_size(wanted)}"
            derived.append(Derived(flag, value, f"{verdict}: {rule.buffers} buffers of {value} within "
                                   f"{format_number(rule.usable_fraction * 100)}% of {format_number(gpu_memory_gib)}"
                                   f" GiB per GPU: {rule.why}"))
    return args, derived
