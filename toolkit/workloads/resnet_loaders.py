"""The ResNet trainer's --loader choices. With gpu and dali the loader workers only read file bytes; decoding
and augmentation run batched on the training device, one batch ahead, on a side stream.

    --loader pil   (default) PIL decode + torchvision transforms in the loader workers; batches copied to the
                   device one ahead on a side stream from pinned memory.
    --loader gpu   torchvision's batched nvjpeg decode (`decode_jpeg` on a list, device="cuda"; torchvision
                   >= 0.19, pytorch/vision torchvision/io/image.py), then random-resized crop, flip and
                   normalisation on the GPU. Crop boxes and flips are drawn exactly as the PIL path draws them
                   (same generator, same seed per sample), so data order, labels, crops and flips match it and
                   resuming stays exact; only pixels differ (nvjpeg and tensor resize vs PIL).
    --loader dali  NVIDIA DALI's mixed-device decode + random crop, fed the same bytes in the same order by
                   our workers (fn.external_source); DALI draws the crops itself, so they differ from the PIL
                   path's and a resumed run repeats the data order but not the crops.

torchvision 0.29 deprecates its image decoders in favour of TorchCodec (a DeprecationWarning once per
process); decode() is the one place that calls them.

The side-stream prefetch follows NVIDIA DeepLearningExamples' PrefetchedWrapper, and the DALI graph their
HybridTrainPipe/HybridValPipe (PyTorch/Classification/ConvNets/image_classification/dataloaders.py).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from toolkit.errors import HpcError
from toolkit.workloads.resnet_data import (IMAGENET_MEAN, IMAGENET_STD, RankShard, ResumableSampler, SeededSamples,
                                           SizedDataset, image_folder, sample_seed, train_transform, val_transform)

JPEG_MAGIC = b"\xff\xd8"
# torchvision's val_transform ratio: resize to size/0.875 (256 for 224), then center-crop
VAL_RESIZE_RATIO = 0.875


def check_loader(loader: str, device: torch.device) -> None:
    """Refuse a loader this rank cannot run, with the one fix, before any data is read."""
    if loader == "pil":
        return
    if loader == "dali":
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            raise HpcError("--loader dali needs NVIDIA DALI, which does not import in this environment",
                           fix="install nvidia-dali-cuda120 (or -cuda130, as the node's CUDA) into the job's venv, "
                               "or use --loader gpu") from None
    if device.type != "cuda":
        raise HpcError(f"--loader {loader} decodes JPEGs on a CUDA GPU, but this rank runs on {device.type}",
                       fix="use --loader pil (the default) on nodes without an NVIDIA GPU")
    if loader == "dali":
        return
    import torchvision

    try:  # a list input needs torchvision >= 0.19; a CPU-only build has no nvjpeg
        torchvision.io.decode_jpeg([torchvision.io.encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))],
                                   device=device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise HpcError(f"--loader gpu: torchvision {torchvision.__version__} cannot decode a batch of JPEGs on "
                       f"{device} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                       fix="install a CUDA build of torchvision >= 0.19 (it ships nvjpeg), "
                           "or use --loader pil") from None


def crop_and_flip(image, seed: int, crop_scale_min: float) -> tuple[tuple[int, int, int, int], bool]:
    """(top, left, height, width) and whether to flip, drawn exactly as resnet_data.train_transform's
    RandomResizedCrop + RandomHorizontalFlip draw them for this sample (same calls, same seed). `image` is
    anything torchvision reads dimensions from: a PIL image opened for its header only will do."""
    from torchvision import transforms

    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        box = transforms.RandomResizedCrop.get_params(image, [crop_scale_min, 1.0], [3 / 4, 4 / 3])
        return box, bool(torch.rand(1) < 0.5)


class EncodedFiles(Dataset):
    """ImageFolder's (path, label) list as raw bytes: `files[key]` -> (uint8 bytes, label, crop).

    key is (epoch, index) for training (ResumableSampler) or an index for validation (RankShard). For training
    the worker also draws the sample's crop box and flip (crop_and_flip, from the PIL path's per-sample seed
    and the size in the file's header), so the device side only resizes; for validation crop is None.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], seed: int, crop_scale_min: float | None) -> None:
        self.samples, self.seed, self.crop_scale_min = samples, seed, crop_scale_min

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        from PIL import Image

        epoch, index = key if isinstance(key, tuple) else (0, key)
        path, label = self.samples[index]
        with open(path, "rb") as handle:
            raw = handle.read()
        crop = None
        if self.crop_scale_min is not None:
            with Image.open(io.BytesIO(raw)) as header:  # reads the header: the size, not the pixels
                crop = crop_and_flip(header, sample_seed(self.seed, epoch, index), self.crop_scale_min)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8), label, crop


def collate_encoded(batch):
    """Bytes stay a list (every file has its own length); labels become one tensor as in the PIL path."""
    data, labels, crops = zip(*batch, strict=True)
    return list(data), torch.tensor(labels), list(crops)


def decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 CHW RGB images on device: JPEGs in one batched call, anything else (ImageNet holds a few PNGs and
    the smoke data are PNGs) decoded on the CPU and copied over."""
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    jpeg = [i for i, data in enumerate(encoded) if bytes(data[:2].tolist()) == JPEG_MAGIC]
    images: list[torch.Tensor | None] = [None] * len(encoded)
    if jpeg:
        decoded = decode_jpeg([encoded[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)
        for i, image in zip(jpeg, decoded, strict=True):
            images[i] = image
    return [decode_image(encoded[i], mode=ImageReadMode.RGB).to(device, non_blocking=True) if image is None
            else image for i, image in enumerate(images)]


class BatchTransform:
    """Decoded batch -> normalised float batch (N, 3, size, size) on the device, as the PIL path's transforms.

    Training: each sample's crop box resized to size x size and flipped as its worker drew them (crop_and_flip:
    RandomResizedCrop(size, scale=(crop_scale_min, 1), ratio=(3/4, 4/3)) + horizontal flip). Validation:
    resize the short side to size/0.875, center crop.
    """

    def __init__(self, image_size: int, *, device: torch.device, channels_last: bool) -> None:
        self.size, self.device, self.channels_last = image_size, device, channels_last
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255

    def __call__(self, encoded: list[torch.Tensor], labels: torch.Tensor, crops: list):
        from torchvision.transforms.v2 import functional as F

        size = self.size
        out = torch.empty((len(encoded), 3, size, size), dtype=torch.uint8, device=self.device)
        for i, (image, crop) in enumerate(zip(decode(encoded, self.device), crops, strict=True)):
            if crop is None:
                image = F.resize(image, [round(size / VAL_RESIZE_RATIO)], antialias=True)
                out[i] = F.center_crop(image, [size, size])
            else:
                (top, left, height, width), flip = crop
                image = F.resized_crop(image, top, left, height, width, [size, size], antialias=True)
                out[i] = F.horizontal_flip(image) if flip else image
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        images = out.to(memory_format=memory_format).float().sub_(self.mean).div_(self.std)
        return images, labels.to(self.device, non_blocking=True)


def to_device(device: torch.device) -> Callable:
    """The PIL path's prepare step: a pinned batch copied without blocking the host."""
    def prepare(images: torch.Tensor, labels: torch.Tensor):
        return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
    return prepare


class DevicePrefetcher:
    """Iterates `loader`, preparing batch k+1 (`prepare(*batch)`) while batch k trains.

    On CUDA the preparation runs on a side stream; the training stream waits only for that batch's event and
    the tensors are recorded on it so the allocator does not reuse them early. Elsewhere it runs inline.
    """

    def __init__(self, loader: DataLoader, prepare: Callable, device: torch.device) -> None:
        self.loader, self.prepare, self.device = loader, prepare, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        ahead = None
        for batch in self.loader:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                prepared = self.prepare(*batch)
                ready = torch.cuda.Event() if side is not None else None
                if ready is not None:
                    ready.record(side)
            if ahead is not None:
                yield self._hand_over(*ahead)
            ahead = (prepared, ready)
        if ahead is not None:
            yield self._hand_over(*ahead)

    def _hand_over(self, tensors, ready):
        if ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)
            for tensor in tensors:
                tensor.record_stream(current)
        return tensors


class DaliBatches:
    """Batches of our byte loader run through a DALI pipeline: (normalised float images, labels) on the GPU.

    Graph as DeepLearningExamples' HybridTrainPipe/HybridValPipe: decoders.image_random_crop (mixed device,
    nvjpeg) + resize + crop_mirror_normalize with a coin-flip mirror; validation decodes, resizes the short
    side and center-crops. Fed by fn.external_source so the sampler, not DALI's reader, orders the data.
    """

    def __init__(self, loader: DataLoader, *, image_size: int, train: bool, crop_scale_min: float, batch_size: int,
                 threads: int, device: torch.device, seed: int, channels_last: bool) -> None:
        from nvidia.dali import fn, pipeline_def, types

        self.loader, self.device, self.channels_last = loader, device, channels_last

        # one batch in flight: each run() consumes exactly the batch fed before it (feed_input), in our order
        @pipeline_def(batch_size=batch_size, num_threads=max(threads, 1), device_id=device.index or 0, seed=seed,
                      prefetch_queue_depth=1)
        def graph():
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
            if train:
                images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                                       random_area=[crop_scale_min, 1.0],
                                                       random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
                images = fn.resize(images, resize_x=image_size, resize_y=image_size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=round(image_size / VAL_RESIZE_RATIO))
                mirror = 0
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                            crop=(image_size, image_size), mirror=mirror,
                                            mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD])

        self.pipe = graph()
        self.pipe.build()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        for encoded, labels, _ in self.loader:
            self.pipe.feed_input("jpegs", [data.numpy() for data in encoded])
            (output,) = self.pipe.run()
            dense = output.as_tensor()
            images = torch.empty(dense.shape(), dtype=torch.float32, device=self.device)
            feed_ndarray(dense, images, cuda_stream=torch.cuda.current_stream(self.device))
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(self.device, non_blocking=True)


class Loaders:
    """A rank's training and validation batches for one --loader: each yields (images, labels) on the device."""

    def __init__(self, loader: str, roots: dict[str, str], *, image_size: int, crop_scale_min: float, seed: int,
                 batch_size: int, workers: int, rank: int, world_size: int, device: torch.device,
                 channels_last: bool = False, worker_init_fn=None) -> None:
        pil = loader == "pil"
        train = image_folder(roots["train"], train_transform(image_size, crop_scale_min) if pil else None)
        val = image_folder(roots["val"], val_transform(image_size) if pil else None)
        self.classes = train.classes
        self.train_images = len(train)
        self.sampler = ResumableSampler(train, world_size, rank, seed)
        train_samples: SeededSamples | EncodedFiles
        val_samples: SizedDataset
        if pil:
            train_samples, val_samples, collate = SeededSamples(train, seed), val, None
        else:  # the workers read bytes (and draw gpu's crops from the header); DALI draws its own on the device
            train_samples = EncodedFiles(train.samples, seed, crop_scale_min if loader == "gpu" else None)
            val_samples, collate = EncodedFiles(val.samples, seed, None), collate_encoded
        options = dict(num_workers=workers, pin_memory=device.type == "cuda", worker_init_fn=worker_init_fn,
                       persistent_workers=workers > 0, collate_fn=collate)
        train_batches = DataLoader(train_samples, batch_size=batch_size, sampler=self.sampler, drop_last=True,
                                   **options)
        val_batches = DataLoader(RankShard(val_samples, rank, world_size), batch_size=batch_size, **options)
        self.train: DaliBatches | DevicePrefetcher
        self.val: DaliBatches | DevicePrefetcher
        if loader == "dali":
            def dali(batches: DataLoader, train: bool) -> DaliBatches:
                return DaliBatches(batches, train=train, image_size=image_size, crop_scale_min=crop_scale_min,
                                   batch_size=batch_size, threads=max(workers, 1), device=device, seed=seed + rank,
                                   channels_last=channels_last)
            self.train, self.val = dali(train_batches, True), dali(val_batches, False)
            return
        prepare = to_device(device) if pil else BatchTransform(image_size, device=device, channels_last=channels_last)
        self.train = DevicePrefetcher(train_batches, prepare, device)
        self.val = DevicePrefetcher(val_batches, prepare, device)
