"""Small training data made on the spot (no download), for smoke runs of the three recipes.

    python -m toolkit.workloads.smoke_data {images,translation,masked-lm} OUT_DIR

images       ImageFolder (OUT_DIR/train/<digit>/*.png, OUT_DIR/val/...) from scikit-learn's bundled 8x8
             digits, upscaled; for our ResNet trainer's --data.
translation  a toy en->de pair (a word-for-word code, reversed word order) binarized with a joined dictionary:
             OUT_DIR is fairseq's data-bin (splits train/valid/test) for --share-all-embeddings.
masked-lm    documents from a toy grammar, one sentence a line, blank lines between documents, binarized
             with --only-source: OUT_DIR is fairseq's data-bin for --task masked_lm.

Every byte is a function of the kind alone (fixed seeds), so two runs make identical files. OUT_DIR is built
beside itself and renamed into place, with a completion marker: a present, complete OUT_DIR is left as it is,
and concurrent makers (several ranks or nodes) are safe.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from toolkit.errors import HpcError

KINDS = ("images", "translation", "masked-lm")
MARKER = ".smoke-complete"
FORMAT_VERSION = 1
IMAGE_SIZE = 32
TRANSLATION_PAIRS = {"train": 400, "valid": 50, "test": 50}
MASKED_LM_DOCS = {"train": 300, "valid": 30}


def is_complete(out_dir: str | Path, kind: str) -> bool:
    marker = Path(out_dir) / MARKER
    try:
        return json.loads(marker.read_text()) == {"kind": kind, "version": FORMAT_VERSION}
    except (OSError, ValueError):
        return False


def ensure(kind: str, out_dir: str | Path) -> tuple[Path, bool]:
    """Make the data set in out_dir unless it is already there; returns (out_dir, whether it was made now)."""
    if kind not in KINDS:
        raise HpcError(f"unknown smoke data kind {kind!r}", fix=f"use one of: {', '.join(KINDS)}", exit_code=2)
    out_dir = Path(out_dir)
    if is_complete(out_dir, kind):
        return out_dir, False
    if out_dir.exists() and any(out_dir.iterdir()):
        raise HpcError(f"{out_dir} exists but holds no complete {kind} smoke data",
                       fix="remove it, or pick another directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        MAKERS[kind](building)
        (building / MARKER).write_text(json.dumps({"kind": kind, "version": FORMAT_VERSION}))
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above); fails if a concurrent maker just filled it
        building.rename(out_dir)
    except OSError:
        if is_complete(out_dir, kind):  # another process won the race: its copy is just as good
            return out_dir, False
        raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out_dir, True


# -- images ------------------------------------------------------------------------------------------
def make_images(out_dir: Path, size: int = IMAGE_SIZE) -> None:
    """Every fifth digit goes to val/, the rest to train/, as size x size grayscale PNGs."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        split = "val" if index % 5 == 0 else "train"
        folder = out_dir / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray((pixels * (255 / 16)).round().astype("uint8"), mode="L")
        image.resize((size, size), Image.Resampling.BILINEAR).save(folder / f"{index:04d}.png", optimize=False)


# -- text --------------------------------------------------------------------------------------------
def _syllable_words(consonants: str, vowels: str, count: int) -> list[str]:
    words = [c1 + v1 + c2 + v2 for c1 in consonants for v1 in vowels for c2 in consonants for v2 in vowels]
    return random.Random(len(consonants) * 31 + count).sample(words, count)


def translation_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """Source sentences of 3-8 toy words; the target codes each word and reverses the order."""
    source_words = _syllable_words("bdgklmnpst", "aeiou", 40)
    code = dict(zip(source_words, _syllable_words("fhjrvwz", "aeiy", 40), strict=True))
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        sentence = [rng.choice(source_words) for _ in range(rng.randint(3, 8))]
        pairs.append((" ".join(sentence), " ".join(code[word] for word in reversed(sentence))))
    return pairs


_GRAMMAR = {
    "det": ["the", "a", "every", "some"],
    "adj": ["small", "red", "quiet", "old", "bright", "heavy", "quick", "green"],
    "animate": ["cat", "dog", "child", "teacher", "bird", "farmer"],
    "thing": ["stone", "book", "river", "table", "garden", "letter"],
    "verb": ["sees", "finds", "carries", "likes", "watches", "follows"],
    "intransitive": ["sleeps", "sings", "waits", "runs"],
    "place": ["near the river", "in the garden", "at home", "under the table"],
}


def _sentence(rng: random.Random) -> str:
    def phrase(kind: str) -> str:
        words = [rng.choice(_GRAMMAR["det"])]
        if rng.random() < 0.5:
            words.append(rng.choice(_GRAMMAR["adj"]))
        return " ".join([*words, rng.choice(_GRAMMAR[kind])])

    if rng.random() < 0.3:
        return f"{phrase('animate')} {rng.choice(_GRAMMAR['intransitive'])} {rng.choice(_GRAMMAR['place'])} ."
    return f"{phrase('animate')} {rng.choice(_GRAMMAR['verb'])} {phrase(rng.choice(['animate', 'thing']))} ."


def masked_lm_documents(count: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[_sentence(rng) for _ in range(rng.randint(3, 6))] for _ in range(count)]


def _preprocess(args: Sequence[str], out_dir: Path) -> None:
    """fairseq-preprocess into out_dir; its log (which names the temporary paths) is dropped."""
    command = [sys.executable, "-m", "fairseq_cli.preprocess", *args, "--destdir", str(out_dir), "--workers", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise HpcError(f"fairseq-preprocess failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}",
                       fix="check that fairseq is installed (make train-env)")
    (out_dir / "preprocess.log").unlink(missing_ok=True)


def make_translation(out_dir: Path) -> None:
    raw = out_dir / "raw"
    raw.mkdir(parents=True)
    for offset, (split, count) in enumerate(TRANSLATION_PAIRS.items()):
        pairs = translation_pairs(count, seed=100 + offset)
        (raw / f"{split}.en").write_text("".join(f"{source}\n" for source, _ in pairs))
        (raw / f"{split}.de").write_text("".join(f"{target}\n" for _, target in pairs))
    _preprocess(["--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
                 *[arg for split in TRANSLATION_PAIRS for arg in (f"--{split}pref", str(raw / split))]], out_dir)


def make_masked_lm(out_dir: Path) -> None:
    raw = out_dir / "raw"
    raw.mkdir(parents=True)
    for offset, (split, count) in enumerate(MASKED_LM_DOCS.items()):
        documents = masked_lm_documents(count, seed=200 + offset)
        (raw / f"{split}.txt").write_text("\n".join("".join(f"{line}\n" for line in doc) for doc in documents))
    _preprocess(["--only-source", *[arg for split in MASKED_LM_DOCS
                                    for arg in (f"--{split}pref", str(raw / f"{split}.txt"))]], out_dir)


MAKERS: dict[str, Callable[[Path], None]] = {
    "images": make_images, "translation": make_translation, "masked-lm": make_masked_lm,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.workloads.smoke_data",
                                     description="Make small training data locally (no download).")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    try:
        out_dir, made = ensure(args.kind, args.out_dir)
    except HpcError as exc:
        sys.stderr.write(f"error: {exc.message}\n" + (f"  fix: {exc.fix}\n" if exc.fix else ""))
        return exc.exit_code
    print(f"{args.kind} smoke data {'made in' if made else 'already complete in'} {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
