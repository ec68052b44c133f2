"""One rank of the straggler comparison (benchmarks/bench_stragglers.py): a small DDP model on gloo (CPU), one rank
doing three times the forward work of the others (a real straggler: more compute, not a sleep), timed by no
detector, by hpc's heartbeat phases, or by nvidia-resiliency-ext's straggler Detector.

    straggler_ddp.py none|hpc|nvrx SLOW_RANK STEPS OUT_DIR
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

mode, slow_rank, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if mode == "nvrx":
    from nvidia_resiliency_ext.straggler import Detector

    Detector.initialize(scores_to_compute=["relative_perf_scores", "individual_perf_scores"], gather_on_rank0=True)
    # Stand-ins, named as such: no GPU here. Its report starts with torch.cuda.synchronize() and reads CUPTI's
    # kernel statistics; with every section timed on the host (profile_cuda=False) nothing was queued on a GPU,
    # so there is nothing to wait for and no kernel to report.
    torch.cuda.synchronize = lambda *args, **kwargs: None
    Detector.cupti_manager.get_results = lambda: {}
    Detector.cupti_manager.reset_results = lambda: None
    section = lambda: Detector.detection_section("forward", profile_cuda=False)  # noqa: E731
else:
    import contextlib

    section = contextlib.nullcontext
if mode == "hpc":
    from toolkit.workloads.heartbeat import beat

step_seconds = []
for step in range(1, steps + 1):
    began = time.perf_counter()
    x = torch.randn(128, 512)
    loaded = time.perf_counter()
    with section():
        loss = model(x).square().mean()
        if rank == slow_rank:
            with torch.no_grad():
                for _ in range(2):
                    model.module(x)
    forward = time.perf_counter()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    done = time.perf_counter()
    if mode == "hpc":
        beat(step, data=loaded - began, compute=forward - loaded, sync=done - forward)
    step_seconds.append(done - began)
out.mkdir(parents=True, exist_ok=True)
(out / f"steps-{rank}.json").write_text(json.dumps(step_seconds))
if mode == "nvrx":
    report = Detector.generate_report()
    if rank == 0:
        found = report.identify_stragglers()
        (out / "nvrx.json").write_text(json.dumps({key: sorted(s.rank for s in value) if isinstance(value, set) else
                                                   {k: sorted(s.rank for s in v) for k, v in value.items()}
                                                   for key, value in found.items()}))
dist.destroy_process_group()
