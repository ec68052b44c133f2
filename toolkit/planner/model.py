"""The planner's model: one data-parallel step at N nodes, from what one and two nodes measured (or typed figures).

A data-parallel step (every rank a replica, gradients all-reduced each step) takes, on each node

    step(N) = max(wait(N) + compute(N) + exposed_allreduce(N), input(N), fsx(N))

- wait(N): the ranks' wait for input measured at one node (our trainer's `data` phase), kept at every N.
- compute(N): the ranks' own work per step (forward, backward, optimizer; at one node that includes the node's own
  intra-node all-reduce), measured at one node as its step minus the time the ranks waited for input (our
  trainer's `data` phase, toolkit/workloads/resnet.py). It does not change with N on separate nodes. Where the
  nodes share one host's cores (the local test bench: 16 Slurm nodes on 2 cores), it grows with the ranks sharing
  them: compute(N) = compute(1) x max(1, k x N / 2), k the forward-pass time at two nodes over one (the forward
  pass holds no collective, so its growth is the sharing alone; a calibration at 1 and M nodes: k x N / M), and
  so does the exposed all-reduce (its copies and reductions run on the same cores), relative to M nodes.
- exposed_allreduce(N): the part of the gradient all-reduce not hidden behind the backward pass. The ring
  all-reduce of S bytes over n ranks costs 2(n-1) latencies and 2(n-1)/n x S bytes through each rank's link
  (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009).
  nccl-tests' bus bandwidth is defined so that this is what it measures: busbw = algbw x 2(n-1)/n, algbw = S / t
  (NVIDIA/nccl-tests doc/PERFORMANCE.md, "Bus bandwidth", all_reduce), so t = 2(n-1)/n x S / busbw, with busbw
  measured at two nodes (it stays near flat with n for the ring: the same page). Where none was measured, the
  instance's published network figure (toolkit/catalog.yaml network_gbps / 8 GB/s) stands in: an upper bound,
  so a first estimate errs fast. S is the gradient bytes: parameters x 4 (DDP all-reduces fp32 gradients, mixed
  precision included; torch.nn.parallel.DistributedDataParallel). The part hidden behind backward (DDP starts a
  bucket's all-reduce as soon as its gradients are ready; torch DDP design notes) is estimated from the 1-vs-2-node
  difference: hidden = 1 - (step(2) - step(1)) / t(2), clamped to [0, 1]; what the 2-node step grew beyond t(2)
  is read as the ring's per-hop latency, alpha = excess / (2(n2-1)), which then costs 2(n-1) alpha at n ranks.
- input(N): the loader's pace per node: the measured step when the ranks waited for input at one node (the loader
  set the pace there), or the samples per node step over a typed loader rate. It does not change with N (each node
  loads its own shard).
- fsx(N): the shared file system's throughput, the one input resource all nodes share: N x samples per node step
  x bytes per sample / the file system's throughput (FSx for Lustre: PerUnitStorageThroughput MB/s per TiB x
  StorageCapacity; the cluster config). Not judged without bytes per sample.

Throughput(N) = N x samples per node step / step(N); efficiency = throughput(N) / (N x throughput(1)); the time
to the target is samples to train / throughput (epochs x samples per epoch), or updates x step(N). The uncertainty
band is the calibration's own spread: the relative spread of its logged intervals' throughput (one sample
standard deviation over the mean), the 1- and 2-node runs' combined in quadrature.

Node failures and checkpoint cost are not in the step: they come from goodput records where a run has them.
"""

from __future__ import annotations

import dataclasses
import math

BOUNDS = ("compute", "gradient all-reduce", "input pipeline", "FSx throughput")


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """What the model is given: measured at one (and two) nodes, or typed. Seconds, bytes, GB/s (10^9 B/s)."""

    ranks_per_node: int
    samples_per_rank_step: float  # per-rank batch x gradient accumulation: samples each rank takes per step
    node_step_s: float  # one node's step
    data_wait_s: float = 0.0  # of node_step_s, the ranks' wait for input
    gradient_bytes: float | None = None
    busbw_gbs: float | None = None
    hidden: float = 0.0  # the fraction of the all-reduce hidden behind backward
    latency_s: float = 0.0  # the ring's per-hop latency (alpha)
    loader_samples_per_s_node: float | None = None  # a typed loader rate (per node)
    fsx_bytes_per_s: float | None = None
    bytes_per_sample: float | None = None
    shared_host: bool = False  # the nodes share one host's cores (the local test bench)
    forward_ratio: float = 1.0  # k: the forward pass at fit_nodes over one node (used only with shared_host)
    fit_nodes: int = 2  # the multi-node calibration run's node count
    spread: float = 0.0  # relative (1 sigma) spread of the throughput

    @property
    def samples_per_node_step(self) -> float:
        return self.samples_per_rank_step * self.ranks_per_node


@dataclasses.dataclass(frozen=True)
class StepAt:
    """One node count's step, its parts, and what sets it."""

    nodes: int
    ranks: int
    step_s: float
    compute_s: float
    allreduce_s: float  # the ring all-reduce's whole cost
    exposed_s: float  # what of it the step pays
    input_s: float | None
    fsx_s: float | None
    throughput: float  # samples/s over the whole job
    bound: str


def ring_allreduce_s(gradient_bytes: float, ranks: int, busbw_gbs: float) -> float:
    """Bandwidth term of the ring all-reduce: 2(n-1)/n x S / busbw (nccl-tests PERFORMANCE.md's busbw)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * gradient_bytes / (busbw_gbs * 1e9)


def sharing_factor(inputs: ModelInputs, nodes: int) -> float:
    """How much longer the ranks' own work takes at `nodes` because they share cores (1 on separate nodes)."""
    if not inputs.shared_host or nodes <= 1:
        return 1.0
    return max(1.0, inputs.forward_ratio * nodes / inputs.fit_nodes)


def step_at(inputs: ModelInputs, nodes: int) -> StepAt:
    ranks = nodes * inputs.ranks_per_node
    compute = (inputs.node_step_s - inputs.data_wait_s) * sharing_factor(inputs, nodes)
    allreduce = 0.0
    exposed = 0.0
    if nodes > 1 and inputs.gradient_bytes and inputs.busbw_gbs:
        allreduce = ring_allreduce_s(inputs.gradient_bytes, ranks, inputs.busbw_gbs)
        exposed = (1 - inputs.hidden) * allreduce
    if nodes > 1:
        exposed += 2 * (ranks - 1) * inputs.latency_s
        # on a shared host the collective's copies and reductions are work on the same cores: they slow as the
        # ranks' own work does, relative to the fit's node count (where the fit measured them)
        exposed *= sharing_factor(inputs, nodes) / sharing_factor(inputs, inputs.fit_nodes)
    if inputs.loader_samples_per_s_node:
        input_s: float | None = inputs.samples_per_node_step / inputs.loader_samples_per_s_node
    elif inputs.data_wait_s > 0.05 * inputs.node_step_s:  # the ranks waited for input: the loader set the pace
        input_s = inputs.node_step_s * sharing_factor(inputs, nodes)
    else:
        input_s = None
    fsx_s = None
    if inputs.fsx_bytes_per_s and inputs.bytes_per_sample:
        fsx_s = nodes * inputs.samples_per_node_step * inputs.bytes_per_sample / inputs.fsx_bytes_per_s
    # the ranks' wait for input stays in the step (each node loads its own shard: it does not change with N)
    waited = inputs.data_wait_s * sharing_factor(inputs, nodes)
    step = max(waited + compute + exposed, input_s or 0.0, fsx_s or 0.0)
    parts = {"compute": compute, "gradient all-reduce": exposed, "input pipeline": input_s or 0.0,
             "FSx throughput": fsx_s or 0.0}
    if step == (fsx_s or -1.0):
        bound = "FSx throughput"
    elif step == (input_s or -1.0) and (input_s or 0.0) > waited + compute + exposed:
        bound = "input pipeline"
    else:
        bound = max(("compute", "gradient all-reduce"), key=lambda name: parts[name])
    return StepAt(nodes, ranks, step, compute, allreduce, exposed, input_s, fsx_s,
                  nodes * inputs.samples_per_node_step / step, bound)


def efficiency(inputs: ModelInputs, nodes: int) -> float:
    """Throughput at `nodes` over linear scaling of the one-node throughput."""
    return step_at(inputs, nodes).throughput / (nodes * step_at(inputs, 1).throughput)


def fit_overlap(step_1: float, step_2: float, allreduce_2: float, ranks_2: int) -> tuple[float, float]:
    """(hidden fraction, per-hop latency) from the 1- and 2-node steps and the all-reduce's cost at two nodes.

    The step grew by step_2 - step_1 (the exposed all-reduce). Up to allreduce_2 it is the bandwidth term's
    unhidden part; beyond it, the ring's latency over its 2(n-1) hops."""
    grew = max(0.0, step_2 - step_1)
    if allreduce_2 <= 0:
        return 0.0, grew / (2 * (ranks_2 - 1)) if ranks_2 > 1 else 0.0
    hidden = min(1.0, max(0.0, 1 - grew / allreduce_2))
    excess = max(0.0, grew - allreduce_2)
    return hidden, excess / (2 * (ranks_2 - 1))


def relative_spread(rates: list[float]) -> float:
    """One sample standard deviation over the mean of the logged intervals' rates (0 with fewer than two)."""
    if len(rates) < 2:
        return 0.0
    mean = sum(rates) / len(rates)
    var = sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)
    return math.sqrt(var) / mean if mean > 0 else 0.0


def combined_spread(*spreads: float) -> float:
    """Independent relative spreads, combined in quadrature."""
    return math.sqrt(sum(s * s for s in spreads))
