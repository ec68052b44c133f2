"""`hpc cluster doctor --recipe`: does the dynamic loader, in a rendered job's own environment, resolve what it loads?

The job's set-up lines (its modules, venv and exports, LD_LIBRARY_PATH among them: toolkit.slurm.render.
environment_lines) run in bash on one node of the job's queue, started by srun with only the submitter variables a
job gets (toolkit.job.env.SUBMIT_ENV_ALLOWLIST), then toolkit.node.loader_check asks the loader. What a job
needs follows its spec: an MPI/NCCL program's libraries (nccl-tests: libnccl, libmpi), then what its accelerator
family's collective library loads (toolkit.accelerators: Family.loader_checks, and Family.loader_fix for the fix).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from typing import Callable

from toolkit.node import standalone_source
from toolkit.accelerators import FAMILIES
from toolkit.accelerators.base import OPENMPI_DIR
from toolkit.job.env import filter_submit_env, submit_env_allowlist
from toolkit.job.spec import JobSpec
from toolkit.launchers import launcher_for
from toolkit.slurm.materialize import loader_check_arguments

JOB_NAME = "hpc-doctor"


@dataclasses.dataclass(frozen=True)
class LibraryCheck:
    library: str  # the soname the loader was asked for (libnccl.so.2), or what it stands for (nccl-net-plugin)
    status: str  # resolves | does not resolve | n/a
    wanted_by: str  # which lookup: the ld.so trace of a program, NCCL_NET_PLUGIN=..., dlopen
    path: str | None  # the file the loader chose
    detail: str | None  # the loader's error, or what was found
    fix: str | None


@dataclasses.dataclass(frozen=True)
class JobLoaderReport:
    job: str
    queue: str
    node: str | None
    ld_library_path: str | None  # as the job's set-up left it on the node
    checks: tuple[LibraryCheck, ...]
    error: str | None = None  # why there are no checks (srun, set-up or python3 failed)

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.status != "does not resolve" for c in self.checks)

    def as_dict(self) -> dict:
        return {"job": self.job, "queue": self.queue, "ok": self.ok, "node": self.node,
                "ld_library_path": self.ld_library_path, "error": self.error,
                "libraries": [dataclasses.asdict(c) for c in self.checks]}


def loader_check_source() -> str:
    return standalone_source("loader_check")


def check_script(spec: JobSpec, fabric: str) -> str:
    """bash: the job's environment, then the loader check in it (one JSON line)."""
    from toolkit.slurm.render import environment_lines

    check = shlex.join(["python3", "-c", loader_check_source(), "--json", *loader_check_arguments(spec, fabric)])
    return "\n".join(["set -eu", *environment_lines(spec), f"exec {check}", ""])


def srun_argv(spec: JobSpec, script: str) -> list[str]:
    """One task on one node of the job's queue, with the submitter variables a job gets and nothing else."""
    return ["srun", f"--partition={spec.partition}", "--nodes=1", "--ntasks=1", "--time=5", f"--job-name={JOB_NAME}",
            f"--export={','.join(submit_env_allowlist())}", "bash", "-c", script]


def run_here(script: str, environ: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """The script in bash on this machine with only the allow-listed variables of `environ`, as srun's
    --export=LIST gives them to a task (the tests' way; the doctor runs it on a node)."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=filter_submit_env(environ))


def fix_for(library: str, spec: JobSpec) -> str:
    # any family's: a program's ld.so trace may name a collective library on any queue (libnccl of a binary)
    fixes = (f.loader_fix(library, binary=not launcher_for(spec.launcher).python) for f in FAMILIES.values())
    if (fix := next((f for f in fixes if f), None)) is not None:
        return fix
    if library.startswith("libmpi"):
        return (f"the EFA installer's Open MPI ({OPENMPI_DIR}) is on EFA jobs' path; elsewhere add the lib "
                "directory of the MPI the program was built against to the recipe's software.library_path")
    return f"add the directory that holds {library} on the nodes to the recipe's software.library_path"


def judge(facts: dict, spec: JobSpec) -> tuple[LibraryCheck, ...]:
    checks = []
    for lib in facts.get("libraries", []):
        status = {True: "resolves", False: "does not resolve", None: "n/a"}[lib["resolves"]]
        checks.append(LibraryCheck(lib["library"], status, lib["wanted_by"], lib["path"], lib["detail"],
                                   fix_for(lib["library"], spec) if status == "does not resolve" else None))
    return tuple(checks)


def check_job(spec: JobSpec, fabric: str, run: Callable[[str], subprocess.CompletedProcess]) -> JobLoaderReport:
    """Run the loader check of `spec` with `run` (a script -> its finished process: srun, or run_here)."""
    res = run(check_script(spec, fabric))
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    try:
        facts = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        facts = None
    if not isinstance(facts, dict) or res.returncode != 0:
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        # The job's own last word (e.g. a venv that cannot be activated), not srun's "task 0: Exited" after it.
        own = [line for line in errors if not line.startswith("srun: ")]
        return JobLoaderReport(spec.job_name, spec.partition, None, None, (),
                               (own or errors or [f"the loader check exited {res.returncode}, printing nothing"])[-1])
    return JobLoaderReport(spec.job_name, spec.partition, facts.get("node"), facts.get("ld_library_path"),
                           judge(facts, spec))


def check_job_on_slurm(spec: JobSpec, fabric: str, timeout: float) -> JobLoaderReport:
    from toolkit.health.doctor import run_srun

    return check_job(spec, fabric, lambda script: run_srun(srun_argv(spec, script), timeout))
