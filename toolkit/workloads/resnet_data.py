"""ImageFolder data for the ResNet trainer, made reproducible per (seed, epoch, sample).

Data order comes from the sampler (seed + epoch); each sample's augmentation is drawn from a generator seeded
by (seed, epoch, index) inside whichever process loads it. So a run resumed part-way into an epoch sees
exactly the batches and crops the uninterrupted run saw, whatever the number of loader workers.
"""

from __future__ import annotations

import torch
import torchvision
from typing import Any, Protocol

from torch.utils.data import Dataset, DistributedSampler
from torchvision import transforms

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * 1_000_000_007 + index) % (2**63)


def train_transform(image_size: int, crop_scale_min: float = 0.08) -> transforms.Compose:
    return transforms.Compose([
        transforms.RandomResizedCrop(image_size, scale=(crop_scale_min, 1.0), ratio=(3 / 4, 4 / 3)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def val_transform(image_size: int) -> transforms.Compose:
    # The reference's 256/224 resize-then-crop ratio at any size.
    return transforms.Compose([
        transforms.Resize(round(image_size / 0.875)),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class SizedDataset(Protocol):
    """What the wrappers here need of a dataset: its length and its items (torch's Dataset declares no length)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


def image_folder(root, transform) -> torchvision.datasets.ImageFolder:
    return torchvision.datasets.ImageFolder(root, transform)


class SeededSamples(Dataset):
    """`dataset[(epoch, index)]`, with the augmentation's randomness fixed by (seed, epoch, index).

    Only the CPU default generator is reseeded (torchvision's transforms draw from it), inside fork_rng so
    the caller's RNG stream is left as it was.
    """

    def __init__(self, dataset: SizedDataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
            return self.dataset[index]


class ResumableSampler(DistributedSampler):
    """DistributedSampler yielding (epoch, index) keys that can start part-way into an epoch."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.skip = 0

    def start_epoch(self, epoch: int, skip_samples: int = 0) -> None:
        self.set_epoch(epoch)
        self.skip = skip_samples

    def __iter__(self):
        indices = list(super().__iter__())[self.skip:]
        return iter([(self.epoch, index) for index in indices])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class RankShard(Dataset):
    """Every world_size-th sample starting at rank: an exact, unpadded split for validation."""

    def __init__(self, dataset: SizedDataset, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.indices = range(rank, len(dataset), world_size)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int):
        return self.dataset[self.indices[position]]
