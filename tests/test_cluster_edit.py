"""`hpc cluster queue add|set|remove` through the real CLI: in-place edits that leave every other byte alone,
validated before the file is replaced, and refused (file untouched) when the result would be invalid."""

import difflib
import shutil

import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc

EXAMPLES = sorted((REPO / "cluster-configs").glob("*.yaml"))
AWS_STYLE = REPO / "tests" / "data" / "aws-style-cluster.yaml"
FILES = [*EXAMPLES, AWS_STYLE]


def _copy(tmp_path, source, name=None):
    target = tmp_path / (name or source.name)
    shutil.copyfile(source, target)
    return target


def _queues(path):
    return {q["Name"]: q for q in yaml.safe_load(path.read_text())["Scheduling"]["SlurmQueues"]}


def _ok(*args):
    res = run_hpc("cluster", "queue", *args)
    assert res.returncode == 0, res.stderr
    return res


def _diff_ops(before: bytes, after: bytes) -> set[str]:
    """The kinds of line operations between two texts: {'-'}, {'+'} or {'-', '+'}."""
    ops = difflib.ndiff(before.decode().splitlines(keepends=True), after.decode().splitlines(keepends=True))
    return {line[0] for line in ops if line[0] in "+-"}


@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
def test_set_and_set_back_is_byte_identical(tmp_path, source):
    path = _copy(tmp_path, source)
    original = path.read_bytes()
    name, queue = next(iter(_queues(path).items()))
    resource = queue["ComputeResources"][0]
    old_max = resource["MaxCount"]
    _ok("set", str(path), name, "--compute-resource", resource["Name"], "--max", str(old_max + 5))
    changed = path.read_bytes()
    assert _queues(path)[name]["ComputeResources"][0]["MaxCount"] == old_max + 5
    # exactly one line changed (two in a Capacity Block, whose MinCount must follow), comments kept on them
    capacity_block = queue.get("CapacityType") == "CAPACITY_BLOCK"
    if capacity_block:
        assert _queues(path)[name]["ComputeResources"][0]["MinCount"] == old_max + 5
    # not strict: the line counts are compared below, with the assertion's own message
    lines = [(a, b) for a, b in zip(original.splitlines(), changed.splitlines(), strict=False) if a != b]
    assert len(lines) == 1 + capacity_block and len(original.splitlines()) == len(changed.splitlines())
    assert all(a.split(b"#")[1:] == b.split(b"#")[1:] for a, b in lines)
    _ok("set", str(path), name, "--compute-resource", resource["Name"], "--max", str(old_max))
    assert path.read_bytes() == original


@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
def test_add_then_remove_is_byte_identical(tmp_path, source):
    path = _copy(tmp_path, source)
    original = path.read_bytes()
    _ok("add", str(path), "--queue-spec", "extra=p4d.24xlarge:3")
    added = _queues(path)["extra"]
    resource = added["ComputeResources"][0]
    assert (resource["InstanceType"], resource["MinCount"], resource["MaxCount"]) == ("p4d.24xlarge", 0, 3)
    assert resource["Efa"] == {"Enabled": True}
    assert resource["Networking"]["PlacementGroup"]["Enabled"] is True
    first = next(iter(_queues(path).values()))
    assert added["Networking"]["SubnetIds"] == first["Networking"]["SubnetIds"]
    assert _diff_ops(original, path.read_bytes()) == {"+"}  # only lines added
    _ok("remove", str(path), "extra")
    assert path.read_bytes() == original


@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
def test_remove_deletes_only_that_queue(tmp_path, source):
    path = _copy(tmp_path, source)
    original = path.read_bytes()
    before = yaml.safe_load(original)
    victim = before["Scheduling"]["SlurmQueues"][0]["Name"]
    if len(before["Scheduling"]["SlurmQueues"]) == 1:  # ParallelCluster needs a queue: refused, file untouched
        res = run_hpc("cluster", "queue", "remove", str(path), victim)
        assert res.returncode == 1 and "only queue" in res.stderr and path.read_bytes() == original
        return
    _ok("remove", str(path), victim)
    after = yaml.safe_load(path.read_bytes())
    before["Scheduling"]["SlurmQueues"].pop(0)
    assert after == before
    assert _diff_ops(original, path.read_bytes()) == {"-"}
    # every comment outside the removed queue (and the one line that introduces it) is still there, in order
    lines = original.decode().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- Name: {victim}")
    start -= lines[start - 1].lstrip().startswith("#")
    following = before["Scheduling"]["SlurmQueues"][0]["Name"]
    end = next(i for i, line in enumerate(lines) if line.strip() == f"- Name: {following}")
    while not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#"):  # what introduces the next one
        end -= 1
    comments = [line for i, line in enumerate(lines) if line.lstrip().startswith("#") and not start <= i < end]
    assert [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")] == comments


def test_aws_style_layout_is_kept_for_a_new_queue(tmp_path):
    """Items flush with their key, blank lines between queues: the new queue is written the same way."""
    path = _copy(tmp_path, AWS_STYLE)
    _ok("add", str(path), "--queue-spec", "p5=p5.48xlarge:2", "--capacity-block", "cr-0123456789abcdef0")
    text = path.read_text()
    assert "\n\n  - Name: p5\n    CapacityType: CAPACITY_BLOCK\n" in text
    assert "    ComputeResources:\n    - Name: p5-48xlarge\n" in text
    resource = _queues(path)["p5"]["ComputeResources"][0]
    assert resource["MinCount"] == resource["MaxCount"] == 2
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert resource["Networking"]["PlacementGroup"]["Enabled"] is False
    assert "AllocationStrategy" not in text
    assert run_hpc("cluster", "validate", str(path)).returncode == 0


def test_set_inserts_a_missing_min_count_and_keeps_quotes(tmp_path):
    path = _copy(tmp_path, AWS_STYLE)
    _ok("set", str(path), "train", "--compute-resource", "p4de", "--min", "1")
    assert "      MinCount: 1\n      MaxCount: 2\n      Efa: {Enabled: true}\n" in path.read_text()
    _ok("set", str(path), "cpu", "--instance", "c5n.18xlarge")
    assert "      InstanceType: 'c5n.18xlarge'\n" in path.read_text()


def test_crlf_file_keeps_its_line_endings(tmp_path):
    path = tmp_path / "crlf.yaml"
    original = AWS_STYLE.read_bytes().replace(b"\n", b"\r\n")
    path.write_bytes(original)
    _ok("add", str(path), "--queue-spec", "extra=m5.8xlarge:2")
    assert b"\n" not in path.read_bytes().replace(b"\r\n", b"")
    _ok("remove", str(path), "extra")
    assert path.read_bytes() == original


def test_file_without_a_last_newline_keeps_it(tmp_path):
    path = tmp_path / "unterminated.yaml"
    original = AWS_STYLE.read_bytes().rstrip(b"\n")
    path.write_bytes(original)
    _ok("add", str(path), "--queue-spec", "extra=m5.8xlarge:2")
    assert not path.read_bytes().endswith(b"\n") and "extra" in _queues(path)
    _ok("remove", str(path), "extra")
    assert path.read_bytes() == original


def test_dry_run_prints_the_diff_and_changes_nothing(tmp_path):
    path = _copy(tmp_path, EXAMPLES[0])
    original = path.read_bytes()
    res = _ok("set", str(path), "cpu", "--max", "7", "--dry-run")
    assert path.read_bytes() == original
    assert f"--- a/{path}" in res.stdout and "\n+          MaxCount: 7  # edit: most nodes a job can get" in res.stdout
    data = cli_json(_ok("set", str(path), "cpu", "--max", "7", "--dry-run", "--json"))
    assert data["written"] is False and data["changes"] == ["cpu/c5n-18xlarge: MaxCount 2 -> 7"]
    assert data["diff"].startswith(f"--- a/{path}")
    assert path.read_bytes() == original


def test_an_edit_of_a_file_with_errors_says_they_remain_not_that_it_is_valid(tmp_path):
    """It said "validated offline" beside the warning that the file already had validation errors."""
    path = _copy(tmp_path, EXAMPLES[0])
    text = path.read_text()
    os_line = next(line for line in text.splitlines() if line.strip().startswith("Os:"))
    path.write_text(text.replace(os_line, os_line.split("Os:")[0] + "Os: alinux2", 1))  # dropped in 3.16
    res = _ok("set", str(path), "cpu", "--max", "7", "--dry-run")
    assert "validated offline: the edit adds no error (the 1 the file had remain); dry run" in res.stdout
    assert "already had 1 validation error(s)" in res.stderr


def test_json_output_of_a_real_edit(tmp_path):
    path = _copy(tmp_path, EXAMPLES[0])
    res = _ok("remove", str(path), "cpu", "--json")
    data = cli_json(res)
    assert data["written"] is True and data["action"] == "remove" and data["queue"] == "cpu"
    assert list(_queues(path)) == ["p3dn"]


@pytest.mark.parametrize("args, exit_code, words", [
    # an EFA compute resource cannot run on a type without EFA: pcluster's EfaValidator, offline
    (["set", "{f}", "train", "--compute-resource", "p4d", "--instance", "m5.8xlarge"], 1, "does not support EFA"),
    (["set", "{f}", "cpu", "--min", "20"], 2, "MinCount 20 would be above MaxCount 16"),
    (["set", "{f}", "train", "--max", "3"], 2, "--compute-resource (p4d, p4de)"),
    (["set", "{f}", "nope", "--max", "3"], 2, "queues in this file: cpu, train"),
    (["set", "{f}", "cpu"], 2, "give --max N, --min N, --instance TYPE or --subnet SUBNET_ID"),
    (["add", "{f}", "--queue-spec", "cpu=m5.8xlarge:2"], 1, "already exists"),
    (["add", "{f}", "--queue-spec", "Bad_Name=m5.8xlarge:2"], 2, "queue name 'Bad_Name' is not allowed"),
    # the instance checks `hpc cluster config` makes: a typo is a bad flag value, with the type meant
    (["add", "{f}", "--queue-spec", "x=p4d.24xlarg:2"], 2, "did you mean --queue-spec x=p4d.24xlarge:2?"),
    (["set", "{f}", "cpu", "--instance", "c5.18xlarg"], 2, "did you mean --instance c5.18xlarge?"),
    (["add", "{f}", "--queue-spec", "gpu=p5.48xlarge"], 2, "NAME=INSTANCE_TYPE:MAX_NODES"),
    (["add", "{f}", "--queue-spec", "cb=p5.48xlarge:2", "--capacity-block", "cr-12"], 2, "reservation id"),
    (["add", "{f}", "--queue-spec", "cb=p5.48xlarge:2", "--capacity-block", "cr-0123456789abcdef0", "--min", "1"], 2,
     "must equal MAX"),
    # the V100 trap: a p3dn queue without a custom AMI (the toolkit's own check)
    (["add", "{f}", "--queue-spec", "v100=p3dn.24xlarge:2"], 1, "V100"),
])
def test_bad_edits_leave_the_file_untouched(tmp_path, args, exit_code, words):
    path = _copy(tmp_path, AWS_STYLE)
    original, mtime = path.read_bytes(), path.stat().st_mtime_ns
    res = run_hpc("cluster", "queue", *[a.replace("{f}", str(path)) for a in args])
    assert res.returncode == exit_code, (res.stdout, res.stderr)
    assert words in res.stderr and "Traceback" not in res.stderr
    assert path.read_bytes() == original and path.stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob(".*.tmp"))


def test_removing_the_only_queue_is_refused(tmp_path):
    path = _copy(tmp_path, EXAMPLES[0])
    _ok("remove", str(path), "cpu")
    res = run_hpc("cluster", "queue", "remove", str(path), "p3dn")
    assert res.returncode == 1 and "only queue" in res.stderr


def test_template_variables_are_named(tmp_path):
    path = tmp_path / "template.yaml"
    path.write_text(AWS_STYLE.read_text().replace('"my-key-pair"', "${SSH_KEY}"))
    res = run_hpc("cluster", "queue", "set", str(path), "cpu", "--max", "3")
    assert res.returncode == 1
    assert "HeadNode/Ssh/KeyName holds the variable ${SSH_KEY}" in res.stderr and "envsubst" in res.stderr


def test_missing_file_and_bad_yaml(tmp_path):
    res = run_hpc("cluster", "queue", "remove", str(tmp_path / "nope.yaml"), "cpu")
    assert res.returncode == 1 and "does not exist" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("Scheduling:\n  SlurmQueues:\n  - Name: a\n   bad: [\n")
    res = run_hpc("cluster", "queue", "remove", str(bad), "a")
    assert res.returncode == 1 and "not valid YAML" in res.stderr and "Traceback" not in res.stderr


def test_readme_maintenance_commands_run_as_written(tmp_path):
    """docs/admins.md's block, on the cluster.yaml the same page's `hpc cluster config` example writes (queue p4d)."""
    guide = (REPO / "docs" / "admins.md").read_text()
    example = guide.split("## Cluster configs (admins)\n\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    example = example.strip().splitlines()[0]  # the block's first command, its continuation lines joined
    assert example.split()[:3] == ["hpc", "cluster", "config"], example
    assert run_hpc(*example.split()[1:], cwd=tmp_path).returncode == 0
    block = guide.split("### Maintaining the queues of a live cluster\n\n", 1)[1].split("\n\n", 1)[0]
    commands = [line.strip().split("  #")[0].strip() for line in block.splitlines()]
    assert [c.split()[0] for c in commands] == ["cp", "hpc", "hpc", "hpc", "hpc"]
    codes = []
    for command in commands:
        if command.startswith("cp "):
            shutil.copyfile(tmp_path / "cluster.yaml", tmp_path / "new.yaml")
            continue
        res = run_hpc(*command.split()[1:], cwd=tmp_path)
        assert "Traceback" not in res.stderr
        codes.append(res.returncode)
    # the last one is the diff: MaxCount down with the fleet running needs action, so it exits 1
    assert codes == [0, 0, 0, 1]
    assert list(_queues(tmp_path / "new.yaml")) == ["p4d", "p5"]
