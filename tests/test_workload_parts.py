"""The trainer's torch-free parts: rank layout, learning-rate schedule, log records, the stop flag."""

from __future__ import annotations

import os
import signal

import pytest

from toolkit.workloads.rank_env import rank_env
from toolkit.workloads.resnet import lr_at, parse_args
from toolkit.workloads.stopping import StopFlag, ignore_stop_signals
from toolkit.workloads.train_log import TrainLog, read_log, steady_throughput


def test_the_rank_contract_is_read_and_slurm_task_variables_are_not():
    """The rank program exports the contract on every path: a rank reads it, never Slurm's task variables (which
    say the agent's place under torchrun, not the worker's)."""
    env = rank_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "4242",
                    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8"})
    assert (env.rank, env.local_rank, env.world_size, env.init_method) == (3, 1, 4, "tcp://n1:4242")
    alone = rank_env({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "MASTER_ADDR": "n2"})
    assert (alone.rank, alone.world_size, alone.master_port) == (0, 1, 29500)


def test_a_lone_process_is_rank_zero_of_one():
    env = rank_env({})
    assert (env.rank, env.world_size, env.master_addr) == (0, 1, "127.0.0.1")


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "inconsistent"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK must be an integer"),
])
def test_bad_rank_layouts_are_named(environ, message):
    with pytest.raises(ValueError, match=message):
        rank_env(environ)


def test_lr_warms_up_linearly_then_decays_polynomially_to_zero():
    schedule = dict(lr=1.0, warmup_lr=0.1, warmup_steps=10, total_steps=110, power=2.0)
    assert lr_at(0, **schedule) == pytest.approx(0.1)
    assert lr_at(5, **schedule) == pytest.approx(0.55)
    assert lr_at(10, **schedule) == pytest.approx(1.0)
    assert lr_at(60, **schedule) == pytest.approx(0.25)  # half-way through the decay: (1 - 0.5) ** 2
    assert lr_at(110, **schedule) == 0.0
    assert lr_at(0, **{**schedule, "warmup_steps": 0}) == pytest.approx(1.0)


def test_recipe_argument_names_parse():
    args = parse_args(["--data", "d", "--arch", "resnet50", "--epochs", "90", "--batch-size", "256", "--lr", "6.4",
                       "--warmup-epochs", "10", "--warmup-lr", "0.001", "--lr-decay-power", "2", "--momentum", "0.9",
                       "--nesterov", "--weight-decay", "1e-4", "--zero-init-last-bn", "--amp", "--image-size", "224",
                       "--channels-last", "--workers", "8", "--checkpoint-dir", "c", "--checkpoint-every-steps",
                       "1000", "--log-dir", "l", "--max-steps", "5", "--seed", "1", "--device", "cpu", "--backend",
                       "gloo", "--threads", "2"])
    assert (args.lr, args.warmup_epochs, args.nesterov, args.amp, args.threads) == (6.4, 10.0, True, True, 2)


def test_bad_arguments_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--data", "d", "--batch-size", "0"])
    assert exit_info.value.code == 2
    assert "--batch-size must be at least 1" in capsys.readouterr().err


def _train(step, images, seconds):
    return {"event": "train", "step": step, "interval_images": images, "interval_seconds": seconds}


def test_steady_throughput_leaves_out_the_first_interval_of_each_attempt():
    records = [{"event": "start"}, _train(10, 100, 10.0), _train(20, 100, 1.0), _train(30, 100, 1.0),
               {"event": "checkpoint"}, {"event": "start"}, _train(40, 100, 5.0), _train(50, 100, 2.0)]
    assert steady_throughput(records) == pytest.approx(300 / 4.0)
    assert steady_throughput(records[:2]) is None


def test_only_rank_zero_writes_the_log(tmp_path, capsys):
    TrainLog(tmp_path / "r1", enabled=False).write("start", world_size=2)
    assert not (tmp_path / "r1").exists() and capsys.readouterr().out == ""
    log = TrainLog(tmp_path / "r0", enabled=True)
    log.write("train", step=10, epoch=0, loss=2.5, lr=0.1, images_per_sec=50.0, world_size=2)
    records = read_log(log.path)
    assert records[0]["step"] == 10 and records[0]["event"] == "train" and "time" in records[0]
    assert "step 10 epoch 0 loss 2.5000" in capsys.readouterr().out


def test_stop_flag_remembers_the_first_signal():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        flag = StopFlag().install()
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested and flag.signal_name == "SIGUSR2"
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_children_told_to_ignore_stop_signals_survive_them():
    pid = os.fork()
    if pid == 0:  # the child: ignore, receive both, and exit with a code only a survivor can give
        ignore_stop_signals()
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7


def test_the_workloads_take_devices_backends_and_runtimes_from_the_accelerator_families():
    """Our workloads name no family's device: the choices, defaults and messages they wrote by hand before come
    from the registry (toolkit.workloads.devices), and a device with its own runtime gets that module."""
    import types

    from toolkit.workloads import collectives, devices, hpu, resnet

    assert devices.DEVICES == ("cuda", "hpu", "cpu") and devices.ANYWHERE == "gloo"
    assert devices.BACKENDS == {"cuda": "nccl", "hpu": "hccl", "cpu": "gloo"}
    assert devices.runtime("hpu") is hpu and devices.runtime("cuda") is None and devices.runtime("cpu") is None
    assert devices.of(types.SimpleNamespace(type="hpu")) is hpu
    assert devices.of(types.SimpleNamespace(type="cpu")) is None
    fake_torch = types.SimpleNamespace(float32="f32", float64="f64")
    assert [devices.reduce_dtype(fake_torch, types.SimpleNamespace(type=kind)) for kind in ("hpu", "cuda", "cpu")] \
        == ["f32", "f64", "f64"]  # Gaudi has no float64
    assert devices.each("{backend} with {device}", " and ") == "nccl with cuda, hccl with hpu and gloo with cpu"
    bench = {action.dest: action for action in collectives.parser()._actions}
    assert bench["device"].choices == ("auto", "cuda", "hpu", "cpu")
    assert bench["device"].help == "auto: cuda if available, else cpu; hpu needs the Habana PyTorch bridge"
    assert bench["backend"].choices == ("auto", "nccl", "hccl", "gloo")
    assert bench["backend"].help == "auto: follows --device (cuda: nccl, hpu: hccl, cpu: gloo)"
    trainer = {action.dest: action for action in resnet.parser()._actions}
    assert trainer["device"].choices == ["cpu", "cuda", "hpu"]
    assert trainer["backend"].choices == ["gloo", "nccl", "hccl"]
    assert trainer["backend"].help == "default: nccl on cuda, hccl on hpu, gloo on cpu"
    assert trainer["amp"].help.startswith("fp16 autocast + grad scaling on cuda, bf16 autocast on hpu; ignored on cpu")
    with pytest.raises(SystemExit):
        resnet.parse_args(["--data", "/d", "--device", "tpu"])
