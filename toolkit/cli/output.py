"""Printing for every command: JSON for scripts (--json), plain text for people.

The output contract (one for every `hpc` command): with --json, stdout holds exactly one JSON document, the
envelope, written once by toolkit.cli.main when the command ends:

    {"ok": true,  "command": "recipes submit", "data": ..., "warnings": [...]}
    {"ok": false, "command": "recipes submit", "data": ... or null, "warnings": [...],
     "error": {"message": "...", "fix": "..." or null, "exit_code": 1 or 2}}

`data` is what the command reports (the same facts its text output shows); `warnings` every warning it gave
(also printed on stderr). Exit codes: 0 ok (a no-op included), 1 a problem found in a file or a failed job,
2 a bad flag or value. A command that reports a problem after printing its data (an invalid file, a failed job)
calls `fail`, so its envelope carries both the data and the reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import typer

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON envelope on stdout: "
                                                 '{"ok", "command", "data", "warnings"[, "error"]}.')


class _Envelope:
    """What the running command reported, for main to write as its one JSON envelope."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.active = False  # set by main: outside it (testbench's own CLI) emit prints the data itself
        self.data: Any = None
        self.warnings: list[str] = []
        self.failure: str | None = None


envelope = _Envelope()


def begin() -> None:
    """A new command starts (main calls this: tests run several in one process)."""
    envelope.reset()
    envelope.active = True


def emit(data: Any, as_json: bool, human: Callable[[Any], str] | str | None = None) -> None:
    """Report `data`: kept for the JSON envelope (--json), or printed as the text `human` makes of it."""
    if as_json:
        if envelope.active:
            envelope.data = data
        else:
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif callable(human):
        sys.stdout.write(human(data).rstrip("\n") + "\n")
    elif human is not None:
        sys.stdout.write(human.rstrip("\n") + "\n")


def fail(message: str) -> typer.Exit:
    """End the command with exit 1 after its data was reported: a problem found in a file, a failed job.
    The text output has said it already; the JSON envelope gets `message` as its error. `raise fail(...)`."""
    envelope.failure = message
    return typer.Exit(1)


def envelope_json(command: str, code: int, error: dict | None = None) -> str:
    """The one JSON document a command prints with --json (see the module doc)."""
    doc: dict[str, Any] = {"ok": code == 0, "command": command, "data": envelope.data,
                           "warnings": list(dict.fromkeys(envelope.warnings))}
    if code != 0:
        doc["error"] = error or {"message": envelope.failure or f"hpc {command} ended with exit code {code}",
                                 "fix": None, "exit_code": code}
    return json.dumps(doc, indent=2, default=str) + "\n"


def counted(findings: Sequence[dict]) -> str:
    """"1 error, 2 warnings, 0 notes": a report's findings by level."""
    words = (("error", "error"), ("warning", "warning"), ("info", "note"))
    return ", ".join(f"{n} {word}{'' if n == 1 else 's'}"
                     for level, word in words for n in [sum(f["level"] == level for f in findings)])


def plot_target(path: Path | None, force: bool) -> Path | None:
    """A --plot or -o PNG path, checked before any work is done or printed: *.png, and an existing file only with
    --force (no file is written over unasked, as for every -o)."""
    from toolkit.errors import UsageError
    from toolkit.textfile import refuse_overwrite

    if path is None:
        return None
    if path.suffix.lower() != ".png":
        raise UsageError(f"plot file {path} does not end in .png", fix="name the plot file *.png")
    if path.is_dir():
        raise UsageError(f"plot file {path} is a directory", fix=f"name a file in it, e.g. {path / 'plot.png'}")
    refuse_overwrite(path, force)
    return path


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain aligned text table (no colour: output is often piped or logged)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def warn(message: str) -> None:
    """A warning: on stderr, and in the JSON envelope's `warnings`."""
    envelope.warnings.append(message)
    sys.stderr.write(f"warning: {message}\n")


def info(message: str) -> None:
    """Progress and notes go to stderr so stdout stays clean for --json and redirection."""
    sys.stderr.write(message.rstrip("\n") + "\n")


def output_target(output: str | None, default_name: str) -> Path | None:
    """Where `-o/--output` says to write: None for stdout (`-o -`, or no -o where stdout is the default), a
    directory's `default_name` inside it (`-o DIR`, DIR existing or written with a trailing /), else the file."""
    if output is None or output == "-":
        return None
    if not output.strip():  # `-o ''` (an unset shell variable): it wrote NAME in the current directory
        from toolkit.errors import UsageError

        raise UsageError("-o '' names no file", fix="give -o FILE, -o DIR or -o - (stdout)")
    path = Path(output)
    return path / default_name if path.is_dir() or output.endswith("/") else path


def write_output(path: Path, text: str, force: bool) -> None:
    """Write `text` to an -o file: never over an existing one without --force; errors in the user's terms."""
    from toolkit.errors import HpcError
    from toolkit.textfile import refuse_overwrite

    refuse_overwrite(path, force)
    try:
        path.write_text(text)
    except OSError as exc:
        raise HpcError(f"cannot write {path}: {exc.strerror}",
                       fix="choose an -o FILE in an existing, writable directory (or -o - for stdout)") from None


def hpc_program() -> str:
    """`hpc` as the user can type it again: `hpc` where that is this installation on PATH, else this
    environment's own script (`make demo` runs the venv's hpc without putting it on PATH)."""
    import os
    import shutil

    script = Path(sys.executable).parent / "hpc"
    on_path = shutil.which("hpc")
    if not script.exists() or (on_path and Path(on_path).resolve() == script.resolve()):
        return "hpc"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else str(script)
