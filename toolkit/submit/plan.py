"""A submission, planned once (torchx's dryrun-then-schedule): `--dry-run` prints the plan, `submit` executes it.

plan() decides everything and submits nothing: the recipe, the queue, the job spec, the script rendered once,
the executor with its exact parameters (submitit) or argv (sbatch, for MPI binaries), the batch script submitit
will send, warnings, and the run dir's metadata. execute() checks Slurm would take the job, writes the run dir
(write_run_dir, the one writer) and submits. Nothing downstream re-plans. Sweeps: toolkit.submit.sweep builds
one Plan per grid point and submits them as one array.

    executor kinds   submitit-slurm   submitit's SlurmExecutor: srun starts one RankLauncher per rank
                     submitit-local   submitit's LocalExecutor: this machine, one node (no Slurm installed)
                     sbatch           the rendered script itself (`sbatch --parsable job.sbatch`): MPI binaries
                                      take no rank arguments, srun --mpi gives each task its rank
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from toolkit import rundir
from toolkit.errors import HpcError

ExecutorKind = Literal["submitit-slurm", "submitit-local", "sbatch"]


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
    executor: ExecutorKind
    python: str | None  # submitit kinds: the Python that runs the per-rank code on the nodes
    parameters: dict[str, Any]  # submitit kinds: the executor's parameters, exactly
    batch_script: str | None  # submitit-slurm: the batch script submitit hands to sbatch
    argv: tuple[str, ...] | None  # sbatch kind: the command that submits
    rank0_argv: tuple[str, ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    metadata: dict[str, Any]  # metadata.json before the job id is known

    def to_json(self) -> dict[str, Any]:
        import dataclasses as dc

        return {"executor": self.executor, "run_dir": str(self.run_dir), "queue": self.queue.name,
                "instance_type": self.queue.instance_type, "nodes": self.spec.nodes,
                "ranks": self.spec.world_size, "python": self.python, "parameters": self.parameters,
                "argv": list(self.argv) if self.argv else None, "rank0_argv": list(self.rank0_argv),
                "notes": list(self.notes), "warnings": list(self.warnings),
                "derived": [dc.asdict(d) for d in self.spec.derived], "script": self.script,
                "batch_script": self.batch_script}


def new_run_dir(request: SubmitRequest, root: Path | None = None) -> Path:
    """A fresh run dir path for a request (not created: write_run_dir does that once the job is valid)."""
    return rundir.run_dir_path(request.run_name, root)


def plan_job(request: SubmitRequest, run_dir: Path | None = None,
             queue: Any = None) -> tuple[Any, Any, Any, Path, list[str]]:
    """The job of a plan: (recipe, queue, spec, run dir, notes), all the views share (`hpc recipes show`,
    `render`, `submit --dry-run`). `run_dir`: default a fresh path under the runs root. `queue`: already
    resolved (a task of a sweep), else resolved from the request with a note saying how."""
    from toolkit.job.spec import build_job_spec
    from toolkit.recipes.load import load_recipe

    notes: list[str] = []
    if queue is None:
        from toolkit.cluster.queues import resolve_queue

        queue, how = resolve_queue(request.cluster, request.queue)
        notes.append(f"queue: {how}")
    run_dir = run_dir or new_run_dir(request)
    recipe = load_recipe(request.recipe, profile=request.profile, overrides=request.overrides,
                         data=request.recipe_data)
    spec = build_job_spec(recipe, queue, request.nodes, profile=request.profile,
                          slurm_options=request.slurm_options, run_dir=str(run_dir))
    return recipe, queue, spec, run_dir, notes


def plan(request: SubmitRequest, run_dir: Path | None = None, *, task_of: Plan | None = None) -> Plan:
    """Everything a submit does, decided; nothing written or submitted: plan_job() and its executor.
    `task_of`: another task of the same job array (toolkit.submit.sweep), whose queue, executor and metadata
    this one shares; the array's batch script is the sweep's, not a task's."""
    from toolkit.job.rank import RANK0_PREVIEW, resolve_argv
    from toolkit.job.render import render_script
    from toolkit.recipes.load import find_recipe
    from toolkit.submit import executor as executors

    if task_of is None:
        kind, note = executors.choose_executor(request.executor)
        notes = [note] if note else []
        queue = None
    else:
        kind = "local" if task_of.executor == "submitit-local" else "slurm"
        queue, notes = task_of.queue, list(task_of.notes)
    recipe, queue, spec, run_dir, job_notes = plan_job(request, run_dir, queue)
    notes += job_notes
    executor: ExecutorKind
    python = batch_script = argv = None
    parameters: dict[str, Any] = {}
    if spec.mpi:
        if kind == "local":
            raise HpcError(f"recipe {recipe.name} runs an MPI binary, which only Slurm can start (srun --mpi)",
                           fix="submit it from a Slurm cluster's login node (--executor slurm)")
        executor, argv = "sbatch", ("sbatch", "--parsable", str(run_dir / "job.sbatch"))
    elif kind == "local":
        executor, python = "submitit-local", sys.executable
        parameters = executors.local_parameters(spec)
    else:
        executor, python = "submitit-slurm", executors.node_python(spec)
        parameters = executors.slurm_parameters(spec)
        if task_of is None:
            batch_script = executors.submitit_batch_script(spec, run_dir / "submitit")
    # A task shares its array's recipe file and commit: no git calls per task of a large sweep.
    recipe_file = find_recipe(request.recipe) if request.recipe_data is None else None
    base = rundir.base_metadata(recipe.name, recipe_file) if task_of is None else task_of.metadata
    metadata = {**base, "profile": request.profile, "overrides": list(request.overrides), "executor": executor,
                "queue": queue.name, "instance_type": queue.instance_type, "fabric": queue.fabric,
                "nodes": spec.nodes, "ranks_per_node": spec.tasks_per_node, "ranks": spec.world_size,
                "launcher_style": spec.style, "job_ids": []}
    return Plan(request=request, recipe=recipe, queue=queue, spec=spec, run_dir=run_dir, script=render_script(spec),
                executor=executor, python=python, parameters=parameters, batch_script=batch_script,
                argv=argv, rank0_argv=tuple(resolve_argv(spec.command, RANK0_PREVIEW)), notes=tuple(notes),
                warnings=spec.warnings, metadata=metadata)


def check_slurm_accepts(p: Plan) -> None:
    """Before anything is written: the controller answers and `sbatch --test-only` takes the job."""
    if p.executor == "submitit-local":
        return
    from toolkit.slurm.commands import check_controller
    from toolkit.submit.executor import preflight

    check_controller()
    preflight(p.script)


def write_run_dir(p: Plan, metadata: rundir.Metadata | None = None) -> None:
    """The one run-dir writer: resolved recipe, the script, the plan and its metadata (run dir created here)."""
    import yaml

    run = rundir.RunDir(p.run_dir).create()
    run.write_inputs(yaml.safe_dump(p.recipe.model_dump(mode="json"), sort_keys=False), p.script, p.to_json())
    run.write_metadata(metadata or rundir.Metadata.from_json(p.metadata))


def execute(p: Plan) -> str:
    """Submit a plan: check, write its run dir, submit; returns the job id. A refused job leaves no run dir."""
    from toolkit.submit import executor as executors

    check_slurm_accepts(p)
    try:
        write_run_dir(p)
        if p.executor == "sbatch":
            job_id = executors.submit_script(p.argv)
        else:
            job_id = executors.submit_submitit(p.spec, p.run_dir, p.parameters, p.python,
                                               local=p.executor == "submitit-local")
    except BaseException:
        rundir.RunDir(p.run_dir).discard()  # never leave a run dir for a job that was not submitted
        raise
    rundir.RunDir(p.run_dir).write_metadata(rundir.Metadata.from_json({**p.metadata, "job_ids": [job_id]}))
    if p.executor != "submitit-local":
        save_batch_script(job_id, p.run_dir)
    return job_id


def save_batch_script(job_id: str, run: Path) -> None:
    """Keep the batch script Slurm stored for the job (what really ran, for reproduction)."""
    from toolkit.slurm import commands

    res = commands.run(["scontrol", "write", "batch_script", job_id, str(run / "batch_script.sh")], check=False)
    if res.returncode != 0:
        (run / "batch_script.sh.missing").write_text(res.stderr or res.stdout)


def describe(p: Plan) -> str:
    """The plan for people: how it is submitted, with what, and the script."""
    how = {"submitit-slurm": f"submitit's Slurm executor (nodes run {p.python})",
           "submitit-local": f"submitit's local executor on this machine ({p.python})",
           "sbatch": "sbatch: " + shlex.join(p.argv or ())}[p.executor]
    lines = [f"would submit {p.spec.job_name}: {p.spec.nodes} x {p.spec.instance_type} on queue {p.queue.name}, "
             f"{p.spec.world_size} ranks", f"  with: {how}", f"  run dir: {p.run_dir}"]
    if p.parameters:
        lines.append("parameters:")
        lines += [f"  {k}: {v}" for k, v in p.parameters.items() if k != "setup"]
    lines += ["rank 0 runs: " + shlex.join(p.rank0_argv), "", "script (job.sbatch):", p.script]
    if p.batch_script:
        lines += ["batch script submitit sends to sbatch:", p.batch_script]
    return "\n".join(lines)
