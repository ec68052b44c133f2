"""The pre-flight's parts (toolkit.node.preflight): its node step run for real on this machine, its judgement of
the facts, its decision, and the helper job that requeues without the failed nodes. The same on the local Slurm
with a node's shared file system taken away for real: tests/test_preflight_slurm.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_health import fake_nvidia_smi, healthy_tree, write
from toolkit.node import preflight
from toolkit.node.node_check import Node, gather
from toolkit.cluster.queues import Queue
from toolkit.node.preflight import decide, failures, judge

CPU = Queue("cpu", "m5.xlarge", 1, "none").promise()
P3DN = Queue("p3dn", "p3dn.24xlarge", 1, "modern", fsx_mount="/fsx", efa_enabled=True).promise()


def step_script(argv: list[str]) -> list[str]:
    """The node step's own command (what srun starts on each node): from `bash` on."""
    return argv[argv.index("bash"):]


def test_the_node_step_reports_each_node_as_one_json_line_and_the_loader_answers_apart(tmp_path):
    """The step's command, run here as srun would run it on a node: the node check's facts (with the run dir
    written and read back) and, with loader arguments, the loader's answers, told apart by the parser."""
    argv = preflight.step_argv(2, str(tmp_path), CPU, ["--library", "libc.so.6"])
    # --overlap: beside the ranks' step, which holds the nodes' every CPU (toolkit.node.gate)
    assert argv[:7] == ["srun", "--export=ALL", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--cpus-per-task=1"]
    res = subprocess.run(step_script(argv), capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SLURMD_NODENAME": "n7"})
    assert res.returncode == 0, res.stderr
    reports, loaders = preflight.parse_reports(res.stdout)
    assert set(reports) == set(loaders) == {"n7"}
    facts = reports["n7"]
    assert facts["probe"] == {"path": str(tmp_path), "writable": True, "error": None}
    assert facts["memory"]["available"] > 0 and set(facts["disk"]) == {str(tmp_path), os.environ.get("TMPDIR", "/tmp")}
    assert [lib["library"] for lib in loaders["n7"]["libraries"]] == ["libc.so.6"]
    assert not list(tmp_path.iterdir())  # the probe file is gone again
    checks = {c.name: c.status for c in judge(facts, loaders["n7"], CPU, str(tmp_path))}
    assert checks["shared-fs"] == checks["memory"] == checks["loader:libc.so.6"] == "ok"
    assert "FAIL" not in checks.values(), checks


@pytest.mark.parametrize(("loader", "cpus_per_node", "cpus"), [
    (["--library", "libc.so.6"], "2(x2)", 2),      # both checks, two CPUs on every node: one each
    (["--library", "libc.so.6"], "96(x3),2", 2),   # never more than the two checks use
    (["--library", "libc.so.6"], "4,1", 1),        # a node with one CPU: a step asking two would be refused
    (["--library", "libc.so.6"], "", 1),           # unknown (outside a job)
    ([], "8(x2)", 1),                              # the node check alone
])
def test_the_node_step_asks_a_cpu_per_check_where_every_node_of_the_job_has_them(loader, cpus_per_node, cpus):
    from toolkit.node.slurm import cpus_per_node as parse

    argv = preflight.step_argv(2, "/fsx/run", CPU, loader, "", parse(cpus_per_node))
    assert [a for a in argv if a.startswith("--cpus-per-task")] == [f"--cpus-per-task={cpus}"]


def test_the_jobs_cpus_per_node_are_read_as_slurm_writes_them():
    from toolkit.node.slurm import cpus_per_node

    assert cpus_per_node("72(x2),36") == [72, 72, 36]
    assert cpus_per_node("2(x2)") == [2, 2] and cpus_per_node("4") == [4]
    assert cpus_per_node("") == cpus_per_node("4(x)") == cpus_per_node("four") == []


def test_the_loader_check_runs_beside_the_node_check_and_the_step_keeps_the_node_checks_status(tmp_path):
    """The step's own shell, with each check's source swapped for a probe: the node check waits (up to 10 s) for a
    file the loader check makes, so it sees the file only if both run at once. Both lines still come out, the
    loader's after the node's, and the step's status is the node check's."""
    mark = tmp_path / "loader-started"
    node = ("import os, sys, time\nend = time.time() + 10\nwhile not os.path.exists(%r) and time.time() < end:\n"
            "    time.sleep(0.01)\nprint('{\"node\": \"n7\", \"beside\": %%s}' %% str(os.path.exists(%r)).lower())\n"
            "sys.exit(3)\n" % (str(mark), str(mark)))
    loader = "open(%r, 'w').close(); print('{\"node\": \"n7\", \"libraries\": []}')" % str(mark)
    script = step_script(preflight.step_argv(1, str(tmp_path), CPU, ["--library", "libc.so.6"]))
    script[4:6] = [node, loader]  # bash -c SCRIPT preflight NODE LOADER COUNT PY ...
    res = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert [json.loads(line) for line in res.stdout.splitlines()] == [{"node": "n7", "beside": True},
                                                                      {"node": "n7", "libraries": []}]


def test_the_loader_check_runs_on_the_jobs_python3_with_site_packages_only_where_it_asks_for_torch():
    """The loader check is the job's python3 (its RPATH takes part in dlopen's search), without site-packages
    unless it asks where the job's torch is; the node check is the batch shell's interpreter (HPC_PYTHON)."""
    plain = step_script(preflight.step_argv(1, "/fsx/run", CPU, ["--program", "/fsx/bin/all_reduce_perf"]))[2]
    torch = step_script(preflight.step_argv(1, "/fsx/run", CPU, ["--torch-nccl"]))[2]
    assert '"$lp" -S -c "$loader"' in plain and '"$lp" -c "$loader"' not in plain
    assert '"$lp" -c "$loader"' in torch and '"$py" -S -c "$node"' in torch


def loader_interpreter(tmp_path: Path, job_python3: str) -> str:
    """The interpreter the step's loader check runs on (its sys.executable), as a node's step runs it, with the
    loader check's source swapped for one that prints it; the PATH's python3 is a shim that says it ran."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "python3").write_text(f'#!/bin/sh\necho shim >&2\nexec {sys.executable} "$@"\n')
    (shims / "python3").chmod(0o755)
    script = step_script(preflight.step_argv(1, str(tmp_path), CPU, ["--library", "libc.so.6"], job_python3))
    script[5] = "import json, sys; print(json.dumps({'node': 'n7', 'libraries': [], 'python': sys.executable}))"
    res = subprocess.run(script, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURMD_NODENAME": "n7"})
    assert res.returncode == 0, res.stderr
    _reports, loaders = preflight.parse_reports(res.stdout)
    return ("shim " if "shim" in res.stderr else "") + loaders["n7"]["python"]


def test_the_loader_check_starts_the_finders_interpreter_where_it_is_the_jobs_python3(tmp_path):
    """The batch shell's finder passes the interpreter behind the job's python3 (--job-python3): the loader check
    starts it by that path, not through the PATH's shim; without one (the finder passed over the job's python3),
    or where a node lacks that path, it is the PATH's python3, as the job's processes start it."""
    assert loader_interpreter(tmp_path, sys.executable) == sys.executable
    assert loader_interpreter(tmp_path, "") == "shim " + sys.executable
    assert loader_interpreter(tmp_path, str(tmp_path / "not-on-this-node")) == "shim " + sys.executable


def test_a_gpu_queue_step_asks_for_every_gpu():
    """A step without GPUs sees none where the cgroup constrains devices: the check would fail every node."""
    assert "--gpus-per-node=8" in preflight.step_argv(2, "/fsx/run", P3DN, [])
    assert not any(a.startswith("--gpus") for a in preflight.step_argv(2, "/fsx/run", CPU, []))


def test_a_missing_run_dir_low_memory_and_a_full_disk_each_fail_with_their_fix(tmp_path):
    root = tmp_path / "node"
    write(root / "proc/meminfo", "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:     400000 kB\n")
    facts = gather(Node(str(root), {"PATH": "/usr/bin"}), probe_dir="/shared/run", disk_paths=["/tmp"])
    assert facts["probe"]["writable"] is False and "FileNotFoundError" in facts["probe"]["error"]
    facts["disk"] = {"/shared/run": None, "/tmp": 200 << 20}  # 200 MiB left where the job writes
    failed = {c.name: c for c in judge(facts, None, CPU, "/shared/run") if c.status == "FAIL"}
    assert set(failed) == {"shared-fs", "memory", "disk"}
    assert "/shared/run cannot be written from this node" in failed["shared-fs"].detail
    assert failed["memory"].detail == "0.4 GiB of 15.6 GiB available" and "ps aux" in failed["memory"].fix
    assert failed["disk"].detail == "0.2 GiB free at /tmp" and "df -h /tmp" in failed["disk"].fix


def test_stand_in_gpus_with_memory_errors_fail_the_preflight_on_a_gpu_queue(tmp_path):
    """A stand-in for a GPU with ECC errors (a fake nvidia-smi; no GPU here) on an otherwise healthy p3dn node."""
    root = healthy_tree(tmp_path)
    fake_nvidia_smi(root, 8, ecc={2: 1})
    write(root / "proc/meminfo", "MemTotal: 800000000 kB\nMemAvailable: 790000000 kB\n")
    (root / "fsx/run").mkdir(parents=True)
    facts = gather(Node(str(root), {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "p3dn-1"}), ["/fsx"],
                   probe_dir="/fsx/run")
    failed = failures({"p3dn-1": facts}, {}, ["p3dn-1", "p3dn-2"], P3DN, "/fsx/run", None)
    assert [c["name"] for c in failed["p3dn-1"]] == ["gpu-health"]
    assert failed["p3dn-2"][0]["name"] == "report"  # no report came back from it
    assert preflight.one_line({"p3dn-1": failed["p3dn-1"]}).startswith(
        "p3dn-1: gpu-health: GPU 2 (00000000:12:1C.0): 1 uncorrected ECC error(s)")


DISK = [{"name": "disk"}]
LOADER = [{"name": "loader:libnccl.so.2"}]


@pytest.mark.parametrize("failed, nodes, spares, requeue, earlier, room, action", [
    ({}, ["a", "b"], 0, True, 0, None, "go"),
    ({"b": DISK}, ["a", "b"], 0, True, 0, None, "requeue"),
    ({"b": DISK}, ["a", "b"], 0, True, 0, 2, "requeue"),  # the partition still has 2 nodes for it
    ({"b": DISK}, ["a", "b"], 0, True, 0, 1, "stop"),  # excluding b leaves 1: it would pend forever
    ({"b": DISK}, ["a", "b"], 1, True, 0, None, "go"),  # the spares supervisor leaves it out
    ({"a": DISK, "b": DISK}, ["a", "b", "c"], 1, True, 0, None, "requeue"),  # more failed than spares
    ({"a": DISK, "b": DISK}, ["a", "b"], 0, True, 0, None, "stop"),  # every node: not a node's fault
    ({"a": DISK}, ["a"], 0, True, 0, None, "requeue"),  # one node: cannot tell, bounded by MAX_REQUEUES
    ({"a": LOADER}, ["a"], 0, True, 0, None, "stop"),  # the job's own environment, on any node
    ({"b": LOADER}, ["a", "b"], 0, True, 0, None, "requeue"),  # one node's libraries differ from the others'
    ({"b": DISK}, ["a", "b"], 0, True, preflight.MAX_REQUEUES, None, "stop"),
    ({"b": DISK}, ["a", "b"], 0, False, 0, None, "stop"),  # a benchmark is never requeued
])
def test_what_a_failed_preflight_does(failed, nodes, spares, requeue, earlier, room, action):
    assert decide(failed, nodes, spares, requeue, earlier, room)[0] == action


def test_an_array_task_is_named_as_scontrol_takes_it(monkeypatch):
    """A sweep's task: SLURM_JOB_ID of its first task is the array's own id, which scontrol takes for every task."""
    monkeypatch.setenv("SLURM_JOB_ID", "1528")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert preflight.job_reference() == "1528"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1528")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert preflight.job_reference() == "1528_0"


def test_the_exclude_helper_job_quotes_what_reaches_its_shell_and_writes_nothing(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    argv = preflight.exclude_job_argv("1234", ["w2", "w5"], "wide", "proj-a")
    assert {"--job-name=hpc-exclude-1234", "--output=/dev/null", "--chdir=/", "--no-requeue", "--partition=wide",
            "--account=proj-a", "--export=SLURM_CONF"} <= set(argv)
    wrap = argv[argv.index("--wrap") + 1]
    assert "update JobId=1234 ExcNodeList=w2,w5" in wrap and "release 1234" in wrap
    assert subprocess.run(["bash", "-n", "-c", wrap]).returncode == 0


def test_a_waiter_sees_a_fresh_requeue_by_the_preflight_as_a_hold_that_ends():
    now = time.time()
    requeued = {"job": "7", "time": now - 5, "action": "requeued, excluding w2 (job 8 excludes them ...)"}
    assert preflight.awaiting_release([requeued], now) == requeued
    assert preflight.awaiting_release([], now) is None  # no pre-flight of this job requeued it
    assert preflight.awaiting_release([{**requeued, "time": now - 3600}], now) is None  # a hold that stays
    assert preflight.awaiting_release([requeued, {"job": "7", "time": now, "action": "passed"}], now) is None


def test_a_benchmark_whose_nodes_all_fail_stops_with_one_line_and_a_record(tmp_path, monkeypatch, capsys):
    """main() as the batch shell runs it, with a stub srun and scontrol standing in for Slurm's (named so): every
    node's task reports a run dir it cannot write; nothing is requeued, the job stops with status 1."""
    bin_dir = tmp_path / "bin"
    write(bin_dir / "scontrol", '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\n"\n', 0o755)
    # what a node whose shared file system is gone reports (gathered from an empty node tree)
    node_report = json.dumps(gather(Node(str(tmp_path / "empty"), {"SLURMD_NODENAME": "NODE"}),
                                    probe_dir="/shared/run"))
    write(bin_dir / "srun", "#!/bin/sh\n" + "".join(
        f"echo {shlex.quote(node_report.replace('NODE', n))}\n" for n in ("n1", "n2")), 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert preflight.main(["--run-dir", str(run_dir), "--promise", CPU.to_json(), "--partition", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "hpc: pre-flight: FAILED on n1: shared-fs: the run dir" in out
    assert "job 41 stops (every node fails: the job's environment or the queue's, not a node's)" in out
    record = json.loads((run_dir / "preflight.jsonl").read_text())
    assert record["job"] == "41" and set(record["failed"]) == {"n1", "n2"}
    assert record["action"].startswith("stopped: every node fails")


def test_a_script_run_as_the_program_is_not_traced_by_the_loader():
    """A `binary` launcher's program may be a #! script: no loader trace applies (its interpreter loads what it
    needs), so the pre-flight does not fail it."""
    from toolkit.node.loader_check import program_facts

    facts = program_facts(str(Path(__file__).parent / "payloads" / "probe.py"))
    assert [f["resolves"] for f in facts] == [None] and "is a script" in facts[0]["detail"]


def test_a_missing_program_is_named_as_the_program_not_as_a_library(tmp_path):
    """A fault probe's recipe named a program that does not exist: the pre-flight said `loader:libnccl: libnccl
    does not resolve` and pointed at software.library_path, on a CPU queue. It is the program's own check now, and
    every node failing it stops the job (no node fixes it)."""
    from toolkit.node.loader_check import program_facts

    missing = str(tmp_path / "nope.sh")
    facts = program_facts(missing)
    assert [(f["library"], f["detail"]) for f in facts] == [("program", f"{missing} does not exist on this node")]
    [check] = preflight.loader_checks({"libraries": facts})
    assert (check.name, check.status) == ("program", "FAIL") and "launcher.program" in check.fix
    assert "libnccl" not in check.detail and "library_path" not in check.fix
    assert decide({"n1": [{"name": check.name}]}, ["n1"], spares=0, requeue=True, requeues_so_far=0)[0] == "stop"


def test_a_jobs_records_are_its_own_and_a_sweep_tasks_are_read_from_the_sweep_dir(tmp_path):
    from toolkit.rundir import RunDir

    sweep = RunDir(tmp_path / "sweep")
    sweep.path.mkdir()
    for job in ("7_0", "7_1", "9"):
        sweep.add_preflight({"job": job, "action": "passed"})
    task = RunDir(tmp_path / "sweep" / "task-001")
    assert [r["job"] for r in task.preflights("7_1")] == ["7_1"]  # the task's batch shell wrote to the sweep dir
    assert [r["job"] for r in sweep.preflights()] == ["7_0", "7_1", "9"]
    assert RunDir(tmp_path / "other").preflights("9") == []
