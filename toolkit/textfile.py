"""Reading a user's text file (a recipe, a cluster config, a manifest) with one clear error for each way it fails."""

from __future__ import annotations

from pathlib import Path

from toolkit.errors import HpcError


def read_text(path: str | Path, what: str, fix: str) -> str:
    """The file's text, bytes as they are (no newline translation: edits write them back), or an HpcError
    naming `what` and the problem: missing or a directory (with `fix`), unreadable, not UTF-8."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise HpcError(f"{what} {path} does not exist", fix=fix) from None
    except IsADirectoryError:
        raise HpcError(f"{what} {path} is a directory", fix=fix) from None
    except OSError as exc:
        raise HpcError(f"cannot read {what} {path}: {exc.strerror}", fix="check the path and its permissions") from None
    except UnicodeDecodeError as exc:
        raise HpcError(f"{what} {path}: not UTF-8 text (byte {exc.start})", fix=f"save the {what} as UTF-8") from None


def refuse_overwrite(path: Path, force: bool) -> None:
    """An -o file is never written over without --force: the one check every command that writes one makes."""
    if path.exists() and not force:
        raise HpcError(f"{path} already exists", fix="pass --force to overwrite it, or choose another -o FILE")
