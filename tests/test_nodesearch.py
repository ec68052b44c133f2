"""The bad-node search's rounds (toolkit.health.nodesearch.search) against a stand-in cluster: a function giving
each group's all_reduce bus bandwidth from its nodes' speeds (the slowest node paces a ring) with noise, or a
failure where a node fails. On the local Slurm, with nodes made bad for real: tests/test_nodesearch_slurm.py."""

from __future__ import annotations

import math
from pathlib import Path
import random

import pytest

from toolkit.health.nodesearch import GroupRun, drain_commands, first_groups, max_rounds, search


def standin(slow: dict[str, float] | None = None, failing: set[str] | frozenset[str] = frozenset(),
            noise: float = 0.1, seed: int = 0, once: dict[int, set[str]] | None = None):
    """measure(round, groups): busbw 10 GB/s x the slowest member's speed x (1 +- noise); a group with a failing
    node fails; `once`: nodes slow (x0.2) in that round only (a transient, e.g. a noisy neighbour)."""
    rng = random.Random(seed)
    slow = slow or {}
    calls = []

    def measure(number, groups):
        calls.append([tuple(g) for g in groups])
        runs = []
        for g in groups:
            if failing & set(g):
                runs.append(GroupRun(tuple(g), None, "the collective failed: Connection reset by peer"))
                continue
            speed = min(slow.get(n, 1.0) * (0.2 if n in (once or {}).get(number, ()) else 1.0) for n in g)
            runs.append(GroupRun(tuple(g), 10 * speed * (1 + rng.uniform(-noise, noise))))
        return runs
    measure.calls = calls
    return measure


def names(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(1, n + 1)]


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("group_size", [2, 0])  # 0: plain bisection (halves first)
def test_one_slow_node_is_found_within_the_round_goal_at_every_position(n, group_size):
    for bad in names(n):
        measure = standin({bad: 0.3}, seed=hash(bad) % 1000)
        result = search(names(n), measure, group_size or n // 2)
        assert set(result.bad) == {bad} and not result.unresolved, (bad, result.rounds)
        assert len(result.rounds) <= math.ceil(math.log2(n)) + 2 == max_rounds(n)
        assert "bus bandwidth" in result.bad[bad] and result.per_node[bad]["verdict"] == "bad"
        assert len(measure.calls[0]) == (n // 2 if group_size == 2 else 2)
        for groups in measure.calls:  # a node runs in at most one group at a time
            members = [x for g in groups for x in g]
            assert len(members) == len(set(members))


def test_pairs_take_three_rounds_and_far_fewer_runs_than_all_pairs():
    measure = standin({"n05": 0.3})
    result = search(names(16), measure)
    assert len(result.rounds) == 3  # pairs, the slow pair split (each with a healthy partner), the confirmation
    assert sum(len(c) for c in measure.calls) < math.comb(16, 2) / 5


def test_two_bad_nodes_and_a_failing_one_are_all_named():
    result = search(names(16), standin({"n03": 0.2, "n12": 0.4}, failing={"n07"}))
    assert set(result.bad) == {"n03", "n07", "n12"}
    assert result.bad["n07"] == "the collective failed: Connection reset by peer"
    assert len(result.rounds) <= max_rounds(16)


def test_clean_clusters_raise_no_false_alarm_over_twenty_noisy_searches():
    for seed in range(20):
        assert search(names(16), standin(noise=0.25, seed=seed)).bad == {}


def test_a_transient_slow_run_is_cleared_by_the_confirmation_round():
    """n04 looks slow in rounds 1 and 2 only (a noisy neighbour): the confirmation round clears it."""
    result = search(names(8), standin(once={1: {"n04"}, 2: {"n04"}}))
    assert result.bad == {} and len(result.rounds) == 3
    assert result.per_node["n04"]["verdict"] == "ok"


def test_two_nodes_that_fail_together_cannot_be_told_apart():
    result = search(["a", "b"], standin(failing={"b"}))
    assert result.bad == {} and result.unresolved == ["a", "b"]


def test_groups_and_the_drain_plan():
    assert first_groups(names(5), 2) == [("n01", "n02"), ("n03", "n04", "n05")]  # no group of one
    assert first_groups(names(8), 8) == [tuple(names(4)), tuple(names(8)[4:])]  # two groups at least
    plan = drain_commands({"n03": "all_reduce bus bandwidth 2 GB/s with n01, against 10 GB/s"})
    assert plan == [["scontrol", "update", "NodeName=n03", "State=DRAIN",
                     "Reason=hpc find-bad-nodes: all_reduce bus bandwidth 2 GB/s with n01, against 10 GB/s"]]


def test_noise_in_the_first_round_leaves_few_healthy_partners_and_the_suspects_wait_their_turn():
    """Three of four pairs look slow in round 1 (n01 and n03 by noise, n06 for real): two healthy partners for six
    suspects, so four wait a round; the search still names n06 alone within the goal."""
    measure = standin({"n06": 0.3}, once={1: {"n01", "n03"}})
    result = search(names(8), measure)
    assert result.bad.keys() == {"n06"} and not result.unresolved
    assert len(result.rounds) == 4 <= max_rounds(8)
    # round 2: two partners free; round 4: the confirmation and a control group of healthy nodes
    assert [len(c) for c in measure.calls] == [4, 2, 4, 2]


# -- the search job: a collectives job of the queue (toolkit.health.nodesearch), its ranks' import check ----------

import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from toolkit.cluster.queues import Queue  # noqa: E402
from toolkit.errors import UsageError  # noqa: E402
from toolkit.health.nodesearch import sbatch_argv, script_text, search_env  # noqa: E402
from toolkit.node.nodesearch import PROBE, Shape, group_argv, import_failures, run_group  # noqa: E402


def efa_queue(instance_type: str, **kw) -> Queue:
    return Queue(name="q", instance_type=instance_type, max_nodes=16, efa_stack="modern", efa_enabled=True,
                 fsx_mount="/fsx", **kw)


def step(env, group=("n1", "n2")) -> list[str]:
    """A group's srun argv inside the job, as the job's node-side search builds it from the job's arguments."""
    args = dict(zip(env.node_args()[0::2], env.node_args()[1::2], strict=False))  # a trailing bare flag
    binding = tuple(a.split("=", 1)[1] for a in env.node_args() if a.startswith("--srun-option="))
    shape = Shape(int(args["--ranks-per-node"]), int(args["--cpus-per-task"]) or 96,
                  int(args["--gpus-per-node"]), binding)
    return group_argv(group, 21000, args["--python"], args["--device"], ["--ops", "all_reduce"], shape)


@pytest.mark.parametrize("instance_type, cpus", [("p4d.24xlarge", 12), ("p5.48xlarge", 24)])
def test_gpu_queues_run_one_rank_per_gpu_in_the_collectives_jobs_software_and_efa_environment(instance_type, cpus):
    env = search_env(efa_queue(instance_type), 2)
    assert (env.device, env.ranks_per_node, env.gpus_per_node, env.cpus_per_task) == ("cuda", 8, 8, cpus)
    assert env.binding == ("--cpu-bind=none",)
    assert env.python == "/fsx/envs/train/bin/python"  # the collectives recipe's venv under the queue's FSx
    setup = "\n".join(env.setup)
    assert "source /fsx/envs/train/bin/activate" in setup
    assert "export NCCL_NET='AWS Libfabric'" in setup and "/opt/amazon/efa/lib:/opt/amazon/openmpi/lib" in setup
    argv = step(env)
    assert argv[:9] == ["srun", "--export=ALL,MASTER_ADDR=n1,MASTER_PORT=21000", "--nodes=2", "--ntasks=16",
                        "--ntasks-per-node=8", "--nodelist=n1,n2", f"--cpus-per-task={cpus}", "--gpus-per-node=8",
                        "--cpu-bind=none"]
    program = argv[argv.index("bash") + 2]
    assert 'LOCAL_RANK="$SLURM_LOCALID"' in program and "LOCAL_WORLD_SIZE=8" in program
    assert argv[argv.index("group") + 1:] == ["/fsx/envs/train/bin/python", "-c", PROBE, "cuda", "--ops", "all_reduce"]
    sbatch = sbatch_argv(env, "q", ["n1", "n2"], Path("/fsx/runs/s"), Path("/fsx/runs/s/search.sbatch"))
    assert "--ntasks-per-node=8" in sbatch and "--gpus-per-node=8" in sbatch and "--exclusive" in sbatch


def test_a_venv_replaces_the_recipes_software_and_the_submitters_python_reaches_no_node(tmp_path):
    env = search_env(efa_queue("p4d.24xlarge"), 2, venv="/fsx/other venv")
    assert env.python == "/fsx/other venv/bin/python" and "source '/fsx/other venv/bin/activate'" in env.setup[0]
    text = script_text(env, tmp_path / "run", ["--size", "64M"])
    assert sys.executable not in text and sys.prefix not in text
    last = shlex.split(text.splitlines()[-1])
    assert last[:3] == ["exec", "$HPC_PYTHON", "-S"] and last[4] == "nodesearch"  # -S: stdlib only
    assert last[last.index("--python") + 1] == "/fsx/other venv/bin/python" and last[-2:] == ["--size", "64M"]
    assert text.index("export NCCL_NET=") < text.index("HPC_NODE_BUNDLE") < text.index("exec ")


def test_dl1_runs_one_rank_per_hpu_with_gaudis_binding_and_no_gpus():
    env = search_env(efa_queue("dl1.24xlarge"), 2)
    assert (env.device, env.ranks_per_node, env.gpus_per_node) == ("hpu", 8, 0)
    assert env.binding and env.binding != ("--cpu-bind=none",)  # toolkit.accelerators.gaudi.srun_binding's
    assert "export PT_HPU_LAZY_MODE=1" in env.setup and not any("NCCL_NET" in line for line in env.setup)
    argv = step(env)
    assert "--ntasks-per-node=8" in argv and not any(a.startswith("--gpus-per-node") for a in argv)
    assert argv[argv.index(PROBE) + 1] == "hpu"
    assert not any(a.startswith("--gpus") for a in sbatch_argv(env, None, ["a", "b"], Path("/r"), Path("/r/s")))


def test_cpu_queues_keep_one_rank_per_node_with_every_cpu():
    queue = Queue(name="cpu", instance_type="c5n.18xlarge", max_nodes=4, efa_stack="none", ranks_per_node=4)
    env = search_env(queue, 2, venv="/shared/venv")
    assert (env.device, env.ranks_per_node, env.cpus_per_task, env.gpus_per_node) == ("cpu", 1, 0, 0)
    assert not any("OMP_NUM_THREADS" in line or "NCCL_NET" in line for line in env.setup)
    argv = step(env)
    assert "--ntasks-per-node=1" in argv and "--cpus-per-task=96" in argv and "--cpu-bind=none" in argv
    assert argv[argv.index(PROBE) + 1] == "cpu"
    with pytest.raises(UsageError) as err:  # no FSx for the recipe's relative venv, none given
        search_env(queue, 2)
    assert "--venv" in err.value.fix


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A venv made by the system's python3 -m venv: no torch, no toolkit (as a node's python may be)."""
    path = tmp_path_factory.mktemp("venv") / "bare"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path


def test_a_rank_whose_python_has_no_torch_says_so_in_one_parseable_line(bare_venv):
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "c3"}
    res = subprocess.run([str(bare_venv / "bin" / "python"), "-c", PROBE, "cuda", "--ops", "all_reduce"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 3
    found = import_failures(res.stderr)
    assert list(found) == ["c3"]
    assert found["c3"].startswith("torch does not import on c3: ModuleNotFoundError: No module named 'torch'")
    assert str(bare_venv / "bin" / "python") in found["c3"]


def test_a_group_whose_ranks_fail_to_import_names_those_nodes(tmp_path):
    """run_group on a stand-in srun printing what two ranks' PROBE prints: the nodes, not 'the collective failed'."""
    srun = tmp_path / "srun"
    report = ('hpc-find-bad-nodes: import failed: {"node": "%s", "kind": "%s", "python": "/v/bin/python", '
              '"error": "%s"}')
    srun.write_text("#!/bin/sh\n" + "".join(f"echo {shlex.quote(report % r)} >&2\n" for r in (
        ("c2", "torch", "ModuleNotFoundError: No module named 'torch'"),
        ("c2", "torch", "ModuleNotFoundError: No module named 'torch'"),
        ("c1", "nccl", "OSError: libnccl.so.2: cannot open shared object file")))
                    + "echo 'srun: error: c1: task 0: Exited with exit code 3' >&2\nexit 3\n")
    srun.chmod(0o755)
    run = run_group([str(srun)], ("c1", "c2"), 30)
    assert run.busbw is None and dict(run.software) == {
        "c1": "NCCL (torch's) does not load on c1: OSError: libnccl.so.2: cannot open shared object file "
              "(python /v/bin/python)",
        "c2": "torch does not import on c2: ModuleNotFoundError: No module named 'torch' (python /v/bin/python)"}


def test_nodes_whose_torch_does_not_import_are_named_so_not_bad_nor_unresolved():
    """c2 and c5 lack torch: named at round 1 and left out; their partners are tested again with healthy ones."""
    def measure(number, groups):
        runs = []
        for g in groups:
            missing = [n for n in g if n in ("n02", "n05")]
            runs.append(GroupRun(tuple(g), None, "torch does not import", 1.0,
                                 tuple((n, f"torch does not import on {n}: ModuleNotFoundError") for n in missing))
                        if missing else GroupRun(tuple(g), 10.0))
        return runs
    result = search(names(8), measure)
    assert set(result.software) == {"n02", "n05"} and result.bad == {} and result.unresolved == []
    assert result.software["n02"] == "torch does not import on n02: ModuleNotFoundError"
    assert result.per_node["n02"]["verdict"] == "software" and result.per_node["n01"]["verdict"] == "ok"
    assert len(result.rounds) == 2  # n01 and n06 (their partners) pass with healthy partners in round 2
    every = search(names(4), lambda _n, gs: [GroupRun(tuple(g), None, "x", 0, tuple((n, "no torch") for n in g))
                                             for g in gs])
    assert set(every.software) == set(names(4)) and every.unresolved == [] and len(every.rounds) == 1
