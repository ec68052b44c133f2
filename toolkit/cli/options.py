"""The CLI's vocabulary, declared once: every option more than one command takes, and the choices flags offer.

A name means one thing in every command. The job options (`hpc run`, `hpc recipes submit/new/render/show`) are
one set, JobOptions; a command that cannot honour one refuses it (exit 2), never ignores it. Short letters are
sbatch's where sbatch has the option (sbatch(1): -p partition, -q qos, -N nodes, -t time, -A account,
-d dependency), else none: -p is the queue (a Slurm partition), and --profile has no letter.

The choices are Enums so `--help` and shell completion list them; each mirrors the library's own tuple (the test
tests/test_cli_vocabulary.py holds them equal), declared here so that `hpc --help` imports no library module.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Optional, Sequence

import typer


class Launcher(str, enum.Enum):
    """toolkit.recipes.user.user_recipe's styles."""
    script = "script"
    torchrun = "torchrun"
    accelerate = "accelerate"


class Executor(str, enum.Enum):
    """toolkit.slurm.executors.Executor."""
    slurm = "slurm"
    local = "local"
    sbatch = "sbatch"


class KubeflowApi(str, enum.Enum):
    """toolkit.k8s.manifests.APIS."""
    trainer_v2 = "trainer-v2"
    v1 = "v1"


class ScriptFrom(str, enum.Enum):
    """toolkit.k8s.usercode.SOURCES."""
    image = "image"
    configmap = "configmap"


class Os(str, enum.Enum):
    """toolkit.cluster.build.OSES (ParallelCluster 3.16's names)."""
    alinux2023 = "alinux2023"
    ubuntu2204 = "ubuntu2204"
    ubuntu2404 = "ubuntu2404"
    rhel8 = "rhel8"
    rocky8 = "rocky8"
    rhel9 = "rhel9"
    rocky9 = "rocky9"


class FsxDeployment(str, enum.Enum):
    """toolkit.cluster.build.FSX_DEPLOYMENTS."""
    SCRATCH_2 = "SCRATCH_2"
    PERSISTENT_2 = "PERSISTENT_2"


class Transport(str, enum.Enum):
    """The floors toolkit.reports.nccl judges against."""
    efa = "efa"
    tcp = "tcp"


class State(str, enum.Enum):
    """toolkit.cluster.diff.STATES: a part of the cluster is running or stopped."""
    running = "running"
    stopped = "stopped"


def value(choice) -> str | None:
    """An Enum choice's string (the library takes plain strings), None kept."""
    return None if choice is None else choice.value


def _recipe_names(incomplete: str) -> list[str]:
    """Shell completion for a recipe NAME: the recipes `hpc recipes list` shows."""
    from toolkit.recipes.load import list_recipe_files

    return sorted({p.stem for p in list_recipe_files() if p.stem.startswith(incomplete)})


RECIPE = typer.Argument(..., metavar="RECIPE", help="Recipe name or path to a recipe file.",
                        autocompletion=_recipe_names)
# `hpc k8s render`: a recipe, or a researcher's own script as `hpc run` takes it
RECIPE_OR_SCRIPT = typer.Argument(None, metavar="RECIPE|SCRIPT.py", autocompletion=_recipe_names,
                                  help="Recipe name or recipe file; or your own script (a .py file here), as "
                                       "`hpc run` takes it.")

# Where the job runs.
NODES = typer.Option(None, "--nodes", "-N", min=1, help="Nodes of the job (default: the recipe's resources.nodes).")
CLUSTER = typer.Option(None, "--cluster", metavar="FILE",
                       help="A ParallelCluster v3 config (default: this cluster's own, else p3dn).")
QUEUE = typer.Option(None, "--queue", "-p", metavar="QUEUE", help="Queue (Slurm partition) of the cluster config "
                                                                  "(default: its first queue).")
# What the recipe is made of.
PROFILE = typer.Option(None, "--profile", metavar="PROFILE", help="A named profile of the recipe (e.g. smoke).")
SET = typer.Option([], "--set", metavar="KEY.PATH=VALUE", help="Override a recipe value (e.g. args.--lr=0.1); "
                                                               "null removes it. Repeatable.")
SWEEP = typer.Option([], "--sweep", metavar="KEY.PATH=V1,V2,...",
                     help="Sweep a recipe value as one job array (A..B: integers; \\, a comma in a value); repeat "
                          "for a grid.")
ARRAY_PARALLELISM = typer.Option(None, "--array-parallelism", min=1, help="With --sweep: at most this many tasks of "
                                                                          "each array at once (default: submitit's "
                                                                          "256).")
TIME = typer.Option(None, "--time", "-t", metavar="TIME", help="Time limit, as sbatch --time: MINUTES, HH:MM:SS, "
                                                               "D-HH:MM... (resources.time; default 24:00:00).")
HANG_TIMEOUT = typer.Option(None, "--hang-timeout", min=1, metavar="SECONDS",
                            help="End the job once a rank has made no progress (heartbeat step) for this long, "
                                 "naming it (resources.hang_timeout_s; default: never).")
SPARES = typer.Option(None, "--spares", min=0, metavar="K",
                      help="Hold K nodes beyond --nodes and, when a node or a rank is lost, restart on healthy ones of "
                           "the same allocation from the last checkpoint (resources.spares; Slurm, sbatch).")
PREFLIGHT = typer.Option(None, "--preflight/--no-preflight",
                         help="Check every node against its queue (devices, EFA, loader, shared file system, memory, "
                              "disk) before the ranks start (resources.preflight; default: on for training jobs).")
AVOID_SUSPECTS = typer.Option(True, "--avoid-suspects/--no-avoid-suspects",
                              help="Leave out the nodes the fleet's ledger suspects (its quarantine policy: "
                                   "`hpc cluster nodes`), as --exclude, never so many that the job cannot start "
                                   "(default: on).")
ENV = typer.Option([], "--env", metavar="NAME=VALUE", help="Set a variable in the job (env.NAME). Repeatable.")
VENV = typer.Option(None, "--venv", metavar="DIR", help="Virtual environment the nodes activate (software.venv; "
                                                        "default: the recipe's, for `hpc run` the one hpc runs in).")
# Passed through to sbatch untouched (checked where they become #SBATCH lines).
ACCOUNT = typer.Option(None, "--account", "-A", metavar="ACCOUNT", help="Slurm account (sbatch --account).")
QOS = typer.Option(None, "--qos", "-q", metavar="QOS", help="Slurm QOS (sbatch --qos).")
RESERVATION = typer.Option(None, "--reservation", metavar="NAME", help="Slurm reservation (sbatch --reservation).")
DEPENDENCY = typer.Option(None, "--dependency", "-d", metavar="WHEN:JOB_ID",
                          help="Slurm dependency, e.g. afterok:123 (sbatch --dependency).")
EXECUTOR = typer.Option(None, "--executor", help="sbatch (the rendered script itself: a single job's default on "
                                                 "Slurm), slurm (submitit's executor: a sweep's default) or local "
                                                 "(only where no Slurm is installed).")
RESUME_FROM = typer.Option(None, "--resume-from", metavar="RUN_DIR|JOB_ID",
                           help="Continue another run: its checkpoints seed this run's own, once (every run owns its "
                                "checkpoints and logs; a requeue resumes its own).")
DRY_RUN = typer.Option(False, "--dry-run", help="Print what would be submitted; submit nothing.")
VERBOSE = typer.Option(False, "--verbose", help="With --dry-run: the scripts and submitit's parameters in full "
                                                "after the summary.")
WAIT = typer.Option(False, "--wait", help="Show progress until the job ends; exit 1 if it fails.")
FORCE = typer.Option(False, "--force", help="Overwrite an existing output file (-o, --plot).")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """The shared job options as one value (each command passes what it declares; the rest stay unset)."""
    overrides: Sequence[str] = ()
    sweeps: Sequence[str] = ()
    profile: Optional[str] = None
    time: Optional[str] = None
    env: Sequence[str] = ()
    venv: Optional[Path] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    reservation: Optional[str] = None
    dependency: Optional[str] = None
    hang_timeout: Optional[int] = None
    spares: Optional[int] = None
    preflight: Optional[bool] = None

    def slurm_options(self) -> dict[str, str | None]:
        check_dependency(self.dependency)
        return {"account": self.account, "qos": self.qos, "reservation": self.reservation,
                "dependency": self.dependency}

    def refuse(self, command: str, why: str, *fields: str) -> None:
        """Refuse (exit 2) each of `fields` that was given: `command` cannot honour it, for reason `why`."""
        from toolkit.errors import UsageError

        given = [f for f in fields if getattr(self, f) not in (None, (), [])]
        if given:
            flags = ", ".join(_flag(f) for f in given)
            raise UsageError(f"{command} does not take {flags}: {why}",
                             fix=f"drop {flags}" + (f" ({_ALTERNATIVES[given[0]]})" if given[0] in _ALTERNATIVES
                                                    else ""))

    def recipe_overrides(self) -> tuple[str, ...]:
        """--time, --env, --venv, --hang-timeout, --spares and --preflight as the recipe values they set, then each
        --set."""
        self.refuse_twice()
        return (*_job_values(self.time, self.env, self.venv, self.hang_timeout, self.spares, self.preflight),
                *self.overrides)

    def refuse_twice(self) -> None:
        """Two options for one value (exit 2), as --nodes with --set resources.nodes: one of them was dropped without
        a word (`--time 01:00:00 --set resources.time=02:00:00` ran 2 h, a --set of a swept key was lost)."""
        from toolkit.errors import UsageError

        named = {"resources.time": f"--time {self.time}" if self.time else None,
                 **{f"env.{e.partition('=')[0]}": f"--env {e}" for e in self.env},
                 "software.venv": f"--venv {self.venv}" if self.venv else None,
                 "resources.hang_timeout_s": f"--hang-timeout {self.hang_timeout}" if self.hang_timeout else None,
                 "resources.spares": f"--spares {self.spares}" if self.spares is not None else None,
                 "resources.preflight": "--preflight" if self.preflight else "--no-preflight"
                 if self.preflight is False else None}
        swept = {item.partition("=")[0]: item for item in self.sweeps}
        for item in self.overrides:
            key = item.partition("=")[0]
            other = named.get(key) or (f"--sweep {swept[key]}" if key in swept else None)
            if other is not None:
                raise UsageError(f"{other} and --set {item} both set {key}", fix=f"give one of them: {other}, or "
                                 f"--set {item}")


_FLAGS = {"overrides": "--set", "sweeps": "--sweep"}
_ALTERNATIVES = {
    "profile": "a profile belongs to a recipe file: write one with `hpc recipes new`, add profiles, submit it",
    "sweeps": "sweep when submitting: `hpc recipes submit RECIPE --sweep ...` or `hpc run ... --sweep ...`",
    "account": "give it when submitting", "qos": "give it when submitting",
    "reservation": "give it when submitting", "dependency": "give it when submitting",
}


def _flag(field: str) -> str:
    return _FLAGS.get(field, "--" + field)


def preflight_override(preflight: bool | None) -> list[str]:
    """--preflight / --no-preflight as the `--set` item it stands for."""
    return [f"resources.preflight={json.dumps(preflight)}"] if preflight is not None else []


def check_time(time: str | None) -> None:
    """--time in one of sbatch's forms (sbatch(1), --time), said in words, not as the schema's pattern."""
    import re

    from toolkit.errors import UsageError
    from toolkit.recipes.schema import TIME_PATTERN

    if time is not None and not re.match(TIME_PATTERN, time):
        raise UsageError(f"--time {time!r} is not a Slurm time limit",
                         fix="write MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES "
                             "or DAYS-HOURS:MINUTES:SECONDS, e.g. --time 01:30:00")


# sbatch(1), --dependency: TYPE:JOB_ID[:JOB_ID...] joined by "," (all) or "?" (any), or singleton; a bare job id is
# afterany (the default type); only `after` takes +MINUTES. A job id may name an array task (123_4).
_DEPENDENCY_TYPES = ("after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok")


def check_dependency(dependency: str | None) -> None:
    """--dependency in sbatch's form, said in words: a typo (`afterok` alone, `bogus:12`) went into the script's
    #SBATCH line, and sbatch refused the job only at submit (a dry run showed it)."""
    import re

    from toolkit.errors import UsageError

    if dependency is None:
        return
    job = r"[0-9]+(?:_[0-9]+)?"
    items = re.split(r"[,?]", dependency) if not ("," in dependency and "?" in dependency) else None
    for item in items or []:
        kind, ids = item.split(":", 1) if ":" in item and not item[:1].isdigit() else ("afterany", item)
        one = job + (r"(?:\+[0-9]+)?" if kind == "after" else "")
        if item == "singleton" or (kind in _DEPENDENCY_TYPES and re.fullmatch(f"{one}(?::{one})*", ids)):
            continue
        raise UsageError(f"--dependency {dependency!r} is not a Slurm dependency ({item!r}: TYPE:JOB_ID[:JOB_ID...], "
                         f"TYPE one of {', '.join(_DEPENDENCY_TYPES)}, or singleton)",
                         fix="e.g. --dependency afterok:123 (sbatch(1), --dependency; join several with , for all "
                             "or ? for any)")
    if items is None:
        raise UsageError(f"--dependency {dependency!r} joins its parts with both , and ?: sbatch takes one of them",
                         fix="use , (all must hold) or ? (any may hold), not both")


def _job_values(time, env, venv, hang_timeout=None, spares=None, preflight=None) -> list[str]:
    """--time/--env/--venv/--hang-timeout/--spares/--preflight as `--set` items (values JSON-quoted: YAML would read
    01:00:00 as a number)."""
    from toolkit.recipes.user import parse_env, venv_dir

    check_time(time)
    items = [f"resources.time={json.dumps(time)}"] if time else []
    items += [f"env.{name}={json.dumps(text)}" for name, text in parse_env(env).items()]
    items += [f"software.venv={json.dumps(venv_dir(str(venv)))}"] if venv else []
    items += [f"resources.hang_timeout_s={hang_timeout}"] if hang_timeout else []
    items += [f"resources.spares={spares}"] if spares is not None else []
    return items + preflight_override(preflight)
