"""What every launcher kind answers (toolkit.launchers: one module per kind), with the defaults of a program hpc
knows nothing about: its argv as written, no device flags, no parser, no resume rule, no advice, no Kubernetes form.

A launcher is asked by the job spec (toolkit.job.spec: device forms, argv, environment, advice), by the rank program
(its resume rule), by the plan (its own-parser argument check), by the Kubernetes renderer (its Kubeflow kind) and by
the reports (its program's own training log: log_reader()).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
from typing import TYPE_CHECKING, Any, Literal, Mapping

from toolkit.errors import HpcError
from toolkit.job.env import EnvVar
from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived

if TYPE_CHECKING:
    from toolkit.recipes.schema import Launcher as LauncherSection, Recipe

# The Kubeflow kinds a launcher may take on Kubernetes (toolkit.k8s.manifests)
PYTORCH_JOB, MPI_JOB = "PyTorchJob", "MPIJob"


def under(root: str, path: str) -> str:
    """A recipe path: absolute as given, relative under the dirs root."""
    return path if path.startswith("/") else f"{root}/{path}"


class DeviceForm:
    """A launcher's args being put in a queue's device form, each change said as a Derived value."""

    def __init__(self, args: Mapping[str, Any], device: str) -> None:
        self.args = dict(args)
        self.device = device
        self.why = f"{device.upper()} queue"
        self.derived: list[Derived] = []

    def put(self, flag: str, value: Any, reason: str) -> None:
        self.args[flag] = value
        self.derived.append(Derived(flag, "set" if value is True else str(value), f"{self.why}: {reason}"))

    def drop(self, flags: tuple[str, ...], reason: str) -> None:
        for flag in flags:
            if self.args.pop(flag, None) is not None:
                self.derived.append(Derived(flag, "removed", f"{self.why}: {reason}"))


@dataclasses.dataclass
class LogPoint:
    """One record of a training log (toolkit.reports.training_logs): what a LogReader yields."""

    kind: str  # the program's own record kinds (per interval, end of epoch, validation); our trainer: train / val
    update: int | None
    epoch: float | None
    loss: float | None
    rate: float | None  # words/s or images/s over the logged interval
    wall: float | None  # seconds since start
    values: dict


def number(value: Any) -> float | None:
    """A log value as a float (logs write numbers as strings too); None for what is no number, booleans included."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def whole_number(value: Any) -> int | None:
    found = number(value)
    return int(found) if found is not None else None


def json_object(text: str) -> dict | None:
    """A log line's JSON object, or None where the text is no JSON object."""
    import json

    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class LogReader:
    """A launcher's program's own training log, as the reports read it (toolkit.reports.training_logs asks every
    launcher's log_reader()): its records, its throughput rule, and what to tell a user whose log it cannot read."""

    name = ""  # the log's format, as summaries name it (TrainingLog.format): the program's name
    unit = ""  # the rate's unit, e.g. words/s
    loss_base = "e"  # the logarithm's base of the logged loss
    step_kind = ""  # the per-interval record kind: the loss curve's and the throughput's
    wanted = ""  # how the program must log, in a fix: "PROGRAM (--log-format ...)"
    interval_flag = ""  # the program's option that makes it log intervals
    fix = ""  # for a log of the program that holds no records this reader can read

    def points(self, text: str) -> list[LogPoint]:
        """Every record of the program's log in `text`, in log order (empty when it holds none)."""
        raise NotImplementedError

    def recognises(self, text: str) -> bool:
        """Whether `text` is the program's output (then `fix` says why it holds no records)."""
        return False

    def timed_records(self, text: str) -> list[dict[str, Any]]:
        """The log's timed records for the goodput ledger (toolkit.reports.goodput), in our trainer's vocabulary:
        {"event": start | resumed | train | checkpoint, "time": epoch seconds, "step", "seconds"}; none by default."""
        return []

    def throughput(self, points: list[LogPoint], warmup: int) -> tuple[float | None, str]:
        """The post-warm-up rate of the points (the first `warmup` logged intervals dropped), and how it was
        computed, in a sentence."""
        raise NotImplementedError


class Launcher:
    """A launcher kind with the defaults of a program hpc has no knowledge of. Subclasses override what their
    program needs."""

    kind = ""  # the recipe's launcher.kind
    python = True  # its ranks run Python with torch (the loader check asks for torch's NCCL; a venv is inferred)
    owned_flags: tuple[str, ...] = ()  # args hpc sets from the queue: a recipe may not set them
    kubernetes: str | None = None  # its Kubeflow kind (PYTORCH_JOB, MPI_JOB), None: no Kubernetes form
    one_task_per_node = False  # Slurm starts one agent per node that starts its ranks (torchrun's way)
    parser: str | None = None  # whose parser checks the job's arguments at plan time (None: not checked)
    devices: tuple[str, ...] | None = None  # the device forms its program runs on (None: any the queue has)

    def owns_module(self, module: str | None) -> bool:
        """Whether this launcher is its kind's for launcher.module (a kind may have several launchers)."""
        return True

    def style(self, section: LauncherSection) -> Literal["script", "torchrun"]:
        """The JobSpec's style: "torchrun" (one Slurm task per node) or "script" (one per rank)."""
        return "torchrun" if self.one_task_per_node else section.style

    def device_args(self, args: Mapping[str, Any], device: str, threads: int | None,
                    world: int) -> tuple[dict, list[Derived]]:
        """The recipe's args in the queue's device form (its accelerator family's); as written by default."""
        return dict(args), []

    def refuse_device(self, device: str, fix: str) -> None:
        """One clear error where the program has no form for the queue's devices (`devices`)."""
        if self.devices is not None and device not in self.devices:
            from toolkit.accelerators import of_device
            from toolkit.errors import HpcError

            raise HpcError(f"{self.kind} has no {of_device(device).label} support here", fix=fix)

    def program(self, section: LauncherSection, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        """The argv before the positional dirs and the args, for `nodes` nodes of `tasks` ranks on `device`."""
        raise NotImplementedError

    def trailer(self) -> list[Arg]:
        """Words after every arg (a program's explicit rendezvous)."""
        return []

    def env(self) -> list[EnvVar]:
        """Variables the program needs on every node, whatever the queue."""
        return []

    def rank_prelude(self) -> str:
        """Bash each Slurm task runs before the program (values its argv reads): "" for none."""
        return ""

    def pod_prelude(self) -> str | None:
        """On Kubernetes: None when torchrun (the Training Operator's PET_* settings) starts the workers, else bash
        each pod runs before the program, which is its own per-node agent."""
        return None

    def resume_script(self, checkpoint_dir: str | None) -> str:
        """Bash each rank runs before the program so that a requeued job resumes ("" for none)."""
        return ""

    def advice(self, args: Mapping[str, Any], data_dir: str | None,
               world_size: int) -> tuple[list[Derived], list[str]]:
        """What the job's numbers imply that its flags do not say (toolkit.job.advice adds the general rules)."""
        return [], []

    def check_arguments(self, recipe: Recipe, spec: Any, argv: list[str]) -> list[str]:
        """Refuse the job's arguments where the program's own parser refuses them; the notes name what was not
        checked. `argv` is rank 0's (toolkit.job.rank.preview_argv)."""
        return [f"arguments: not checked: hpc has no parser for {self.what(recipe.launcher)} (only {parsers()})"]

    def what(self, section: LauncherSection) -> str:
        """The program, in messages."""
        return f"the {self.kind} launcher"

    def log_reader(self) -> LogReader | None:
        """How the reports read the program's own training log; None: it writes none hpc reads."""
        return None

    def user_code(self, section: LauncherSection) -> tuple[Literal["script", "module"], str] | None:
        """The researcher's own code the ranks run: ("script", its path as the recipe names it), which on Kubernetes
        the image or a ConfigMap brings to the pods (toolkit.k8s.usercode), or ("module", its name), which the
        image holds. None: hpc's own program, or one on the FSx volume."""
        return None

    def kubernetes_kind(self, recipe: Recipe) -> str:
        """The Kubeflow kind of the recipe's job, or a refusal naming the launchers that have one."""
        if self.kubernetes is None:
            raise no_kubernetes_form(recipe)
        return self.kubernetes


def no_kubernetes_form(recipe: Recipe, detail: str = "") -> HpcError:
    return HpcError(f"recipe {recipe.name}: launcher kind {recipe.launcher.kind}{detail} has no Kubernetes form",
                    fix=f"Kubernetes forms exist for {kubernetes_forms()}; run this recipe with `hpc recipes submit`")


def checked_script(root: str, script: str) -> str:
    """A launcher's training script as the nodes see it, refused here when it does not exist."""
    path = under(root, script)
    if not os.path.isfile(path):
        raise HpcError(f"script {path} does not exist" + ("" if script.startswith("/") else
                                                           f" (launcher.script {script} under {root})"),
                       fix="give the path of an existing .py file on the file system the nodes share")
    return os.path.abspath(path)


HELPERS = ("base", "torchrun")  # modules of toolkit.launchers that are no launcher kind


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, tuple[Launcher, ...]]:
    """recipe launcher.kind -> its launchers, the most specific first (python-module has two: our trainers' for a
    module under toolkit.workloads, a user's module otherwise). Every module of toolkit.launchers but the helpers
    is one launcher (its LAUNCHER): adding a kind is adding a module. Imported on the first question only."""
    package = importlib.import_module("toolkit.launchers")
    found: dict[str, list[Launcher]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if info.name not in HELPERS:
            launcher = importlib.import_module(f"toolkit.launchers.{info.name}").LAUNCHER
            found.setdefault(launcher.kind, []).append(launcher)
    # a launcher that claims only some modules (overrides owns_module) before its kind's catch-all
    return {kind: tuple(sorted(launchers, key=lambda one: type(one).owns_module is Launcher.owns_module))
            for kind, launchers in found.items()}


def launcher_for(kind: str, module: str | None = None) -> Launcher:
    """The launcher of a recipe's launcher.kind (and launcher.module, for python-module)."""
    kinds = registry()
    if kind not in kinds:
        raise HpcError(f"launcher kind {kind!r} is not one of {', '.join(sorted(kinds))}",
                       fix="set launcher.kind in the recipe to one of them")
    return next(launcher for launcher in kinds[kind] if launcher.owns_module(module) or launcher is kinds[kind][-1])


def launcher_of(section: LauncherSection) -> Launcher:
    """The launcher of a recipe's launcher section."""
    return launcher_for(section.kind, section.module)


def all_launchers() -> list[Launcher]:
    return [launcher for launchers in registry().values() for launcher in launchers]


def log_readers() -> list[LogReader]:
    """The training-log readers of the launcher kinds that have one (each once), for the reports."""
    return list({id(reader): reader for launcher in all_launchers() if (reader := launcher.log_reader())}.values())


def parsers() -> str:
    """The programs whose own parsers check a job's arguments, for messages."""
    return ", ".join(dict.fromkeys(p for launcher in all_launchers() if (p := launcher.parser)))


def kubernetes_forms() -> str:
    """Which launcher kinds have which Kubeflow kind, for messages."""
    forms: dict[str, list[str]] = {}
    for launcher in all_launchers():
        if launcher.kubernetes:
            forms.setdefault(launcher.kubernetes, []).append(launcher.kind)
    return "; ".join(f"{', '.join(dict.fromkeys(kinds))} launchers ({kind})" for kind, kinds in forms.items())
