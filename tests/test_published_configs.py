"""Configs as AWS publishes them (tests/data/cluster/published/SOURCES.md): templates for envsubst or Jinja, a
scheduler the pinned pcluster no longer has. Each command an admin or a researcher points at one gives one clear
error or finding that says what the file is, never a traceback (`hpc cluster show` on a `MaxCount: ${NUM_INSTANCES}`
ended in "internal error: ValueError")."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, run_hpc

PUBLISHED = REPO / "tests" / "data" / "cluster" / "published"


@pytest.mark.parametrize("args", [["cluster", "show"], ["recipes", "render", "resnet50", "--nodes", "1", "--cluster"]])
@pytest.mark.parametrize("name,words", [
    ("adt-cluster-vanilla.yaml", "queue compute-gpu: InstanceType holds the variable ${INSTANCE}, left in for a "
                                 "template tool to fill in"),
    ("adt-trn1-custom-ami.yaml", "queue compute-gpu, compute resource distributed-ml: MaxCount is "
                                 "'PLACEHOLDER_MAX_INSTANCES', not a whole number"),
    ("pc-awsbatch.simple.yaml", "Scheduling/Scheduler is 'awsbatch', and hpc's queues are Slurm queues"),
])
def test_a_template_or_a_batch_config_gets_one_error_naming_the_key(args, name, words):
    res = run_hpc(*args, str(PUBLISHED / name))
    assert res.returncode == 1 and res.stdout == "", res.stdout
    assert res.stderr.startswith(f"error: {PUBLISHED / name}") and words in res.stderr, res.stderr
    assert "internal error" not in res.stderr and len(res.stderr.strip().splitlines()) == 2


def test_validate_says_every_template_variable_is_one_with_the_envsubst_fix():
    """pcluster's pattern errors ("does not match expected pattern (got '${PUBLIC_SUBNET_ID}')") keep their
    message and get the template's fix; a variable pcluster takes as it is (Region: ${AWS_REGION}) is reported."""
    for name in ("adt-cluster-vanilla.yaml", "adt-p4de-base.yaml"):
        path = PUBLISHED / name
        report = json.loads(run_hpc("cluster", "validate", str(path), "--json").stdout)["data"]
        variables = set(re.findall(r"\$\{(\w+)\}", path.read_text()))
        told = {v for v in variables for f in report["findings"]
                if f"export {v}=...; envsubst < {path}" in (f["fix"] or "")}
        assert told == variables, (name, variables - told)
    region = [f for f in report_of("adt-cluster-vanilla.yaml")["findings"] if f["path"] == "Region"]
    assert region and region[0]["message"] == "holds the variable ${AWS_REGION}, left in for a template tool to fill in"
    assert region[0]["line"] == 3


def report_of(name: str) -> dict:
    return json.loads(run_hpc("cluster", "validate", str(PUBLISHED / name), "--json").stdout)["data"]


def test_findings_are_in_line_order_within_each_level():
    findings = report_of("adt-cluster-vanilla.yaml")["findings"]
    for level in ("error", "warning"):
        lines = [f["line"] or 0 for f in findings if f["level"] == level]
        assert lines == sorted(lines), (level, lines)


def test_a_jinja_template_is_said_to_be_one():
    res = run_hpc("cluster", "validate", str(PUBLISHED / "pc-patch-multi.yaml"))
    assert res.returncode == 1
    assert "INVALID by ParallelCluster" in res.stdout and "(1 error, 0 warnings, 0 notes)" in res.stdout
    assert "the file holds template markup ({{ ... }} or {% ... %})" in res.stdout
    assert "render the template with its tool first" in res.stdout


def test_an_aws_batch_config_is_told_what_the_pinned_pcluster_has():
    [scheduler] = [f for f in report_of("pc-awsbatch.simple.yaml")["findings"] if f["path"] == "Scheduling/Scheduler"]
    assert "has only the slurm scheduler (pcluster/constants.py SUPPORTED_SCHEDULERS)" in scheduler["fix"]


def test_dropped_oses_name_what_replaces_them():
    [os_] = [f for f in report_of("adt-p4de-base.yaml")["findings"] if f["path"] == "Image/Os"]
    assert "Os: ubuntu2004 is not in ParallelCluster" in os_["fix"] and "ubuntu2204 or ubuntu2404" in os_["fix"]


def test_a_queue_level_placement_group_is_fixed_on_the_queue():
    [group] = [f for f in report_of("adt-p4de-base.yaml")["findings"]
               if f["path"] == "Scheduling/SlurmQueues[compute-gpu]/Networking/PlacementGroup"]
    assert "set Networking/PlacementGroup/Enabled: false on this queue" in group["fix"]
