"""Rendered scripts executed with stub srun/scontrol/workloads: hostile values arrive as literal arguments and
never run, and the rank program expands every rank's values as preview_argv() shows them."""

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.jobhelpers import CPU, P3DN
from tests.stubs import FIRST_HOST, JOB_ID, PASSING_PREFLIGHT, RECORD, install_stubs, run_script, write_executable
from toolkit.slurm.render import render_script
from toolkit.job.rank import master_port, preview_argv
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe, parse_override

CANARY = "PWNED"
HOSTILE = st.one_of(
    st.sampled_from([f"$(touch {CANARY})", f"`touch {CANARY}`", f"'; touch {CANARY}; '", f'"; touch {CANARY}; "',
                     f"\ntouch {CANARY}\n", f"x;touch {CANARY}", f"${{IFS}}touch${{IFS}}{CANARY}", "$SLURM_PROCID",
                     '"${MASTER_ADDR}"', "'\"'\"'", "*", "~", "-rf", "a b", "\\", "!!", "%j", "{{ spec }}"]),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=24),
)
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_root(workdir: Path) -> Path:
    """A dirs.root with the recipes' venv (an activate that does nothing) and a recording nccl-tests binary."""
    root = workdir / "root"
    write_executable(root / "envs" / "train" / "bin" / "activate", "# stub venv\n")
    write_executable(root / "nccl-tests" / "build" / "all_reduce_perf", RECORD)
    return root


def execute(spec, workdir: Path):
    bin_dir = install_stubs(workdir)
    # a stand-in for the node's python3, which the batch shell runs the pre-flight with (the pre-flight itself:
    # tests/test_preflight*.py, tests/test_node_contract.py)
    write_executable(bin_dir / "python3", PASSING_PREFLIGHT)
    proc, ranks = run_script(render_script(spec), workdir, bin_dir)
    assert not (workdir / CANARY).exists(), "a value ran as a command"
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert sorted(ranks) == list(range(spec.world_size))
    for rank, (argv, env) in ranks.items():
        assert argv == preview_argv(spec.command, env)[1:]  # the contract (RANK, ...) as the task's bash expanded it
        assert (env["SLURM_PROCID"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            str(rank), FIRST_HOST, str(master_port(JOB_ID)))
    return ranks


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@FUZZ
@given(arg=HOSTILE, env_value=HOSTILE, data=HOSTILE)
def test_hostile_recipe_fields_arrive_literally(arg, env_value, data):
    raw = yaml.safe_load((REPO / "recipes" / "transformer.yaml").read_text())
    raw["args"]["--hostile"] = arg
    raw["env"] = {"HPC_FUZZ": env_value}
    raw["dirs"]["data"]["dir"] = data
    text = yaml.safe_dump(raw, sort_keys=False)
    assume(yaml.safe_load(text) == raw)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "fuzz.yaml").write_text(text)
        root = make_root(workdir)
        spec = build_job_spec(load_recipe(workdir / "fuzz.yaml", overrides=[f"dirs.root={root}"]), CPU, 2)
        for rank, (argv, env) in execute(spec, workdir).items():
            assert after(argv, "--hostile") == arg
            assert argv[0] == (data if data.startswith("/") else f"{root}/{data}")
            assert after(argv, "--distributed-rank") == str(rank)
            assert env["HPC_FUZZ"] == env_value


@FUZZ
@given(arg=HOSTILE, env_value=HOSTILE, data=HOSTILE)
def test_hostile_set_overrides_arrive_literally(arg, env_value, data):
    values = [parse_override(f"k={v}")[1] for v in (arg, env_value, data)]
    assume(all(isinstance(v, str) and v for v in values))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        root = make_root(workdir)
        recipe = load_recipe("resnet50", overrides=[f"dirs.root={root}", f"args.--hostile={arg}",
                                                    f"env.HPC_FUZZ={env_value}", f"dirs.data.dir={data}"])
        spec = build_job_spec(recipe, CPU, 2)
        for argv, env in execute(spec, workdir).values():
            assert after(argv, "--hostile") == values[0]
            assert env["HPC_FUZZ"] == values[1]
            assert after(argv, "--data") == (values[2] if values[2].startswith("/") else f"{root}/{values[2]}")


def test_mpi_binary_runs_under_srun_with_the_same_argv(tmp_path):
    root = make_root(tmp_path)
    spec = build_job_spec(load_recipe("nccl-tests", overrides=[f"dirs.root={root}"]), P3DN, 1)
    assert "--mpi=pmix" in render_script(spec)
    ranks = execute(spec, tmp_path)
    assert len(ranks) == 8 and ranks[5][0] == ["-b", "16", "-e", "8192M", "-f", "2", "-g", "1", "-c", "1", "-n", "100"]


def test_a_hostile_venv_path_is_sourced_literally_and_runs_nothing(tmp_path):
    recipe = load_recipe("resnet50", overrides=[f"dirs.root={tmp_path}", f"software.venv=$(touch {CANARY})"])
    proc, ranks = run_script(render_script(build_job_spec(recipe, CPU, 1)), tmp_path, install_stubs(tmp_path))
    assert not (tmp_path / CANARY).exists() and proc.returncode != 0 and not ranks
    assert f"{tmp_path}/$(touch {CANARY})/bin/activate" in proc.stderr.decode()
