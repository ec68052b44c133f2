"""The run dir's typed reader and writer (toolkit.rundir): metadata, rank records, logs of every executor kind, the
network verdict; and run dirs written by older toolkits."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_hpc
from tests.test_report_scaling import FIXTURES
from tests.test_transport import EFA_LOG, SOCKET_FALLBACK
from toolkit.errors import HpcError
from toolkit.reports.scaling import read_run
from toolkit.reports.transport import run_network
from toolkit import rundir
from toolkit.rundir import Array, Executor, Metadata, RankRecord, RunDir, find_run, list_runs
from toolkit.slurm.rank_task import _write

NCCL_TABLE = (FIXTURES / "nccl" / "2022_root_wrong_srun-label.sample.txt").read_text()


def test_executor_names_old_and_new():
    assert [Executor.parse(n) for n in ("slurm", "local", "sbatch")] == [Executor.SLURM, Executor.LOCAL,
                                                                          Executor.SBATCH]
    assert Executor.parse("submitit-slurm") == Executor.SLURM and Executor.parse("submitit-local") == Executor.LOCAL
    assert Executor.parse("kubernetes") is None and Executor.parse(None) is None
    assert json.dumps({"executor": Executor.LOCAL}) == '{"executor": "local"}'


def test_metadata_round_trip_writes_the_one_vocabulary(tmp_path):
    run = RunDir(tmp_path / "run").create()
    meta = Metadata(recipe="probe", executor=Executor.parse("submitit-slurm"), nodes=2, ranks=4, fabric="modern",
                    job_ids=["17"], extra={"site_note": "kept"})
    run.write_metadata(meta)
    written = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert written == {"site_note": "kept", "recipe": "probe", "executor": "slurm", "fabric": "modern", "nodes": 2,
                       "ranks": 4, "job_ids": ["17"]}  # unset fields are left out, not written as null
    assert run.metadata() == meta == run.read_metadata()


def test_an_old_run_dir_reads(tmp_path):
    """What toolkits before the typed run dir wrote: the old executor names, a sweep's one array_job_id, no
    fabric; a value of the wrong type reads as missing in status views and is one clear error in reports."""
    (tmp_path / "metadata.json").write_text(json.dumps({
        "recipe": "probe", "executor": "submitit-local", "job_ids": [4242], "nodes": 1, "ranks": "two",
        "kind": "sweep", "array_job_id": 7, "tasks": 3, "launcher_style": "srun"}))
    meta = RunDir(tmp_path).metadata()
    assert (meta.executor, meta.job_ids, meta.nodes, meta.ranks, meta.fabric) == (Executor.LOCAL, ["4242"], 1, None,
                                                                                   None)
    assert meta.sweep_arrays == [Array("7", 0, 3)] and meta.task_ids == ["7_0", "7_1", "7_2"]
    with pytest.raises(HpcError) as err:
        RunDir(tmp_path).read_metadata()
    assert "ranks must be a positive integer, got 'two'" in err.value.message and err.value.fix
    (tmp_path / "metadata.json").write_text('{"kind": "sweep", "arrays": [{"job_id": 7}]}')
    assert RunDir(tmp_path).metadata().sweep_arrays == []
    with pytest.raises(HpcError, match="arrays must be a list"):
        RunDir(tmp_path).read_metadata()
    (tmp_path / "metadata.json").write_text("[1]")
    assert RunDir(tmp_path).metadata() is None


def test_a_one_task_array_is_a_plain_job_id():
    meta = Metadata(kind="sweep", arrays=[Array("500", 0, 3), Array("501", 3, 1)])
    assert meta.task_ids == ["500_0", "500_1", "500_2", "501"]


def test_the_launchers_records_and_the_first_failed_rank(tmp_path):
    run = RunDir(tmp_path)
    assert run.result() is None and run.failures() == [] and run.first_failed_rank() is None
    _write(str(tmp_path), {"rank": 3, "host": "c2", "exit_code": 1, "argv0": "x", "finished_at": "2026-01-01T00:00:02"})
    _write(str(tmp_path), {"rank": 1, "host": "c1", "exit_code": 1, "argv0": "x", "finished_at": "2026-01-01T00:00:01"})
    assert sorted(f.rank for f in run.failures()) == [1, 3] and run.first_failed_rank() == 1 and run.failed()
    assert run.first_failure() == (1, "c1")  # the node its record names
    _write(str(tmp_path), {"rank": 0, "host": "c1", "exit_code": 0, "argv0": "x", "finished_at": "t", "ok": True})
    assert run.result() == RankRecord(0, "c1", 0, "x", "t", ok=True)
    assert json.loads((tmp_path / "result.json").read_text())["ok"] is True
    (tmp_path / "failures" / "rank-9.json").write_text("{half")  # a rank killed while writing: left out
    assert len(run.failures()) == 2


def test_a_rank_srun_killed_is_not_the_first_failure_within_the_same_second(tmp_path):
    # rank 0, slow to start, was ended by srun's SIGTERM (--kill-on-bad-exit) in the second rank 1 failed on its
    # own: rank 1's log says why the job failed (seen under load: "module ... cannot be imported" went missing)
    run = RunDir(tmp_path)

    def failed(rank: int, code: int, second: int = 1) -> None:
        _write(str(tmp_path), {"rank": rank, "host": "c1", "exit_code": code, "argv0": "x",
                               "finished_at": f"2026-01-01T00:00:0{second}"})

    failed(0, -15)
    failed(2, 1)
    failed(1, 1)
    assert run.first_failed_rank() == 1
    # a rank killed by another signal (the kernel's OOM SIGKILL) is a failure of its own: the lowest rank wins
    failed(0, -9)
    assert run.first_failed_rank() == 0
    # an earlier second still comes first, however it ended
    failed(3, -15, second=0)
    assert run.first_failed_rank() == 3


def _run(path, executor: str | None, **meta) -> RunDir:
    run = RunDir(path).create()
    run.write_metadata(Metadata.from_json({"recipe": "probe", "executor": executor, "job_ids": ["55"], **meta}))
    return run


def test_submitit_logs_per_rank(tmp_path):
    run = _run(tmp_path / "r", "slurm")
    (run.path / "submitit").mkdir()
    for rank in (0, 1):
        (run.path / "submitit" / f"55_{rank}_log.out").write_text(f"rank {rank} says hi\n")
    (run.path / "submitit" / "55_1_log.err").write_text("boom\n")
    assert run.rank_log("55", 1).name == "55_1_log.out" and run.rank_log("55", 1, "err").name == "55_1_log.err"
    assert run.rank_log("55", 2) is None and run.log_names("55") == ["55_0_log.out", "55_1_log.out"]
    assert run.failed_rank_log("55") is None  # rank 0 wrote no stderr and no rank recorded a failure
    run.write_failure(RankRecord(rank=1, exit_code=2))
    assert run.failed_rank_log("55").name == "55_1_log.err"


def test_the_sbatch_executors_one_log_serves_every_rank_and_stream(tmp_path):
    run = _run(tmp_path / "r", "sbatch")
    assert run.rank_log("55", 0) is None and run.failed_rank_log("55") is None  # not started yet
    (run.path / "nccl-tests-55.out").write_text("srun: error: PMIx not found\n")
    (run.path / "nccl-tests-551.out").write_text("another job's\n")
    for rank, stream in [(0, "out"), (3, "out"), (0, "err")]:
        assert run.rank_log("55", rank, stream) == run.path / "nccl-tests-55.out"
    assert run.failed_rank_log("55") == run.path / "nccl-tests-55.out"
    assert run.log_names("55") == ["nccl-tests-55.out"]



def test_the_rendered_scripts_first_failed_rank_is_the_first_task_srun_saw_exit(tmp_path):
    """Its ranks write no records: srun's lines in the job's one log say which task ended first by itself; one
    srun killed after it (even one reported earlier) is not it; a log where srun reported none names none."""
    run = _run(tmp_path / "r", "sbatch")
    (run.path / "probe-55.out").write_text(
        "hpc: job 55 at ...\n 3: probe rank 3: failing on purpose\n 3: hpc: error: rank 3 gave up\n"
        "srun: error: c1: tasks 0-1: Killed\nsrun: error: c2: task 3: Exited with exit code 3\n"
        "srun: error: c2: task 2: Exited with exit code 1\n")
    assert run.first_failed_rank("55") == 3 and run.failed_rank_log("55") == run.path / "probe-55.out"
    assert run.first_failure("55") == (3, "c2")
    assert run.first_failed_rank() is None  # which job's log: not known without its id
    assert rundir.first_failed_task_on_node(["srun: error: c1: tasks [0-1]: Terminated"]) == (0, "c1")
    assert rundir.first_failed_task_on_node(["no srun error here"]) is None
    from toolkit.submit.runs import failure_reason

    assert failure_reason(str(run.path / "probe-55.out"), 3) == "rank 3 gave up"
    assert failure_reason(str(run.path / "probe-55.out"), 2) is None

def test_jobs_logs_rank_picks_one_ranks_lines_of_the_sbatch_executors_labelled_log(tmp_path):
    run = _run(tmp_path / "r", "sbatch")
    # srun --label of 12 tasks pads the task number to 2 columns; the batch shell's and srun's own lines have none
    (run.path / "probe-55.out").write_text(
        " 0: rank 0 starts\n 1: rank 1 starts\n11: rank 11 starts\n 1: 2: not a label\n"
        "srun: error: c2: task 11: Exited with exit code 3\n")
    env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path)}
    rank = {n: run_hpc("jobs", "logs", "55", "--rank", str(n), env=env) for n in (0, 1, 11)}
    assert all(r.returncode == 0 for r in rank.values()), [r.stderr for r in rank.values()]
    error = "srun: error: c2: task 11: Exited with exit code 3\n"
    assert rank[0].stdout == "rank 0 starts\n" + error  # no error is hidden, whichever rank is asked for
    assert rank[1].stdout == "rank 1 starts\n2: not a label\n" + error
    assert rank[11].stdout == "rank 11 starts\n" + error



def test_jobs_logs_refuses_a_rank_beyond_the_jobs_ranks_on_either_executor(tmp_path):
    """The sbatch executor's one log has lines for every rank and the batch shell's: asked for a rank the job
    never had, `jobs logs` printed the batch shell's lines and exited 0 (submitit's path: no such file, exit 1)."""
    for executor in ("sbatch", "slurm"):
        env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path / executor)}  # one runs root each: one run of job 55
        run = _run(tmp_path / executor / "r", executor, ranks=4)
        (run.path / "probe-55.out").write_text("hpc: job 55 at ...\n 0: rank 0 starts\n 3: rank 3 starts\n")
        (run.path / "submitit").mkdir()
        (run.path / "submitit" / "55_3_log.out").write_text("rank 3 starts\n")
        assert run_hpc("jobs", "logs", "55", "--rank", "3", env=env).stdout.endswith("rank 3 starts\n")
        for rank in ("4", "9", "-1"):
            res = run_hpc("jobs", "logs", "55", "--rank", rank, env=env)
            assert res.returncode == 1 and res.stdout == "", (executor, rank, res.stdout)
            assert f"job 55 has 4 rank(s), 0 to 3: there is no rank {rank}" in res.stderr

def test_jobs_logs_prints_submitits_own_rank_log_whole(tmp_path):
    run = _run(tmp_path / "r", "slurm")
    (run.path / "submitit").mkdir()
    (run.path / "submitit" / "55_1_log.out").write_text("1: the program's own words\n0: and these\n")
    res = run_hpc("jobs", "logs", "55", "--rank", "1", env={**os.environ, "HPC_RUNS_DIR": str(tmp_path)})
    assert (res.returncode, res.stdout) == (0, "1: the program's own words\n0: and these\n"), res.stderr


def test_a_run_dir_without_executor_finds_whichever_log_it_has(tmp_path):
    run = _run(tmp_path / "r", None)
    (run.path / "job-55.out").write_text("hello\n")
    assert run.rank_log("55", 0) == run.path / "job-55.out"


def test_a_sweep_tasks_logs_are_in_its_sweeps_submitit_dir(tmp_path):
    sweep = _run(tmp_path / "sweep", "slurm", kind="sweep", arrays=[{"job_id": "7", "first": 0, "count": 2}],
                 job_ids=["7"])
    (sweep.path / "submitit").mkdir()
    for task in (0, 1):
        (sweep.path / "submitit" / f"7_{task}_0_log.out").write_text(f"task {task}\n")
        (sweep.path / "submitit" / f"7_{task}_0_log.err").write_text(f"task {task} failed\n")
    task = sweep.task(1, 2)
    task.create().write_metadata(Metadata(kind="sweep-task", sweep_dir=str(sweep.path), executor=Executor.SLURM,
                                          job_ids=["7_1"], task_index=1))
    assert task.rank_log("7_1", 0).read_text() == "task 1\n"
    assert task.failed_rank_log("7_1").read_text() == "task 1 failed\n"
    assert [p.name for p in task.log_files()] == ["7_1_0_log.out", "7_1_0_log.err"]  # not task 0's


def test_list_and_find_runs(tmp_path):
    single = _run(tmp_path / "a", "slurm")
    sweep = _run(tmp_path / "b-sweep", "slurm", kind="sweep", job_ids=["7", "8"],
                 arrays=[{"job_id": "7", "first": 0, "count": 2}, {"job_id": "8", "first": 2, "count": 2}])
    (tmp_path / "not-a-run").mkdir()
    assert {r.name for r in list_runs(tmp_path)} == {"a", "b-sweep"}
    assert find_run("55", tmp_path) == single
    assert find_run("8_1", tmp_path) == find_run("b-sweep", tmp_path) == sweep
    assert find_run("a", tmp_path) is None and find_run("9", tmp_path) is None  # only a sweep goes by its name


def test_a_job_id_two_runs_name_is_the_newer_runs_and_a_new_job_is_found_reading_one_metadata(tmp_path,
                                                                                                monkeypatch):
    """A rebuilt cluster's Slurm counts job ids from 1 again while the runs root (on FSx, in home) keeps the old
    cluster's runs; and `--wait` looks its job up on every poll, which read every run's metadata, oldest first."""
    for n in range(30):
        run = _run(tmp_path / f"r{n:02d}", "slurm", job_ids=[str(100 + n)])
        os.utime(run.path, (1_000_000 + n, 1_000_000 + n))
    again = _run(tmp_path / "rebuilt", "slurm", job_ids=["101"])
    os.utime(again.path, (2_000_000, 2_000_000))
    reads = []
    real = RunDir.metadata
    monkeypatch.setattr(RunDir, "metadata", lambda self: reads.append(self.name) or real(self))
    assert find_run("101", tmp_path) == again and reads == ["rebuilt"]
    reads.clear()
    assert find_run("129", tmp_path).name == "r29" and reads == ["rebuilt", "r29"]


@pytest.mark.parametrize("executor,log", [("slurm", "submitit/55_1_log.err"), ("sbatch", "nccl-tests-55.out")])
def test_one_network_verdict_for_jobs_status_and_report_run(tmp_path, executor, log):
    """A socket fallback in any rank's log (submitit's stderr, the sbatch log) is the run's network, the same
    in `hpc jobs status` (run_network) and `hpc report run` (read_run)."""
    run = _run(tmp_path / "r", executor, fabric="modern", nodes=2)
    (run.path / "submitit").mkdir()
    (run.path / "submitit" / "55_0_log.out").write_text(EFA_LOG + NCCL_TABLE)
    (run.path / log).write_text(SOCKET_FALLBACK)
    network = run_network(run)
    assert network.transport.name == "tcp" and network.transport.source == str(run.path / log)
    assert network.problem.startswith("the queue has EFA but NCCL used TCP sockets")
    summary = read_run(run.path)
    assert summary.nccl and (summary.transport["name"], summary.efa_problem) == ("tcp", network.problem)
    run.write_metadata(Metadata(fabric="none", executor=Executor.parse(executor), job_ids=["55"]))
    assert run_network(run).problem is None and read_run(run.path).efa_problem is None  # a TCP queue: sockets it has


def test_following_a_labelled_log_never_splits_a_line_from_its_label(tmp_path):
    from toolkit.rundir import task_lines
    from toolkit.submit.runs import follow

    log = tmp_path / "job-55.out"
    log.write_text(" 1: half")  # srun caught mid-line
    polls = []

    def is_done():
        if not polls:
            with log.open("a") as fh:
                fh.write("way\n 0: other\n")
        polls.append(1)
        return len(polls) > 1

    assert list(task_lines(follow(log, is_done, poll_s=0), 0)) == ["other\n"]
