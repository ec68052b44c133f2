"""A recipe for a researcher's own script or module, from command-line choices: what `hpc run` submits (in
memory) and `hpc recipes new` writes to a file. The launcher contract for such code: toolkit.job.user_main."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from toolkit.errors import UsageError

STYLES = ("script", "torchrun", "accelerate")  # --launcher: srun per rank, torchrun per node, accelerate per node
MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def target_launcher(target: str, module: bool = False) -> dict[str, Any]:
    """SCRIPT.py (a path: kept absolute, as the nodes see the shared file system) or MODULE (dotted name; `module`:
    it is one, whatever is on the disk here)."""
    if module and not MODULE_PATTERN.match(target):
        raise UsageError(f"{target!r} is not a module name (pkg.module)",
                         fix="pass a dotted module name, e.g. mypkg.train; a script goes without --module")
    if not module and (target.endswith(".py") or os.sep in target or os.path.exists(target)):
        _refuse_other_than_python(target)
        return {"kind": "python-script", "script": os.path.abspath(target)}
    if MODULE_PATTERN.match(target):
        return {"kind": "python-module", "module": target}
    raise UsageError(f"{target!r} is neither a Python script (a .py path) nor a module name (pkg.module)",
                     fix="pass SCRIPT.py or a dotted module name, e.g. `hpc run train.py` or `hpc run mypkg.train`")


# What the ranks would start `python` on and fail at once: a shell script, a directory.
SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh", ".csh")


def _refuse_other_than_python(target: str) -> None:
    """A script `hpc run` would hand to python that is not Python: a directory, a shell script (by its suffix or a
    `#!` line naming another interpreter). A missing file is the launcher's to refuse (toolkit.launchers.base)."""
    if os.path.isdir(target):
        raise UsageError(f"{target} is a directory, not a script",
                         fix=f"give the .py file in it, e.g. hpc run {os.path.join(target, 'train.py')} ...")
    first = ""
    if os.path.isfile(target):
        try:
            with open(target, "rb") as file:
                first = file.readline(200).decode("utf-8", "replace")
        except OSError:
            return
    foreign = first.startswith("#!") and "python" not in first
    if target.endswith(SHELL_SUFFIXES) or foreign:
        raise UsageError(f"{target} is not a Python script{f' ({first.strip()})' if foreign else ''}: `hpc run` "
                         "starts each rank with python",
                         fix=f"run it from a recipe whose launcher is `{{kind: binary, program: "
                             f"{os.path.abspath(target)}}}` (`hpc recipes submit FILE.yaml`)")


def recipe_name(target: str) -> str:
    """A recipe name from a script's file stem or a module's last part (recipe names are [a-z0-9_-])."""
    stem = os.path.splitext(os.path.basename(target))[0] if target.endswith(".py") else target.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")[:64]
    return name or "run"


def parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise UsageError(f"--env {item!r} is not NAME=VALUE", fix="e.g. --env NCCL_DEBUG=WARN")
        env[name] = value
    return env


def venv_dir(venv: str) -> str:
    """--venv DIR as the nodes activate it: an absolute path to a virtual environment (bin/activate)."""
    if not os.path.isfile(os.path.join(venv, "bin", "activate")):
        raise UsageError(f"--venv {venv} has no bin/activate", fix="pass the directory of a virtual environment "
                                                                  "on the file system the nodes share")
    return os.path.abspath(venv)


def container_spec(image: str, mounts: Sequence[str] = (), image_option: str = "--container") -> dict[str, Any]:
    """software.container from --container and --container-mount, checked by the recipe's own model here so that a
    bad value is named by the option that gave it (not as a key of a recipe the user never wrote)."""
    from pydantic import ValidationError

    from toolkit.recipes.load import plain_error
    from toolkit.recipes.schema import Container

    spec = {"image": image, "mounts": list(mounts)}
    try:
        Container.model_validate(spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        option, fix = ((image_option, f"e.g. {image_option} nvcr.io/nvidia/pytorch:24.01-py3 or {image_option} "
                                      "/fsx/images/pytorch.sqsh") if err["loc"][0] == "image" else
                       ("--container-mount", "e.g. --container-mount /fsx/data:/data:ro, the option once per mount"))
        raise UsageError(f"{option}: {plain_error(err)}", fix=fix) from None
    return spec


def user_recipe(target: str, script_args: Sequence[str], *, name: str | None = None, nodes: int | None = None,
                style: str = "script", time: str | None = None, max_restarts: int | None = None,
                venv: str | None = None, env: Mapping[str, str] | None = None,
                rendezvous_timeout_s: int | None = None, container: str | None = None,
                container_mounts: Sequence[str] = (), hang_timeout_s: int | None = None,
                spares: int | None = None, module: bool = False) -> dict[str, Any]:
    """The recipe (as data) that runs `python TARGET SCRIPT_ARGS...` on every rank. `style`: script, torchrun, or
    accelerate (launcher kind accelerate: `accelerate launch` per node). `module`: TARGET is a module name."""
    if style not in STYLES:
        raise UsageError(f"--launcher {style!r} is not one of {', '.join(STYLES)}",
                         fix="use --launcher script (srun, one process per rank), --launcher torchrun or "
                             "--launcher accelerate")
    if max_restarts and style == "script":
        raise UsageError("--max-restarts needs --launcher torchrun or accelerate (srun does not restart ranks)",
                         fix="add --launcher torchrun, or drop --max-restarts")
    launcher: dict[str, Any] = target_launcher(target, module)
    if style == "accelerate":  # its own kind, for a script or a module alike (toolkit.launchers.accelerate)
        launcher["kind"] = "accelerate"
    else:
        launcher["style"] = style
    if script_args:
        launcher["argv"] = list(script_args)
    if max_restarts:
        launcher["max_restarts"] = max_restarts
    if rendezvous_timeout_s:
        launcher["rendezvous_timeout_s"] = rendezvous_timeout_s
    recipe: dict[str, Any] = {
        "name": name or recipe_name(target),
        "description": f"{target} (your own code)",
        "source": "hpc run: a researcher's own script; the rank environment is torchrun's (see docs/researchers.md, "
                  "'Your own training script')",
        "launcher": launcher,
        "resources": {"nodes": nodes or 1, **({"time": time} if time else {}),
                      **({"hang_timeout_s": hang_timeout_s} if hang_timeout_s else {}),
                      **({"spares": spares} if spares else {})},
    }
    if venv:
        recipe["software"] = {"venv": venv_dir(venv)}
    if container:  # every rank in this image (software.container; toolkit.job.container)
        recipe.setdefault("software", {})["container"] = container_spec(container, container_mounts)
    elif container_mounts:
        raise UsageError("--container-mount needs --container IMAGE", fix="add --container IMAGE.sqsh")
    if env:
        recipe["env"] = dict(env)
    return recipe
