"""toolkit.slurm.batchhost in-process, Slurm's answers faked with the lines Slurm 22.05 gave on the local lane for
a job whose batch host could not open its output file (tests/test_batch_host_slurm.py makes that fault for real)."""

from __future__ import annotations

import subprocess

import pytest

from toolkit.node.records import PREFLIGHTS, read_records
from toolkit.slurm.status import State
from toolkit.slurm import batchhost

FAILED_JOB = ("JobId=14 JobName=wrap JobState=FAILED Reason=JobLaunchFailure Requeue=1 Restarts=0 ExitCode=0:53 "
              "Partition=wide NodeList=w[15-16] NumNodes=2 BatchHost=w15 StdOut={out}")


class FakeSlurm:
    def __init__(self, monkeypatch, job_line: str, sacct: str = "", refuse: tuple[str, ...] = ()):
        self.job_line, self.sacct, self.refuse, self.calls = job_line, sacct, refuse, []
        monkeypatch.setattr("toolkit.slurm.commands.run", self.run)
        monkeypatch.setattr(batchhost, "excluded_now", lambda job_id: ["w9"])
        monkeypatch.setattr(batchhost, "room_after_excluding", lambda job_id, partition, failed: 14)
        monkeypatch.setattr(batchhost, "hostnames", lambda nodes: {"w[15-16]": ["w15", "w16"]}.get(nodes, [nodes]))

    def run(self, args, check=True, **_kw):
        self.calls.append(args)
        out, rc = "", 0
        if args[:2] == ["scontrol", "-o"]:
            out = self.job_line + "\n" if self.job_line else ""
        elif args[0] == "sacct":
            out = self.sacct
        elif args[0] == "scontrol" and args[1] in self.refuse:
            rc = 1
        elif args[:2] == ["scontrol", "release"]:
            self.job_line = self.job_line.replace("JobState=FAILED", "JobState=PENDING")
        return subprocess.CompletedProcess(args, rc, out, "Requested operation is presently disabled" if rc else "")


def _output(tmp_path) -> str:
    (tmp_path / "submitit").mkdir(parents=True)
    return str(tmp_path / "submitit" / "14_0_log.out")


def test_only_a_failed_launch_counts():
    assert batchhost.is_launch_failure(State.FAILED, "0:53", None)
    assert batchhost.is_launch_failure(State.FAILED, None, "JobLaunchFailure")
    assert not batchhost.is_launch_failure(State.FAILED, "1:0", "NonZeroExitCode")
    assert not batchhost.is_launch_failure(State.COMPLETED, "0:53", None)


def test_the_batch_host_is_named_and_the_job_requeued_held_excluding_it_then_released(monkeypatch, tmp_path):
    slurm = FakeSlurm(monkeypatch, FAILED_JOB.format(out=_output(tmp_path)))
    recovery = batchhost.recover("14", tmp_path, State.FAILED, "0:53", None)
    assert recovery is not None and recovery.pending
    scontrols = [c[1:] for c in slurm.calls if c[0] == "scontrol" and c[1] != "-o"]
    assert scontrols == [["requeuehold", "14"], ["update", "JobId=14", "ExcNodeList=w15,w9"], ["release", "14"]]
    [record] = read_records(tmp_path / PREFLIGHTS)
    assert record == recovery.record
    assert (record["stage"], record["nodes"], record["restarts"]) == ("launch", ["w15", "w16"], 0)
    assert record["action"] == "requeued, excluding w15,w9 (by hpc on the submit side)"
    [check] = record["failed"]["w15"]
    assert check["detail"] == (f"Slurm could not start the batch script on this node (JobLaunchFailure, exit code "
                               f"0:53): it cannot open the job's output file {_output_path(tmp_path)}, so this node "
                               "cannot write the run dir")

    # seen again (accounting still says FAILED; the controller has it pending): recorded and requeued once
    again = batchhost.recover("14", tmp_path, State.FAILED, "0:53", None)
    assert again == batchhost.Recovery(record, True) and len(read_records(tmp_path / PREFLIGHTS)) == 1


def _output_path(tmp_path) -> str:
    return str(tmp_path / "submitit" / "14_0_log.out")


@pytest.mark.parametrize("job_line, refuse, action", [
    (FAILED_JOB.replace("Requeue=1", "Requeue=0"), (), "stopped: a benchmark is not requeued"),
    (FAILED_JOB, ("requeuehold",), "stopped: the requeue failed: scontrol requeuehold 14: Requested operation is "
                                   "presently disabled"),
    ("", (), "stopped: Slurm no longer holds the finished job (MinJobAge): resubmit it"),
])
def test_a_job_that_cannot_be_requeued_is_named_and_left_failed(monkeypatch, tmp_path, job_line, refuse, action):
    sacct = "14|w[15-16]\n14.batch|w15\n"  # accounting names the batch host once the controller forgot the job
    FakeSlurm(monkeypatch, job_line.format(out=_output(tmp_path)), sacct, refuse)
    recovery = batchhost.recover("14", tmp_path, State.FAILED, "0:53", None)
    assert recovery is not None and not recovery.pending
    assert (list(recovery.record["failed"]), recovery.record["action"]) == (["w15"], action)


def test_the_batch_host_from_accounting_is_the_last_starts(monkeypatch):
    def answer(rows: str) -> str | None:
        monkeypatch.setattr("toolkit.slurm.commands.run",
                            lambda args, check=True, **_kw: subprocess.CompletedProcess(args, 0, rows, ""))
        return batchhost.batch_host_from_accounting("14")

    assert answer("14|w[15-16]\n14.batch|w15\n14|w[1-2]\n14.batch|w1\n14.0|w[1-2]\n") == "w1"
    assert answer("14|w[15-16]\n14.batch|w15\n14|None assigned\n") is None  # the last start did not get that far


def test_a_failed_launch_reads_as_such_beside_the_preflights_records():
    check = {"name": "batch-host", "status": "FAIL", "detail": "Slurm could not start ...", "fix": "findmnt"}
    launch = {"job": "14", "stage": "launch", "failed": {"w1": [check]}, "action": "requeued, excluding w1"}
    passed = {"job": "14", "nodes": ["w2", "w3"], "failed": {}, "seconds": 0.5, "action": "passed"}
    assert batchhost.failure_line(launch) == "launch FAILED on w1: batch-host: Slurm could not start ...; " \
                                             "requeued, excluding w1"
    assert batchhost.summary_lines([launch, passed]) == [
        "  launch: FAILED on w1: batch-host: Slurm could not start ...", "    then: requeued, excluding w1",
        "  pre-flight: passed on 2 node(s) in 0.5 s"]
