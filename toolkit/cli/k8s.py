"""`hpc k8s`: the recipes as Kubernetes manifests for Amazon EKS (render, validate offline)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Sequence

import typer

from toolkit.cli import options as o
from toolkit.cli.output import JSON_OPTION, counted, emit, fail, info, output_target, warn, write_output

# A new EKS user who installs Kubeflow today gets Trainer v2 (kubeflow/trainer v2.2+, TrainJob): Kubeflow's
# installation guide (kubeflow.org docs, components/trainer/operator-guides/installation) installs it, and lists the
# Training Operator (PyTorchJob) as "Legacy (v1)". v1 stays for clusters that run it.
DEFAULT_API = "trainer-v2"
_DEFAULT_API_CHOICE = o.KubeflowApi(DEFAULT_API)  # --api's default, as the option's enum

app = typer.Typer(help="The recipes as Kubernetes manifests (Amazon EKS): render, validate offline.",
                  no_args_is_help=True, rich_markup_mode=None)


def render_command_line(name: str | None, nodes: int, instance: str, profile, overrides, namespace, image, claim,
                        storage_class, efa, output, api: str = DEFAULT_API, module: str | None = None,
                        script_from: str | None = None, script_args: Sequence[str] = ()) -> str:
    """The `hpc k8s render` line that reproduces a rendering (recorded in the file's header)."""
    what = ["--module", module] if module is not None else [name or ""]
    words = ["hpc", "k8s", "render", *what, "--nodes", str(nodes), "--instance", instance]
    words += ["--api", api] if api != DEFAULT_API else []
    words += ["--profile", profile] if profile else []
    for item in overrides:
        words += ["--set", item]
    words += ["--namespace", namespace] if namespace != "default" else []
    words += ["--image", image] if image else []
    words += ["--fsx-claim", claim] if claim else []
    words += ["--fsx-storage-class", storage_class] if storage_class else []
    words += [] if efa is None else ["--efa" if efa else "--no-efa"]
    words += ["--script-from", script_from] if script_from else []
    words += ["-o", str(output)] if output else []
    words += ["--", *script_args] if script_args else []
    return shlex.join(words)


def _check_names(namespace: str, claim: str | None, storage_class: str | None) -> None:
    """The names the user gives, as the API server checks them (k8s.io/apimachinery pkg/util/validation: a
    namespace is a DNS-1123 label, a claim's and a StorageClass's name a DNS-1123 subdomain), before rendering:
    `hpc k8s validate` refused them, the render wrote them."""
    import re

    from toolkit.errors import UsageError
    from toolkit.k8s.crd import dns1123_label, dns1123_subdomain

    label = "at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    subdomain = ("lowercase letters, digits, '-' and '.', each part between dots starting and ending with a letter "
                 "or digit, at most 253 characters")
    for option, value, valid, what, kept in (("--namespace", namespace, dns1123_label, label, r"[^a-z0-9]+"),
                                             ("--fsx-claim", claim, dns1123_subdomain, subdomain, r"[^a-z0-9.]+"),
                                             ("--fsx-storage-class", storage_class, dns1123_subdomain, subdomain,
                                              r"[^a-z0-9.]+")):
        if value is not None and not valid(value):
            like = re.sub(r"-?\.-?", ".", re.sub(kept, "-", value.lower())).strip("-.")[:63].strip("-.") or "train"
            raise UsageError(f"{option} {value!r} is not a name Kubernetes accepts ({what})",
                             fix=f"e.g. {option} {like}")


@app.command()
def render(name: Optional[str] = o.RECIPE_OR_SCRIPT,
           script_args: Optional[list[str]] = typer.Argument(None, metavar="-- SCRIPT_ARGS...",
                                                             help="Arguments for your script or module, after `--`."),
           module: Optional[str] = typer.Option(None, "--module", "-m", metavar="PKG.MODULE",
                                                help="Your own module instead (python -m), from the image: needs "
                                                     "--image."),
           nodes: int = typer.Option(..., "--nodes", "-N", min=1, help="Nodes of the job (pods, one per node)."),
           instance: str = typer.Option(..., "--instance", metavar="INSTANCE_TYPE",
                                        help="EC2 instance type of the nodes (catalog name)."),
           profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET,
           namespace: str = typer.Option("default", "--namespace", "-n", help="Kubernetes namespace."),
           image: Optional[str] = typer.Option(None, "--image", help="Container image (default: a placeholder to "
                                                                      "fill in)."),
           claim: Optional[str] = typer.Option(None, "--fsx-claim", help="An existing ReadWriteMany claim for the "
                                                                          "dirs (default: fsx-claim)."),
           storage_class: Optional[str] = typer.Option(None, "--fsx-storage-class",
                                                       help="Render a StorageClass of this name (FSx CSI dynamic "
                                                            "provisioning) and a claim through it."),
           efa: Optional[bool] = typer.Option(None, "--efa/--no-efa", help="Use the instance's EFA devices "
                                                                           "(default: all of them, if it has any)."),
           script_from: Optional[o.ScriptFrom] = typer.Option(
               None, "--script-from", help="Where the pods read your script: image (the default with --image: it "
                                           "must hold the script at the path given) or configmap (the default "
                                           "without: a ConfigMap carries the file, up to 1 MiB)."),
           api: o.KubeflowApi = typer.Option(_DEFAULT_API_CHOICE, "--api",
                                             help="Kubeflow API: trainer-v2 (TrainJob on Kubeflow Trainer v2.2+, what "
                                             "a new install gets today) or v1 (PyTorchJob of the Training Operator "
                                             "v1.9, MPIJob of the MPI Operator, for clusters that run them)."),
           output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE|DIR|-",
                                                help="Write the manifests here (a directory: RECIPE.yaml, or "
                                                     "SCRIPT.yaml, in it; default and -: stdout)."),
           force: bool = o.FORCE,
           as_json: bool = JSON_OPTION) -> None:
    """Render a recipe as Kubernetes manifests: a Kubeflow Trainer v2 TrainJob (default) or a v1 PyTorchJob
    (training) / MPIJob (nccl-tests), and the FSx claim. Or your own script or module, as `hpc run` takes it:
    `hpc k8s render train.py --nodes 2 --instance p4d.24xlarge -- --epochs 3` (a ConfigMap carries the script, or
    the --image holds it), `hpc k8s render -m mypkg.train --image IMAGE ...`."""
    import dataclasses

    from toolkit.errors import UsageError
    from toolkit.k8s.manifests import DEFAULT_CLAIM, Storage
    from toolkit.k8s.manifests import render as render_manifests
    from toolkit.k8s.usercode import is_user_code, user_code_recipe
    from toolkit.recipes.load import load_recipe
    from toolkit.textfile import refuse_overwrite

    api_name = api.value
    if claim and storage_class:
        raise UsageError("--fsx-claim names an existing claim; --fsx-storage-class makes a new one",
                         fix="give one of them")
    if name is None and module is None:
        raise UsageError("no recipe, script or module given",
                         fix="e.g. hpc k8s render resnet50 ..., hpc k8s render train.py ..., or "
                             "hpc k8s render -m mypkg.train --image IMAGE ...")
    _check_names(namespace, claim, storage_class)
    if image is not None:
        from toolkit.k8s.image import FORM, image_problem

        if (problem := image_problem(image)) is not None:
            raise UsageError(f"--image {image!r} {problem}: the kubelet could not pull it (the pods would wait in "
                             "InvalidImageName)", fix=f"give --image as {FORM}")
    user_code = is_user_code(name, module)
    if not user_code and script_args:
        raise UsageError(f"{name} is a recipe: arguments after it ({shlex.join(script_args)}) are for a script",
                         fix="set the recipe's arguments with --set args.--FLAG=VALUE, or render your script "
                             "(SCRIPT.py -- ARGS)")
    if user_code and profile:
        raise UsageError("--profile: your script has no recipe profiles", fix="drop --profile")
    data = user_code_recipe(name, module, script_args or [], nodes, image) if user_code else None
    stem = data["name"] if data is not None else Path(name or "").stem
    path = output_target(output, f"{stem}.yaml")
    if path is not None:  # before the work of rendering
        refuse_overwrite(path, force)
    recipe = (load_recipe(stem, overrides=overrides, data=data) if data is not None
              else load_recipe(name or "", profile=profile, overrides=overrides))
    storage = Storage(claim=claim or DEFAULT_CLAIM, storage_class=storage_class)
    words = [] if module is None or name is None else [name]  # with --module every positional word is its argument
    line = render_command_line(name if module is None else None, nodes, instance, profile, overrides, namespace,
                               image, claim, storage_class, efa, path, api_name, module=module,
                               script_from=o.value(script_from), script_args=[*words, *(script_args or [])])
    rendered = render_manifests(recipe, instance, nodes, profile=profile, namespace=namespace, image=image,
                                storage=storage, efa=efa, command_line=line, api=api_name,
                                script_from=o.value(script_from),
                                script_in_image=name if user_code and module is None else None)
    for note in rendered.notes:
        info(f"note: {note}")
    for warning in rendered.spec.warnings:
        warn(warning)
    if path is not None:
        write_output(path, rendered.text, force)
        info(f"wrote {path}")
    if as_json:
        spec = rendered.spec
        emit({"manifests": rendered.text, "documents": rendered.documents,
              "output": str(path) if path else None, "nodes": spec.nodes, "world_size": spec.world_size,
              "derived": [dataclasses.asdict(d) for d in spec.derived], "warnings": list(spec.warnings),
              "notes": rendered.notes, "script": rendered.script}, True)
    elif path is None:
        typer.echo(rendered.text, nl=False)


def _validation_text(report: dict) -> str:
    findings, documents = report["findings"], len(report["documents"])
    lines = [f"{report['file']}: {'valid' if report['valid'] else 'INVALID'} ({documents} "
             f"document{'' if documents == 1 else 's'}; {counted(findings)})"]
    for f in findings:
        lines += [f"{f['level']:<8}{f['path']}", f"        {f['message']}"]
        lines += [f"        fix: {f['fix']}"] if f["fix"] else []
    return "\n".join(lines)


@app.command()
def validate(file: Path = typer.Argument(..., help="A file of Kubernetes manifests (YAML, `---`-separated)."),
             as_json: bool = JSON_OPTION) -> None:
    """Check manifests offline as kubectl and the API server would: kubectl's YAML reading, the operators' CRDs and
    the core schemas (strict), pod and operator admission rules, GPUs/EFA vs the instance, claim access modes."""
    from toolkit.k8s.validate import validate_file

    report = validate_file(file)
    emit(report, as_json, _validation_text)
    if not report["valid"]:
        raise fail(f"{file}: the manifests are not valid")


@app.command()
def apply(file: Path = typer.Argument(..., help="A file of rendered manifests (`hpc k8s render -o FILE`)."),
          context: Optional[str] = typer.Option(None, "--context", help="kubectl context (default: its current one)."),
          as_json: bool = JSON_OPTION) -> None:
    """Apply rendered manifests with kubectl, after the offline checks pass; refused, naming the file, where this
    machine has no kubectl or no context."""
    from toolkit.k8s.target import Apply, Kubernetes

    created = Kubernetes().schedule(Apply(file, context))
    emit({"file": str(file), "created": created.split()}, as_json, f"applied {file}: {created}")
