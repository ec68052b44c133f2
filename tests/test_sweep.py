"""Sweep grids, their validation before anything is submitted, and how an array's status is summarised."""

from __future__ import annotations

import subprocess

import pytest

from tests.jobhelpers import probe_recipe, write_cluster
from toolkit.errors import HpcError, UsageError
from toolkit.slurm import status as slurm_status
from toolkit import rundir
from toolkit.rundir import Metadata
from toolkit.submit import runs, sweep
from toolkit.submit import plan as plans
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


def test_an_empty_sweep_is_not_told_to_remove_a_comma_it_has_not():
    with pytest.raises(UsageError) as err:
        sweep.parse_sweep("args.--seed=")
    assert err.value.fix == "give the values after the =: --sweep args.--seed=V1,V2,..."
    with pytest.raises(UsageError) as err:
        sweep.parse_sweep("args.--seed=1,,2")
    assert "remove the extra comma" in err.value.fix


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
    # the lines that differ, not the two set-ups whole (with the node bundle, 200 KB of message)
    assert ("sweep point 1 (env.OMP_NUM_THREADS=2) changes the job's setup ('export OMP_NUM_THREADS=1' -> "
            "'export OMP_NUM_THREADS=2')") in err.value.message and len(err.value.message) < 400
    assert "args.*" in err.value.fix
    with pytest.raises(HpcError, match=r"changes the job's time \('00:10:00' -> '00:20:00'\)"):
        sweep.plan(_request(tmp_path), ["resources.time=00:10:00,00:20:00"], sweep_dir=tmp_path / "sweep")


def test_the_local_executor_cannot_run_a_sweep(tmp_path):
    request = _request(tmp_path, executor="local")
    with pytest.raises(UsageError, match="Slurm job array"):
        sweep.plan(request, ["args.--count=1,2"], sweep_dir=tmp_path / "sweep")


def test_a_plan_gives_each_task_its_own_run_dir_and_argv(tmp_path):
    tasks = sweep.plan(_request(tmp_path), ["args.--count=7,8"], sweep_dir=tmp_path / "sweep").tasks
    assert [t.run_dir.name for t in tasks] == ["task-000", "task-001"]
    assert [t.spec.run_dir for t in tasks] == [str(tmp_path / "sweep" / "task-000"),
                                               str(tmp_path / "sweep" / "task-001")]
    assert [t.spec.command[t.spec.command.index("--count") + 1] for t in tasks] == ["7", "8"]


def _roberta_request(tmp_path, *overrides: str) -> SubmitRequest:
    return SubmitRequest("roberta", nodes=1, cluster=str(write_cluster(tmp_path)), queue="cpu", executor="slurm",
                         overrides=overrides)


def test_each_point_checkpoints_and_logs_in_its_own_run_dir(tmp_path):
    """roberta's checkpoints are under the dirs root (/shared/checkpoints/roberta on this cluster): fairseq would
    resume each point from the other's checkpoint_last.pt. In a sweep they go under each task's run dir."""
    tasks = sweep.plan(_roberta_request(tmp_path, "dirs.logs.dir=logs/roberta"),
                       ["args.--weight-decay=0.0,0.01"], sweep_dir=tmp_path / "sweep").tasks
    for task in tasks:
        assert task.spec.dirs["checkpoints"] == f"{task.run_dir}/checkpoints/roberta"
        assert task.spec.dirs["logs"] == f"{task.run_dir}/logs/roberta"
        assert task.spec.command[task.spec.command.index("--save-dir") + 1] == task.spec.dirs["checkpoints"]
        assert task.spec.dirs["data"] == "/shared/data-bin/wikitext-103"  # read by all: stays shared
    # a single submission owns its dirs too (issue 31: a second run never continues the first)
    single = plans.plan(_roberta_request(tmp_path), tmp_path / "single")
    assert single.spec.dirs["checkpoints"] == f"{tmp_path}/single/checkpoints/roberta"


@pytest.mark.parametrize("overrides,sweeps", [
    (("dirs.checkpoints.dir=/shared/ckpt",), ["args.--weight-decay=0.0,0.01"]),
    ((), ["args.--weight-decay=0.0,0.01", "dirs.checkpoints.under=run,root"]),
])
def test_points_that_would_share_a_checkpoint_dir_are_refused(tmp_path, overrides, sweeps):
    with pytest.raises(HpcError) as err:
        sweep.plan(_roberta_request(tmp_path, *overrides), sweeps, sweep_dir=tmp_path / "sweep")
    assert "share the checkpoints dir" in err.value.message and "resume from the other's" in err.value.message
    assert "relative path" in err.value.fix


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


def test_every_earlier_start_of_a_job_is_a_requeue_and_a_running_jobs_pending_reason_is_gone(monkeypatch):
    """sacct -D lists each start of a job. A fault probe set a node down mid-job: NODE_FAIL, then the job ran
    again (Slurm: Restarts=1), and hpc counted no requeue, and showed 'reason: BeginTime' for the running job (the
    reason it last pended)."""
    _fake_slurm(monkeypatch, "12|NODE_FAIL|0:0|00:00:09|c2|None\n12|RUNNING|0:0|00:00:04|c1|BeginTime\n"
                             "13|REQUEUED|0:0|00:00:03|c1|None\n13|PREEMPTED|0:0|00:00:02|c1|None\n"
                             "13|PENDING|0:0|00:00:00||BeginTime\n14|COMPLETED|0:0|00:00:05|c1|None\n")
    found = slurm_status.query(["12", "13", "14"])
    assert {k: (s.state, s.requeues, s.reason) for k, s in found.items()} == {
        "12": ("RUNNING", 1, None), "13": ("PENDING", 2, "BeginTime"), "14": ("COMPLETED", 0, None)}


def _sweep_dir(tmp_path, count: int):
    meta = {"kind": "sweep", "array_job_id": "7", "arrays": [{"job_id": "7", "first": 0, "count": count}],
            "tasks": count, "recipe": "probe", "nodes": 1, "job_ids": ["7"]}
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


def test_tasks_accounting_has_not_recorded_yet_are_pending_not_failed(tmp_path, monkeypatch):
    """Seen on the local Slurm: 1 s after submission sacct knew task 0 only. Accounting forgets nothing, so the
    tasks it lacks were submitted and not recorded yet: pending, and --wait keeps waiting (no second query)."""
    _sweep_dir(tmp_path, 3)
    calls = _recording_slurm(monkeypatch, sacct="")
    s = runs.status("7")
    assert (s.state, s.tasks, s.done) == ("PENDING", {"PENDING": 3}, False)
    calls.clear()
    _recording_slurm(monkeypatch, sacct="7_0|COMPLETED|0:0|00:00:01|c1|None\n", calls=calls)
    s = runs.status("7")
    assert (s.state, s.tasks, s.done) == ("PENDING", {"COMPLETED": 1, "PENDING": 2}, False)
    assert [c[0] for c in calls] == ["sacct"]


def test_a_task_accounting_lacks_is_not_ended_by_its_run_dirs_result(tmp_path, monkeypatch):
    """Seen in a full run on the local Slurm: tasks 0 and 1 had ended, task 2 ran; sacct had neither the row of
    the tasks not started (gone when task 2 started) nor task 2's own (not recorded yet), and task 2's rank 0 had
    written its result.json. The sweep's --wait took the run dir's word and ended while Slurm still ran task 2."""
    run, _meta = _sweep_dir(tmp_path, 3)
    rundir.write_json(run / "task-002" / "result.json", {"ok": True})
    _recording_slurm(monkeypatch, sacct="7_0|COMPLETED|0:0|00:00:01|c1|None\n7_1|FAILED|3:0|00:00:01|c1|None\n")
    s = runs.status("7")
    assert (s.state, s.tasks, s.done) == ("RUNNING", {"COMPLETED": 1, "FAILED": 1, "RUNNING": 1}, False)
    _recording_slurm(monkeypatch, sacct="7_0|COMPLETED|0:0|00:00:01|c1|None\n7_1|FAILED|3:0|00:00:01|c1|None\n"
                                        "7_2|COMPLETED|0:0|00:00:02|c1|None\n")
    assert (runs.status("7").state, runs.status("7").done) == ("FAILED", True)


# -- sweeps larger than MaxArraySize: chunks, one array each, and one Slurm call per status poll -------------------

def test_chunks_keep_every_array_below_max_array_size_for_10000_tasks():
    parts = sweep.chunks(10_000, 1001)
    assert [len(c) for c in parts] == [1001] * 9 + [991]
    assert [i for c in parts for i in c] == list(range(10_000))  # every task once, in order
    assert [(c.start, c.stop) for c in sweep.chunks(250, 101)] == [(0, 101), (101, 202), (202, 250)]
    assert sweep.chunks(101, 101) == (range(0, 101),) and sweep.chunks(1, 101) == (range(0, 1),)


def test_the_limit_is_the_clusters_capped_by_the_environment(monkeypatch):
    calls = _recording_slurm(monkeypatch, scontrol="MaxArraySize            = 101\nMaxJobCount = 10000\n")
    monkeypatch.delenv(sweep.MAX_ARRAY_SIZE_ENV, raising=False)
    assert sweep.array_limit()[0] == 101 and calls == [["scontrol", "show", "config"]]
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "40")
    assert sweep.array_limit()[0] == 40
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "500")
    assert sweep.array_limit()[0] == 101  # the cap never raises the cluster's limit
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "ten")
    with pytest.raises(HpcError, match="HPC_MAX_ARRAY_SIZE='ten'") as err:
        sweep.array_limit()
    assert err.value.fix

    def no_slurm(args, timeout=20.0, check=True, input=None):
        raise HpcError("Slurm's `scontrol` is not installed here", fix="x")
    monkeypatch.setattr("toolkit.slurm.commands.run", no_slurm)
    monkeypatch.delenv(sweep.MAX_ARRAY_SIZE_ENV)
    assert sweep.array_limit()[0] == sweep.SLURM_DEFAULT_MAX_ARRAY_SIZE  # a dry run away from Slurm


def test_the_plan_shows_the_chunking(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "2")
    sp = sweep.plan(_request(tmp_path), ["args.--count=1..5"], sweep_dir=tmp_path / "sweep")
    data = sp.to_json()
    assert (data["max_array_size"], data["arrays"]) == (2, [{"first": 0, "count": 2}, {"first": 2, "count": 2},
                                                            {"first": 4, "count": 1}])
    assert "#SBATCH --array=0-1" in data["batch_script"]  # submitit numbers each array from 0


def _stub_submission(monkeypatch, refuse_at: int | None = None) -> list[list[str]]:
    """Stand-in for sbatch (submitit) and the preflight: array k gets job id 500+k; scancel calls recorded."""
    submitted: list[range] = []

    def submit_array(sp, chunk):
        if len(submitted) == refuse_at:
            raise HpcError("Slurm refused the job: QOSMaxSubmitJobPerUserLimit", fix="x")
        submitted.append(chunk)
        return str(500 + len(submitted) - 1)
    monkeypatch.setattr(sweep, "_submit_array", submit_array)
    monkeypatch.setattr("toolkit.slurm.targets.SubmititSlurm.check", lambda self, p: None)
    return _recording_slurm(monkeypatch)


def test_execute_records_every_array_and_each_tasks_place_in_it(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "3")
    sp = sweep.plan(_request(tmp_path), ["args.--count=1..7"], sweep_dir=tmp_path / "sweep")
    _stub_submission(monkeypatch)
    assert sweep.execute(sp) == "500"
    meta = rundir.read_json(sp.sweep_dir / "metadata.json")
    assert meta["arrays"] == [{"job_id": "500", "first": 0, "count": 3}, {"job_id": "501", "first": 3, "count": 3},
                              {"job_id": "502", "first": 6, "count": 1}]
    assert (meta["job_ids"], meta["array_job_id"], meta["max_array_size"]) == (["500", "501", "502"], "500", 3)
    tasks = [rundir.read_json(sp.sweep_dir / f"task-{i:03d}" / "metadata.json") for i in range(7)]
    assert [t["job_ids"] for t in tasks] == [["500_0"], ["500_1"], ["500_2"], ["501_0"], ["501_1"], ["501_2"],
                                             ["502"]]  # submitit sends a one-task batch as a plain job
    assert [(t["task_index"], t["array_task"]) for t in tasks] == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2),
                                                                   (6, 0)]
    assert Metadata.from_json(meta).task_ids == [j for t in tasks for j in t["job_ids"]]
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path))
    assert runs.cancel_ids("501") == runs.cancel_ids(sp.sweep_dir.name) == ["500", "501", "502"]
    assert runs.cancel_ids("501_2") == ["501_2"]


def test_a_refused_later_array_cancels_the_earlier_ones_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.MAX_ARRAY_SIZE_ENV, "2")
    sp = sweep.plan(_request(tmp_path), ["args.--count=1..5"], sweep_dir=tmp_path / "sweep")
    calls = _stub_submission(monkeypatch, refuse_at=2)
    with pytest.raises(HpcError, match="QOSMaxSubmitJobPerUserLimit"):
        sweep.execute(sp)
    assert calls == [["scancel", "500", "501"]]
    assert not sp.sweep_dir.exists()


def _recording_slurm(monkeypatch, sacct: str | None = None, squeue: str = "", scontrol: str = "",
                     calls: list | None = None) -> list[list[str]]:
    """A recording stand-in for toolkit.slurm.commands.run: every Slurm call, and canned answers (sacct=None:
    accounting is disabled, as ParallelCluster ships)."""
    calls = [] if calls is None else calls

    def run(args, timeout=20.0, check=True, input=None):
        calls.append(list(args))
        if args[0] == "sacct" and sacct is None:
            return subprocess.CompletedProcess(args, 1, "", "sacct: error: accounting storage is disabled")
        out = {"sacct": sacct, "squeue": squeue, "scontrol": scontrol}.get(args[0], "")
        return subprocess.CompletedProcess(args, 0, out or "", "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)
    return calls


def _big_sweep(tmp_path, count: int = 10_000, limit: int = 1001):
    """A 10,000-task sweep's metadata as execute() writes it: arrays 9000, 9001, ... of `limit` tasks."""
    arrays = [{"job_id": str(9000 + k), "first": c.start, "count": len(c)}
              for k, c in enumerate(sweep.chunks(count, limit))]
    run = tmp_path / "runs" / "probe-sweep-big"
    run.mkdir(parents=True)
    meta = {"kind": "sweep", "array_job_id": "9000", "arrays": arrays, "tasks": count, "recipe": "probe", "nodes": 1,
            "job_ids": [a["job_id"] for a in arrays]}
    rundir.write_json(run / "metadata.json", meta)
    return run, arrays


def test_a_10000_task_status_poll_is_one_slurm_call(tmp_path, monkeypatch):
    run, arrays = _big_sweep(tmp_path)
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    # sacct -X: finished/running tasks one row each, not-yet-started tasks of an array one "ID_[a-b]" row.
    rows = [f"{a['job_id']}_{n}|COMPLETED|0:0|00:00:01|c1|None" for a in arrays[:9] for n in range(a["count"])]
    rows[17] = "9000_17|FAILED|1:0|00:00:01|c1|None"
    rows += ["9009_0|RUNNING|0:0|00:00:01|c1|None", "9009_[1-990%256]|PENDING|0:0|00:00:00||JobArrayTaskLimit"]
    calls = _recording_slurm(monkeypatch, sacct="\n".join(rows) + "\n")
    for sweep_id in ["9000", "9004", run.name]:  # any array's id, or the sweep's dir name
        calls.clear()
        s = runs.status(sweep_id)
        assert (s.job_id, s.state, s.tasks) == ("9000", "RUNNING", {"COMPLETED": 9008, "FAILED": 1, "RUNNING": 1,
                                                                   "PENDING": 990})
        assert len(calls) == 1 and calls[0][0] == "sacct"
        assert calls[0][calls[0].index("-j") + 1] == ",".join(a["job_id"] for a in arrays)
    calls.clear()
    task = runs.status("9009_990")  # the sweep's last task, 9999
    assert (task.state, task.run_dir) == ("PENDING", str(run / "task-9999")) and len(calls) == 1
    calls.clear()
    [row] = runs.list_statuses()
    assert (row.job_id, row.tasks["COMPLETED"]) == ("9000", 9008) and len(calls) == 1
    with pytest.raises(HpcError, match="no task 9009_991") as err:
        runs.status("9009_991")
    assert "9000_0 .. 9000_1000" in err.value.fix and "9009_0 .. 9009_990" in err.value.fix


def test_without_accounting_a_poll_is_one_squeue_for_all_arrays(tmp_path, monkeypatch):
    run, arrays = _big_sweep(tmp_path)
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    # squeue -r: one row per task the controller holds; the rest it forgot, and their run dirs say how they ended
    rows = [f"{a['job_id']}_{n}|RUNNING|c1|0:01|None" for a in arrays[5:] for n in range(a["count"])]
    for i in range(0, 5005):
        (run / rundir.task_dir_name(i, 10_000)).mkdir()
        rundir.write_json(run / rundir.task_dir_name(i, 10_000) / "result.json", {"ok": True})
    calls = _recording_slurm(monkeypatch, sacct=None, squeue="\n".join(rows) + "\n")
    s = runs.status("9009")
    assert (s.state, s.tasks) == ("RUNNING", {"COMPLETED": 5005, "RUNNING": 4995})
    assert [c[0] for c in calls] == ["sacct", "squeue"]  # accounting refused, then the controller: no scontrol
    squeue = calls[1]
    assert "-r" in squeue and squeue[squeue.index("-j") + 1] == ",".join(a["job_id"] for a in arrays)


def test_wait_polls_a_sweep_with_one_slurm_call_each(tmp_path, monkeypatch):
    from toolkit.submit import submission

    run, arrays = _big_sweep(tmp_path, count=250, limit=101)
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    answers = iter([f"{a['job_id']}_[0-{a['count'] - 1}]|PENDING|0:0|00:00:00||None" for a in arrays[:1]] * 2
                   + ["\n".join(f"{a['job_id']}_{n}|COMPLETED|0:0|00:00:01|c1|None"
                                for a in arrays for n in range(a["count"]))] * 1)
    calls = []

    def run_slurm(args, timeout=20.0, check=True, input=None):
        calls.append(list(args))
        return subprocess.CompletedProcess(args, 0, next(answers) + "\n", "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run_slurm)
    seen = []
    outcome = submission.wait("9000", run, progress=seen.append, poll_s=0)
    assert outcome["state"] == "COMPLETED" and len(calls) == 3  # three polls, one sacct each for all 3 arrays
    assert {c[c.index("-j") + 1] for c in calls} == {"9000,9001,9002"}
    assert [m.split(":")[1].split()[0] for m in seen] == ["PENDING", "COMPLETED"]
