"""The Target interface (toolkit/target.py): every executor kind is one target in its room, the plan is written once
over it (its dispatch is the target's dry run), the local target ends its own processes rather than asking Slurm,
and Kubernetes applies only what the offline checks pass, through kubectl where it can reach a cluster."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_json, run_hpc
from toolkit.errors import HpcError
from toolkit.rundir import Executor, Metadata, RunDir
from toolkit.target import TARGETS, target_for


@pytest.mark.parametrize("kind", [*Executor, "kubernetes"])
def test_every_kind_is_one_target_that_answers_the_whole_interface(kind):
    target = target_for(kind)
    assert target.kind == str(kind)
    for method in ("dry_run", "describe", "check", "schedule", "status", "cancel", "logs", "sweep_refusal"):
        assert callable(getattr(target, method)), method
    assert target.summary and target.scheduler in ("slurm", "local", "kubernetes")
    assert set(TARGETS) == {*(k.value for k in Executor), "kubernetes"}


def test_only_the_executor_choice_and_the_run_dir_reader_branch_on_the_kind():
    """The plan, sweeps, `hpc jobs` and the summary ask the target; comparing a kind by name is left to the one
    place that chooses it (toolkit.slurm.executors.choose_executor) and the run dir's log reader (which reads what
    a kind stored, below the targets)."""
    allowed = {"toolkit/slurm/executors.py", "toolkit/rundir.py"}
    found = []
    for path in (REPO / "toolkit").rglob("*.py"):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n for n in (node.left, *node.comparators)
                         if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "Executor"]
                if names and rel not in allowed:
                    found.append(f"{rel}:{node.lineno}")
    assert found == []


def test_a_plans_dispatch_is_its_targets_dry_run(tmp_path, monkeypatch):
    from toolkit.submit.plan import SubmitRequest, plan
    from toolkit.target import Dispatch

    monkeypatch.setattr("toolkit.slurm.commands.slurm_installed", lambda: True)
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path))
    for kind in ("sbatch", "slurm"):
        p = plan(SubmitRequest("resnet50", nodes=1, profile="smoke", executor=kind), tmp_path / kind)
        assert p.executor == kind
        expected = target_for(kind).dry_run(p.spec, p.run_dir)
        assert Dispatch(p.python, p.parameters, p.batch_script, p.argv) == expected
    assert p.parameters["nodes"] == 1 and p.batch_script and "#SBATCH" in p.batch_script


def _local_run(tmp_path: Path, job_id: str) -> RunDir:
    run = RunDir(tmp_path / f"local-{job_id}").create()
    run.write_metadata(Metadata.from_json({"recipe": "x", "executor": "local", "job_ids": [job_id], "nodes": 1}))
    return run


# A stand-in for submitit's local controller (`python -m submitit.local._local FOLDER`, pinned 1.5.4): a process
# whose command line names it, as the local target checks a pid by before it believes or signals it.
CONTROLLER = [sys.executable, "-c", "import time; time.sleep(120)", "submitit.local._local"]


def test_cancelling_a_local_run_ends_its_process_not_a_slurm_job(tmp_path, monkeypatch):
    """A local run's id is submitit's process id: `hpc jobs cancel` ends that process (scancel would be asked to
    cancel a Slurm job of that number, someone else's or none)."""
    proc = subprocess.Popen(CONTROLLER)
    try:
        _local_run(tmp_path, str(proc.pid))
        env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path)}
        res = cli_json(run_hpc("jobs", "cancel", str(proc.pid), "--json", env=env))
        assert res["cancelled"] and res["job_ids"] == [str(proc.pid)]
        assert proc.wait(timeout=10) == -15  # SIGTERM, as scancel's default
        assert target_for("local").status([str(proc.pid)], RunDir(tmp_path / f"local-{proc.pid}"))[
            str(proc.pid)].state == "FAILED"  # gone without rank 0's result
        again = run_hpc("jobs", "cancel", str(proc.pid), env=env)
        assert again.returncode == 0 and "had already ended (FAILED): nothing to cancel" in again.stdout
    finally:
        proc.kill()


def test_a_pid_taken_by_another_process_is_neither_running_nor_signalled(tmp_path):
    """A local run's controller has ended and its pid now belongs to some other process of the user's (here: a
    process that is not submitit's controller): the run has ended, and `hpc jobs cancel` leaves that process be."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        cmdline = Path(f"/proc/{other.pid}/cmdline")
        for _ in range(500):  # empty until its exec is done (then the target cannot tell, and waits)
            if cmdline.read_bytes():
                break
            time.sleep(0.01)
        _local_run(tmp_path, str(other.pid))
        env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path)}
        res = run_hpc("jobs", "cancel", str(other.pid), env=env)  # another process: not its parent
        assert res.returncode == 0 and "had already ended (FAILED)" in res.stdout, res.stderr
        assert other.poll() is None, "an unrelated process was signalled"
    finally:
        other.kill()
        other.wait()


def test_a_zombie_under_the_pid_is_not_a_running_controller(tmp_path):
    """A process with an empty command line is one still in its exec (alive), or a zombie or kernel thread that
    has the pid now: the local target tells them apart by /proc/PID/exe (here a zombie whose parent, not this
    process, never reaps it)."""
    parent = subprocess.Popen(["bash", "-c", "sleep 0 & echo $!; exec sleep 60"], stdout=subprocess.PIPE, text=True)
    try:
        zombie = parent.stdout.readline().strip()
        state = Path(f"/proc/{zombie}/stat")
        for _ in range(500):
            if state.read_text().split(")")[-1].split()[0] == "Z":
                break
            time.sleep(0.01)
        run = _local_run(tmp_path, zombie)
        assert target_for("local").status([zombie], run)[zombie].state == "FAILED"  # ended, without a result
    finally:
        parent.kill()
        parent.wait()


def test_a_local_run_runs_while_its_controller_lives_then_its_result_says_how_it_ended(tmp_path):
    """submitit's controller waits for every rank: rank 0's result while it still runs (another rank at work) is
    not the job's end. Once it has gone, the result decides."""
    from toolkit.rundir import RankRecord

    proc = subprocess.Popen(CONTROLLER)
    try:
        job = str(proc.pid)
        run = _local_run(tmp_path, job)
        run.write_result(RankRecord(rank=0, exit_code=0, ok=True))
        assert target_for("local").status([job], run)[job].state == "RUNNING"
    finally:
        proc.kill()
        proc.wait()
    assert target_for("local").status([job], run)[job].state == "COMPLETED"


def _stand_in_kubectl(bin_dir: Path, log: Path, context_rc: int = 0) -> None:
    """A stand-in for kubectl (no Kubernetes API server here): records its argv, answers like kubectl would."""
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  *"config current-context"*) [ {context_rc} = 0 ] && echo eks-test; exit {context_rc} ;;
  *apply*) echo trainjob.trainer.kubeflow.org/resnet50 ;;
esac
""")
    script.chmod(0o755)


def _render(tmp_path: Path) -> Path:
    out = tmp_path / "resnet50.yaml"
    subprocess.run([sys.executable, "-m", "toolkit", "k8s", "render", "resnet50", "--nodes", "2", "--instance",
                    "p4d.24xlarge", "--image", "example.org/train:1", "-o", str(out)], check=True, cwd=REPO,
                   capture_output=True, timeout=120)
    return out


def test_kubernetes_applies_checked_manifests_through_kubectl(tmp_path, monkeypatch):
    log = tmp_path / "kubectl.log"
    _stand_in_kubectl(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    manifests = _render(tmp_path)
    res = cli_json(run_hpc("k8s", "apply", str(manifests), "--context", "eks-test", "--json",
                           env={**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}))
    assert res["created"] == ["trainjob.trainer.kubeflow.org/resnet50"]
    calls = log.read_text().splitlines()
    assert calls[-1] == f"--context eks-test apply -f {manifests} -o name"


def test_kubernetes_refuses_without_kubectl_or_context_and_never_applies_an_invalid_file(tmp_path, monkeypatch):
    from toolkit.k8s.target import Apply, Kubernetes

    manifests = _render(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HpcError, match="kubectl is not installed") as err:
        Kubernetes().schedule(Apply(manifests))
    assert "kubectl apply -f" in err.value.fix
    log = tmp_path / "kubectl.log"
    _stand_in_kubectl(tmp_path / "bin", log, context_rc=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(HpcError, match="no current context"):
        Kubernetes().schedule(Apply(manifests))
    bad = tmp_path / "bad.yaml"
    bad.write_text(manifests.read_text().replace("numNodes: 2", "numNodes: two"))
    log.unlink()
    with pytest.raises(HpcError, match="not applied"):
        Kubernetes().schedule(Apply(bad))
    assert not log.exists() or "apply" not in log.read_text()  # the offline checks come first
