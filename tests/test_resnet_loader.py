"""The ResNet trainer's --loader choice, on CPU: the gpu path's code run with device=cpu against the PIL path.

There is no GPU here: nvjpeg, the side stream and DALI are not exercised. decode_jpeg on a list with
device="cpu" is the same call the GPU path makes with device="cuda" (torchvision/io/image.py), so what is
checked is everything around it: bytes-only workers, crop/flip parameters, resize, normalisation, order.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import run_hpc
from tests.jobhelpers import write_cluster

pytestmark = pytest.mark.training

try:
    import torch
except ModuleNotFoundError:  # collected without the training environment: every test here is deselected then
    torch = None

SIZE = 32
# one uint8 level after normalisation (std 0.224 is the smallest): nvjpeg/libjpeg-turbo and tensor resize
# may differ from PIL by a rounding step, not more
LEVEL = 1 / 255 / 0.224


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> dict[str, str]:
    """An ImageFolder of smooth gradients at assorted sizes (so any crop or flip mismatch shows), JPEG but for
    one PNG (ImageNet holds a few non-JPEG files: the gpu path decodes those on the CPU)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 6), ("val", 3)):
        for label in range(3):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                height, width = rng.integers(40, 90, 2)
                ys, xs = np.mgrid[0:height, 0:width]
                pixels = np.stack([xs * 255 // width, ys * 255 // height, np.full((height, width), 50 + 60 * label)],
                                  axis=-1).astype(np.uint8)
                suffix = ".png" if (split, label, i) == ("train", 1, 0) else ".jpg"
                Image.fromarray(pixels).save(folder / f"{i}{suffix}", **({"quality": 95} if suffix == ".jpg" else {}))
    return {split: str(root / split) for split in ("train", "val")}


def loaders(kind: str, roots: dict[str, str], **extra):
    from toolkit.workloads.resnet_loaders import Loaders

    options = dict(image_size=SIZE, crop_scale_min=0.3, seed=3, batch_size=4, workers=0, rank=0, world_size=1,
                   device=torch.device("cpu"))
    return Loaders(kind, roots, **{**options, **extra})


def epoch_batches(kind: str, roots: dict[str, str], epoch: int, skip: int = 0, **extra):
    chosen = loaders(kind, roots, **extra)
    chosen.sampler.start_epoch(epoch, skip)
    return list(chosen.train), list(chosen.val)


@pytest.mark.parametrize("epoch, skip, workers", [(0, 0, 0), (1, 4, 1)])
def test_gpu_path_gives_the_pil_paths_batches(jpegs, epoch, skip, workers):
    """Same shapes, dtypes, labels in the same order, the same crops and flips (pixels within a level), for
    training and validation, from the start of an epoch and part-way in (a resume), with a loader worker."""
    pil_train, pil_val = epoch_batches("pil", jpegs, epoch, skip)
    gpu_train, gpu_val = epoch_batches("gpu", jpegs, epoch, skip, workers=workers)
    assert len(gpu_train) == len(pil_train) == (18 - skip) // 4 and len(gpu_val) == len(pil_val) == 3
    for (pil_images, pil_labels), (gpu_images, gpu_labels) in zip(pil_train + pil_val, gpu_train + gpu_val,
                                                                  strict=True):
        assert gpu_images.shape == pil_images.shape and gpu_images.dtype == pil_images.dtype == torch.float32
        assert gpu_labels.tolist() == pil_labels.tolist() and gpu_labels.dtype == pil_labels.dtype
        difference = (gpu_images - pil_images).abs()
        assert difference.max() <= 2.01 * LEVEL and difference.mean() < 0.05 * LEVEL
    # the normalisation statistics of the center/eval crops agree too
    pil_all, gpu_all = torch.cat([b[0] for b in pil_val]), torch.cat([b[0] for b in gpu_val])
    assert torch.allclose(gpu_all.mean(dim=(0, 2, 3)), pil_all.mean(dim=(0, 2, 3)), atol=0.01)
    assert torch.allclose(gpu_all.std(dim=(0, 2, 3)), pil_all.std(dim=(0, 2, 3)), atol=0.01)


def test_a_different_epoch_reorders_and_recrops(jpegs):
    """The comparison above can fail: another epoch's batches differ from epoch 0's in order and pixels."""
    (first, _), (second, _) = epoch_batches("gpu", jpegs, 0)[0][0], epoch_batches("gpu", jpegs, 1)[0][0]
    assert (first - second).abs().max() > 10 * LEVEL


def test_crop_and_flip_parameters_are_honoured():
    """With the whole image kept (scale 1, a 4:3 image), a flip shows as a reversed horizontal gradient;
    both outcomes occur over a few seeds. Channels-last output is asked for and given."""
    from torchvision.io import encode_jpeg

    from toolkit.workloads.resnet_loaders import BatchTransform, crop_and_flip

    ramp = torch.arange(64, dtype=torch.float32).mul(4).to(torch.uint8)
    image = torch.stack([ramp.expand(48, 64), ramp.expand(48, 64).flip(-1), torch.full((48, 64), 128)]).to(torch.uint8)
    crops = [crop_and_flip(image, seed, crop_scale_min=1.0) for seed in range(8)]
    assert {flip for _, flip in crops} == {True, False} and {box for box, _ in crops} == {(0, 0, 48, 64)}
    transform = BatchTransform(SIZE, device=torch.device("cpu"), channels_last=True)
    images, _ = transform([encode_jpeg(image, quality=100)] * len(crops), torch.zeros(len(crops)), crops)
    assert images.shape == (8, 3, SIZE, SIZE) and images.is_contiguous(memory_format=torch.channels_last)
    red_rises = (images[:, 0, :, -1] - images[:, 0, :, 0]).mean(dim=1) > 0
    assert red_rises.tolist() == [not flip for _, flip in crops]


def test_gpu_and_dali_are_refused_clearly_without_their_decoder(monkeypatch):
    from toolkit.errors import HpcError
    from toolkit.workloads.resnet_loaders import check_loader

    check_loader("pil", torch.device("cpu"))
    with pytest.raises(HpcError) as refused:
        check_loader("gpu", torch.device("cpu"))
    assert "CUDA GPU" in refused.value.message and "--loader pil" in refused.value.fix
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # stand-in for a node without nvidia-dali: import fails
    with pytest.raises(HpcError) as refused:
        check_loader("dali", torch.device("cpu"))
    assert "NVIDIA DALI" in refused.value.message and "nvidia-dali" in refused.value.fix


def test_the_trainer_refuses_gpu_on_a_cpu_rank_in_one_line(monkeypatch, capsys, tmp_path):
    from toolkit.workloads import resnet

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29999")):
        monkeypatch.setenv(name, value)
    assert resnet.parse_args(["--data", "x"]).loader == "pil"
    assert resnet.main(["--data", str(tmp_path), "--device", "cpu", "--loader", "gpu", "--compile"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --loader gpu decodes JPEGs on a CUDA GPU") and "fix:" in err
    assert "Traceback" not in err


def test_the_recipe_shows_the_loader_choice():
    plain = run_hpc("recipes", "show", "resnet50")
    assert plain.returncode == 0 and " --loader pil " in plain.stdout and "--compile" not in plain.stdout
    gpu = run_hpc("recipes", "show", "resnet50", "--profile", "gpu-data")
    assert gpu.returncode == 0 and " --loader gpu --compile " in gpu.stdout
    smoke = run_hpc("recipes", "show", "resnet50", "--profile", "smoke")
    assert smoke.returncode == 0 and " --loader pil " in smoke.stdout



@pytest.mark.parametrize("queue", ["gaudi", "cpu"])
def test_a_gpu_loader_on_a_queue_without_cuda_is_refused_at_plan_time(queue, tmp_path):
    """Said once when planning, not by every rank after the job has started."""
    res = run_hpc("recipes", "render", "resnet50", "--nodes", "1", "--profile", "gpu-data", "--cluster",
                  str(write_cluster(tmp_path)), "--queue", queue, "-o", str(tmp_path / "job.sbatch"))
    assert res.returncode == 1 and "--loader gpu decodes JPEGs on a CUDA GPU" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "job.sbatch").exists()
