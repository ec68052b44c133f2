"""A submission, planned once (torchx's dryrun-then-schedule): `--dry-run` prints the plan, `submit` executes it.

plan() decides everything and submits nothing: the recipe, the queue, the job spec, the script rendered once,
the executor (toolkit.rundir.Executor: slurm, local, sbatch) with its exact parameters (submitit)
or argv (sbatch), the batch script submitit will send, the rank program every task runs, warnings, and the run
dir's metadata. execute() checks Slurm would take the job, writes the run dir (write_run_dir, the one writer)
and submits. Nothing downstream re-plans. Sweeps: toolkit.submit.sweep builds one Plan per grid point and
submits them as one array.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence

from toolkit import rundir
from toolkit.rundir import Executor


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    recipe: str
    nodes: int | None = None
    cluster: str | None = None
    queue: str | None = None
    profile: str | None = None
    overrides: Sequence[str] = ()
    slurm_options: Mapping[str, str | None] = dataclasses.field(default_factory=dict)  # sbatch --account, --qos...
    executor: str | None = None
    recipe_data: Mapping[str, Any] | None = None  # a recipe built in memory (`hpc run`); `recipe` is its name
    resume_from: str | None = None  # another run (dir or job id) whose checkpoints seed this one's
    avoid_suspects: bool = True  # leave the nodes the fleet's ledger suspects out (toolkit.health.fleet)

    @property
    def run_name(self) -> str:
        """The stem of the run dir's name: the recipe (file stem) and profile."""
        stem = Path(self.recipe).stem
        return stem if self.profile is None else f"{stem}-{self.profile}"


@dataclasses.dataclass(frozen=True)
class Plan:
    request: SubmitRequest
    recipe: Any  # toolkit.recipes.schema.Recipe
    queue: Any  # toolkit.cluster.queues.Queue
    spec: Any  # toolkit.job.spec.JobSpec
    run_dir: Path
    script: str  # job.sbatch: what sbatch runs for the sbatch kind, the equivalent script otherwise
    executor: Executor
    python: str | None  # slurm, local: the Python that runs submitit's per-rank code on the nodes
    parameters: dict[str, Any]  # slurm, local: the executor's parameters, exactly
    batch_script: str | None  # slurm: the batch script submitit hands to sbatch
    argv: tuple[str, ...] | None  # sbatch: the command that submits
    rank_program: tuple[str, ...]  # what srun starts on every task, on every path (toolkit.job.rank)
    rank0_argv: tuple[str, ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    metadata: dict[str, Any]  # metadata.json before the job id is known

    def to_json(self) -> dict[str, Any]:
        import dataclasses as dc

        return {"executor": self.executor.value, "run_dir": str(self.run_dir), "queue": self.queue.name,
                "instance_type": self.queue.instance_type, "nodes": self.spec.nodes,
                "ranks": self.spec.world_size, "python": self.python, "parameters": self.parameters,
                "argv": list(self.argv) if self.argv else None, "rank_program": list(self.rank_program),
                "rank0_argv": list(self.rank0_argv),
                "notes": list(self.notes), "warnings": list(self.warnings),
                "derived": [dc.asdict(d) for d in self.spec.derived], "script": self.script,
                "batch_script": self.batch_script}


def new_run_dir(request: SubmitRequest, root: Path | None = None) -> Path:
    """A fresh run dir path for a request (not created: write_run_dir does that once the job is valid)."""
    return rundir.run_dir_path(request.run_name, root)


def plan_job(request: SubmitRequest, run_dir: Path | None = None,
             queue: Any = None) -> tuple[Any, Any, Any, Path, list[str]]:
    """The job of a plan: (recipe, queue, spec, run dir, notes), all the views share (`hpc recipes show`,
    `render`, `submit --dry-run`). `run_dir`: default a fresh path under the runs root (toolkit.submit.runsroot:
    $HPC_RUNS_DIR, the cluster config's FSx, else home, with a warning for checkpoints there). `queue`: already
    resolved (a task of a sweep), else resolved from the request with a note saying how."""
    from toolkit.launchers import check_arguments
    from toolkit.recipes.load import load_recipe
    from toolkit.slurm.materialize import build_job_spec
    from toolkit.slurm.render import slurm_part
    from toolkit.submit import outputs, runsroot, sharedfs

    refuse_conflicts(request)
    notes: list[str] = []
    if queue is None:
        from toolkit.cluster.queues import resolve_queue

        queue, how = resolve_queue(request.cluster, request.queue)
        notes.append(f"queue: {how}")
    refuse_per_node_overrides(request, queue)
    root = None
    if run_dir is None:  # an explicit one (--run-dir, a sweep's task) wins
        root = runsroot.choose(queue)
        run_dir = new_run_dir(request, root.path)
    recipe = load_recipe(request.recipe, profile=request.profile, overrides=request.overrides,
                         data=request.recipe_data)
    spec = build_job_spec(recipe, queue, request.nodes, profile=request.profile,
                          slurm_options=request.slurm_options, run_dir=str(run_dir))
    spec, fleet_notes = avoid_suspects(request, recipe, queue, spec, run_dir)
    notes += fleet_notes
    if root is not None and (warning := runsroot.home_warning(root, spec)):
        spec = dataclasses.replace(spec, warnings=(*spec.warnings, warning))
    if outside := sharedfs.outside_warnings(recipe, spec, queue):
        spec = dataclasses.replace(spec, warnings=(*spec.warnings, *outside))
    roots = [root.path] if root is not None else runsroot.reader_roots()
    if request.resume_from:  # a run owns its outputs; continuing another is explicit (toolkit.submit.outputs)
        spec = outputs.resume_from(spec, request.resume_from, roots)
    if shared := outputs.shared_output_warnings(spec, roots):
        spec = dataclasses.replace(spec, warnings=(*spec.warnings, *shared))
    if spec.requeue and not queue.from_config:
        # ParallelCluster never takes SlurmctldParameters (CustomSlurmSettings deny-list): a cluster config means
        # a bare --requeue; self-managed Slurm (no cluster config) is asked
        spec = expedite_requeue(spec)
    if slurm_part(spec).preflight_args and not spec.software.container:  # it runs hpc's toolkit.node
        from toolkit.errors import HpcError
        from toolkit.job.staging import python_problem

        problem = python_problem(spec.software.venv, queue.os_python3)
        if problem:
            raise HpcError(problem[0], fix=problem[1])
    notes += check_arguments(recipe, spec)
    return recipe, queue, spec, run_dir, notes


def expedite_requeue(spec):
    """--requeue=expedite where the Slurm here takes it (toolkit.slurm.version.expedited_requeue). Never for a
    queue of a ParallelCluster config: pcluster refuses SlurmctldParameters in CustomSlurmSettings
    (aws-parallelcluster cli/src/pcluster/validators/slurm_settings_validator.py, SLURM_SETTINGS_DENY_LIST)."""
    import dataclasses as dc

    from toolkit.job.spec import Derived
    from toolkit.slurm.version import EXPEDITED_REQUEUE_PARAMETER, expedited_requeue

    if not expedited_requeue():
        return spec
    why = (f"Slurm here is 25.11+ with SlurmctldParameters={EXPEDITED_REQUEUE_PARAMETER}: on a node failure the "
           "job requeues at once, first in line")
    from toolkit.slurm.render import slurm_part

    return dc.replace(spec, slurm=dc.replace(slurm_part(spec), expedited_requeue=True),
                      derived=(*spec.derived, Derived("--requeue", "expedite", why)))


def refuse_conflicts(request: SubmitRequest) -> None:
    """Two options that set one value: --nodes and an override (--set, or a --sweep point) of resources.nodes."""
    from toolkit.errors import UsageError
    from toolkit.recipes.load import option_of

    for item in request.overrides:
        if request.nodes is not None and item.partition("=")[0] == "resources.nodes":
            option = option_of(item)
            raise UsageError(
                f"--nodes {request.nodes} and {option} {item} both set the node count",
                fix="a sweep's tasks share one node count: submit one sweep per count (--nodes 1, then --nodes 2, "
                    "...) without sweeping resources.nodes" if option == "--sweep" else
                    f"give one of them: --nodes {request.nodes}, or --set {item}")


# resources.* keys a Slurm habit may try: a node's accelerators and ranks are its instance type's (one rank per
# accelerator; a CPU queue's declared ranks), not a recipe's
PER_NODE_KEYS = ("gpus_per_node", "gpus", "gpus_per_task", "ntasks_per_node", "tasks_per_node", "ranks_per_node")


def refuse_per_node_overrides(request: SubmitRequest, queue: Any) -> None:
    """`--set resources.gpus_per_node=16` on a queue of 8-GPU nodes: name the instance's count, and how to get
    more GPUs (more nodes, or another queue)."""
    from toolkit.cluster.queues import TAG_RANKS_PER_NODE
    from toolkit.errors import UsageError
    from toolkit.recipes.load import option_of

    for item in request.overrides:
        key, _, value = item.partition("=")
        if key not in {f"resources.{name}" for name in PER_NODE_KEYS}:
            continue
        kind = queue.instance.accelerator
        unit = "GPUs" if kind == "nvidia" else f"{kind} accelerators"
        has = (f"{queue.gpus_per_node} {unit}, one rank each" if queue.gpus_per_node else
               f"no accelerators: {queue.tasks_per_node} rank(s) per node, from the queue's {TAG_RANKS_PER_NODE} tag "
               "(default 1)")
        wanted = int(value) if value.isdigit() and queue.gpus_per_node else 0
        nodes = -(-wanted // queue.gpus_per_node) if wanted > queue.gpus_per_node else 0
        raise UsageError(f"{option_of(item)} {item}: a node's accelerators and ranks come from its instance type, "
                         f"not the recipe: {queue.instance_type} (queue {queue.name}) has {has}",
                         fix=(f"ask for nodes instead: --nodes {nodes} gives {nodes * queue.gpus_per_node} {unit}; "
                              if nodes else f"drop {option_of(item)} {key}; ") + "or pick a queue of another "
                             "instance type with --queue (`hpc cluster show FILE` lists them)")


def avoid_suspects(request: SubmitRequest, recipe: Any, queue: Any, spec: Any,
                   run_dir: Path) -> tuple[Any, list[str]]:
    """The nodes the fleet's ledger suspects (toolkit.health.fleet) left out of the job (--exclude), never so many
    that the job cannot start; `request.avoid_suspects` False keeps them. (The job records into the same ledger:
    toolkit.slurm.materialize exports its dir.)"""
    from toolkit.health import fleet
    from toolkit.slurm.materialize import build_job_spec

    where = fleet.fleet_dir(queue)
    if where is None:
        return spec, []
    notes = []
    found = fleet.suspects(where) if request.avoid_suspects else {}
    if found:
        avoid = fleet.avoidance(found, queue.name, spec.nodes + spec.spares)
        if avoid.excluded:
            options = fleet.merge_exclude(request.slurm_options, avoid.excluded)
            spec = build_job_spec(recipe, queue, request.nodes, profile=request.profile, slurm_options=options,
                                  run_dir=str(run_dir))
            notes.append(f"suspected node(s) left out (--exclude={','.join(avoid.excluded)}; the fleet's ledger, "
                         f"{where}; --no-avoid-suspects keeps them): "
                         + "; ".join(f"{n}: {avoid.why[n]}" for n in avoid.excluded))
        if avoid.kept:
            notes.append(f"suspected node(s) kept, or the job could not start on queue {queue.name}: "
                         f"{', '.join(avoid.kept)}")
    return spec, notes


def plan(request: SubmitRequest, run_dir: Path | None = None, *, task_of: Plan | None = None,
         array: bool = False) -> Plan:
    """Everything a submit does, decided; nothing written or submitted: plan_job() and its executor.
    `task_of`: another task of the same job array (toolkit.submit.sweep), whose queue, executor and metadata
    this one shares; the array's batch script is the sweep's, not a task's. `array`: this is the first task of
    one (a submitit job array, whatever else would choose the rendered script)."""
    from toolkit.job.rank import preview_argv
    from toolkit.slurm.render import render_script
    from toolkit.recipes.load import find_recipe
    from toolkit.slurm import executors
    from toolkit.target import target_for

    recipe, queue, spec, run_dir, notes = plan_job(request, run_dir, task_of.queue if task_of else None)
    if task_of is None:
        executor, note = executors.choose_executor(request.executor, mpi=bool(spec.mpi), spares=spec.spares,
                                                   node_python=executors.node_python(spec),
                                                   cluster_given=queue.from_config, array=array)
        notes = [note, *notes] if note else notes
        if off := executors.planned_without_slurm(executor):  # said once: a sweep's tasks share their notes
            notes.append(off)
    else:
        executor, notes = task_of.executor, list(task_of.notes)
    warnings = list(spec.warnings)
    if spec.software.container and task_of is None:  # a sweep's tasks share their array's cluster
        warnings += container_warnings(request)
    dispatch = target_for(executor).dry_run(spec, run_dir, array=task_of is not None)
    # A task shares its array's recipe file and commit: no git calls per task of a large sweep.
    recipe_file = find_recipe(request.recipe) if request.recipe_data is None else None
    base = rundir.base_metadata(recipe.name, recipe_file) if task_of is None else task_of.metadata
    metadata = {**base, "profile": request.profile, "overrides": list(request.overrides), "executor": executor.value,
                "queue": queue.name, "instance_type": queue.instance_type, "fabric": queue.fabric,
                "nodes": spec.nodes, "ranks_per_node": spec.tasks_per_node, "ranks": spec.world_size,
                "launcher_style": spec.style, "job_ids": []}
    return Plan(request=request, recipe=recipe, queue=queue, spec=spec, run_dir=run_dir, script=render_script(spec),
                executor=executor, python=dispatch.python, parameters=dispatch.parameters,
                batch_script=dispatch.batch_script, argv=dispatch.argv, rank_program=spec.program.argv,
                rank0_argv=tuple(preview_argv(spec.command)), notes=tuple(notes), warnings=tuple(warnings),
                metadata=metadata)


def container_warnings(request: SubmitRequest) -> list[str]:
    """A containerized job planned on a cluster config that does not enable pyxis (the submission asks srun)."""
    from toolkit.cluster.queues import cluster_config_candidates
    from toolkit.health.containers import config_warning

    path = request.cluster or next((p for p in cluster_config_candidates() if p.is_file()), None)
    warning = config_warning(path) if path else None
    return [warning] if warning else []


def write_run_dir(p: Plan, metadata: rundir.Metadata | None = None) -> None:
    """The one run-dir writer: resolved recipe, the script, the plan and its metadata (run dir created here)."""
    import yaml

    run = rundir.RunDir(p.run_dir).create()
    run.write_inputs(yaml.safe_dump(p.recipe.model_dump(mode="json"), sort_keys=False), p.script, p.to_json())
    run.write_metadata(metadata or rundir.Metadata.from_json(p.metadata))


def execute(p: Plan) -> str:
    """Submit a plan: the target checks it would take the job, the run dir is written, the target submits;
    returns the job id. A refused job leaves no run dir."""
    from toolkit.target import target_for

    target = target_for(p.executor)
    target.check(p)
    try:
        write_run_dir(p)
        job_id = target.schedule(p)
    except BaseException:
        rundir.RunDir(p.run_dir).discard()  # never leave a run dir for a job that was not submitted
        raise
    rundir.RunDir(p.run_dir).write_metadata(rundir.Metadata.from_json({**p.metadata, "job_ids": [job_id]}))
    return job_id


def describe(p: Plan) -> str:
    """The plan for people: how it is submitted, with what, and the script."""
    from toolkit.target import Dispatch, target_for

    how = target_for(p.executor).describe(Dispatch(p.python, p.parameters, p.batch_script, p.argv))
    lines = [f"would submit {p.spec.job_name}: {p.spec.nodes} x {p.spec.instance_type} on queue {p.queue.name}, "
             f"{p.spec.world_size} ranks", f"  with: {how}", f"  run dir: {p.run_dir}"]
    if p.parameters:
        lines.append("parameters:")
        lines += [f"  {k}: {v}" for k, v in p.parameters.items() if k != "setup"]
    lines += ["every task runs: " + shlex.join(p.rank_program), "rank 0 runs: " + shlex.join(p.rank0_argv), "",
              "script (job.sbatch):", p.script]
    if p.batch_script:
        lines += ["batch script submitit sends to sbatch:", p.batch_script]
    return "\n".join(lines)
