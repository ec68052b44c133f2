"""A per-user cache of what hpc derives from its own packaged files on every command: the parsed instance catalog
(toolkit/catalog.yaml) and the compiled job templates (toolkit/slurm/templates). Redoing both cost ~0.1 s of each
`hpc recipes submit` (docs/start-up.md), which a researcher's debug loop pays on every turn.

Where: $HPC_CACHE_DIR (an empty value turns the cache off), else $XDG_CACHE_HOME/hpc, else ~/.cache/hpc (the XDG
base directory spec, as pip and uv use it). Entries are keyed by their source's content, so an upgraded or edited
source is read afresh and a stale entry is never used. The cache is never needed: one that cannot be made, read or
written is passed by without a word, and deleting it at any time is safe. A directory that others may write to
(or another user owns) is not used.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

CACHE_ENV = "HPC_CACHE_DIR"


def cache_dir() -> Path | None:
    """The cache's directory, made private to the user (0700) if new; None when it is off or cannot be made."""
    named = os.environ.get(CACHE_ENV)
    if named == "":
        return None
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    try:
        # the XDG spec: a relative path in XDG_CACHE_HOME is invalid and ignored (a cache in every working dir)
        base = Path(named).expanduser() if named else (Path(xdg) if os.path.isabs(xdg) else
                                                       Path.home() / ".cache") / "hpc"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = base.stat()
    except (OSError, RuntimeError):  # RuntimeError: no home to be found (no $HOME, a uid without a passwd entry)
        return None
    # What is read back here is run (jinja's compiled templates) or believed (the catalog): never from a directory
    # someone else owns or may write to (a shared /tmp path in HPC_CACHE_DIR), as jinja2/bccache.py refuses for its
    # own default directory.
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    return base if os.access(base, os.W_OK | os.X_OK) else None


def _write_atomically(path: Path, text: str) -> None:
    """Another hpc may read or write the same entry meanwhile: it sees the old file or the whole new one."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError:  # a full disk, a quota: no entry this time
        return
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def cached_json(name: str, source: str, derive: Callable[[str], Any]) -> Any:
    """derive(source), kept as JSON under NAME and the digest of the source and of derive's own code (an edited
    derive, in a new hpc or a checkout, derives afresh). A value JSON would not give back as it is (a date, a
    tuple) is returned and not kept."""
    directory = cache_dir()
    if directory is None:
        return derive(source)
    code = getattr(derive, "__code__", None)  # a plain function's (any other callable: the source alone)
    digest = hashlib.sha256(source.encode() + b"\0" + (code.co_code if code else b""))
    path = directory / f"{name}-{digest.hexdigest()[:24]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass  # not there yet, or cut short or garbled: derive it again
    value = derive(source)
    try:
        text = json.dumps(value)
        if json.loads(text) == value:
            _write_atomically(path, text)
            _keep_newest(directory, name)
    except (TypeError, ValueError):
        pass
    return value


KEEP = 4  # entries per name: an upgrade leaves its old one behind, and two hpc versions in use each keep theirs


def _keep_newest(directory: Path, name: str) -> None:
    def mtime(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except OSError:  # another hpc pruned it meanwhile
            return 0.0

    try:
        for old in sorted(directory.glob(f"{name}-*.json"), key=mtime)[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def template_cache() -> Any:
    """jinja2's own bytecode cache for compiled templates, in this cache's directory; None when the cache is off.
    Jinja keys each entry by the template's file and checks its source's digest before using it (jinja2/bccache.py
    FileSystemBytecodeCache and Bucket), and writes it through a temporary file and a rename."""
    directory = cache_dir()
    if directory is None:
        return None
    import jinja2

    class TemplateCache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except Exception:  # noqa: BLE001 - a garbled entry (jinja catches only marshal's errors, not pickle's):
                bucket.reset()  # the template is compiled afresh, and the entry rewritten

    templates = directory / "templates"
    try:
        templates.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return TemplateCache(str(templates))
