#!/usr/bin/env python3
"""ResNet data paths against the GPU's ceiling: img/s and ratios, all measured in one run on one device.

Rows (each the same model, batch size, AMP and channels-last on CUDA):
  synthetic eager            random tensors already on the device: the ceiling without torch.compile
  synthetic compiled         the same through torch.compile: the ceiling the issue's goal is set against
  hand-written torchvision   ImageFolder + the reference transforms + DataLoader + the same step (what users write)
  trainer --loader pil       our trainer (python -m toolkit.workloads.resnet, one rank), its steady img/s
  trainer --loader pil --compile
  trainer --loader gpu --compile   (the recipe's gpu-data profile)
  trainer --loader dali --compile  (only where nvidia.dali imports)
  data only --loader L       the trainer's batches for loader L with no model: what the data path can feed
                             (gpu runs here with device=cpu where there is no GPU: the same code, CPU decode)
A trainer row the device cannot run (gpu or dali on a CPU) prints the trainer's own error instead of a figure.
Ratios are to synthetic compiled (or synthetic eager with --no-compile). Goal on a GPU: trainer --loader gpu
--compile >= 0.9x, and no loader slower than pil.

Without CUDA it runs tiny sizes (resnet18, 32 px, batch 16) on the CPU, to exercise the code: those figures say
nothing about the GPU goal. Images are generated (smooth JPEGs of assorted sizes around --source-size) unless
--data names an ImageFolder root with train/ and val/.

    python benchmarks/bench_resnet_loader.py [--json FILE]                     # CPU here, or 1 GPU
    python benchmarks/bench_resnet_loader.py --data /fsx/data/imagenet --workers 15
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CUDA_SIZES = dict(arch="resnet50", image_size=224, batch_size=256, warmup=20, steps=60, source_size=(500, 375))
CPU_SIZES = dict(arch="resnet18", image_size=32, batch_size=16, warmup=3, steps=8, source_size=(64, 48))
CLASSES = 10


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_images(root: Path, count: int, source_size: tuple[int, int], workers: int) -> None:
    """`count` training JPEGs (and one validation image a class) with smooth random content."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(root / "train" / f"c{i % CLASSES}" / f"{i}.jpg", i, source_size) for i in range(count)]
    jobs += [(root / "val" / f"c{c}" / f"v{c}.jpg", count + c, source_size) for c in range(CLASSES)]
    for path, _, _ in jobs:
        path.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max(workers, 1)) as pool:
        list(pool.map(_write_one, jobs, chunksize=64))


def _write_one(job) -> None:
    import numpy as np
    from PIL import Image

    path, seed, (width, height) = job
    rng = np.random.default_rng(seed)
    width, height = (int(v * rng.uniform(0.75, 1.25)) for v in (width, height))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    base = [np.sin(xs / rng.uniform(5, 40) + rng.uniform(0, 6)) + np.cos(ys / rng.uniform(5, 40)) for _ in range(3)]
    pixels = np.stack(base, axis=-1) * 60 + 128 + rng.normal(0, 12, (height, width, 3))
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)


def trainer_step(torch, sizes, device, num_classes: int, compiled: bool = False):
    """One training step on a batch already on `device`, as the trainer takes it: fp16 autocast, channels-last and
    loss scaling on CUDA, SGD with momentum."""
    import torchvision

    model = torchvision.models.get_model(sizes["arch"], num_classes=num_classes).to(device)
    on_cuda = device.type == "cuda"
    if on_cuda:
        model = model.to(memory_format=torch.channels_last)
    step_model = torch.compile(model) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=on_cuda)

    def step(images, labels):
        if on_cuda:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.float16, enabled=on_cuda):
            loss = torch.nn.functional.cross_entropy(step_model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def synthetic(torch, sizes, device, compiled: bool) -> float:
    batch = sizes["batch_size"]
    images = torch.randn(batch, 3, sizes["image_size"], sizes["image_size"], device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    train = trainer_step(torch, sizes, device, 1000, compiled)
    return timed_steps(torch, device, lambda: train(images, labels), sizes)


def timed_steps(torch, device, step, sizes) -> float:
    for _ in range(sizes["warmup"]):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    for _ in range(sizes["steps"]):
        step()
    sync()
    return sizes["steps"] * sizes["batch_size"] / (time.perf_counter() - began)


def hand_written(torch, sizes, device, data: Path, workers: int) -> float:
    """The torchvision reference loop as users write it: CPU decode and transforms, pinned memory."""
    import torchvision
    from torchvision import transforms

    size = sizes["image_size"]
    train = torchvision.datasets.ImageFolder(data / "train", transforms.Compose([
        transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    on_cuda = device.type == "cuda"
    loader = torch.utils.data.DataLoader(train, batch_size=sizes["batch_size"], shuffle=True, drop_last=True,
                                         num_workers=workers, pin_memory=on_cuda, persistent_workers=workers > 0)
    train_step = trainer_step(torch, sizes, device, len(train.classes))
    batches = iter(loader)

    def step():
        nonlocal batches
        try:
            images, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            images, labels = next(batches)
        train_step(images.to(device, non_blocking=True), labels.to(device, non_blocking=True))

    return timed_steps(torch, device, step, sizes)


def data_only(torch, sizes, device, data: Path, workers: int, loader: str) -> float | str:
    """Batches per second of the trainer's Loaders alone, times the batch size."""
    from toolkit.errors import HpcError
    from toolkit.workloads.resnet_loaders import Loaders, check_loader

    try:
        if loader == "dali":
            check_loader(loader, device)
        built = Loaders(loader, {split: str(data / split) for split in ("train", "val")},
                        image_size=sizes["image_size"], crop_scale_min=0.08, seed=1, batch_size=sizes["batch_size"],
                        workers=workers, rank=0, world_size=1, device=device, channels_last=device.type == "cuda")
    except HpcError as exc:
        return f"error: {exc.message}"
    batches = iter(())
    epoch = 0

    def step():
        nonlocal batches, epoch
        try:
            next(batches)
        except StopIteration:
            built.sampler.start_epoch(epoch)
            epoch += 1
            batches = iter(built.train)
            next(batches)

    return timed_steps(torch, device, step, sizes)


def trainer(sizes, device, data: Path, workers: int, loader: str, compiled: bool, work: Path) -> float | str:
    """Our trainer as one rank; its steady img/s (train_log's, first interval left out), or its error line."""
    from toolkit.workloads.train_log import LOG_NAME, read_log

    run = Path(tempfile.mkdtemp(prefix=f"{loader}-", dir=work))
    steps = sizes["warmup"] + sizes["steps"]
    argv = [sys.executable, "-m", "toolkit.workloads.resnet", "--data", str(data), "--arch", sizes["arch"],
            "--image-size", str(sizes["image_size"]), "--batch-size", str(sizes["batch_size"]), "--epochs", "100",
            "--max-steps", str(steps), "--log-every-steps", str(sizes["warmup"]), "--workers", str(workers),
            "--loader", loader, "--device", device.type, "--log-dir", str(run), "--seed", "1"]
    argv += ["--amp", "--channels-last"] if device.type == "cuda" else ["--threads", str(os.cpu_count())]
    argv += ["--compile"] if compiled else []
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=str(REPO))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        return lines[0] if lines else f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    end = read_log(run / LOG_NAME)[-1]
    return end["steady_images_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--data", type=Path, help="an ImageFolder root (train/, val/); default: generated JPEGs")
    parser.add_argument("--workers", type=int, help="loader workers (default: CPUs - 1)")
    parser.add_argument("--arch")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--warmup", type=int, help="steps before timing")
    parser.add_argument("--steps", type=int, help="timed steps")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import torch

    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if on_cuda else "cpu")
    sizes = dict(CUDA_SIZES if on_cuda else CPU_SIZES)
    sizes.update({key: value for key in ("arch", "image_size", "batch_size", "warmup", "steps")
                  if (value := getattr(args, key)) is not None})
    workers = args.workers if args.workers is not None else max((os.cpu_count() or 2) - 1, 1)
    compile_too = not args.no_compile
    work = Path(tempfile.mkdtemp(prefix="bench-resnet-loader-"))
    data = args.data
    if data is None:
        data = work / "images"
        write_images(data, (sizes["warmup"] + sizes["steps"]) * sizes["batch_size"], sizes["source_size"], workers)
    what = torch.cuda.get_device_name(device) if on_cuda else "CPU (tiny sizes: exercises the code, not the GPU goal)"
    print(f"device: {what}; {sizes['arch']} {sizes['image_size']} px, batch {sizes['batch_size']}, "
          f"{sizes['steps']} timed steps after {sizes['warmup']}; {workers} loader workers; data {data}", flush=True)

    rows: dict[str, float | str] = {}
    rows["synthetic eager"] = synthetic(torch, sizes, device, compiled=False)
    if compile_too:
        rows["synthetic compiled"] = synthetic(torch, sizes, device, compiled=True)
    rows["hand-written torchvision loop"] = hand_written(torch, sizes, device, data, workers)
    for loader in ("pil", "gpu", "dali"):
        for compiled in ((False, True) if loader == "pil" else (compile_too,)):
            if compiled and not compile_too:
                continue
            name = f"trainer --loader {loader}" + (" --compile" if compiled else "")
            rows[name] = trainer(sizes, device, data, workers, loader, compiled, work)
            print(f"  {name}: {rows[name]}", flush=True)
    for loader in ("pil", "gpu", "dali"):
        rows[f"data only --loader {loader}"] = data_only(torch, sizes, device, data, workers, loader)
    ceiling_name = "synthetic compiled" if compile_too else "synthetic eager"
    ceiling = rows[ceiling_name]
    print(f"\n{'WAY':<34} {'IMG/S':>10} {'RATIO':>7}  (ratio to {ceiling_name})")
    for name, value in rows.items():
        if isinstance(value, float):
            print(f"{name:<34} {value:>10.1f} {value / ceiling:>6.2f}x")
        else:
            print(f"{name:<34} {'-':>10} {'':>7}  not run: {value}")
    if args.json:
        args.json.write_text(json.dumps({"device": what, "sizes": sizes, "workers": workers,
                                         "ceiling": ceiling_name, "images_per_sec": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
