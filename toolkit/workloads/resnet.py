"""Our ResNet (v1.5: torchvision's resnet50) data-parallel trainer, torchvision reference style.

Launched once per rank: `python -m toolkit.workloads.resnet --data DIR ...`. The rank layout comes from the
rank contract: RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (toolkit.workloads.rank_env).

Exit codes: 0 done (all epochs, or --max-steps reached); 1 error (message on stderr);
EXIT_STOPPED (75) stopped on SIGUSR2/SIGTERM after saving a checkpoint: requeue to continue.

Resuming is automatic from --checkpoint-dir/checkpoint_last.pt and exact: with the same seed, world size and
batch size, every step's loss equals that of an uninterrupted run (on CPU; cuDNN kernels are not bitwise
reproducible). The checkpoint dir must be shared by all ranks (every rank loads it; only rank 0 writes).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence

from toolkit.errors import HpcError
from toolkit.node import heartbeat
from toolkit.workloads import checkpoint, devices
from toolkit.workloads.rank_env import rank_env
from toolkit.workloads.stopping import EXIT_STOPPED, StopFlag, all_reduce_step, ignore_stop_signals
from toolkit.workloads.train_log import TrainLog, steady_throughput

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
           "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2")


def parser() -> argparse.ArgumentParser:
    """The trainer's flags (also what `hpc` checks a recipe's args against when it plans a job:
    toolkit.job.argcheck)."""
    p = argparse.ArgumentParser(prog="python -m toolkit.workloads.resnet", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder root with train/ and val/")
    p.add_argument("--arch", default="resnet50", choices=RESNETS)
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate, already scaled to the global batch")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--warmup-lr", type=float, default=0.001, help="learning rate at step 0 of the warm-up")
    p.add_argument("--lr-decay-power", type=float, default=2.0, help="polynomial decay to 0 after the warm-up")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--zero-init-last-bn", action="store_true", help="zero gamma of each block's last BN")
    p.add_argument("--amp", action="store_true",
                   help=f"fp16 autocast + grad scaling on cuda, {devices.amp_forms()}; ignored on cpu (keeps CPU "
                        "runs exactly resumable)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--crop-scale-min", type=float, default=0.08,
                   help="smallest area fraction RandomResizedCrop keeps (tiny smoke images need more)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes per rank")
    p.add_argument("--loader", choices=("pil", "gpu", "dali"), default="pil",
                   help="where JPEGs are decoded and augmented: pil in the loader workers (any device); gpu "
                        "batched nvjpeg + crop/flip/normalise on the GPU (same crops as pil); dali NVIDIA DALI "
                        "(needs nvidia-dali; its own crops). See toolkit.workloads.resnet_loaders")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    p.add_argument("--checkpoint-dir", help="resume from checkpoint_last.pt here; save here")
    p.add_argument("--checkpoint-every-steps", type=int, default=0, help="0: only at epoch ends and stops")
    p.add_argument("--log-dir", help="rank 0 appends train_log.jsonl here")
    p.add_argument("--log-every-steps", type=int, default=10)
    p.add_argument("--max-steps", type=int, help="stop (exit 0, after saving) once this many steps are done")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=sorted(devices.DEVICES), help=f"default: cuda if available; {devices.needs()}")
    p.add_argument("--backend", choices=[devices.BACKENDS[device] for device in sorted(devices.DEVICES)],
                   help="default: {}".format(devices.each("{backend} on {device}")))
    p.add_argument("--threads", type=int, help="torch/OpenMP threads per rank (default: SLURM_CPUS_PER_TASK)")
    return p


def check_values(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse's types cannot say (p.error exits 2 with the message, as argparse does)."""
    for name in ("epochs", "batch_size", "image_size", "log_every_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.crop_scale_min <= 1:
        p.error("--crop-scale-min must be in (0, 1]")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    check_values(p, args)
    return args


def lr_at(step: int, *, lr: float, warmup_lr: float, warmup_steps: int, total_steps: int, power: float) -> float:
    """Learning rate for the update numbered `step` (0-based): linear warm-up, then polynomial decay to 0."""
    if step < warmup_steps:
        return warmup_lr + (lr - warmup_lr) * step / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    return lr * max(1.0 - (step - warmup_steps) / decay_steps, 0.0) ** power


def _threads(args: argparse.Namespace) -> int | None:
    if args.threads is not None:
        return args.threads
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() and int(cpus) > 0 else None


class Trainer:
    """One rank's training run; `run()` returns the process exit code."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from toolkit.workloads.resnet_loaders import check_loader

        self.args = args
        self.torch = torch
        try:
            self.env = rank_env()
        except ValueError as exc:
            raise HpcError(f"cannot tell this rank's place in the job: {exc}",
                           fix="launch with srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT") from None
        self.device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device_type == "cuda" and not torch.cuda.is_available():
            raise HpcError("--device cuda but this node has no usable GPU", fix="use --device cpu")
        native = devices.BACKENDS
        self.backend = args.backend or native[self.device_type]
        if self.backend != devices.ANYWHERE and self.backend != native[self.device_type]:
            pairs = devices.each("{backend} with {device}")
            raise HpcError(f"--backend {self.backend} does not run on --device {self.device_type}",
                           fix=f"use {pairs} (or leave --backend out)")
        # a device with its own runtime (devices.runtime: a vendor's bridge); in lazy mode the graph runs at each
        # mark_step (after backward and after the optimizer step)
        self.runtime = devices.runtime(self.device_type)
        self.htcore = self.runtime.load_bridge(self.env.local_rank) if self.runtime is not None else None
        if self.device_type == "cuda":
            torch.backends.cudnn.benchmark = True
            self.device = torch.device("cuda", self.env.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        elif self.runtime is not None:
            self.device = torch.device(self.runtime.DEVICE)
        else:
            self.device = torch.device("cpu")
        check_loader(args.loader, self.device)
        if args.compile and not hasattr(torch, "compile"):
            raise HpcError(f"--compile needs torch >= 2.0 (this is {torch.__version__})", fix="drop --compile")
        self.is_main = self.env.rank == 0
        self.log = TrainLog(args.log_dir, enabled=self.is_main)
        self.stop_flag = StopFlag().install()
        self.started = time.perf_counter()

    # -- set-up --------------------------------------------------------------------------------------
    def _data(self):
        from toolkit.workloads.resnet_loaders import Loaders

        args, env = self.args, self.env
        roots = {split: os.path.join(args.data, split) for split in ("train", "val")}
        for split, root in roots.items():
            if not os.path.isdir(root):
                raise HpcError(f"no {split}/ directory in --data {args.data}",
                               fix="point --data at an ImageFolder root holding train/ and val/ "
                                   "(for a smoke run: python -m toolkit.workloads.smoke_data images DIR)")
        try:
            loaders = Loaders(args.loader, roots, image_size=args.image_size, crop_scale_min=args.crop_scale_min,
                              seed=args.seed, batch_size=args.batch_size, workers=args.workers, rank=env.rank,
                              world_size=env.world_size, device=self.device, channels_last=args.channels_last,
                              worker_init_fn=ignore_stop_signals)
        except (FileNotFoundError, OSError) as exc:
            raise HpcError(f"cannot read the images under --data {args.data}: {exc}",
                           fix="each of train/ and val/ needs one sub-directory of images per class") from None
        self.num_classes = len(loaders.classes)
        self.sampler = loaders.sampler
        self.steps_per_epoch = len(self.sampler) // args.batch_size
        if self.steps_per_epoch == 0:
            raise HpcError(f"{loaders.train_images} training images make no full batch of {args.batch_size} "
                           f"on each of {env.world_size} ranks", fix="lower --batch-size or use more data")
        self.train_loader, self.val_loader = loaders.train, loaders.val

    def _model(self):
        import torchvision

        torch, args = self.torch, self.args
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        model = torchvision.models.get_model(args.arch, weights=None, num_classes=self.num_classes,
                                             zero_init_residual=args.zero_init_last_bn)
        model.to(self.device)
        if args.channels_last:
            model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                         nesterov=args.nesterov, weight_decay=args.weight_decay)
        # mixed precision on cuda (fp16) and where the device's runtime has its own dtype, which takes no scaling
        own_amp = self.runtime.AMP_DTYPE if self.runtime is not None else None
        self.amp = args.amp and (self.device_type == "cuda" or own_amp is not None)
        self.amp_dtype = getattr(torch, own_amp) if own_amp is not None else torch.float16
        on_cuda = self.device_type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda" if on_cuda else "cpu", enabled=self.amp and on_cuda)
        self.criterion = torch.nn.CrossEntropyLoss()

    def _checkpoint_state(self) -> dict:
        import numpy as np

        torch = self.torch
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "step": self.step, "epoch": self.epoch, "position": self.position,
            "world_size": self.env.world_size, "batch_size": self.args.batch_size, "arch": self.args.arch,
            "seed": self.args.seed,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.device_type == "cuda" else None},
        }

    def _resume(self) -> None:
        import numpy as np

        self.step = self.epoch = self.position = 0
        if self.is_main and self.args.checkpoint_dir:
            checkpoint.remove_partial_saves(self.args.checkpoint_dir)
        path = checkpoint.last_checkpoint(self.args.checkpoint_dir)
        if path is None:
            return
        state = checkpoint.load(path)
        ours = {"arch": self.args.arch, "world_size": self.env.world_size, "batch_size": self.args.batch_size,
                "seed": self.args.seed}
        differing = {key: (state[key], value) for key, value in ours.items() if state[key] != value}
        if differing:
            listed = ", ".join(f"{key} {was} -> {now}" for key, (was, now) in differing.items())
            raise HpcError(f"{path} was written by a different run ({listed}); an exact resume is impossible",
                           fix="run with the checkpoint's settings, or use a new --checkpoint-dir")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self.torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and self.device_type == "cuda":
            self.torch.cuda.set_rng_state_all(rng["cuda"])

    # -- the loop ------------------------------------------------------------------------------------
    def _save(self, reason: str) -> None:
        if self.is_main and self.args.checkpoint_dir:
            began = time.perf_counter()
            checkpoint.save_atomic(self._checkpoint_state(), os.path.join(self.args.checkpoint_dir, checkpoint.LAST))
            self.log.write("checkpoint", step=self.step, epoch=self.epoch, position=self.position, reason=reason,
                           seconds=round(time.perf_counter() - began, 3))

    def _lr(self) -> float:
        args = self.args
        return lr_at(self.step, lr=args.lr, warmup_lr=args.warmup_lr,
                     warmup_steps=round(args.warmup_epochs * self.steps_per_epoch),
                     total_steps=args.epochs * self.steps_per_epoch, power=args.lr_decay_power)

    def _train_step(self, images, targets, lr: float):
        """One update; returns this rank's loss as a tensor and a function giving its forward pass's seconds."""
        torch = self.torch
        images = images.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if self.args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        timer = ForwardTimer(torch, self.device)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            loss = self.criterion(self.ddp(images), targets)
        timer.stop()
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self._mark_step()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._mark_step()
        return loss.detach(), timer

    def _mark_step(self) -> None:
        if self.htcore is not None:
            self.htcore.mark_step()

    def _evaluate(self) -> dict:
        torch = self.torch
        self.ddp.eval()
        stat = devices.reduce_dtype(torch, self.device)
        totals = torch.zeros(3, dtype=stat, device=self.device)  # correct, loss sum, images
        with torch.no_grad(), torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            for images, targets in self.val_loader:
                images, targets = images.to(self.device), targets.to(self.device)
                if self.args.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
                output = self.model(images)  # not the DDP wrapper: ranks hold different numbers of batches
                totals += torch.stack([(output.argmax(1) == targets).sum().to(stat),
                                       self.criterion(output.float(), targets).to(stat) * len(targets),
                                       torch.tensor(float(len(targets)), dtype=stat, device=self.device)])
                self._mark_step()
        torch.distributed.all_reduce(totals)
        self.ddp.train()
        correct, loss_sum, count = totals.tolist()
        return {"top1": round(100.0 * correct / max(count, 1), 3), "loss": loss_sum / max(count, 1),
                "images": int(count)}

    def _log_interval(self) -> None:
        interval = self.interval
        if interval["steps"]:
            images = interval["steps"] * self.args.batch_size * self.env.world_size
            self.log.write("train", step=self.step, epoch=self.epoch, loss=interval["loss"] / interval["steps"],
                           lr=interval["lr"], images_per_sec=images / max(interval["seconds"], 1e-9),
                           world_size=self.env.world_size, elapsed=round(time.perf_counter() - self.started, 3),
                           interval_steps=interval["steps"], interval_images=images,
                           interval_seconds=round(interval["seconds"], 6))
        interval.update(steps=0, loss=0.0, seconds=0.0)

    def _finish(self, status: str) -> int:
        torch = self.torch
        torch.distributed.barrier()  # every rank leaves after rank 0's checkpoint is on disk
        self.log.write("end", status=status, step=self.step, epoch=self.epoch,
                       elapsed=round(time.perf_counter() - self.started, 3),
                       steady_images_per_sec=steady_throughput(self.log.records),
                       top1=self.last_val["top1"] if self.last_val else None)
        if status == "stopped":
            got = f"got {self.stop_flag.signal_name}" if self.stop_flag.requested else "was asked by another rank"
            saved = "checkpoint saved" if self.args.checkpoint_dir else "NO --checkpoint-dir: nothing saved"
            print(f"rank {self.env.rank} {got}: stopped after step {self.step} ({saved}), "
                  f"exit {EXIT_STOPPED} to be requeued", flush=True)
        torch.distributed.destroy_process_group()
        return EXIT_STOPPED if status == "stopped" else 0

    def _train_epoch(self) -> str | None:
        """Train the rest of the current epoch; "stopped" or "max_steps" if it ended early."""
        args = self.args
        if args.max_steps is not None and self.step >= args.max_steps:
            return "max_steps"
        self.sampler.start_epoch(self.epoch, self.position * args.batch_size)
        mark = time.perf_counter()
        for images, targets in self.train_loader:
            loaded = time.perf_counter()
            lr = self._lr()
            loss, forward = self._train_step(images, targets, lr)
            (loss_sum,), stop = all_reduce_step([float(loss)], self.stop_flag.requested, self.device)
            self.step += 1
            compute, whole = forward.seconds(), time.perf_counter() - loaded
            heartbeat.beat(self.step, **({"data": loaded - mark, "compute": compute, "sync": whole - compute}
                                         if compute is not None else {"data": loaded - mark}))
            self.position += 1
            interval = self.interval
            interval.update(steps=interval["steps"] + 1, loss=interval["loss"] + loss_sum / self.env.world_size,
                            seconds=interval["seconds"] + time.perf_counter() - mark, lr=lr)
            capped = args.max_steps is not None and self.step >= args.max_steps
            if self.step % args.log_every_steps == 0 or stop or capped:
                self._log_interval()
            if stop or capped:
                self._save("stop" if stop else "max_steps")
                return "stopped" if stop else "max_steps"
            if args.checkpoint_every_steps and self.step % args.checkpoint_every_steps == 0:
                self._save("periodic")
            mark = time.perf_counter()  # saves and logging are not training time
        self._log_interval()
        return None

    def run(self) -> int:
        from torch.nn.parallel import DistributedDataParallel

        args, env, torch = self.args, self.env, self.torch
        self._data()  # bad inputs fail here, on every rank, before anyone waits at the rendezvous
        self._model()
        self._resume()
        torch.distributed.init_process_group(self.backend, init_method=env.init_method, rank=env.rank,
                                             world_size=env.world_size)
        print(f"rank {env.rank} local_rank {env.local_rank} world_size {env.world_size} backend {self.backend} "
              f"device {self.device} threads {torch.get_num_threads()} amp {self.amp} "
              f"master {env.master_addr}:{env.master_port}", flush=True)
        on_gpu = self.device.type == "cuda"
        self.ddp = DistributedDataParallel(self.model, device_ids=[self.device] if on_gpu else None)
        if args.compile:  # the DDP wrapper, so checkpoints keep the plain model's parameter names
            self.ddp = torch.compile(self.ddp)
        self.log.write("start", world_size=env.world_size, backend=self.backend, device=self.device.type,
                       threads=torch.get_num_threads(), amp=self.amp, arch=args.arch, loader=args.loader,
                       compiled=args.compile, batch_size=args.batch_size,
                       global_batch_size=args.batch_size * env.world_size, steps_per_epoch=self.steps_per_epoch,
                       total_steps=args.epochs * self.steps_per_epoch, max_steps=args.max_steps,
                       resumed_from_step=self.step)
        self.interval = {"steps": 0, "loss": 0.0, "seconds": 0.0, "lr": 0.0}
        self.last_val = None
        while self.epoch < args.epochs:
            ended_early = self._train_epoch()
            if ended_early:
                return self._finish(ended_early)
            self.epoch += 1
            self.position = 0
            self.last_val = self._evaluate()
            self.log.write("val", epoch=self.epoch - 1, step=self.step, **self.last_val)
            self._save("epoch")
        return self._finish("completed")


class ForwardTimer:
    """The forward pass's time, the part of a step no collective holds back (a straggler's own slowness shows
    there; under DDP every rank's backward waits for the slowest). CUDA events on a GPU, read after the step's
    all-reduce has synchronised the stream; the host clock on CPU; None on a device whose runtime is lazy (it only
    queues the graph: the host sees no compute)."""

    def __init__(self, torch, device) -> None:
        self.kind = device.type
        runtime = devices.of(device)
        self.lazy = runtime is not None and runtime.LAZY
        if self.kind == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        self.started = time.perf_counter()
        self.ended: float | None = None

    def stop(self) -> None:
        if self.kind == "cuda":
            self.events[1].record()
        self.ended = time.perf_counter()

    def seconds(self) -> float | None:
        if self.kind == "cuda":
            return self.events[0].elapsed_time(self.events[1]) / 1000
        return None if self.lazy or self.ended is None else self.ended - self.started


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    threads = _threads(args)
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch is imported: its OpenMP pool reads this
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return Trainer(args).run()
    except HpcError as exc:
        sys.stderr.write(f"error: {exc.message}\n" + (f"  fix: {exc.fix}\n" if exc.fix else ""))
        return 1


if __name__ == "__main__":
    sys.exit(main())
