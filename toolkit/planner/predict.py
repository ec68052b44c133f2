"""`hpc plan RECIPE`: one row per node count, from calibration runs and typed figures (toolkit.planner.model).

Where each input comes from is said in the output (`inputs`: value and source), so a prediction can be checked
and redone by hand. Bad input is one UsageError (exit 2): calibration runs of another recipe, profile or queue,
one node count only, no 1-node run, a target the recipe does not define, an epoch target without a data set size.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

from toolkit.errors import UsageError
from toolkit.planner import model
from toolkit.planner.calibration import Collectives, Measured
from toolkit.planner.inputs import Typed

# Parameter counts of torchvision's ResNets (torchvision.models, each weights enum's meta["num_params"],
# IMAGENET1K_V1), for a recipe whose --arch names one and no run logged its count.
KNOWN_PARAMETERS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
                    "resnet101": 44_549_160, "resnet152": 60_192_808}
EPOCH_FLAGS = ("--epochs", "--max-epoch")  # our trainer's, fairseq's
UPDATE_FLAGS = ("--max-steps", "--max-update")
TARGETS = ("epochs", "updates")
NO_GOODPUT = ("no goodput records: node failures, restarts and checkpoint saves are not in these times (they "
              "are the step time's alone)")


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    recipe: str
    nodes: Sequence[int]
    cluster: str | None = None
    queue: str | None = None
    instance_type: str | None = None
    profile: str | None = None
    overrides: Sequence[str] = ()
    runs: Sequence[str] = ()
    typed: Mapping[str, Typed] = dataclasses.field(default_factory=dict)
    target: str | None = None


@dataclasses.dataclass(frozen=True)
class Where:
    """The machines the plan is for."""

    instance_type: str
    ranks_per_node: int
    queue: str | None
    capacity_block: bool
    fsx_bytes_per_s: float | None
    fsx_source: str | None
    note: str


def _config_facts(path: Path, queue: str) -> tuple[bool, float | None, str | None]:
    """(the queue uses a Capacity Block, FSx for Lustre's throughput in bytes/s, where that came from)."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False, None, None
    queues = ((config.get("Scheduling") or {}).get("SlurmQueues")) or []
    entry = next((q for q in queues if isinstance(q, dict) and q.get("Name") == queue), {})
    capacity_block = entry.get("CapacityType") == "CAPACITY_BLOCK"
    for storage in config.get("SharedStorage") or []:
        if not isinstance(storage, dict) or storage.get("StorageType") != "FsxLustre":
            continue
        settings = storage.get("FsxLustreSettings") or {}
        if not settings.get("StorageCapacity"):
            continue
        # FSx for Lustre's throughput: MB/s per TiB of storage (PERSISTENT: PerUnitStorageThroughput; SCRATCH_2:
        # 200; the FSx for Lustre User Guide, "Aggregate throughput capacity")
        per_tib = settings.get("PerUnitStorageThroughput") or 200
        tib = float(settings["StorageCapacity"]) / 1024
        return capacity_block, per_tib * tib * 1e6, (f"{path}: FSx {settings['StorageCapacity']} GiB x {per_tib} "
                                                     "MB/s per TiB")
    return capacity_block, None, None


def resolve_where(request: PlanRequest) -> Where:
    from toolkit import catalog

    if request.instance_type is not None:
        if request.cluster or request.queue:
            raise UsageError("--instance-type plans for a type without a cluster; --cluster/--queue for a queue",
                             fix="give either --instance-type TYPE or --cluster FILE --queue Q")
        facts = catalog.instance(request.instance_type)
        return Where(facts.name, facts.gpus or 1, None, False, None, None,
                     f"instance type {facts.name} ({facts.gpus or 1} ranks per node), no cluster config")
    from toolkit.cluster.queues import cluster_config_candidates, resolve_queue

    queue, how = resolve_queue(request.cluster, request.queue)
    path = Path(request.cluster) if request.cluster else next(
        (p for p in cluster_config_candidates() if p.is_file()), None)
    block, fsx, fsx_source = _config_facts(path, queue.name) if path else (False, None, None)
    return Where(queue.instance_type, queue.tasks_per_node, queue.name, block, fsx, fsx_source, how)


def split_runs(runs: Sequence[str]) -> tuple[list[Measured], list[Collectives]]:
    from toolkit.planner.calibration import is_collectives, read_collectives, read_training

    training, collectives = [], []
    for run in runs:
        if not Path(run).is_dir():
            raise UsageError(f"--from {run}: no such run dir", fix="give run dirs of calibration runs")
        if is_collectives(run):
            collectives.append(read_collectives(run))
        else:
            training.append(read_training(run))
    return training, collectives


def check_runs(training: list[Measured], recipe: str, profile: str | None, queue: str | None) -> None:
    """Calibration runs must be of this recipe, profile and queue, at two or more node counts, one of them 1."""
    for run in training:
        if run.recipe != recipe or run.profile != profile:
            theirs = f"{run.recipe}" + (f" --profile {run.profile}" if run.profile else "")
            ours = recipe + (f" --profile {profile}" if profile else "")
            raise UsageError(f"--from {run.run_dir} is a run of {theirs}, not {ours}",
                             fix=f"give calibration runs of {ours} (hpc plan calibrate {ours} ...)")
        if queue is not None and run.queue not in (None, queue):
            raise UsageError(f"--from {run.run_dir} ran on queue {run.queue}, not {queue}",
                             fix=f"plan for --queue {run.queue}, or calibrate on {queue}")
    counts = sorted({run.nodes for run in training})
    if len(counts) < 2:
        raise UsageError(f"calibration runs at one node count only ({counts[0]}): a fit needs two (1 and 2 nodes)",
                         fix="calibrate at 1 and 2 nodes: hpc plan calibrate RECIPE --queue Q --nodes 1,2")
    if counts[0] != 1:
        raise UsageError(f"no 1-node calibration run (node counts {', '.join(map(str, counts))}): the model's base is "
                         "one node's step", fix="calibrate at 1 and 2 nodes: --nodes 1,2")


def _median_run(runs: list[Measured]) -> Measured:
    ordered = sorted(runs, key=lambda r: r.throughput)
    return ordered[len(ordered) // 2]


def build_inputs(recipe: Any, where: Where, training: list[Measured], collectives: list[Collectives],
                 typed: Mapping[str, Typed]) -> tuple[model.ModelInputs, list[dict[str, Any]]]:
    """The model's inputs and, for each, its value and where it came from."""
    from toolkit import catalog

    used: list[dict[str, Any]] = []

    def say(name: str, value: Any, source: str) -> None:
        used.append({"name": name, "value": value, "source": source})

    one = _median_run([r for r in training if r.nodes == 1]) if training else None
    multi = sorted({r.nodes for r in training if r.nodes > 1})
    two = _median_run([r for r in training if r.nodes == multi[0]]) if multi else None
    rpn = one.ranks_per_node if one else where.ranks_per_node
    if "samples_per_rank_step" in typed:
        per_rank, source = typed["samples_per_rank_step"].value, "typed"
    elif one:
        per_rank, source = one.samples_per_rank_step, f"{one.run_dir} (its trainer's start record)"
    else:
        per_rank, source = _recipe_batch(recipe)
    say("samples per rank step", per_rank, source)
    say("ranks per node", rpn, one.run_dir if one else where.note)
    spreads: list[float] = []
    if "throughput_1node" in typed:
        rate = typed["throughput_1node"]
        node_step = per_rank * rpn / rate.value
        data_wait = 0.0
        spreads.append(rate.spread)
        say("throughput at 1 node", rate.value, f"typed ({rate.text})")
    elif one:
        node_step, data_wait = one.step_s, one.data_s
        spreads.append(one.spread)
        say("throughput at 1 node", one.throughput, f"{one.run_dir} ({one.unit}, steady)")
        say("input wait per step at 1 node (s)", round(data_wait, 6), f"{one.run_dir} (heartbeats' data phase)")
    else:
        raise UsageError("nothing to predict from: no calibration runs and no one-node throughput",
                         fix="calibrate (hpc plan calibrate RECIPE --queue Q --nodes 1,2), give --from RUN_DIR..., "
                             "or type a first estimate: --throughput-1node SAMPLES_PER_S")
    if "parameters" in typed:
        parameters: float | None = typed["parameters"].value
        say("parameters", parameters, "typed")
    elif one and one.parameters:
        parameters = one.parameters
        say("parameters", parameters, f"{one.run_dir} (logged by the trainer)")
    else:
        arch = recipe.args.get("--arch")
        parameters = KNOWN_PARAMETERS.get(arch) if isinstance(arch, str) else None
        say("parameters", parameters, f"torchvision's {arch} (num_params)" if parameters else
            "unknown: no all-reduce cost (give --assume parameters=N)")
    gradient_bytes = parameters * 4 if parameters else None
    if "busbw" in typed:
        busbw: float | None = typed["busbw"].value
        say("bus bandwidth (GB/s)", busbw, "typed")
    elif collectives:
        best = collectives[-1]
        busbw = best.busbw_gbs
        say("bus bandwidth (GB/s)", busbw, f"{best.run_dir} (all_reduce busbw at {best.size} B)")
    else:
        facts = catalog.catalog().get(where.instance_type)
        busbw = facts.network_gbps / 8 if facts and facts.network_gbps else None
        say("bus bandwidth (GB/s)", busbw, f"catalog: {where.instance_type} network {facts.network_gbps} Gbps / 8 "
            "(published line rate: an upper bound)" if busbw and facts else "unknown: no all-reduce cost")
    hidden, latency, ratio, fit_nodes = 0.0, 0.0, 1.0, 2
    shared = bool(typed["shared_host"].value) if "shared_host" in typed else False
    if one and two:
        fit_nodes = two.nodes
        if shared and one.forward_s and two.forward_s:
            ratio = two.forward_s / one.forward_s
            say("forward pass at the fit's nodes over 1 (shared host)", round(ratio, 3),
                f"{two.run_dir} vs {one.run_dir}")
        base = model.ModelInputs(rpn, per_rank, node_step, data_wait, shared_host=shared, forward_ratio=ratio,
                                 fit_nodes=fit_nodes)
        own_at_two = (node_step - data_wait) * model.sharing_factor(base, two.nodes) + data_wait
        ranks_two = two.nodes * rpn
        allreduce_two = model.ring_allreduce_s(gradient_bytes, ranks_two, busbw) if gradient_bytes and busbw else 0.0
        hidden, latency = model.fit_overlap(own_at_two, two.step_s, allreduce_two, ranks_two)
        spreads.append(two.spread)
        say(f"step at 1 and {two.nodes} nodes (s)", [round(node_step, 6), round(two.step_s, 6)],
            f"{one.run_dir if one else 'typed'}; {two.run_dir}")
        say("all-reduce hidden behind backward", round(hidden, 3), f"fit: 1 - step growth / ring cost at {two.nodes} "
            "nodes")
        say("ring latency per hop (us)", round(latency * 1e6, 3), "fit: step growth beyond the ring's bandwidth cost")
    if "hidden" in typed:
        hidden = typed["hidden"].value
        say("all-reduce hidden behind backward", hidden, "typed")
    elif not two:
        say("all-reduce hidden behind backward", 0.0, "assumed none (no 2-node calibration; --assume hidden=F)")
    if "latency_us" in typed:
        latency = typed["latency_us"].value / 1e6
        say("ring latency per hop (us)", typed["latency_us"].value, "typed")
    loader = typed["loader_rate_1node"].value if "loader_rate_1node" in typed else None
    fsx = typed["fsx_mbps"].value * 1e6 if "fsx_mbps" in typed else where.fsx_bytes_per_s
    if fsx:
        say("FSx throughput (MB/s)", round(fsx / 1e6, 1), "typed" if "fsx_mbps" in typed else str(where.fsx_source))
    bytes_per_sample = typed["bytes_per_sample"].value if "bytes_per_sample" in typed else None
    if fsx and not bytes_per_sample:
        say("bytes per sample", None, "unknown: FSx not judged (--assume bytes_per_sample=N)")
    if shared:
        say("nodes share one host's cores", True, "typed")
    spread = model.combined_spread(*spreads)
    inputs = model.ModelInputs(rpn, per_rank, node_step, data_wait, gradient_bytes, busbw, hidden, latency, loader,
                               fsx, bytes_per_sample, shared, ratio, fit_nodes, spread)
    return inputs, used


def _recipe_batch(recipe: Any) -> tuple[float, str]:
    for rule in recipe.scaling.values():
        if rule.per_rank_arg and isinstance(recipe.args.get(rule.per_rank_arg), (int, float)):
            return float(recipe.args[rule.per_rank_arg]), f"recipe {rule.per_rank_arg}"
    raise UsageError(f"recipe {recipe.name} names no per-rank batch (a scaling rule's per_rank_arg)",
                     fix="give it: --assume samples_per_rank_step=N")


def target_of(recipe: Any, wanted: str | None, typed: Mapping[str, Typed],
              training: list[Measured]) -> dict[str, Any]:
    """What the recipe trains to: epochs over its data set, or a number of updates."""
    epochs = next(((f, recipe.args[f]) for f in EPOCH_FLAGS if isinstance(recipe.args.get(f), (int, float))), None)
    updates = next(((f, recipe.args[f]) for f in UPDATE_FLAGS if isinstance(recipe.args.get(f), (int, float))), None)
    if wanted == "updates" and updates is None:
        raise UsageError(f"recipe {recipe.name} defines no update target ({' or '.join(UPDATE_FLAGS)})",
                         fix="plan --target epochs, or set one: --set args.--max-steps=N")
    if wanted == "epochs" and epochs is None:
        raise UsageError(f"recipe {recipe.name} defines no epoch target ({' or '.join(EPOCH_FLAGS)})",
                         fix="plan --target updates, or set one: --set args.--epochs=N")
    if wanted is None:
        wanted = "updates" if updates is not None else "epochs" if epochs is not None else None
    if wanted is None:
        raise UsageError(f"recipe {recipe.name} defines no target (epochs or updates)",
                         fix="set one: --set args.--epochs=N or --set args.--max-steps=N")
    if wanted == "updates":
        assert updates is not None
        return {"kind": "updates", "flag": updates[0], "value": updates[1], "samples_per_epoch": None,
                "source": f"recipe {updates[0]}"}
    assert epochs is not None
    samples: float | None
    if "samples_per_epoch" in typed:
        samples, source = typed["samples_per_epoch"].value, "typed"
    else:
        logged = [r for r in training if r.samples_per_epoch]
        if not logged:
            raise UsageError(f"an epoch target needs the data set's size: recipe {recipe.name} trains {epochs[1]} "
                             "epochs of a data set no calibration run measured",
                             fix="give it: --assume samples_per_epoch=N (e.g. 1281167 for ImageNet-1k)")
        samples, source = logged[0].samples_per_epoch, f"{logged[0].run_dir} (steps per epoch x global batch)"
    return {"kind": "epochs", "flag": epochs[0], "value": epochs[1], "samples_per_epoch": samples,
            "source": f"recipe {epochs[0]}; samples per epoch: {source}"}


def scaling_at(recipe: Any, ranks: int) -> tuple[list[dict[str, str]], list[str]]:
    """The recipe's batch and LR rules (linear, accumulate) at `ranks`, and the large-batch warning."""
    from toolkit.errors import HpcError
    from toolkit.job.advice import large_batch
    from toolkit.job.scaling import apply_scaling

    rules = {flag: rule for flag, rule in recipe.scaling.items() if rule.rule in ("linear", "accumulate")}
    try:
        _, derived = apply_scaling(rules, recipe.args, nodes=ranks, ranks_per_node=1, max_nodes=ranks,
                                   gpu_memory_gib=None, cpus_per_rank=1)
    except HpcError as exc:
        return [], [f"at {ranks} ranks: {exc.message}"]
    lr = rules.get("--lr")
    per_rank = recipe.args.get(lr.per_rank_arg) if lr is not None and lr.rule == "linear" and lr.per_rank_arg else None
    warnings = large_batch(per_rank * ranks) if isinstance(per_rank, (int, float)) else []
    return [{"flag": d.key, "value": d.value} for d in derived], warnings


def predict(request: PlanRequest, calibration_runs: Sequence[str] = ()) -> dict[str, Any]:
    """Every row of the plan, the inputs used and their sources, the price, the notes and warnings."""
    from toolkit import catalog
    from toolkit.recipes.load import load_recipe

    if not request.nodes or any(n < 1 for n in request.nodes):
        raise UsageError("--nodes needs node counts of at least 1", fix="e.g. --nodes 1,2,4,8")
    where = resolve_where(request)
    recipe = load_recipe(request.recipe, profile=request.profile, overrides=request.overrides)
    runs = list(request.runs) or list(calibration_runs)
    training, collectives = split_runs(runs)
    if training:
        check_runs(training, recipe.name, request.profile, where.queue)
    inputs, used = build_inputs(recipe, where, training, collectives, request.typed)
    target = target_of(recipe, request.target, request.typed, training)
    price = catalog.price(where.instance_type, "capacity_block" if where.capacity_block else "on_demand")
    kind = "capacity block" if where.capacity_block else "on demand"
    one = model.step_at(inputs, 1)
    rows, warnings = [], []
    for nodes in sorted(set(request.nodes)):
        step = model.step_at(inputs, nodes)
        if target["kind"] == "epochs":
            time_s = target["value"] * target["samples_per_epoch"] / step.throughput
        else:
            time_s = target["value"] * step.step_s
        low, high = time_s / (1 + inputs.spread), time_s / max(1 - inputs.spread, 1e-9)
        cost = price.usd_per_hour * nodes * time_s / 3600 if price else None
        rules, warned = scaling_at(recipe, step.ranks)
        warnings += [f"{nodes} nodes: {w}" for w in warned]
        rows.append({"nodes": nodes, "ranks": step.ranks,
                     "global_batch": inputs.samples_per_rank_step * step.ranks,
                     "step_s": step.step_s, "throughput": step.throughput,
                     "throughput_low": step.throughput * (1 - inputs.spread),
                     "throughput_high": step.throughput * (1 + inputs.spread),
                     "efficiency": step.throughput / (nodes * one.throughput),
                     "time_s": time_s, "time_low_s": low, "time_high_s": high,
                     "cost_usd": cost, "cost_low_usd": cost and cost * low / time_s,
                     "cost_high_usd": cost and cost * high / time_s, "bound": step.bound,
                     "parts_s": {"compute": step.compute_s, "allreduce": step.allreduce_s,
                                 "exposed_allreduce": step.exposed_s, "input": step.input_s, "fsx": step.fsx_s},
                     "scaling": rules})
    return {"recipe": recipe.name, "profile": request.profile, "queue": where.queue,
            "instance_type": where.instance_type, "ranks_per_node": inputs.ranks_per_node, "where": where.note,
            "target": target, "spread": inputs.spread,
            "price": dataclasses.asdict(price) if price else None,
            "price_note": None if price else f"no price for {where.instance_type} ({kind}) in the catalog",
            "inputs": used, "runs": runs, "rows": rows, "notes": [NO_GOODPUT], "warnings": warnings}


def recorded_runs(request: PlanRequest) -> list[str]:
    """The run dirs of the recipe and queue's calibration record (`hpc plan calibrate`), in the runs roots hpc
    reads (toolkit.submit.runsroot.reader_roots); none where there is no record."""
    from toolkit.planner.calibration import read_record
    from toolkit.recipes.load import load_recipe
    from toolkit.submit.runsroot import reader_roots

    queue = resolve_where(request).queue
    if queue is None:
        return []
    name = load_recipe(request.recipe).name
    for root in reader_roots():
        record = read_record(name, queue, root)
        if record is not None and record.get("profile") == request.profile:
            return [*record["training"], *record.get("collectives", [])]
    return []
