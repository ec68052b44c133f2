"""Injection fuzzing beyond the rendered sbatch script (tests/test_render_exec.py): the submitit batch script
(executed with stub srun/scontrol/module), the launcher's argv (executed with a recording stub program), the
cluster YAML writer (parsed back), --sweep values and run-dir names. An escape is any value that ran as a
command, arrived changed, added a key, or put a path outside the runs root. Counts are printed at the end."""

from __future__ import annotations

import collections
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import SUMMARY
from tests.jobhelpers import CPU
from tests.stubs import PASSING_PREFLIGHT, write_executable
from toolkit import rundir
from toolkit.cluster.build import SSH_ALLOWED_IPS, ClusterSpec, QueueSpec, build_config, render
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe, parse_override
from toolkit.recipes.schema import Recipe
from toolkit.submit import sweep
from toolkit.slurm.executors import slurm_parameters
from toolkit.submit.plan import SubmitRequest, new_run_dir

CANARY = "PWNED"
FRAGMENTS = [f"$(touch {CANARY})", f"`touch {CANARY}`", f"'; touch {CANARY}; '", f'"; touch {CANARY}; "',
             f"\ntouch {CANARY}\n", f"x;touch {CANARY}", f"${{IFS}}touch${{IFS}}{CANARY}", "$SLURM_PROCID", "'\"'",
             "\\", ",", "\\,", "=", "..", "../..", "/", "#", ": ", "- ", "{a: b}", "[x]", "&", "|", "\r", "\t", "%j",
             "null", "true", "0x1f", "~", "*", "\u2028", "\x85", "é", "\U0001f600", "\u2028Injected: 1",
             "\nInjected: 1", "\x85- Injected"]
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=16)
HOSTILE = st.lists(st.one_of(TEXT, st.sampled_from(FRAGMENTS)), min_size=1, max_size=4).map("".join)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
CHEAP = settings(FUZZ, max_examples=200)  # no process per example
COUNTS: collections.Counter = collections.Counter()
RECIPE_FILE = Path(tempfile.mkdtemp(prefix="hpc-fuzz-")) / "fuzz.yaml"
RECIPE_FILE.write_text(yaml.safe_dump({"name": "fuzz", "description": "d", "source": "s",
                                      "launcher": {"kind": "binary", "program": "/bin/true"},
                                      "args": {"--text": "x"}, "resources": {"nodes": 1}}))


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    tried = ", ".join(f"{k} {v}" for k, v in COUNTS.items() if not k.startswith("escapes"))
    escapes = sum(v for k, v in COUNTS.items() if k.startswith("escapes"))
    SUMMARY.append(f"injection fuzz: {sum(v for k, v in COUNTS.items() if not k.startswith('escapes'))} values "
                   f"tried ({tried}), {escapes} escapes")


def escape_if(condition: bool, where: str) -> None:
    if condition:
        COUNTS[f"escapes {where}"] += 1
    assert not condition, f"escape in {where}"


def recipe(program: str, args: dict, env: dict, modules: list[str] = ()) -> Recipe:
    return Recipe.model_validate({
        "name": "fuzz", "description": "d", "source": "s", "launcher": {"kind": "binary", "program": program},
        "args": args, "env": env, "software": {"modules": list(modules)}, "resources": {"nodes": 1},
    })


SRUN_RECORD = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_OUT/srun.argv"
env -0 > "$STUB_OUT/srun.env"
"""
MODULE_RECORD = r"""#!/bin/bash
printf '%s\0' "$@" >> "$STUB_OUT/module.argv"
"""
SCONTROL = "#!/bin/bash\nprintf '%s\\n' c1 c2\n"


@FUZZ
@given(env_value=HOSTILE, module=HOSTILE)
def test_the_submitit_batch_script_exports_values_literally_and_runs_nothing(env_value, module):
    """What submitit's SlurmExecutor sends: our parameters and setup lines inside submitit's own script."""
    from submitit.slurm.slurm import _make_sbatch_string

    COUNTS["submitit script"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = build_job_spec(recipe("/bin/true", {"--x": "1"}, {"HPC_FUZZ": env_value}, [module]), CPU, 1,
                              run_dir=str(work / "run"))
        folder = work / "submitit"
        text = _make_sbatch_string(command=f"python -u -m submitit.core._submit {folder}", folder=folder,
                                   **slurm_parameters(spec))
        bin_dir, out = work / "bin", work / "out"
        out.mkdir()
        write_executable(bin_dir / "srun", SRUN_RECORD)
        write_executable(bin_dir / "module", MODULE_RECORD)
        write_executable(bin_dir / "scontrol", SCONTROL)
        # a stand-in for the node's python3, which runs the pre-flight (tests/test_preflight*.py, test_node_contract.py)
        write_executable(bin_dir / "python3", PASSING_PREFLIGHT)
        (work / "job.sh").write_text(text)
        proc = subprocess.run(["bash", str(work / "job.sh")], cwd=work, capture_output=True, timeout=60, env={
            "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "c[1-2]", "HOME": str(work)})
        escape_if((work / CANARY).exists(), "submitit script (a value ran)")
        assert proc.returncode == 0, proc.stderr
        env = dict(os.fsdecode(e).split("=", 1) for e in (out / "srun.env").read_bytes().split(b"\0")[:-1])
        escape_if(env.get("HPC_FUZZ") != env_value, "submitit script (exported value changed)")
        module_argv = [os.fsdecode(w) for w in (out / "module.argv").read_bytes().split(b"\0")[:-1]]
        escape_if(module_argv != ["load", module], "submitit script (module name changed)")
        argv = [os.fsdecode(w) for w in (out / "srun.argv").read_bytes().split(b"\0")[:-1]]
        escape_if(argv[-5:] != ["python", "-u", "-m", "submitit.core._submit", str(folder)],
                  "submitit script (srun command)")
        # Every #SBATCH line stays one directive: no value opened a line of its own.
        directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
        escape_if(len(directives) != text.count("#SBATCH"), "submitit script (#SBATCH lines)")


RECORD_ARGV = "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" > \"$STUB_OUT/argv\"\n"


@FUZZ
@given(value=HOSTILE, listed=st.lists(HOSTILE, min_size=1, max_size=3))
def test_the_launcher_runs_exactly_the_recipe_argv(value, listed):
    """The rank program, executed as submitit's per-rank task runs it (the rendered script's srun runs the same)."""
    from toolkit.slurm.rank_task import _run

    COUNTS["launcher argv"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        program = work / "prog"
        write_executable(program, RECORD_ARGV)
        spec = build_job_spec(recipe(str(program), {"--text": value, "--list": listed}, {}), CPU, 1,
                              run_dir=str(work / "run"))
        task_env = {"PATH": "/usr/bin:/bin", "STUB_OUT": str(work), "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                    "SLURM_NODEID": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
        code = _run(list(spec.program.argv), task_env, ignore_usr2=True)
        escape_if((work / CANARY).exists(), "launcher (a value ran)")
        assert code == 0
        got = [os.fsdecode(w) for w in (work / "argv").read_bytes().split(b"\0")[:-1]]
        escape_if(got != [str(program), "--text", value, "--list", *listed], "launcher (argv changed)")


QUEUE = st.from_regex(r"\A[a-z][a-z0-9-]{0,24}\Z")


@CHEAP
@given(subnet=HOSTILE, key=HOSTILE, post_install=HOSTILE, queue=QUEUE,
       name=st.from_regex(r"\A[a-zA-Z][a-zA-Z0-9-]{0,59}\Z"))
def test_the_cluster_yaml_writer_keeps_every_value_and_adds_no_key(subnet, key, post_install, queue, name):
    COUNTS["cluster yaml"] += 1
    spec = ClusterSpec(name=name, region="us-east-1", head_subnet=subnet, compute_subnet=subnet, key_name=key,
                       queues=(QueueSpec(queue, "c5n.18xlarge", 2),), post_install=post_install)
    doc, _ = build_config(spec, output="out.yaml")
    text = render(doc)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    escape_if(not isinstance(data, dict), "cluster yaml (does not parse)")
    escape_if(set(data) != {"Region", "Image", "HeadNode", "Scheduling"}, "cluster yaml (top-level keys)")
    escape_if(data["HeadNode"]["Networking"] != {"SubnetId": subnet}, "cluster yaml (subnet)")
    escape_if(data["HeadNode"]["Ssh"] != {"KeyName": key, "AllowedIps": SSH_ALLOWED_IPS}, "cluster yaml (key name)")
    [q] = data["Scheduling"]["SlurmQueues"]
    escape_if(q["Name"] != queue or q["Networking"] != {"SubnetIds": [subnet]}, "cluster yaml (queue)")
    escape_if(q["CustomActions"] != {"OnNodeConfigured": {"Script": post_install}}, "cluster yaml (--post-install)")
    known_keys = {"Name", "CapacityType", "Networking", "ComputeResources", "CustomActions", "Iam", "Tags"}
    escape_if(set(q) - known_keys != set(), "cluster yaml (queue keys)")


@CHEAP
@given(values=st.lists(HOSTILE, min_size=1, max_size=4, unique=True))
def test_sweep_values_arrive_as_the_same_set_value_would(values):
    """Splitting and escaping never change a value: each point's job equals `--set` of that value alone."""
    assume(not any(sweep.RANGE_LIKE.match(v) for v in values))  # A..B[:STEP] ranges, or refused as ranges
    COUNTS["sweep values"] += len(values)
    item = "args.--text=" + ",".join(sweep.escape_value(v) for v in values)
    points = sweep.grid([item])
    escape_if([p.overrides for p in points] != [(f"args.--text={v}",) for v in values], "sweep (values split)")
    for v in values:
        expected = parse_override(f"args.--text={v}")[1]  # `--set` reads a value as YAML: `|` is ""
        if isinstance(expected, str) and expected:
            swept = load_recipe(RECIPE_FILE, overrides=list(points[values.index(v)].overrides))
            spec = build_job_spec(swept, CPU, 1, run_dir="/tmp/r")
            escape_if(spec.command[1:3] != ("--text", expected), "sweep (argv word)")


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=0, max_size=80), profile=st.one_of(st.none(), st.text(max_size=30)))
def test_run_dir_names_stay_directly_under_the_runs_root(name, profile):
    COUNTS["run-dir names"] += 1
    root = Path("/srv/runs")
    request = SubmitRequest(name, profile=profile)  # the run dir's name comes from the request, as submit makes it
    for path in (new_run_dir(request, root), sweep.new_sweep_dir(request, root)):
        escape_if(path.parent != root or path.name in ("", ".", "..") or "/" in path.name
                  or os.path.normpath(path) != str(path), "run-dir name")
        task = path / rundir.task_dir_name(7, 200)
        escape_if(task.parent != path, "sweep task dir")
