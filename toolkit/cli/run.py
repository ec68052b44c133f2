"""`hpc run SCRIPT_OR_MODULE -- ARGS`: a researcher's own code on N nodes, no recipe file needed.

It builds a recipe in memory (toolkit.recipes.user) and submits it exactly as `hpc recipes submit` does: the same
plan, so `--dry-run` prints what would be submitted. The contract for the script: toolkit.job.user_main.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION
from toolkit.cli.recipes import CLUSTER, QUEUE

LAUNCHER = typer.Option("script", "--launcher", help="script: srun starts one process per rank; torchrun: one "
                                                     "torchrun per node starts its ranks (restarts: --max-restarts).")
TIME = typer.Option(None, "--time", "-t", help="Slurm time limit (e.g. 01:00:00; default 24:00:00).")
MAX_RESTARTS = typer.Option(None, "--max-restarts", min=0, help="torchrun: restart the ranks up to K times after "
                                                                "a failure (the script resumes from its checkpoint).")
VENV = typer.Option(None, "--venv", help="Virtual environment the nodes activate (default: the one hpc runs in).")
ENV = typer.Option([], "--env", "-e", help="Set a variable in the job: NAME=VALUE (repeatable).")
CONTAINER = typer.Option(None, "--container", help="Run every rank in this container image (a .sqsh file or an "
                                                   "image reference) with pyxis: srun --container-image.")
CONTAINER_MOUNT = typer.Option([], "--container-mount", help="SRC[:DST[:FLAGS]] mounted into the container "
                                                             "(repeatable), e.g. /fsx or /fsx/data:/data:ro.")
RDZV_TIMEOUT = typer.Option(None, "--rendezvous-timeout", min=1,
                            help="Seconds a rank may wait in init_process_group before failing (default 300).")


def run(target: str = typer.Argument(..., metavar="SCRIPT_OR_MODULE",
                                     help="SCRIPT.py (a path on the shared file system) or a module (pkg.train)."),
        script_args: Optional[list[str]] = typer.Argument(None, metavar="-- SCRIPT_ARGS...",
                                                          help="Arguments for the script, after `--`."),
        nodes: int = typer.Option(1, "--nodes", "-N", min=1, help="Nodes (ranks per node come from the queue)."),
        cluster: Optional[Path] = CLUSTER, queue: Optional[str] = QUEUE, launcher: str = LAUNCHER,
        time: Optional[str] = TIME, max_restarts: Optional[int] = MAX_RESTARTS, venv: Optional[Path] = VENV,
        env: list[str] = ENV, rendezvous_timeout: Optional[int] = RDZV_TIMEOUT,
        container: Optional[str] = CONTAINER, container_mount: list[str] = CONTAINER_MOUNT,
        executor: Optional[str] = typer.Option(None, "--executor", help="slurm | local | sbatch (default: slurm; "
                                                                        "local only where no Slurm is installed)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan that would be submitted; submit "
                                                              "nothing."),
        wait: bool = typer.Option(False, "--wait", help="Show progress until the job ends; exit 1 if it fails."),
        as_json: bool = JSON_OPTION) -> None:
    """Run your own Python script or module on N nodes: `hpc run train.py --nodes 2 -- --epochs 3`.

    Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT,
    as under torchrun: a script written for torchrun runs unchanged (README: "Your own training script").
    """
    from toolkit.cli.recipes import submit_request
    from toolkit.recipes.user import parse_env, user_recipe
    from toolkit.submit.plan import SubmitRequest

    data = user_recipe(target, script_args or [], nodes=nodes, style=launcher, time=time, max_restarts=max_restarts,
                       venv=str(venv) if venv else None, env=parse_env(env),
                       rendezvous_timeout_s=rendezvous_timeout, container=container,
                       container_mounts=container_mount)
    request = SubmitRequest(data["name"], nodes, str(cluster) if cluster else None, queue, executor=executor,
                            recipe_data=data)
    submit_request(request, dry_run, wait, as_json)
