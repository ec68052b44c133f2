"""`hpc run SCRIPT_OR_MODULE -- ARGS`: a researcher's own code on N nodes, no recipe file needed.

It builds a recipe in memory (toolkit.recipes.user) and submits it exactly as `hpc recipes submit` does: the same
plan and the same job options (toolkit.cli.options), so `--dry-run` prints what would be submitted. The contract
for the script: toolkit.job.user_main.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolkit.cli import options as o
from toolkit.cli.output import JSON_OPTION

LAUNCHER = typer.Option(o.Launcher.script, "--launcher", help="script: srun starts one process per rank; torchrun: "
                                                              "one torchrun per node starts its ranks (restarts: "
                                                              "--max-restarts); accelerate: one `accelerate launch` "
                                                              "per node (Hugging Face Accelerate).")
MAX_RESTARTS = typer.Option(None, "--max-restarts", min=0, help="torchrun, accelerate: restart the ranks up to K "
                                                                "times after a failure (the script resumes from its "
                                                                "checkpoint).")
CONTAINER = typer.Option(None, "--container", help="Run every rank in this container image (a .sqsh file or an "
                                                   "image reference) with pyxis: srun --container-image.")
CONTAINER_MOUNT = typer.Option([], "--container-mount", help="SRC[:DST[:FLAGS]] mounted into the container "
                                                             "(repeatable), e.g. /fsx or /fsx/data:/data:ro.")
RDZV_TIMEOUT = typer.Option(None, "--rendezvous-timeout", min=1,
                            help="Seconds a rank may wait in init_process_group before failing (default 300).")


def run(target: Optional[str] = typer.Argument(None, metavar="SCRIPT_OR_MODULE",
                                               help="SCRIPT.py (a path on the shared file system) or a module "
                                                    "(pkg.train)."),
        script_args: Optional[list[str]] = typer.Argument(None, metavar="-- SCRIPT_ARGS...",
                                                          help="Arguments for the script, after `--`."),
        # python's, torchrun's and `hpc k8s render`'s way to name a module, besides the bare name
        module: Optional[str] = typer.Option(None, "--module", "-m", metavar="PKG.MODULE",
                                             help="Your module, as python -m PKG.MODULE takes it (or give its name "
                                                  "as SCRIPT_OR_MODULE)."),
        nodes: int = typer.Option(1, "--nodes", "-N", min=1, help="Nodes of the job (ranks per node come from the "
                                                                  "queue)."),
        cluster: Optional[Path] = o.CLUSTER, queue: Optional[str] = o.QUEUE, launcher: o.Launcher = LAUNCHER,
        max_restarts: Optional[int] = MAX_RESTARTS, rendezvous_timeout: Optional[int] = RDZV_TIMEOUT,
        container: Optional[str] = CONTAINER, container_mount: list[str] = CONTAINER_MOUNT,
        profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET, sweeps: list[str] = o.SWEEP,
        array_parallelism: Optional[int] = o.ARRAY_PARALLELISM,
        time: Optional[str] = o.TIME, hang_timeout: Optional[int] = o.HANG_TIMEOUT,
        spares: Optional[int] = o.SPARES, preflight: Optional[bool] = o.PREFLIGHT, env: list[str] = o.ENV,
        venv: Optional[Path] = o.VENV,
        account: Optional[str] = o.ACCOUNT, qos: Optional[str] = o.QOS, reservation: Optional[str] = o.RESERVATION,
        dependency: Optional[str] = o.DEPENDENCY, executor: Optional[o.Executor] = o.EXECUTOR,
        resume_from: Optional[str] = o.RESUME_FROM, avoid_suspects: bool = o.AVOID_SUSPECTS,
        dry_run: bool = o.DRY_RUN, verbose: bool = o.VERBOSE, wait: bool = o.WAIT,
        as_json: bool = JSON_OPTION) -> None:
    """Run your own Python script or module on N nodes: `hpc run train.py --nodes 2 -- --epochs 3`.

    Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT,
    as under torchrun: a script written for torchrun runs unchanged (docs/researchers.md: "Your own training script").
    """
    from toolkit.cli.recipes import submit_any
    from toolkit.errors import UsageError
    from toolkit.recipes.user import parse_env, user_recipe
    from toolkit.submit.plan import SubmitRequest

    if target is None and module is None:
        raise UsageError("missing argument SCRIPT_OR_MODULE",
                         fix="e.g. hpc run train.py --nodes 2 -- --epochs 3, or hpc run -m mypkg.train --nodes 2")
    if module is not None:  # as `python -m MOD A B` and `hpc k8s render -m`: every word after the module is its own
        if module.endswith(".py"):
            raise UsageError(f"-m {module!r} is a file name: -m takes a module (pkg.train)",
                             fix=f"run the script without -m: hpc run {module} ...")
        script_args = [*([target] if target is not None else []), *(script_args or [])]

    job = o.JobOptions(overrides, sweeps, profile, time, env, venv, account, qos, reservation, dependency)
    job.refuse("hpc run", "your script has no recipe profiles", "profile")
    job.refuse_twice()
    o.check_time(time)
    data = user_recipe(module or target or "", script_args or [], module=module is not None, nodes=nodes,
                       style=launcher.value, time=time, max_restarts=max_restarts,
                       venv=str(venv) if venv else None, env=parse_env(env),
                       rendezvous_timeout_s=rendezvous_timeout, container=container,
                       container_mounts=container_mount, hang_timeout_s=hang_timeout, spares=spares)
    request = SubmitRequest(data["name"], nodes, str(cluster) if cluster else None, queue,
                            overrides=(*o.preflight_override(preflight), *overrides),
                            slurm_options=job.slurm_options(),
                            executor=o.value(executor), recipe_data=data, resume_from=resume_from,
                            avoid_suspects=avoid_suspects)
    submit_any(request, sweeps, array_parallelism, dry_run, wait, as_json, verbose)
