"""The node-side bundle: toolkit/node packed as the `hpc_node` zip that a job's batch shell unpacks into its run dir.

Compute nodes share only the shared file systems with the submitter (toolkit.node's contract), so the code hpc
runs there travels with the job: the rendered script carries it (base64, unpacked once per run dir), which keeps a
script rendered on a laptop and sent by hand as complete as one submitted by hpc, and leaves in the run dir the
exact code that ran. Python runs a zip with a __main__.py and imports from it (zipimport), so the node needs
nothing but its own python3.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import shlex
import zipfile
from importlib import resources
from pathlib import Path

from toolkit.node import BUNDLE_PACKAGE
from toolkit.node.records import batch_dir

STAGE_DIR = ".hpc"  # in the run dir (its batch dir, for a sweep): hpc's own files
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same code always packs to the same bytes
_ROOT_MAIN = (
    "# `python3 hpc-node-*.pyz COMMAND ...`: the node-side command (toolkit/node/__main__.py)\n"
    "import sys\n\nfrom %s.__main__ import main\n\nsys.exit(main(sys.argv[1:]))\n" % BUNDLE_PACKAGE
)


def _members() -> list[tuple[str, bytes]]:
    package = resources.files("toolkit.node")
    files = sorted((p.name, p.read_bytes()) for p in package.iterdir() if p.name.endswith(".py"))
    return [("__main__.py", _ROOT_MAIN.encode()), *((f"{BUNDLE_PACKAGE}/{name}", data) for name, data in files)]


@functools.cache
def bundle() -> bytes:
    """The zip's bytes: deterministic for the same sources."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in _members():
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return out.getvalue()


def bundle_name() -> str:
    """`hpc-node-<digest>.pyz`: named by its content, so a requeue reuses it and two versions never mix."""
    return f"hpc-node-{hashlib.sha256(bundle()).hexdigest()[:12]}.pyz"


def bundle_path(run_dir: str | Path) -> str:
    """Where a job's batch shell unpacks the bundle (on the shared file system, as the run dir is)."""
    return str(batch_dir(run_dir) / STAGE_DIR / bundle_name())


# The interpreter for node-side code: the job's python3 (its venv's, once the set-up ran) if it is new enough, else
# the node's own. An accelerator vendor's venv (its SDK's) may be Python 3.8 while the node's /usr/bin/python3 is 3.10.
PYTHONS = ("python3", "/usr/bin/python3", "/usr/local/bin/python3", "python3.13", "python3.12", "python3.11",
           "python3.10", "python3.9")
# The test prints the interpreter's own path (sys.executable; empty only for an embedded one): a pyenv or asdf shim
# on PATH is a bash script that costs ~65 ms per start (measured: docs/start-up.md), and every node-side command
# (the pre-flight, its checks on every node) starts through HPC_PYTHON.
_MIN = 'import sys; new = sys.version_info >= (3, 9); print(sys.executable if new else ""); sys.exit(not new)'
PYTHON_VAR = "HPC_PYTHON"
# HPC_PYTHON again where it is the job's own python3 (the first on its PATH, so the finder's first candidate), else
# empty: the pre-flight's loader check, which must run on the job's python3, then starts it without its shim too.
JOB_PYTHON3_VAR = "HPC_JOB_PYTHON3"


def unpack_lines(run_dir: str | Path, choose_python: bool = True) -> list[str]:
    """Shell lines that choose the node-side python3 (with `choose_python`: the job runs node_command()s, which
    need one) and write the bundle unless it is there already (written aside, then moved: a node reading it never
    sees half a file). Ranks that only import from the bundle bring their own Python."""
    path = bundle_path(run_dir)
    quoted, partial = shlex.quote(path), shlex.quote(path) + '".$$"'
    text = base64.encodebytes(bundle()).decode().rstrip("\n")
    choose = [f"{PYTHON_VAR}= {JOB_PYTHON3_VAR}=", f"for candidate in {' '.join(PYTHONS)}; do",
              f"  if found=$(\"$candidate\" -S -c {shlex.quote(_MIN)} 2>/dev/null); then",
              f"    {PYTHON_VAR}=${{found:-$(command -v \"$candidate\")}}; break", "  fi",
              "done",
              f'[ "$candidate" != {PYTHONS[0]} ] || {JOB_PYTHON3_VAR}=${PYTHON_VAR}',
              f"if [ -z \"${PYTHON_VAR}\" ]; then",
              "  echo \"hpc: no python3 >= 3.9 on $(hostname) (tried the job's PATH and the system's): hpc's node-side "
              "code needs one; put it first on PATH in the recipe's software (a venv or module)\" >&2",
              "  exit 1", "fi"]
    return [*(choose if choose_python else []),
            f"if [ ! -s {quoted} ]; then", f"  mkdir -p {shlex.quote(str(Path(path).parent))}",
            f"  base64 -d > {partial} <<'HPC_NODE_BUNDLE'", *text.splitlines(), "HPC_NODE_BUNDLE",
            f"  mv -f {partial} {quoted}", "fi"]


def venv_python(venv: str) -> tuple[int, int] | None:
    """A venv's Python version from its pyvenv.cfg (readable here when the venv is on the shared file system)."""
    import re

    try:
        config = (Path(venv) / "pyvenv.cfg").read_text()
    except OSError:
        return None
    match = re.search(r"^\s*version(?:_info)?\s*=\s*(\d+)\.(\d+)", config, re.M)
    return (int(match.group(1)), int(match.group(2))) if match else None


def python_problem(venv: str | None, os_python3: tuple[int, int] | None) -> tuple[str, str] | None:
    """(what, fix) when no candidate of unpack_lines can be a python3 >= 3.9 on the nodes, as far as the plan can
    tell: the job's venv (its pyvenv.cfg) and the nodes' OS (the cluster config's Image/Os). Unknown is no problem:
    the batch shell still says so in one line if it finds none."""
    from toolkit.node import MIN_PYTHON

    job = venv_python(venv) if venv else None
    if (job and job >= MIN_PYTHON) or os_python3 is None or os_python3 >= MIN_PYTHON:
        return None
    if venv and job is None:
        return None  # a venv not readable here (or without pyvenv.cfg) may still be new enough
    version = "%d.%d" % os_python3
    what = (f"the nodes' own python3 is {version} and the job's venv {venv} is Python {job[0]}.{job[1]}" if job else
            f"the nodes' own python3 is {version} and the job's software names no venv")
    return (f"{what}: hpc's node-side code (the pre-flight) needs a python3 >= 3.9 on every node",
            "install one on the nodes (e.g. the python39 package in a custom AMI or an OnNodeConfigured action) and "
            "name its venv in the recipe (software.venv / --venv), or run with --no-preflight")


def node_command(run_dir: str | Path, command: str, *args: str) -> str:
    """`"$HPC_PYTHON" -S BUNDLE COMMAND ARGS...` (the python3 unpack_lines chose), every other word quoted. -S: the
    bundle is standard library only (toolkit.node), so no site-packages: a third of a venv Python's start (27 ms
    against 10 here), and nothing of the job's venv (a .pth file) runs before hpc's own code."""
    return f'"${PYTHON_VAR}" -S ' + shlex.join([bundle_path(run_dir), command, *args])
