"""Our workloads' HPU paths (--device hpu), exercised with a STAND-IN for the Habana PyTorch bridge.

No Gaudi hardware or SynapseAI is available here: nothing in this file ran on a real HPU. The stand-in
(HabanaStandIn) is a fake `habana_frameworks` package put into sys.modules: htcore.mark_step() and
hpu.synchronize() only record that they were called, and importing ...distributed.hccl is replaced by
registering `hccl` as a torch.distributed backend that is really gloo. Tensors stay on the CPU (the stand-in
has no HPU memory: toolkit.workloads.hpu.DEVICE is patched to "cpu"). What is verified: the workloads load
the bridge, mark lazy-mode steps where Habana requires them (after backward, after optimizer.step; around
each timed collective), initialise the `hccl` backend, and, without the bridge, stop with one clear error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from tests.conftest import REPO, free_port
from toolkit.reports.nccl import parse_text
from toolkit.workloads import hpu


class HabanaStandIn:
    """Records the bridge calls our workloads make (see the module doc: a stand-in, not the real bridge)."""

    def __init__(self, monkeypatch) -> None:
        import torch.distributed as dist

        self.calls: list[str] = []
        names = ["habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core",
                 "habana_frameworks.torch.hpu", "habana_frameworks.torch.distributed",
                 "habana_frameworks.torch.distributed.hccl"]
        modules = {name: types.ModuleType(name) for name in names}
        for name, module in modules.items():
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(modules[parent], child, module)
            monkeypatch.setitem(sys.modules, name, module)
        modules["habana_frameworks.torch.core"].mark_step = lambda: self.calls.append("mark_step")
        modules["habana_frameworks.torch.hpu"].synchronize = lambda: self.calls.append("synchronize")
        if not hasattr(dist.Backend, "HCCL"):  # once per process: torch keeps registered backends
            dist.Backend.register_backend("hccl", HabanaStandIn._gloo_as_hccl, devices=["cpu"])
        HabanaStandIn.current = self
        monkeypatch.setattr(hpu, "DEVICE", "cpu")

    @staticmethod
    def _gloo_as_hccl(store, rank, size, timeout):
        import torch.distributed as dist

        HabanaStandIn.current.calls.append(f"hccl process group rank {rank} of {size}")
        return dist.ProcessGroupGloo(store, rank, size, timeout)


@pytest.fixture
def one_rank(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.training
def test_collectives_on_hpu_mark_steps_and_use_hccl(monkeypatch, one_rank, capsys):
    from toolkit.workloads.collectives import main

    bridge = HabanaStandIn(monkeypatch)
    assert main(["--device", "hpu", "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "32M", "-e", "32M",
                 "-n", "2", "-w", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "backend hccl, 1 ranks" in out
    assert bridge.calls.count("hccl process group rank 0 of 1") == 1
    # per op and placement: 1 warm-up + 2 timed launches, a mark before each of the 3 synchronizes
    # (after warm-up, after timing, after the checked call): 3 ops x 2 placements x (3 + 3)
    assert bridge.calls.count("mark_step") == 36 and bridge.calls.count("synchronize") == 18
    tests = parse_text(out)
    assert [t.name for t in tests] == ["all_reduce", "all_gather", "reduce_scatter"]
    assert all([r.size for r in t.rows] == [32 << 20] and t.devices == ["HPU (hccl)"] for t in tests)
    assert all(m.wrong == 0 for t in tests for r in t.rows for m in r.measures())


@pytest.mark.training
def test_resnet_on_hpu_marks_a_step_after_backward_and_after_the_optimizer(monkeypatch, one_rank, tmp_path):
    from toolkit.workloads import resnet, smoke_data

    full, _ = smoke_data.ensure("images", tmp_path / "full")
    data = tmp_path / "digits"
    for split, per_class in (("train", 4), ("val", 1)):
        for class_dir in sorted((full / split).iterdir()):
            (data / split / class_dir.name).mkdir(parents=True)
            for image in sorted(class_dir.iterdir())[:per_class]:
                shutil.copy(image, data / split / class_dir.name / image.name)
    bridge = HabanaStandIn(monkeypatch)
    marks_per_step = []
    real_step = resnet.Trainer._train_step

    def counted_step(self, images, targets, lr):
        before = bridge.calls.count("mark_step")
        loss = real_step(self, images, targets, lr)
        marks_per_step.append(bridge.calls.count("mark_step") - before)
        return loss

    monkeypatch.setattr(resnet.Trainer, "_train_step", counted_step)
    code = resnet.main(["--data", str(data), "--device", "hpu", "--arch", "resnet18", "--batch-size", "4",
                        "--image-size", "32", "--epochs", "1", "--max-steps", "3", "--workers", "0",
                        "--threads", "1", "--log-dir", str(tmp_path / "logs")])
    assert code == 0
    assert marks_per_step == [2, 2, 2]
    assert bridge.calls.count("hccl process group rank 0 of 1") == 1


@pytest.mark.parametrize("module,extra", [("toolkit.workloads.collectives", []),
                                          ("toolkit.workloads.resnet", ["--data", "/nonexistent"])])
def test_without_the_bridge_hpu_stops_at_start_with_one_clear_error(module, extra):
    """A real process with no habana_frameworks installed (this machine): one error naming the package."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    res = subprocess.run([sys.executable, "-m", module, "--device", "hpu", *extra], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert "error: --device hpu needs the Habana PyTorch bridge, package habana_frameworks" in res.stderr
    assert "fix: run in the Habana environment" in res.stderr


@pytest.mark.training
def test_a_cuda_backend_on_hpu_is_refused(capsys):
    from toolkit.workloads.collectives import main

    assert main(["--device", "hpu", "--backend", "nccl"]) == 1
    assert "--backend nccl does not run on --device hpu" in capsys.readouterr().err


@pytest.mark.training
def test_two_hpu_ranks_exchange_over_hccl_and_the_report_reads_them(tmp_path):
    """Two processes (ranks), each with the stand-in bridge: the nranks-dependent buffers of all_gather and
    reduce_scatter go through the HPU path, values check out, and rank 0's table parses as HPU (hccl) ranks."""
    port, procs = str(free_port()), []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "payloads" / "hpu_standin_collectives.py"),
             str(tmp_path / f"calls{rank}.json"), "--device", "hpu", "--ops", "all_reduce,all_gather,reduce_scatter",
             "-b", "1M", "-e", "4M", "-f", "4", "-n", "2", "-w", "1"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO))
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"calls{rank}.json").read_text())
        assert f"hccl process group rank {rank} of 2" in calls and calls.count("mark_step") == 72  # 2 sizes
    tests = parse_text(outs[0][0])
    assert [t.name for t in tests] == ["all_reduce", "all_gather", "reduce_scatter"]
    for t in tests:
        assert (t.ranks, t.devices) == (2, ["HPU (hccl)", "HPU (hccl)"])
        assert [r.size for r in t.rows] == [1 << 20, 4 << 20]
        assert all(m.wrong == 0 for r in t.rows for m in r.measures())
