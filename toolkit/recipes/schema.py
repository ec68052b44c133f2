"""The recipe schema: what a researcher may write in recipes/*.yaml, validated with pydantic.

A recipe says what to run (launcher + args), with what resources, in which software environment, on which
data, and how its hyperparameters follow the world size (scaling rules). Queue-dependent choices (ranks,
devices, CPU forms, the NCCL/EFA environment) are not recipe fields: they come from the queue (toolkit.job.spec).

Conventions:
  args     an ordered mapping flag -> value: `true` is a bare flag, a list gives several values, and `null`
           (in a profile or `--set`) removes the flag. Order is kept as written.
  dirs     relative paths are under `dirs.root`, else the queue's FSx mount, except that a run owns its outputs:
           checkpoints and logs go under the run's own dir unless `under: root` says otherwise (a fresh run never
           resumes another run's checkpoints; `--resume-from` continues one explicitly). Data stays under the root.
  prepare  a command that makes the data if it is missing: it runs once, on the first node, before the
           ranks start, with the data dir appended as its last argument (smoke data, preprocessing).
  profiles named overlays with the recipe's own shape, merged over it (see toolkit.recipes.load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, field_validator,
                      model_validator)

from toolkit.accelerators.base import Device

FLAG_PATTERN = r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Slurm --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_PATTERN = r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$"

Flag = Annotated[str, Field(pattern=FLAG_PATTERN)]
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]


def _no_nul(text: str) -> str:
    if "\0" in text:
        raise ValueError("must not contain a NUL character (no program argument or variable can)")
    return text


def _arg_value(value: Any) -> Any:
    """One rule for flag values, so a bad value gets one message (not one per union member)."""
    scalars = (str, int, float)
    if value is True or (isinstance(value, scalars) and not isinstance(value, bool)):
        return _no_nul(value) if isinstance(value, str) else value
    if isinstance(value, list) and value and all(isinstance(v, scalars) and not isinstance(v, bool) for v in value):
        for v in value:
            if isinstance(v, str):
                _no_nul(v)
        return value
    if value is False:
        raise ValueError("`false` is not a flag value: use null (in a profile or --set) to remove the flag")
    raise ValueError("must be a string, a number, true (a bare flag) or a non-empty list of strings/numbers")


def _env_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("must be a string or a number")
    return _no_nul(str(value))


ArgValue = Annotated[Any, AfterValidator(_arg_value)]
EnvValue = Annotated[Any, AfterValidator(_env_value)]
SafeStr = Annotated[str, Field(min_length=1), AfterValidator(_no_nul)]


class StrictModel(BaseModel):
    # strict: no coercion ("2" is not a node count, "yes" not a boolean), so every fault the JSON Schema of
    # recipe_json_schema() shows in an editor is one the loader refuses too (tests/test_recipe_schema.py).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Launcher(StrictModel):
    """What each rank runs: fairseq-train, `python -m MODULE`, `python SCRIPT.py`, a binary (MPI: srun --mpi), or
    `python SCRIPT` under DeepSpeed (the user's model code; the toolkit writes its config, see `deepspeed`), or a
    script or module under Hugging Face Accelerate (`accelerate launch` per node; toolkit.launchers.accelerate).

    Python code (python-module, python-script) is started in one of two styles: `script` (srun starts one
    process per rank) or `torchrun` (srun starts one torchrun per node, which starts the node's ranks and
    restarts them up to `max_restarts` times). Either way each rank gets the torchrun environment (RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT): see toolkit.job.user_main.
    """

    kind: Literal["fairseq", "python-module", "python-script", "binary", "deepspeed", "accelerate"]
    module: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    program: SafeStr | None = None
    script: SafeStr | None = None  # python-script, deepspeed, accelerate: the training script (relative: dirs.root)
    argv: list[SafeStr] = []  # python code: arguments passed as they are, before `args`
    mpi: Literal["pmix"] | None = None
    style: Literal["script", "torchrun"] = "script"
    max_restarts: Annotated[int, Field(ge=0)] = 0  # torchrun, accelerate: restarts of a node's ranks after a failure
    # A rank whose init_process_group has not returned after this long exits with a clear message, instead of
    # waiting until the time limit (a script that ignores the rendezvous environment).
    rendezvous_timeout_s: PositiveInt = 300
    # The workload saves and exits 75 on SIGUSR2/SIGTERM (our trainers). Others get SIGUSR2 ignored (its
    # default action kills) and resume from their last periodic checkpoint after the requeue.
    stops_on_signal: bool = False

    @model_validator(mode="after")
    def _fields_match_kind(self) -> Launcher:
        python = self.kind in ("python-module", "python-script")
        if self.kind == "accelerate":
            return self._accelerate_fields()
        if self.kind == "python-module" and not self.module:
            raise ValueError("launcher kind python-module needs `module` (e.g. toolkit.workloads.resnet)")
        if self.kind == "binary" and not self.program:
            raise ValueError("launcher kind binary needs `program` (a path; relative means under dirs.root)")
        if self.kind != "python-module" and self.module:
            raise ValueError("`module` is only for launcher kind python-module")
        if self.kind != "binary" and (self.program or self.mpi):
            raise ValueError("`program` and `mpi` are only for launcher kind binary")
        takes_script = self.kind in ("python-script", "deepspeed")
        if takes_script and not self.script:
            raise ValueError(f"launcher kind {self.kind} needs `script` (the training script)")
        if self.script and not takes_script:
            raise ValueError("`script` is only for launcher kinds python-script and deepspeed")
        if not python and (self.style != "script" or self.max_restarts or self.argv):
            raise ValueError("`style: torchrun`, `max_restarts` and `argv` are only for python-module and "
                             "python-script launchers")
        if self.style == "script" and self.max_restarts:
            raise ValueError("`max_restarts` needs `style: torchrun` (srun does not restart ranks)")
        return self

    def _accelerate_fields(self) -> Launcher:
        """accelerate launch runs a script or a module (its --module) and is its own per-node agent."""
        if bool(self.script) == bool(self.module):
            raise ValueError("launcher kind accelerate needs `script` (a .py file) or `module`, not both")
        if self.program or self.mpi:
            raise ValueError("`program` and `mpi` are only for launcher kind binary")
        if self.style != "script":
            raise ValueError("launcher kind accelerate starts one accelerate launch per node itself: leave out "
                             "`style`")
        return self


# pyxis's own forms (NVIDIA/pyxis v0.24.0 args.c, spank_opts and parse_mount_option): --container-mounts takes
# SRC[:DST[:FLAGS]] entries joined by ",", with enroot mount flags joined by "+" (e.g. ro+rprivate);
# --container-env takes NAME[,NAME...]. A squashfs image is a path: pyxis takes an image starting with "." or "/"
# for a file (pyxis_slurmstepd.c), anything else for a reference to import.
MOUNT_PATTERN = r"^[^\s,:]+(:[^\s,:]+(:[a-z]+(\+[a-z]+)*)?)?$"
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs")
MountSpec = Annotated[str, Field(pattern=MOUNT_PATTERN), AfterValidator(_no_nul)]

# An image pyxis can start: a path (starting with "." or "/", or a .sqsh file under dirs.root), a dockerd://
# reference, or a reference enroot imports. pyxis puts docker:// before any image that lacks it and dockerd://
# (NVIDIA/pyxis v0.24.0 pyxis_slurmstepd.c enroot_container_create), and enroot refuses what its forms do not
# match ("Invalid image reference": NVIDIA/enroot v4.1.2 src/docker.sh docker::_parse_uri, whose user, image, tag
# and digest classes these are; docker::daemon::import for dockerd://), on the node, after the job has started.
# Its nine forms, as three: [USER@]REGISTRY/IMAGE, [USER@]IMAGE and [USER@]REGISTRY#IMAGE, each [:TAG][@DIGEST].
_USER = r"(?:[A-Za-z0-9_.!~*\\'()%;:&=+$,\-./<>?@]+@)?"  # enroot's class, its range ,-@ written out
_IMAGE, _TAG, _DIGEST = r"[a-z0-9/._-]+", r"[A-Za-z0-9._:-]+", r"sha256:[A-Za-z0-9]+"
_VERSION = f"(?::{_TAG})?(?:@{_DIGEST})?"
_REFERENCE = f"{_USER}(?:[^/#\\s,]+/{_IMAGE}|[^/@#:\\s,]+|[^#/@\\s,]+#{_IMAGE}){_VERSION}"
IMAGE_PATTERN = f"^(?:[./][^\\s,]*|[^\\s,]*\\.(?:sqsh|squashfs)|dockerd://[A-Za-z0-9/._:-]+|(?:docker://)?{_REFERENCE})$"
IMAGE_WORDS = ("an image pyxis can start: a squashfs file (/fsx/images/x.sqsh) or a reference enroot imports, "
               "[USER@][REGISTRY/ or REGISTRY#]IMAGE[:TAG][@sha256:DIGEST] with the image's name in lowercase "
               "(e.g. nvcr.io/nvidia/pytorch:24.01-py3)")


def _pyxis_image(image: str) -> str:
    """What IMAGE_PATTERN cannot say: pyxis adds docker:// only where the image lacks it, so after a docker:// of the
    user's own the rest must be a reference (`docker://` alone matched as a registry `docker:`); and a URL's
    scheme other than pyxis's two would become part of a registry's name (docker://https://...)."""
    import re

    scheme, sep, rest = image.partition("://")
    if sep and scheme not in ("docker", "dockerd"):
        raise ValueError(f"{image!r}: pyxis imports docker:// and dockerd:// references (or a path), not {scheme}://:"
                         f" write it without {scheme}://, e.g. nvcr.io/nvidia/pytorch:24.01-py3")
    if scheme == "docker" and sep and not re.fullmatch(_REFERENCE, rest):
        raise ValueError(f"{image!r} is not {IMAGE_WORDS}")
    return image


class Container(StrictModel):
    """Every rank runs in this container, started by NVIDIA pyxis (srun --container-image ...); the batch script
    stays on the host. `image`: a squashfs file (.sqsh: relative means under dirs.root, keep it on FSx) or an
    image reference enroot imports ([USER@][REGISTRY#]IMAGE[:TAG]). `env`: host variables that win over the
    image's environment besides those the job always passes (the rank contract and the job's env)."""

    image: Annotated[str, Field(pattern=IMAGE_PATTERN), AfterValidator(_no_nul), AfterValidator(_pyxis_image)]
    # SRC[:DST[:FLAGS]] as pyxis writes them (SRC alone: the same path inside), e.g. /fsx, /fsx/data:/data:ro
    mounts: list[MountSpec] = []
    workdir: Annotated[str, Field(pattern=r"^/[^\s,:]*$")] | None = None
    env: list[EnvName] = []
    writable: bool = False  # pyxis --container-writable (else --container-readonly: the image as built)


class Software(StrictModel):
    """How the nodes activate the training environment (all optional; relative paths are under dirs.root).
    With a `container`, modules/venv/conda are activated inside it, in every rank."""

    modules: list[SafeStr] = []
    venv: SafeStr | None = None
    conda_root: SafeStr | None = None
    conda_env: SafeStr | None = None
    # Directories put first on the job's LD_LIBRARY_PATH (toolkit.job.env.library_path), e.g. a CUDA or Open MPI
    # the nodes' ldconfig does not know; and the NCCL install whose lib/ a binary built against it loads
    # (nccl-tests `make NCCL_HOME=...`). Before the EFA installer's directories on EFA queues.
    library_path: list[SafeStr] = []
    nccl_home: SafeStr | None = None
    container: Container | None = None

    @field_validator("library_path", "nccl_home")
    @classmethod
    def _one_dir_each(cls, value: list[str] | str | None) -> list[str] | str | None:
        for d in [value] if isinstance(value, str) else value or []:
            if ":" in d:
                raise ValueError(f"{d!r}: one directory per entry (':' separates the entries of LD_LIBRARY_PATH)")
        return value

    @model_validator(mode="after")
    def _one_python(self) -> Software:
        if self.venv and (self.conda_root or self.conda_env):
            raise ValueError("set either `venv` or `conda_root` + `conda_env`, not both")
        if bool(self.conda_root) != bool(self.conda_env):
            raise ValueError("conda needs both `conda_root` (the install) and `conda_env` (the env name)")
        return self


class Resources(StrictModel):
    nodes: PositiveInt = 1
    time: str = Field("24:00:00", pattern=TIME_PATTERN)
    exclusive: bool = True
    # SIGUSR2 this long before the time limit, then a requeue: time for the workload to save. Slurm checks
    # only every ~30 s, so the signal may come up to 30 s later.
    signal_before_s: PositiveInt = 120
    # Requeue before the time limit, on preemption and on node failure. Benchmarks set false: one hung on a bad
    # fabric would requeue itself forever, and a rerun of a half-finished measurement proves nothing.
    requeue: bool = True
    # End the job once a rank has made no progress (heartbeat step) for this long, naming it, instead of waiting
    # for the time limit (toolkit.workloads.heartbeat; --hang-timeout). None: never.
    hang_timeout_s: PositiveInt | None = None
    # Hot spares: hold this many nodes beyond `nodes` and, when a node or a rank is lost, run again on healthy
    # ones of the same allocation from the last checkpoint (toolkit.node.spares; --spares).
    spares: int = Field(0, ge=0)
    # Pre-flight (toolkit.node.preflight): before any rank starts, check every node against its queue (devices,
    # EFA, the loader, the shared file system, memory, disk). null: on for training jobs (requeue: true) outside
    # containers, off for benchmarks (--preflight / --no-preflight).
    preflight: bool | None = None
    runs_on: list[Device] = Field(["gpu", "cpu"], min_length=1)  # the accelerator families' device forms


class PathArg(StrictModel):
    """A directory and how the launcher receives it: a flag, `positional` (first argument), or null (not passed)."""

    dir: SafeStr
    arg: Annotated[str, Field(pattern=FLAG_PATTERN + "|^positional$")] | None = None
    # null: data under the dirs root (read, shared); checkpoints and logs under the run dir (each run its own)
    under: Literal["root", "run"] | None = None


OUTPUT_DIRS = ("checkpoints", "logs")  # the dirs a run writes: its own unless the recipe says `under: root`


def dir_under(name: str, entry: PathArg) -> Literal["root", "run"]:
    """Where dirs.<name> is: as the recipe says, else the run dir for what a run writes, the root for data."""
    return entry.under or ("run" if name in OUTPUT_DIRS else "root")


class Dirs(StrictModel):
    root: SafeStr | None = None
    data: PathArg | None = None
    checkpoints: PathArg | None = None
    logs: PathArg | None = None


class Reference(StrictModel):
    """A published data point the rule must reproduce: at this world size the derived value was `value`."""

    world_size: PositiveInt
    value: float


class ScalingRule(StrictModel):
    """How one flag follows the world size.

    accumulate      keep a global batch: value = global_batch / (per-rank batch x world size), an integer
                    (fairseq --update-freq)
    linear          value = base x (per-rank batch x world size) / per (e.g. LR 0.1 per 256 images)
    gpu-memory-cap  cap a byte size so `buffers` buffers fit in `usable_fraction` of one GPU's memory
                    (nccl-tests -e); on a queue without GPUs (CPU) cap it at `cpu_cap` (e.g. 1G), or, without
                    cpu_cap, refuse the queue
    cpus-per-rank   the CPUs each rank is given less `reserve` (at least 0): data-loader worker processes
                    (the rank's own process keeps `reserve` CPUs)
    """

    rule: Literal["accumulate", "linear", "gpu-memory-cap", "cpus-per-rank"]
    why: SafeStr
    per_rank_arg: Flag | None = None
    global_batch: PositiveInt | None = None
    unit: str = "samples"
    base: float | None = None
    per: Annotated[float, Field(gt=0)] | None = None
    buffers: PositiveInt = 3
    usable_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    cpu_cap: Annotated[str, Field(pattern=r"^\d+[KMG]?$")] | None = None
    reserve: Annotated[int, Field(ge=0)] = 1
    reference: Reference | None = None

    @model_validator(mode="after")
    def _fields_match_rule(self) -> ScalingRule:
        needed = {"accumulate": ("per_rank_arg", "global_batch"), "linear": ("per_rank_arg", "base", "per"),
                  "gpu-memory-cap": (), "cpus-per-rank": ()}[self.rule]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"rule {self.rule} needs: {', '.join(missing)}")
        return self


class DeepSpeed(StrictModel):
    """The DeepSpeed config the toolkit generates (toolkit.job.deepspeed) and passes as `config_arg`.

    global_batch and micro_batch are kept when --nodes changes; gradient_accumulation_steps follows as
    global_batch / (micro_batch x world size), which must be a whole number (else an error lists the node
    counts that work). `config` holds every other DeepSpeed key, passed through as written.
    """

    global_batch: PositiveInt
    micro_batch: PositiveInt
    # ZeRO stages 0-3; a range, not Literal[0, 1, 2, 3]: a Literal takes `true` as 1 (True == 1), strict or not
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 2
    # DeepSpeed's activation_checkpointing section, and the script's own switch that turns checkpointing on
    activation_checkpointing: bool = False
    checkpointing_arg: Flag = "--checkpoint_activations"
    config_arg: Flag = "--deepspeed_config"
    config: dict[str, Any] = {}

    @model_validator(mode="after")
    def _derived_keys_are_not_written(self) -> DeepSpeed:
        derived = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
        if derived & set(self.config):
            raise ValueError(f"config.{sorted(derived & set(self.config))[0]} is derived: set global_batch and "
                             "micro_batch instead")
        if "stage" in (self.config.get("zero_optimization") or {}):
            raise ValueError("config.zero_optimization.stage: set zero_stage instead")
        return self


class Recipe(StrictModel):
    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=64)]
    description: str
    source: str = Field(description="where the setup was published")
    notes: str = ""
    launcher: Launcher
    software: Software = Software()
    args: dict[Flag, ArgValue] = {}
    resources: Resources = Resources()
    dirs: Dirs = Dirs()
    prepare: list[SafeStr] = []
    env: dict[EnvName, EnvValue] = {}
    scaling: dict[Flag, ScalingRule] = {}
    deepspeed: DeepSpeed | None = None
    profiles: dict[Annotated[str, Field(pattern=NAME_PATTERN)], dict[str, Any]] = {}
    # Where each overlaid value came from (key path -> "profile smoke", "--set args.--lr=0.1"), set by
    # toolkit.recipes.load: later checks (toolkit.job.argcheck) name what the user typed.
    _origins: dict[tuple[str, ...], str] = PrivateAttr(default_factory=dict)

    def origin(self, path: tuple[str, ...]) -> str | None:
        """The profile or override that set the value at `path` (or a mapping above it); None: the recipe file."""
        return next((self._origins[path[:i]] for i in range(len(path), 0, -1) if path[:i] in self._origins), None)

    @model_validator(mode="after")
    def _spares_restart_training(self) -> Recipe:
        if self.resources.spares and not self.resources.requeue:
            raise ValueError("resources.spares restart a training job on other nodes; a benchmark "
                             "(resources.requeue: false) is never restarted: remove resources.spares")
        if self.resources.spares and self.launcher.mpi:
            raise ValueError("resources.spares: an MPI binary (launcher.mpi) cannot resume from a checkpoint: "
                             "remove resources.spares")
        return self

    @model_validator(mode="after")
    def _deepspeed_fits_launcher(self) -> Recipe:
        if (self.launcher.kind == "deepspeed") != (self.deepspeed is not None):
            raise ValueError("launcher kind deepspeed and the `deepspeed` section go together (one needs the other)")
        if self.deepspeed is not None and self.deepspeed.config_arg in self.args:
            raise ValueError(f"args.{self.deepspeed.config_arg} is the generated DeepSpeed config: remove it")
        return self

    @model_validator(mode="after")
    def _dirs_own_their_flags(self) -> Recipe:
        # The job passes each dir's flag itself (toolkit.job.spec): a value in args for it was silently replaced.
        for name in ("data", "checkpoints", "logs"):
            spec = getattr(self.dirs, name)
            if spec is not None and spec.arg not in (None, "positional") and spec.arg in self.args:
                raise ValueError(f"args.{spec.arg} is the job's dirs.{name} (its arg: {spec.arg}), which the job "
                                 f"passes: set dirs.{name}.dir instead of args.{spec.arg}")
        return self

    @model_validator(mode="after")
    def _scaling_fits_args(self) -> Recipe:
        for flag, rule in self.scaling.items():
            if flag in self.args and rule.rule != "gpu-memory-cap":
                raise ValueError(f"args.{flag} is derived by scaling.{flag}: remove one of them "
                                 f"(a profile can drop the rule with `scaling: {{{flag}: null}}`)")
            if rule.rule == "gpu-memory-cap" and flag not in self.args:
                raise ValueError(f"scaling.{flag} caps args.{flag}, which is not set")
            if rule.per_rank_arg and rule.per_rank_arg not in self.args:
                raise ValueError(f"scaling.{flag}.per_rank_arg {rule.per_rank_arg} is not in args")
        return self


# The JSON Schema of recipe files, generated from Recipe and shipped beside this module (package data) for editors.
SCHEMA_FILE = Path(__file__).with_name("recipe.schema.json")
REGENERATE = "make recipe-schema (or: hpc recipes schema -o toolkit/recipes/recipe.schema.json --force)"


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, pydantic's dialect) of a recipe file, made from Recipe itself, for editors
    (yaml-language-server's `# yaml-language-server: $schema=...` modeline). It is looser than the loader where
    JSON Schema cannot say a rule (the model validators: fields that go with a launcher kind, scaling rules that
    need args); it is never stricter."""
    schema = Recipe.model_json_schema()
    _close_pattern_maps(schema)
    # A profile is a partial recipe merged over the recipe (toolkit.recipes.load): its values may be null (remove),
    # so only its keys are checked here; `hpc recipes validate` checks each profile applied.
    overlay_keys = sorted(set(Recipe.model_fields) - {"name", "profiles"})
    profile = schema["properties"]["profiles"]["patternProperties"][NAME_PATTERN]
    profile["propertyNames"] = {"enum": overlay_keys}
    return {"$comment": f"Generated from toolkit/recipes/schema.py; do not edit. Regenerate: {REGENERATE}",
            "title": "hpc recipe",
            "description": "A training recipe for hpc (recipes/*.yaml): what to run, with what resources, in which "
                           "software environment, on which data. Check a file with `hpc recipes validate FILE`.",
            **{k: v for k, v in schema.items() if k != "title"}}


def _close_pattern_maps(node: Any) -> None:
    """A mapping keyed by a pattern (args' flags, env names, profile names) allows no other key, as the loader."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_pattern_maps(value)
    elif isinstance(node, list):
        for value in node:
            _close_pattern_maps(value)


def recipe_json_schema_text() -> str:
    """The schema as the shipped file holds it (tests/test_recipe_schema.py keeps the file in sync)."""
    return json.dumps(recipe_json_schema(), indent=2) + "\n"


def flag_words(flag: str, value: Any) -> list[str]:
    """The argv words of one recipe arg: `--flag`, `--flag value` or `--flag v1 v2`."""
    if value is True:
        return [flag]
    values = value if isinstance(value, list) else [value]
    return [flag, *(format_value(v) for v in values)]


def format_value(value: str | int | float) -> str:
    """A recipe value as fairseq and our trainers expect it: floats in Python's shortest exact spelling."""
    if isinstance(value, float):
        return repr(value)
    return str(value)
