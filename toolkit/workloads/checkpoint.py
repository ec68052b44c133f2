"""Checkpoint files written atomically: a reader (or a requeued job) sees the old file or the new one, never
a half-written one, even if the writer is killed mid-save."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

LAST = "checkpoint_last.pt"
PARTIAL_SUFFIX = ".partial"


def save_atomic(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save to a temp file in the same directory, fsync, then os.replace onto `path`."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Make the rename itself durable (a node crash right after must not bring the old file back).
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint this trainer wrote (it holds RNG states and plain Python values, so not weights-only)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def last_checkpoint(checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """checkpoint_last.pt in the directory, if there is one to resume from."""
    if checkpoint_dir is None:
        return None
    path = Path(checkpoint_dir) / LAST
    return path if path.is_file() else None


def remove_partial_saves(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """Delete temp files left by a writer that was killed mid-save (call before anything saves again)."""
    directory = Path(checkpoint_dir)
    leftovers = sorted(directory.glob(f".*{PARTIAL_SUFFIX}")) if directory.is_dir() else []
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    return leftovers
