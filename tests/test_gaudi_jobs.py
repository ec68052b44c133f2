"""dl1.24xlarge (Habana Gaudi) jobs at 1, 2, 4 and 16 nodes: ranks, environment, CPU binding, the bert-5b
DeepSpeed config (its batch arithmetic, and DeepSpeed's own config parser), and the rank environment.

Nothing here ran on an HPU (there is none): the renders are executed with stub srun/scontrol/python
(tests/stubs.py), and the generated DeepSpeed config is parsed by the real DeepSpeed package on CPU.
"""

from __future__ import annotations

import importlib
import json
import socket

import pytest

from tests.conftest import REPO
from tests.stubs import FIRST_HOST, JOB_ID, PASSING_PREFLIGHT, install_stubs, run_script, write_executable
from toolkit.cluster.queues import Queue, load_queues
from toolkit.errors import HpcError
from toolkit.job.rank import master_port, preview_argv
from toolkit.slurm.render import export_line, render_script, srun_options
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe

NODES = (1, 2, 4, 16)
DL1 = load_queues(REPO / "jobs" / "dl1-cluster.yaml")["dl1"]
# What HabanaAI/Model-References release 1.8.0 holds (recorded from its branch, with the commit, in this dir)
RELEASE = REPO / "tests" / "data" / "model-references-1.8.0"
RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}


def words(spec) -> list[str]:
    return preview_argv(spec.command, RANK0)


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("recipe", ["bert-5b", "resnet50", "collectives"])
def test_one_rank_per_hpu_with_the_habana_environment_and_core_binding(recipe, nodes):
    spec = build_job_spec(load_recipe(recipe), DL1, nodes)
    assert (spec.tasks_per_node, spec.world_size, spec.cpus_per_task) == (8, 8 * nodes, 12)
    script = render_script(spec)
    assert "--gpus-per-node" not in script and "#SBATCH --ntasks-per-node=8" in script
    assert srun_options(spec)[-1].startswith("--cpu-bind=mask_cpu:0x3f00000000003f,")  # 6 cores (+ siblings)
    env = {v.name: v for v in spec.env}
    assert [n for n in env if n != "PYTHONUNBUFFERED"] == ["LD_LIBRARY_PATH", "PT_HPU_LAZY_MODE", "RDMAV_FORK_SAFE",
                                                           "FI_EFA_USE_DEVICE_RDMA", "HCCL_SOCKET_IFNAME"]
    assert env["RDMAV_FORK_SAFE"].value == env["FI_EFA_USE_DEVICE_RDMA"].value == "1"
    assert all("SynapseAI >= 1.8.0" in env[name].doc for name in ("RDMAV_FORK_SAFE", "FI_EFA_USE_DEVICE_RDMA"))
    lines = script.splitlines()
    for var in spec.env:  # each variable documented where it is set
        assert lines[lines.index(export_line(var)) - 1] == f"# {var.doc}"
    assert not [n for n in env if n.startswith("NCCL_")]
    if recipe != "bert-5b":
        argv = words(spec)
        assert argv[argv.index("--device") + 1] == "hpu" and argv[argv.index("--backend") + 1] == "hccl"


def test_a_dl1_queue_without_efa_gets_no_peer_direct_variables():
    queue = Queue(name="dl1", instance_type="dl1.24xlarge", max_nodes=4, efa_stack="none")
    assert [v.name for v in build_job_spec(load_recipe("collectives"), queue, 1).env] == [
        "PYTHONUNBUFFERED", "PT_HPU_LAZY_MODE"]


@pytest.mark.parametrize("nodes,steps", [(1, 64), (2, 32), (4, 16), (16, 4)])
def test_bert_5b_accumulation_keeps_the_global_batch(nodes, steps):
    spec = build_job_spec(load_recipe("bert-5b"), DL1, nodes)
    config = json.loads(spec.files[0].text)
    assert config["gradient_accumulation_steps"] == steps == 12288 // (24 * spec.world_size)
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (12288, 24)
    assert config["zero_optimization"]["stage"] == 2 and config["bf16"] == {"enabled": True}
    assert "--checkpoint_activations" in words(spec)
    argv = words(spec)
    assert argv[argv.index("--deepspeed_config") + 1] == spec.files[0].path == f"{spec.run_dir}/deepspeed.json"
    assert argv[argv.index("--optimizer") + 1] == "lans" and config["zero_allow_untested_optimizer"] is True


@pytest.mark.parametrize("nodes", [3, 5, 6])
def test_bert_5b_refuses_node_counts_that_do_not_divide_the_global_batch(nodes):
    with pytest.raises(HpcError) as err:
        build_job_spec(load_recipe("bert-5b"), DL1, nodes)
    assert "is not a whole number" in err.value.message and err.value.fix == "use --nodes 1 | 2 | 4 | 8 | 16"


def test_fairseq_recipes_do_not_run_on_gaudi():
    with pytest.raises(HpcError, match="runs on gpu or cpu only; queue dl1 .* has Gaudi HPUs"):
        build_job_spec(load_recipe("roberta"), DL1, 1)


def test_bert_5b_renders_exactly_its_pinned_model_references_release():
    """Model-References 1.8.0: the script where that release has it, the flags its run_bert_5b_128x_lans.sh
    passes (--use_hpu: else cuda + nccl) with its values, nothing its parser lacks, and its DeepSpeed config's
    keys and values (max_group_size included) but for the batch keys derived per job."""
    release = json.loads((RELEASE / "deepspeed-bert.json").read_text())
    spec = build_job_spec(load_recipe("bert-5b"), DL1, 16)
    argv = words(spec)
    assert argv[1] == f"/fsx/Model-References-{release['release']}/{release['dir']}/run_pretraining.py"
    flags = [w for w in argv[2:] if w.startswith("--")]
    ran = release["run_script_flags"]
    assert set(flags) <= set(release["parser_flags"])
    assert set(flags) == set(ran["run_pretraining.py"]) - {"--steps_this_run"}  # -1, its default: --max_steps
    for flag, value in ran["values"].items():
        if flag != "--steps_this_run":
            assert argv[argv.index(flag) + 1] == value, flag
    assert argv[argv.index("--config_file") + 1].endswith(f"{release['dir']}/scripts/bert_5b_config.json")
    published = json.loads((RELEASE / "deepspeed_config_bert_5b_lans.json").read_text())
    published.pop("tensorboard")  # disabled there, with a path relative to the cwd
    config = json.loads(spec.files[0].text)
    assert config.pop("gradient_accumulation_steps") == 4  # 12288 / (24 x 128): DeepSpeed derives it the same
    assert config == published


def test_the_deepspeed_config_and_outputs_are_in_the_jobs_own_run_dir(tmp_path):
    """Renders at two node counts name different run dirs (a fresh one each, or --run-dir): each writes its own
    DeepSpeed config (its accumulation differs) and checkpoints there."""
    specs = [build_job_spec(load_recipe("bert-5b"), DL1, n, run_dir=str(tmp_path / f"r{n}")) for n in (4, 16)]
    for spec in specs:
        argv = words(spec)
        assert spec.files[0].path == f"{spec.run_dir}/deepspeed.json" == argv[argv.index("--deepspeed_config") + 1]
        assert argv[argv.index("--output_dir") + 1] == f"{spec.run_dir}/checkpoints"
        assert argv[argv.index("--json-summary") + 1] == f"{spec.run_dir}/dllogger.json"
    assert [json.loads(s.files[0].text)["gradient_accumulation_steps"] for s in specs] == [16, 4]


class DataParallel:
    """A stand-in for Megatron-style `mpu`: DeepSpeed reads the data-parallel world size from it."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self.world_size

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture(scope="module")
def deepspeed_config_class():
    """DeepSpeed's DeepSpeedConfig, with deepspeed.comm initialised as one gloo rank (its parser asks
    deepspeed.comm for the rank first and ignores `mpu` when nothing is initialised)."""
    import os

    deepspeed = importlib.import_module("deepspeed")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    mp = pytest.MonkeyPatch()
    # DeepSpeed's shared-memory all-reduce kernel for CPU: JIT-compiled on first use (~110 s here) and not
    # needed to parse a config
    mp.setattr(ds_torch, "build_shm_op", lambda: None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        mp.setitem(os.environ, name, value)
    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.runtime.config import DeepSpeedConfig

    yield DeepSpeedConfig
    import torch.distributed

    torch.distributed.destroy_process_group()
    mp.undo()


@pytest.mark.training
@pytest.mark.parametrize("nodes", NODES)
def test_bert_5b_config_passes_deepspeeds_own_parser(deepspeed_config_class, nodes):
    spec = build_job_spec(load_recipe("bert-5b"), DL1, nodes)
    config = json.loads(spec.files[0].text)
    # max_group_size is a key of Habana's DeepSpeed fork (HabanaAI/DeepSpeed deepspeed/runtime/zero/config.py);
    # upstream's parser, the one installed here, forbids unknown keys
    assert config["zero_optimization"].pop("max_group_size") == 1310822400
    parsed = deepspeed_config_class(config, mpu=DataParallel(spec.world_size))
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (
        12288, 24, 12288 // (24 * spec.world_size))
    assert parsed.zero_optimization_stage == 2 and parsed.bfloat16_config.enabled and parsed.gradient_clipping == 1.0
    assert parsed.zero_allow_untested_optimizer and parsed.optimizer_name is None  # LANS comes from the script
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):  # the parser does check the world
        deepspeed_config_class(config, mpu=DataParallel(spec.world_size * 2))


@pytest.mark.parametrize("nodes", [1, 2])
def test_rendered_bert_5b_gives_each_rank_deepspeeds_environment(tmp_path, nodes):
    """The render, executed with stub srun/scontrol/python: every rank sees RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT (the rank contract) and the argv preview_argv gives; the config file is written."""
    root = tmp_path / "root"
    write_executable(root / "envs" / "habana" / "bin" / "activate", "# stub venv\n")
    spec = build_job_spec(load_recipe("bert-5b", overrides=[f"dirs.root={root}"]), DL1, nodes)
    bin_dir = install_stubs(tmp_path)
    # a stand-in for the node's python3, which the batch shell runs the pre-flight with (the pre-flight itself:
    # tests/test_preflight*.py, tests/test_node_contract.py); the ranks run the venv's `python` (a recording stub)
    write_executable(bin_dir / "python3", PASSING_PREFLIGHT)
    proc, ranks = run_script(render_script(spec), tmp_path, bin_dir)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert sorted(ranks) == list(range(8 * nodes))
    for rank, (argv, env) in ranks.items():
        assert argv == preview_argv(spec.command, env)[1:]  # after `python`
        assert argv[0] == f"{root}/Model-References-1.8.0/PyTorch/nlp/pretraining/deepspeed-bert/run_pretraining.py"
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank % 8), str(8 * nodes))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (FIRST_HOST, str(master_port(JOB_ID)))
        assert env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["PT_HPU_LAZY_MODE"] == "1"
    written = (tmp_path / "root" / "runs" / "bert-5b" / "deepspeed.json").read_text()
    assert json.loads(written) == json.loads(spec.files[0].text)


def test_the_submitit_path_gets_the_same_gaudi_job():
    """submit (submitit) consumes the same spec: no GPU request, the core binding, the config written in set-up."""
    from toolkit.slurm.executors import slurm_parameters

    spec = build_job_spec(load_recipe("bert-5b"), DL1, 4)
    params = slurm_parameters(spec)
    assert "gpus_per_node" not in params["additional_parameters"]
    assert (params["nodes"], params["ntasks_per_node"]) == (4, 8)
    assert params["srun_args"] == srun_options(spec) and spec.slurm.srun_binding[0] in params["srun_args"]
    setup = "\n".join(params["setup"])
    assert "export FI_EFA_USE_DEVICE_RDMA=1" in setup and f"> {spec.files[0].path}" in setup


def test_the_node_doctor_asks_no_gpus_on_a_gaudi_queue():
    from toolkit.health import doctor

    argv = doctor.srun_argv(DL1, 2, None)
    assert "--partition=dl1" in argv and not [a for a in argv if a.startswith("--gpus")]
