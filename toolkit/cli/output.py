"""Printing for every command: JSON for scripts (--json), plain text for people."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Sequence

import typer

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")


def emit(data: Any, as_json: bool, human: Callable[[Any], str] | str | None = None) -> None:
    """Print `data` as JSON, or as the text `human` makes of it."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    elif callable(human):
        sys.stdout.write(human(data).rstrip("\n") + "\n")
    elif human is not None:
        sys.stdout.write(human.rstrip("\n") + "\n")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain aligned text table (no colour: output is often piped or logged)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


def info(message: str) -> None:
    """Progress and notes go to stderr so stdout stays clean for --json and redirection."""
    sys.stderr.write(message.rstrip("\n") + "\n")


def hpc_program() -> str:
    """`hpc` as the user can type it again: `hpc` where that is this installation on PATH, else this
    environment's own script (`make demo` runs the venv's hpc without putting it on PATH)."""
    import os
    import shutil
    from pathlib import Path

    script = Path(sys.executable).parent / "hpc"
    on_path = shutil.which("hpc")
    if not script.exists() or (on_path and Path(on_path).resolve() == script.resolve()):
        return "hpc"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else str(script)
