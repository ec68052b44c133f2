"""What a job's numbers imply that its flags do not say: which limit ends a fairseq run, and large-batch limits.

Each finding is a Derived value (shown by `hpc recipes show`, in every plan) and, where the published setup
would not do what its flags suggest on this job, a warning (stderr, and `warnings` in --json). Flags are never
changed here: the recipe keeps what was published.

fairseq stops at whichever of --max-epoch and --max-update comes first. When the data-bin is readable, its
token count (fairseq's .idx index files) gives the updates per epoch:
    masked LM     samples = tokens / --tokens-per-sample (a lower bound with --sample-break-mode complete)
                  updates = samples / (--max-sentences x world size x --update-freq)
    translation   updates = max(source, target) tokens / (--max-tokens x world size x --update-freq)
Both are estimates from below (padding and block packing only add batches), said as "about".
"""

from __future__ import annotations

import array
import math
import struct
from pathlib import Path
from typing import Any, Mapping

from toolkit.job.scaling import Derived
from toolkit.recipes.schema import ScalingRule

# Linear LR scaling with plain SGD is published to hold up to a global batch of about 8k (Goyal et al. 2017)
# and, with warm-up and care, 16k; beyond that layer-wise optimizers (LARS, LAMB) are what the large-batch
# results (You et al. 2017; the P3dn ResNet50 post) used.
LINEAR_SCALING_LIMIT = 16384

MMAP_MAGIC = b"MMIDIDX\x00\x00"  # fairseq.data.indexed_dataset.MMapIndexedDataset
CACHED_MAGIC = b"TNTIDX\x00\x00"  # fairseq.data.indexed_dataset.IndexedDataset (the legacy "cached"/"lazy")


def idx_tokens(path: Path) -> int:
    """The number of tokens in one fairseq .idx index (the sum of its sentence sizes)."""
    data = path.read_bytes()
    if data.startswith(MMAP_MAGIC):  # magic, version <Q, dtype <B, count <Q, sizes int32[count], pointers
        offset = len(MMAP_MAGIC) + 8 + 1
        (count,) = struct.unpack_from("<Q", data, offset)
        sizes = array.array("i")
        start = offset + 8
        sizes.frombytes(data[start:start + 4 * count])
        return sum(sizes)
    if data.startswith(CACHED_MAGIC):  # magic, version <Q, (code, element size) <QQ, (count, s) <QQ,
        count, total = struct.unpack_from("<QQ", data, len(CACHED_MAGIC) + 24)  # then int64 offsets, sizes
        start = len(CACHED_MAGIC) + 40 + 2 * 8 * (count + 1)
        sizes = array.array("q")
        sizes.frombytes(data[start:start + 8 * total])
        return sum(sizes)
    raise ValueError(f"{path} is not a fairseq index file")


def _int(args: Mapping[str, Any], flag: str) -> int | None:
    """A flag's value as a whole number, or None (unset, a switch, or not a number)."""
    value = args.get(flag)
    if value is None or isinstance(value, (bool, list)):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _train_tokens(data_dir: Path, task: str | None) -> int | None:
    """Tokens per epoch of the train split (translation: the longer side), or None if the data is unreadable."""
    try:
        if task == "translation":
            sides = [idx_tokens(p) for p in sorted(data_dir.glob("train.*-*.*.idx"))]
            return max(sides) if sides else None
        idx = data_dir / "train.idx"
        return idx_tokens(idx) if idx.is_file() else None
    except (OSError, ValueError, struct.error):
        return None


def advise(launcher_kind: str, args: Mapping[str, Any], scaling: Mapping[str, ScalingRule], data_dir: str | None,
           world_size: int) -> tuple[list[Derived], list[str]]:
    """Every finding for a job whose program gets `args` (flag -> value, as derived) on `world_size` ranks."""
    derived, warnings = (fairseq_run_length(args, data_dir, world_size) if launcher_kind == "fairseq"
                         else ([], []))
    lr_rule = scaling.get("--lr")
    per_rank_arg = lr_rule.per_rank_arg if lr_rule is not None and lr_rule.rule == "linear" else None
    per_rank = args.get(per_rank_arg) if per_rank_arg is not None else None
    if isinstance(per_rank, (int, float)):
        warnings += large_batch(per_rank * world_size)
    return derived, warnings


def fairseq_run_length(args: Mapping[str, Any], data_dir: str | None,
                       world_size: int) -> tuple[list[Derived], list[str]]:
    """Which of --max-epoch / --max-update ends a fairseq run, from the data's token count."""
    max_epoch, max_update = _int(args, "--max-epoch"), _int(args, "--max-update")
    if not max_epoch or not max_update or not data_dir:
        return [], []
    task = args.get("--task")
    tokens = _train_tokens(Path(data_dir), task)
    if tokens is None:
        return [Derived("run length", "unknown", f"--max-epoch {max_epoch} or --max-update {max_update}, whichever "
                        f"comes first; {data_dir} has no readable train index here to tell which")], []
    update_freq = _int(args, "--update-freq") or 1
    if task == "translation":
        per_update = (_int(args, "--max-tokens") or 0) * world_size * update_freq
        basis = f"{tokens} tokens / (--max-tokens x {world_size} ranks x update-freq {update_freq})"
        per_epoch = math.ceil(tokens / per_update) if per_update else None
    else:
        block = _int(args, "--tokens-per-sample") or 512
        sentences = _int(args, "--max-sentences") or _int(args, "--batch-size")
        per_update = (sentences or 0) * world_size * update_freq
        basis = (f"{tokens} tokens / {block} per sample / ({sentences} sentences x {world_size} ranks x "
                 f"update-freq {update_freq})")
        per_epoch = math.ceil(tokens / block / per_update) if per_update else None
    if not per_epoch:
        return [], []
    by_epochs = per_epoch * max_epoch
    if by_epochs >= max_update:
        return [Derived("run length", f"{max_update} updates", f"--max-update ends it: --max-epoch {max_epoch} "
                        f"x about {per_epoch} updates per epoch ({basis}) is later")], []
    derived = [Derived("run length", f"about {by_epochs} updates", f"--max-epoch {max_epoch} ends it first: about "
                       f"{per_epoch} updates per epoch ({basis}); --max-update is {max_update}")]
    warmup = _int(args, "--warmup-updates")
    warning = (f"--max-epoch {max_epoch} ends this run after about {by_epochs} updates ({per_epoch} per epoch on "
               f"{data_dir}), before --max-update {max_update}"
               + (f" and before its warm-up ends (--warmup-updates {warmup})" if warmup and by_epochs < warmup else "")
               + ": the LR schedule will not reach its end; raise --max-epoch (or --set args.--max-epoch=null) to "
                 "train for the full update schedule")
    return derived, [warning]


def large_batch(global_batch: float) -> list[str]:
    """Linear LR scaling (a `linear` rule on --lr) beyond the global batch it is published to hold for."""
    if global_batch <= LINEAR_SCALING_LIMIT:
        return []
    return [f"global batch {global_batch:g} with the LR scaled linearly: linear scaling with plain SGD is published "
            f"to hold up to about 8k-16k images (Goyal et al.); beyond that accuracy drops. Use fewer ranks or a "
            f"smaller per-GPU batch (e.g. --set args.--batch-size=N so the global batch is <= "
            f"{LINEAR_SCALING_LIMIT}), or a layer-wise optimizer such as LARS (what the large-batch ResNet50 runs, "
            f"e.g. the P3dn post, used)"]
