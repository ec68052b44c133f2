"""The node-side contract (toolkit.node): what hpc runs on a compute node needs only that node's own python3
(>= 3.9, standard library) and the shared file system, never the submitter's venv, home or checkout. Held here
for the code itself (imports, grammar), for the bundle a job stages (toolkit.job.staging), and for the rendered
script's unpacking; tests/test_node_lane.py runs it on nodes built unlike this machine (Debian bullseye)."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO
from tests.test_health import write
from toolkit.node.node_check import Node, gather
from toolkit.job import staging

NODE = REPO / "toolkit" / "node"
SYSTEM_PYTHON = "/usr/bin/python3"  # this machine's own, outside the venv: it has nothing of ours


def node_modules() -> list[Path]:
    return sorted(NODE.glob("*.py"))


def test_node_modules_import_only_the_standard_library_and_each_other():
    """No `toolkit...` import (the bundle is renamed hpc_node) and no third-party module, lazy imports included."""
    wrong = []
    for path in node_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__":
                    wrong.append(f"{path.name}: {name}")
    assert wrong == []


def test_node_modules_parse_as_python_3_9():
    """No 3.10+ syntax (match, parenthesised context managers...): ast's feature_version check."""
    for path in node_modules():
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def annotation_nodes(tree: ast.AST) -> set[int]:
    """Every node inside an annotation (postponed by `from __future__ import annotations`: never evaluated)."""
    roots = [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation]
    roots += [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    return {id(sub) for root in roots for sub in ast.walk(root)}


def test_node_modules_use_no_3_10_runtime_features():
    """What feature_version cannot see: `zip(strict=...)`, and `X | None` unions evaluated at run time (3.10+)
    rather than in annotations, which `from __future__ import annotations` keeps as text."""
    wrong = []
    for path in node_modules():
        text = path.read_text()
        tree = ast.parse(text)
        inside = annotation_nodes(tree)
        if inside and "from __future__ import annotations" not in text:
            wrong.append(f"{path.name}: annotations without `from __future__ import annotations`")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "zip" and \
                    any(k.arg == "strict" for k in node.keywords):
                wrong.append(f"{path.name}:{node.lineno}: zip(strict=)")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in inside and \
                    any(isinstance(side, ast.Constant) and side.value is None or
                        isinstance(side, ast.Name) and side.id in ("str", "int", "float", "dict", "list", "tuple")
                        for side in (node.left, node.right)):
                wrong.append(f"{path.name}:{node.lineno}: a `|` union evaluated at run time")
    assert wrong == []


def test_the_bundle_holds_every_node_module_and_packs_the_same_bytes_each_time():
    data = staging.bundle()
    staging.bundle.cache_clear()
    assert staging.bundle() == data
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as archive:
        names = set(archive.namelist())
    assert names == {"__main__.py", *(f"hpc_node/{p.name}" for p in node_modules())}
    assert staging.bundle_name().startswith("hpc-node-") and staging.bundle_path("/fsx/runs/r/task-003") == \
        f"/fsx/runs/r/.hpc/{staging.bundle_name()}"  # a sweep's tasks share their batch dir's


def unpack(tmp_path: Path, run_dir: Path) -> Path:
    """The rendered script's unpacking lines, run by bash as the batch shell runs them."""
    script = tmp_path / "unpack.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(staging.unpack_lines(run_dir)) + "\n")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return Path(staging.bundle_path(run_dir))


def test_the_scripts_lines_unpack_the_bundle_byte_for_byte_and_keep_one_already_there(tmp_path):
    run_dir = tmp_path / "run dir's"  # quoting
    path = unpack(tmp_path, run_dir)
    assert path.read_bytes() == staging.bundle()
    path.write_bytes(path.read_bytes())
    before = path.stat().st_mtime_ns
    unpack(tmp_path, run_dir)  # a requeue of the same job: the file is there, nothing rewritten
    assert path.stat().st_mtime_ns == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left beside it


def chosen_python(tmp_path: Path, path: str) -> str:
    """HPC_PYTHON as the rendered script's finder chooses it, on the given PATH, and then HPC_JOB_PYTHON3 (the
    same where it is the PATH's python3, else empty), as `HPC_PYTHON|HPC_JOB_PYTHON3`."""
    script = tmp_path / "choose.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(staging.unpack_lines(tmp_path / "run")) +
                      '\necho "$HPC_PYTHON|$HPC_JOB_PYTHON3"\n')
    res = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, timeout=60, env={"PATH": path})
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_finder_keeps_the_interpreters_own_path_not_a_shims_and_skips_an_old_python3(tmp_path):
    """A pyenv-style shim (a shell script that execs the real interpreter) first on PATH: HPC_PYTHON is the
    interpreter's own path (sys.executable), so no node-side command pays the shim's start again. A python3 older
    than 3.9 first on PATH is passed over for the system's."""
    shims = tmp_path / "shims"
    write(shims / "python3", f'#!/bin/bash\nexec {SYSTEM_PYTHON} "$@"\n', 0o755)
    real = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.executable)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    # the PATH's python3 is the job's: the pre-flight's loader check starts it by this path too (--job-python3)
    assert chosen_python(tmp_path, f"{shims}:/usr/bin:/bin") == f"{real}|{real}" and real != str(shims / "python3")
    old = tmp_path / "old"  # answers the version test as a Python 3.8 would: exit status 1, nothing printed
    write(old / "python3", "#!/bin/sh\nexit 1\n", 0o755)
    assert chosen_python(tmp_path, f"{old}:/usr/bin:/bin") == f"{real}|"  # the job's python3 is not the node's


def test_the_bundle_runs_on_a_python_with_nothing_of_ours(tmp_path):
    """The pre-flight from the unpacked bundle under this machine's system python3, isolated (-I: no user site, no
    PYTHONPATH, not the venv), from a directory without the checkout: as the batch shell of a node runs it. Stub
    srun and scontrol (named so) stand in for Slurm's: each node's task reports a run dir it cannot write."""
    path = unpack(tmp_path, tmp_path / "run")
    bin_dir = tmp_path / "bin"
    # what a node whose shared file system is gone reports (the real node check, on an empty node tree)
    report = json.dumps(gather(Node(str(tmp_path / "empty"), {"SLURMD_NODENAME": "NODE"}), probe_dir="/shared/run"))
    write(bin_dir / "scontrol", '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\n"\n', 0o755)
    write(bin_dir / "srun", "#!/bin/sh\n" + "".join(
        f"echo {shlex.quote(report.replace('NODE', n))}\n" for n in ("n1", "n2")), 0o755)
    promise = json.dumps({"queue": "cpu", "instance_type": "m5.xlarge"})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-2]"}
    res = subprocess.run([SYSTEM_PYTHON, "-I", str(path), "preflight", "--run-dir", str(tmp_path / "run"),
                          "--promise", promise], capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert res.returncode == 1, res.stderr
    assert "hpc: pre-flight: FAILED on n1: shared-fs" in res.stdout and "Traceback" not in res.stderr
    record = json.loads((tmp_path / "run" / "preflight.jsonl").read_text())
    assert record["job"] == "41" and set(record["failed"]) == {"n1", "n2"}


def test_an_unknown_command_or_an_old_python_says_so_in_one_line(tmp_path):
    path = unpack(tmp_path, tmp_path / "run")
    res = subprocess.run([SYSTEM_PYTHON, "-I", str(path), "nonsense"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("usage: python3 BUNDLE {nodesearch,preflight")
    # the version gate, as an older python3 meets it (sys.version_info seen as 3.8's)
    code = ("import sys, zipimport; sys.path.insert(0, %r); import hpc_node.__main__ as m; "
            "sys.version_info = (3, 8, 10); sys.exit(m.main(['preflight']))" % str(path))
    res = subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "python3 is 3.8; hpc's node-side code needs python3 >= 3.9" in res.stderr


def test_a_reviewed_render_runs_its_preflight_from_the_run_dir_not_the_submitters_python():
    """jobs/bert-5b-16xdl1.sbatch (kept as today's render by tests/test_render.py) is the DL1 job that stopped at
    its pre-flight line on every DL1 node (Python 3.8/3.10 venvs, no toolkit there)."""
    script = (REPO / "jobs" / "bert-5b-16xdl1.sbatch").read_text()
    before_ranks = script.split("COMMAND=(")[0]
    assert "-m toolkit." not in before_ranks and ".venv" not in before_ranks
    bundle = f"/fsx/runs/bert-5b-16xdl1/.hpc/{staging.bundle_name()}"
    assert f'"$HPC_PYTHON" -S {bundle} preflight --run-dir /fsx/runs/bert-5b-16xdl1 --promise ' in before_ranks
    assert before_ranks.index("<<'HPC_NODE_BUNDLE'") < before_ranks.index(f'"$HPC_PYTHON" -S {bundle} preflight')


def _venv(root: Path, version: str, submitit: bool, hpc: bool = True) -> str:
    write(root / "pyvenv.cfg", f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {version}\n")
    write(root / "bin" / "python", "", 0o755)
    site = root / "lib" / f"python{version.rsplit('.', 1)[0]}" / "site-packages"
    if submitit:
        (site / "submitit").mkdir(parents=True)
    if hpc:
        (site / "hpc_toolkit-0.1.0.dist-info").mkdir(parents=True)
    return str(root / "bin" / "python")


def test_submitit_is_used_only_where_the_nodes_python_can_run_its_side(tmp_path, monkeypatch):
    """submitit's node side unpickles the job with the nodes' Python: a venv of another Python (a node's 3.9) or one
    without submitit gets the rendered script (sbatch) instead, with a note; asking for submitit there is refused."""
    import pytest

    from toolkit.errors import HpcError
    from toolkit.slurm import executors

    monkeypatch.setattr("toolkit.slurm.commands.slurm_installed", lambda: True)
    here = "%d.%d.%d" % sys.version_info[:3]
    old = _venv(tmp_path / "py39", "3.9.2", submitit=True)
    bare = _venv(tmp_path / "bare", here, submitit=False)
    fit = _venv(tmp_path / "fit", here, submitit=True)
    # a single job goes as its rendered script whatever the venv holds: it needs nothing of hpc's on the nodes
    assert [executors.choose_executor(None, node_python=p) for p in (old, bare, fit)] == [("sbatch", None)] * 3
    # a sweep is submitit's job array: submitit's side must run there
    kind, note = executors.choose_executor(None, node_python=old, array=True)
    assert kind.value == "sbatch" and f"{tmp_path / 'py39'} is Python 3.9" in note
    kind, note = executors.choose_executor(None, node_python=bare, array=True)
    assert kind.value == "sbatch" and "has no submitit" in note
    assert executors.choose_executor(None, node_python=fit, array=True) == ("slurm", None)
    # submitit there, but not hpc, whose rank task submitit unpickles on the node
    kind, note = executors.choose_executor(None, node_python=_venv(tmp_path / "nohpc", here, True, hpc=False),
                                           array=True)
    assert kind.value == "sbatch" and "has no hpc" in note
    assert executors.choose_executor(None, node_python="python", array=True) == ("slurm", None)  # not readable
    assert executors.choose_executor("slurm", node_python=fit) == ("slurm", None)
    assert executors.choose_executor("sbatch", node_python=old) == ("sbatch", None)
    with pytest.raises(HpcError, match="--executor slurm \\(submitit\\): the job's venv .* is Python 3.9") as err:
        executors.choose_executor("slurm", node_python=old)
    assert err.value.exit_code == 2


def test_a_job_whose_nodes_can_have_no_python_3_9_is_refused_when_planned(tmp_path):
    """rocky8/rhel8 nodes have python3 3.6: a training job (the pre-flight runs hpc's node-side code) with no venv
    of a newer Python is refused at plan time, in one line with the fix, not after it waited in the queue."""
    import yaml

    from tests.conftest import cli_envelope, run_hpc
    from tests.jobhelpers import CLUSTER_CONFIG

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def plan(os_name: str, venv_version: str | None) -> tuple[int, str]:
        cluster = tmp_path / f"{os_name}.yaml"
        cluster.write_text(yaml.safe_dump({**CLUSTER_CONFIG, "Image": {"Os": os_name}}))
        args = ["run", str(script), "--cluster", str(cluster), "--queue", "cpu", "--dry-run", "--json"]
        if venv_version:
            venv = tmp_path / f"venv-{venv_version}"
            write(venv / "pyvenv.cfg", f"home = /usr/bin\nversion = {venv_version}\n")
            args += ["--set", f"software.venv={venv}"]
        res = run_hpc(*args, cwd=tmp_path)
        return res.returncode, cli_envelope(res).get("error", {}).get("message", "") if res.returncode else ""

    code, message = plan("rocky8", "3.6.8")
    assert code == 1 and "the nodes' own python3 is 3.6 and the job's venv" in message and "Python 3.6" in message
    assert plan("rocky8", "3.11.2") == (0, "")  # the job's venv brings one
    assert plan("alinux2023", "3.6.8") == (0, "")  # the node's own 3.9 runs it
    assert plan("ubuntu2204", None)[0] == 0


def test_a_ranks_script_beats_from_the_staged_bundle_with_nothing_of_ours_installed(tmp_path):
    """The documented import for a node without hpc (`from hpc_node.heartbeat import beat`): the batch shell's
    staging lines unpack the bundle, the rank program's prelude puts it first on PYTHONPATH, and this machine's
    system python3 (no venv, run from /) imports it from the zip and writes the rank's heartbeat."""
    from tests.jobhelpers import CPU
    from toolkit.slurm.render import staging_lines
    from toolkit.slurm.materialize import build_job_spec
    from toolkit.recipes.load import load_recipe

    run_dir = tmp_path / "run"
    spec = build_job_spec(load_recipe("resnet50", profile="smoke", overrides=["resources.preflight=false"]), CPU, 1,
                          run_dir=str(run_dir))
    assert staging_lines(spec) and "HPC_PYTHON" not in "\n".join(staging_lines(spec))  # no node command run
    user = tmp_path / "train.py"
    user.write_text("import sys\nfrom hpc_node.heartbeat import beat\nfor step in range(3):\n    beat(step)\n"
                    "print(sys.modules['hpc_node.heartbeat'].__file__)\n")
    script = "\n".join(["set -euo pipefail", *staging_lines(spec),
                        "export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0",
                        "bash -c " + shlex.quote(spec.program.script) + f" {SYSTEM_PYTHON} {shlex.quote(str(user))}"])
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd="/",
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(staging.bundle_path(run_dir))  # imported from the zip, not a checkout
    beat = json.loads((run_dir / "heartbeats" / "rank-0.json").read_text())
    assert beat["rank"] == 0 and beat["step"] == 2
