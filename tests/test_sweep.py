"""Sweep grids, their validation before anything is submitted, and how an array's status is summarised."""

from __future__ import annotations

import subprocess

import pytest

from tests.jobhelpers import probe_recipe, write_cluster
from toolkit.errors import HpcError, UsageError
from toolkit.slurm import status as slurm_status
from toolkit.submit import runs, sweep
from toolkit.submit import rundir
from toolkit.submit.plan import SubmitRequest


def test_values_ranges_and_escaped_commas():
    assert sweep.parse_sweep("args.--lr=0.1,0.2") == ("args.--lr", ["0.1", "0.2"])
    assert sweep.parse_sweep("args.--seed=1..3,7") == ("args.--seed", ["1", "2", "3", "7"])
    assert sweep.parse_sweep("args.--x=-2..0") == ("args.--x", ["-2", "-1", "0"])
    assert sweep.parse_sweep(r"args.--text=a\,b,c\\d") == ("args.--text", ["a,b", "c\\d"])
    assert sweep.parse_sweep("args.--text=a=b") == ("args.--text", ["a=b"])
    for value in ["a,b", "x\\", "\\,", ",,", "1..2"]:
        assert sweep.split_values(sweep.escape_value(value)) == [value]


@pytest.mark.parametrize("item, words", [
    ("args.--lr", "not KEY.PATH=V1,V2"), ("=1,2", "not KEY.PATH"), ("args..x=1", "not KEY.PATH"),
    ("args.--lr=0.1,,0.2", "value 2 is empty"), ("args.--lr=", "value 1 is empty"),
    ("args.--seed=5..1", "range 5..1 is empty"),
])
def test_malformed_sweeps_are_usage_errors(item, words):
    with pytest.raises(UsageError, match=words):
        sweep.parse_sweep(item)


def test_the_grid_is_the_cartesian_product_first_option_slowest():
    points = sweep.grid(["args.--a=1,2", "args.--b=x,y,z"])
    assert [p.overrides for p in points] == [
        ("args.--a=1", "args.--b=x"), ("args.--a=1", "args.--b=y"), ("args.--a=1", "args.--b=z"),
        ("args.--a=2", "args.--b=x"), ("args.--a=2", "args.--b=y"), ("args.--a=2", "args.--b=z")]
    assert [p.index for p in points] == list(range(6))
    with pytest.raises(UsageError, match="given twice"):
        sweep.grid(["args.--a=1", "args.--a=2"])
    with pytest.raises(UsageError, match="1 given more than once"):
        sweep.grid(["args.--a=1,2,1"])


def _request(tmp_path, executor: str = "slurm") -> SubmitRequest:
    return SubmitRequest(str(probe_recipe(tmp_path)), nodes=1, cluster=str(write_cluster(tmp_path)), queue="cpu",
                         executor=executor)


def test_every_point_is_validated_and_a_bad_one_is_named(tmp_path):
    with pytest.raises(HpcError) as err:
        sweep.plan(_request(tmp_path), ["args.--count=1..60", "resources.time=00:10:00,ten minutes"],
                   sweep_dir=tmp_path / "sweep")
    assert "sweep point 1 (args.--count=1, resources.time=ten minutes)" in err.value.message
    assert "resources.time" in err.value.message and err.value.fix


def test_a_point_that_changes_the_batch_script_is_refused(tmp_path):
    with pytest.raises(HpcError) as err:
        sweep.plan(_request(tmp_path), ["env.OMP_NUM_THREADS=1,2"], sweep_dir=tmp_path / "sweep")
    assert "sweep point 1 (env.OMP_NUM_THREADS=2) changes the job's setup" in err.value.message
    assert "args.*" in err.value.fix
    with pytest.raises(HpcError, match="changes the job's time"):
        sweep.plan(_request(tmp_path), ["resources.time=00:10:00,00:20:00"], sweep_dir=tmp_path / "sweep")


def test_the_local_executor_cannot_run_a_sweep(tmp_path):
    request = _request(tmp_path, executor="local")
    with pytest.raises(UsageError, match="Slurm job array"):
        sweep.plan(request, ["args.--count=1,2"], sweep_dir=tmp_path / "sweep")


def test_a_plan_gives_each_task_its_own_run_dir_and_argv(tmp_path):
    tasks = sweep.plan(_request(tmp_path), ["args.--count=7,8"], sweep_dir=tmp_path / "sweep").tasks
    assert [t.run_dir.name for t in tasks] == ["task-000", "task-001"]
    assert [t.spec.run_dir for t in tasks] == [str(tmp_path / "sweep" / "task-000"), str(tmp_path / "sweep" / "task-001")]
    assert [t.spec.command[t.spec.command.index("--count") + 1] for t in tasks] == ["7", "8"]


def _fake_slurm(monkeypatch, sacct_out: str) -> None:
    def run(args, timeout=20.0, check=True, input=None):
        return subprocess.CompletedProcess(args, 0 if args[0] == "sacct" else 1, sacct_out, "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)


def test_pending_array_rows_count_as_pending_tasks_and_own_rows_win(monkeypatch):
    _fake_slurm(monkeypatch, "7_[2-5%2]|PENDING|0:0|00:00:00||JobArrayTaskLimit\n7_0|COMPLETED|0:0|00:00:01|c1|None\n"
                             "7_1|RUNNING|0:0|00:00:01|c2|None\n7_2|RUNNING|0:0|00:00:00|c1|None\n")
    found = slurm_status.query(["7"])
    assert {k: s.state for k, s in found.items()} == {
        "7_0": "COMPLETED", "7_1": "RUNNING", "7_2": "RUNNING", "7_3": "PENDING", "7_4": "PENDING", "7_5": "PENDING"}
    assert slurm_status.array_task_ids("9", "1,3-4%8") == ["9_1", "9_3", "9_4"]


def _sweep_dir(tmp_path, count: int):
    meta = {"kind": "sweep", "array_job_id": "7", "tasks": count, "recipe": "probe", "nodes": 1, "job_ids": ["7"]}
    run = tmp_path / "runs" / "probe-sweep-x"
    for i in range(count):
        (run / rundir.task_dir_name(i, count)).mkdir(parents=True)

    rundir.write_json(run / "metadata.json", meta)
    return run, meta


def test_summary_waits_for_pending_tasks_and_falls_back_to_task_run_dirs(tmp_path, monkeypatch):
    run, meta = _sweep_dir(tmp_path, 4)
    _fake_slurm(monkeypatch, "7_0|COMPLETED|0:0|00:00:01|c1|None\n7_[1-3]|PENDING|0:0|00:00:00||None\n")
    s = runs.status("7")
    assert (s.state, s.tasks) == ("PENDING", {"COMPLETED": 1, "PENDING": 3})
    # Slurm forgot the tasks (no accounting, MinJobAge): their run dirs say how they ended.
    _fake_slurm(monkeypatch, "")
    monkeypatch.setattr("toolkit.slurm.status._from_sacct", lambda ids: None)

    for i in range(4):
        if i == 2:
            (run / "task-002" / "failures").mkdir()
            rundir.write_json(run / "task-002" / "failures" / "rank-0.json", {"rank": 0, "exit_code": 3})
        else:
            rundir.write_json(run / f"task-{i:03d}" / "result.json", {"ok": True})
    s = runs.status("7")
    assert (s.state, s.tasks, s.source) == ("FAILED", {"COMPLETED": 3, "FAILED": 1}, "run-dir")
    task = runs.status("7_2")
    assert (task.state, task.run_dir) == ("FAILED", str(run / "task-002"))
    with pytest.raises(HpcError, match="no task 7_9"):
        runs.status("7_9")
    [row] = runs.list_statuses()
    assert (row.job_id, row.state, row.tasks) == ("7", "FAILED", {"COMPLETED": 3, "FAILED": 1})


def test_nothing_known_yet_is_unknown_not_failed(tmp_path, monkeypatch):
    """Right after submission sacct may not list the tasks yet: --wait must keep waiting."""
    _sweep_dir(tmp_path, 3)
    _fake_slurm(monkeypatch, "")
    s = runs.status("7")
    assert s.state == "UNKNOWN" and not s.done


def test_tasks_accounting_has_not_recorded_yet_are_taken_from_the_controller(tmp_path, monkeypatch):
    """Seen on the local Slurm: 1 s after submission sacct knew task 0 only; the array is not FAILED then."""
    _sweep_dir(tmp_path, 3)

    def run(args, timeout=20.0, check=True, input=None):
        out = {"sacct": "7_0|RUNNING|0:0|00:00:01|c1|None\n",
               "squeue": "7_0|RUNNING|c1|0:01|None\n7_1|PENDING||0:00|None\n7_2|PENDING||0:00|None\n"}.get(args[0], "")
        return subprocess.CompletedProcess(args, 0, out, "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)
    s = runs.status("7")
    assert (s.state, s.tasks) == ("RUNNING", {"RUNNING": 1, "PENDING": 2})
