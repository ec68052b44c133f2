"""Smoke data is made locally, byte-for-byte the same every time, and never remade once complete."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO
from toolkit.errors import HpcError
from toolkit.workloads import smoke_data

pytestmark = pytest.mark.training


def digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def mtimes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in root.rglob("*")}


@pytest.mark.parametrize("kind, expected", [
    ("images", ["train/1/0001.png", "val/0/0000.png", "val/9/1795.png"]),
    ("translation", ["dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "valid.en-de.de.idx", "test.en-de.en.idx",
                     "raw/train.en"]),
    ("masked-lm", ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "raw/train.txt"]),
])
def test_made_twice_the_files_are_identical_and_a_complete_set_is_left_alone(kind, expected, tmp_path):
    first, made_first = smoke_data.ensure(kind, tmp_path / "a")
    second, made_second = smoke_data.ensure(kind, tmp_path / "b")
    assert made_first and made_second
    assert digests(first) == digests(second)
    assert set(expected) <= set(digests(first))
    before = mtimes(first)
    assert smoke_data.ensure(kind, first) == (first, False)
    assert mtimes(first) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no build dirs left behind


def test_the_toy_translation_codes_each_word_and_reverses_the_order():
    pairs = smoke_data.translation_pairs(200, seed=7)
    assert pairs == smoke_data.translation_pairs(200, seed=7) != smoke_data.translation_pairs(200, seed=8)
    code: dict[str, str] = {}
    for source, target in pairs:
        for word, coded in zip(source.split(), reversed(target.split()), strict=True):
            assert code.setdefault(word, coded) == coded  # one fixed code word per source word
    assert len(set(code.values())) == len(code) > 20


def test_images_are_an_image_folder_of_ten_classes(tmp_path):
    from PIL import Image

    out, _ = smoke_data.ensure("images", tmp_path / "i")
    counts = {split: {d.name: len(list(d.iterdir())) for d in (out / split).iterdir()} for split in ("train", "val")}
    assert sorted(counts["train"]) == sorted(counts["val"]) == [str(digit) for digit in range(10)]
    assert (sum(counts["train"].values()), sum(counts["val"].values())) == (1437, 360)  # every fifth to val
    with Image.open(out / "val" / "0" / "0000.png") as image:
        assert (image.size, image.mode) == ((smoke_data.IMAGE_SIZE, smoke_data.IMAGE_SIZE), "L")


def test_concurrent_makers_all_end_with_one_complete_set(tmp_path):
    target = tmp_path / "images"
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: smoke_data.ensure("images", target), range(3)))
    assert sum(made for _, made in results) >= 1 and smoke_data.is_complete(target, "images")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]
    assert len([p for p in target.rglob("*.png")]) == 1797


def test_a_directory_with_other_content_is_not_touched(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(HpcError, match="holds no complete images smoke data"):
        smoke_data.ensure("images", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_cli_reports_made_then_present_and_rejects_unknown_kinds(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "toolkit.workloads.smoke_data", *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)

    first, again, bad = cli("images", str(tmp_path / "d")), cli("images", str(tmp_path / "d")), cli("video", "x")
    assert first.returncode == 0 and "made in" in first.stdout
    assert again.returncode == 0 and "already complete" in again.stdout
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
