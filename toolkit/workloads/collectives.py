"""Collectives benchmark: all_reduce, all_gather and reduce_scatter with torch.distributed, one process per rank.

    python -m toolkit.workloads.collectives --ops all_reduce,all_gather,reduce_scatter -b 8 -e 4M -f 2 -n 20 -w 5

Each device's own collective backend, as its accelerator family names it (nccl on GPUs, gloo on CPU, ...; a
family's runtime module drives its devices where torch alone cannot: toolkit.workloads.devices). Rank 0 prints
nccl-tests' own table (same header, columns, number formatting and footer, one block per collective) so `hpc report
nccl` reads this and real nccl-tests logs alike. The size conventions and bus-bandwidth factors are nccl-tests':
the size column is the larger of the send and receive buffers; algbw = size / time; busbw = algbw x 2(n-1)/n for
all_reduce, x (n-1)/n for all_gather and reduce_scatter; time is the mean over iterations, averaged over ranks;
#wrong counts elements that differ from the expected result (checked once per size and placement, outside the
timed loop).

Rank layout comes from the rank contract: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
(toolkit.workloads.rank_env).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable

from toolkit.errors import HpcError
from toolkit.node import heartbeat
from toolkit.workloads import devices
from toolkit.workloads.rank_env import rank_env

OPS = ("all_reduce", "all_gather", "reduce_scatter")
REDOP = {"all_reduce": "sum", "all_gather": "none", "reduce_scatter": "sum"}
DTYPES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2}  # nccl-tests type name -> bytes per element


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw for a collective (see its PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (nranks - 1) / nranks
    return (nranks - 1) / nranks


@dataclasses.dataclass(frozen=True)
class Layout:
    """Element counts of one size, following nccl-tests' getCollByteCount."""

    send: int
    recv: int
    count: int  # the "count" column: elements per rank passed to the collective
    size: int  # the "size" column in bytes: max(send, recv) x word size


def layout(op: str, size: int, nranks: int, word: int) -> Layout:
    count = size // word
    if op == "all_reduce":
        send = recv = param = count
    elif op == "all_gather":
        send = param = count // nranks
        recv = send * nranks
    elif op == "reduce_scatter":
        recv = param = count // nranks
        send = recv * nranks
    else:
        raise HpcError(f"unknown collective {op!r}", fix=f"use one of: {', '.join(OPS)}")
    return Layout(send, recv, param, max(send, recv) * word)


def bandwidths(op: str, size: int, seconds: float, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s."""
    algbw = size / 1e9 / seconds if seconds > 0 else 0.0
    return algbw, algbw * bus_factor(op, nranks)


def parse_size(text: str) -> int:
    """nccl-tests' size syntax: a number with an optional K, M or G (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    raw = text.strip()
    unit = units.get(raw[-1:].lower(), 1)
    try:
        return int(float(raw[:-1] if unit > 1 else raw) * unit)
    except ValueError:
        raise HpcError(f"not a size: {text!r}", fix="write bytes as e.g. 8, 64K, 4M or 1G") from None


def sizes(min_bytes: int, max_bytes: int, factor: int = 2, step_bytes: int = 0) -> list[int]:
    """The sizes nccl-tests walks: times `factor` if it is > 1, else plus `step_bytes`."""
    if min_bytes <= 0 or max_bytes < min_bytes or (factor <= 1 and step_bytes <= 0):
        raise HpcError(f"bad size range {min_bytes}..{max_bytes} (factor {factor}, step {step_bytes})",
                       fix="give -b > 0, -e >= -b and -f >= 2 (or -i > 0)")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size = size * factor if factor > 1 else size + step_bytes
    return out


# ---- nccl-tests' text format ---------------------------------------------------------------------------------

def float_cell(value: float, width: int) -> str:
    """A number in `width` characters the way nccl-tests (>= 2.17, getFloatStr) prints it."""
    digits = len(str(int(value))) if value >= 1 else 0
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    if digits < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def header_lines() -> list[str]:
    blank = ("", "", "", "", "")
    return [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % blank,
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s " % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s " % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


@dataclasses.dataclass(frozen=True)
class Measure:
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # None: not checked (-c 0)


def row_line(lay: Layout, dtype: str, redop: str, measures: list[Measure]) -> str:
    line = "%12d  %12d  %8s  %6s  %6s" % (lay.size, lay.count, dtype, redop, "%6d" % -1)
    for m in measures:
        cells = (float_cell(m.time_us, 7), float_cell(m.algbw, 6), float_cell(m.busbw, 6))
        line += "  %7s  %6s  %6s" % cells + ("  %6g" % m.wrong if m.wrong is not None else "    N/A")
    return line


def footer_lines(test: str, out_of_bounds: int, avg_busbw: float) -> list[str]:
    return [
        "# %-20s : %d %s" % ("Out of bounds values", out_of_bounds, "FAILED" if out_of_bounds else "OK"),
        "# %-20s : %g " % ("Avg bus bandwidth", avg_busbw),
        "#",
        f"# Collective test concluded: {test}",
    ]


# ---- the benchmark -------------------------------------------------------------------------------------------

def _collective(op: str, dist) -> Callable:
    """The torch call for `op` as f(output, input); newer torch renames the tensor variants `*_single`."""
    if op == "all_reduce":
        return lambda out, inp: dist.all_reduce(out)
    if op == "all_gather":
        return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _buffers(op: str, lay: Layout, in_place: bool, rank: int, torch, dtype, device):
    """(output, input) filled with rank+1, as views into one buffer when in place (like nccl-tests)."""
    if op == "all_reduce":
        buf = torch.full((lay.send,), float(rank + 1), dtype=dtype, device=device)
        return buf, buf
    if op == "all_gather":
        out = torch.zeros(lay.recv, dtype=dtype, device=device)
        inp = (out[rank * lay.send:(rank + 1) * lay.send] if in_place
               else torch.empty(lay.send, dtype=dtype, device=device))
        inp.fill_(float(rank + 1))
        return out, inp
    inp = torch.full((lay.send,), float(rank + 1), dtype=dtype, device=device)
    out = inp[rank * lay.recv:(rank + 1) * lay.recv] if in_place else torch.empty(lay.recv, dtype=dtype, device=device)
    return out, inp


def _expected(op: str, lay: Layout, nranks: int, torch, dtype, device):
    if op == "all_gather":
        return torch.arange(1, nranks + 1, dtype=dtype, device=device).repeat_interleave(lay.send)
    return torch.full((lay.recv,), float(nranks * (nranks + 1) // 2), dtype=dtype, device=device)


def run(ops: list[str], byte_sizes: list[int], iters: int, warmup: int, check: bool, dtype_name: str,
        emit: Callable[[str], None], htcore=None, runtime=None) -> int:
    """Benchmark `ops` over `byte_sizes` in an initialised process group; rank 0 emits the tables.
    `runtime`, `htcore`: the device's runtime module (devices.runtime) and its bridge (runtime.load_bridge), else
    None. Returns the number of sizes with wrong values (summed over ops)."""
    import torch
    import torch.distributed as dist

    rank, nranks = dist.get_rank(), dist.get_world_size()
    if htcore is not None and runtime is not None:
        device = torch.device(runtime.DEVICE)
    else:
        device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
                  else torch.device("cpu"))
    dtype = {"float": torch.float32, "double": torch.float64, "half": torch.float16,
             "bfloat16": torch.bfloat16}[dtype_name]
    word = DTYPES[dtype_name]

    def launch():
        if htcore is not None:  # lazy mode: run what was queued (one collective) now
            htcore.mark_step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
        elif htcore is not None and runtime is not None:
            htcore.mark_step()
            runtime.synchronize()

    def mean_over_ranks(value: float) -> float:
        t = torch.tensor([value], dtype=devices.reduce_dtype(torch, device), device=device)
        dist.all_reduce(t)
        return t.item() / nranks

    def sum_over_ranks(value: int) -> int:
        t = torch.tensor([value], dtype=torch.int32 if htcore is not None else torch.int64, device=device)
        dist.all_reduce(t)
        return int(t.item())

    total_bad = measured = 0
    for op in ops:
        call = _collective(op, dist)
        emit(f"# Collective test starting: {op}_perf")
        _emit_devices(emit, device, torch, dist)
        for line in header_lines():
            emit(line)
        busbws, bad_sizes = [], 0
        for size in byte_sizes:
            lay = layout(op, size, nranks, word)
            if lay.recv == 0 or lay.send == 0:
                continue  # smaller than one element per rank
            measures = []
            for in_place in (False, True):
                out, inp = _buffers(op, lay, in_place, rank, torch, dtype, device)
                for _ in range(warmup):
                    call(out, inp)
                    launch()
                sync()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    call(out, inp)
                    launch()
                sync()
                seconds = mean_over_ranks((time.perf_counter() - start) / iters)
                wrong = None
                if check:
                    out, inp = _buffers(op, lay, in_place, rank, torch, dtype, device)
                    call(out, inp)
                    sync()
                    mismatched = int((out != _expected(op, lay, nranks, torch, dtype, device)).sum().item())
                    wrong = sum_over_ranks(mismatched)
                algbw, busbw = bandwidths(op, lay.size, seconds, nranks)
                measures.append(Measure(seconds * 1e6, algbw, busbw, wrong))
                busbws.append(busbw)
            bad_sizes += any(m.wrong for m in measures)
            emit(row_line(lay, dtype_name, REDOP[op], measures))
            measured += 1
            heartbeat.beat(measured)  # a step here is one measured size
        for line in footer_lines(f"{op}_perf", bad_sizes, sum(busbws) / len(busbws) if busbws else 0.0):
            emit(line)
        total_bad += bad_sizes
    return total_bad


def _emit_devices(emit, device, torch, dist) -> None:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        bus = "%04x:%02x:%02x" % (getattr(props, "pci_domain_id", 0), getattr(props, "pci_bus_id", 0),
                                  getattr(props, "pci_device_id", 0))
        me = (socket.gethostname().split(".")[0], os.getpid(), device.index, bus, props.name)
    else:
        runtime = devices.of(device)
        me = (socket.gethostname().split(".")[0], os.getpid(), rank_env().local_rank,
              "0000:00:00", f"{runtime.LABEL} ({dist.get_backend()})" if runtime is not None else "CPU (gloo)")
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    emit("# Using devices")
    for r, (host, pid, dev, bus, name) in enumerate(everyone):
        emit("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s" % (r, pid, host, dev, bus, name))


def parser() -> argparse.ArgumentParser:
    """The benchmark's flags (also what `hpc` checks a recipe's args against when it plans a job:
    toolkit.job.argcheck)."""
    p = argparse.ArgumentParser(prog="python -m toolkit.workloads.collectives", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="all_reduce", help=f"comma-separated: {','.join(OPS)}")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (e.g. 8, 64K, 4M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiply the size by this")
    p.add_argument("-i", "--stepbytes", default="0", help="or add this many bytes (with -f 1)")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, help="1: count wrong values, 0: skip (N/A)")
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("--backend", choices=("auto", *devices.BACKENDS.values()), default="auto",
                   help="auto: follows --device ({})".format(devices.each("{device}: {backend}")))
    # --device and --threads: the device flags every toolkit workload takes (toolkit.job.spec sets them per queue)
    p.add_argument("--device", choices=("auto", *devices.DEVICES), default="auto",
                   help=f"auto: cuda if available, else cpu; {devices.needs()}")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU: the CPUs given per rank)")
    p.add_argument("--timeout-min", type=float, default=10.0, help="process-group timeout in minutes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        unknown = [o for o in ops if o not in OPS]
        if unknown or not ops:
            raise HpcError(f"unknown collective(s): {', '.join(unknown) or '(none given)'}",
                           fix=f"use --ops with {','.join(OPS)}")
        byte_sizes = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor,
                           parse_size(args.stepbytes))
        try:
            env = rank_env()
        except ValueError as exc:
            raise HpcError(f"rank layout: {exc}",
                           fix="run under srun or set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT") from None
        import torch
        import torch.distributed as dist

        if args.threads:
            torch.set_num_threads(args.threads)
        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        native = devices.BACKENDS
        backend = args.backend if args.backend != "auto" else native[device]
        if backend != native[device]:
            pairs = devices.each("{backend} with {device}", " and ")
            raise HpcError(f"--backend {backend} does not run on --device {device}",
                           fix=f"use {pairs} (or leave --backend auto)")
        runtime = devices.runtime(device)
        htcore = runtime.load_bridge(env.local_rank) if runtime is not None else None
        if backend == "nccl":
            torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}", rank=env.rank,
                                world_size=env.world_size, timeout=datetime.timedelta(minutes=args.timeout_min))
        try:
            def emit(line: str) -> None:
                if env.rank == 0:
                    print(line, flush=True)

            emit(f"# hpc collectives benchmark (nccl-tests table format): torch {torch.__version__}, "
                 f"backend {backend}, {env.world_size} ranks")
            emit(f"# nThread 1 nGpus 1 minBytes {byte_sizes[0]} maxBytes {byte_sizes[-1]} step: "
                 + (f"{args.stepfactor}(factor)" if args.stepfactor > 1 else f"{parse_size(args.stepbytes)}(bytes)")
                 + f" warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 validation: {args.check}"
                 + " graph: 0")
            emit("#")
            bad = run(ops, byte_sizes, args.iters, args.warmup_iters, bool(args.check), args.datatype, emit, htcore,
                      runtime)
        finally:
            dist.destroy_process_group()
    except HpcError as exc:
        sys.stderr.write(f"error: {exc.message}\n" + (f"  fix: {exc.fix}\n" if exc.fix else ""))
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
