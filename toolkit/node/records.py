"""JSON-lines records in a run dir, written by node-side code and read by reports (toolkit.rundir reads them too)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

PREFLIGHTS = "preflight.jsonl"  # toolkit.node.preflight: what each start of the job found on its nodes
RESTARTS = "restarts.jsonl"  # toolkit.node.spares: each restart on other nodes, probe and giving up


def read_records(path: Path) -> List[Dict[str, Any]]:
    """A JSON-lines file's records, oldest first (unreadable lines left out; none when there is no file)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def append_record(path: Path, entry: Mapping[str, Any]) -> None:
    with open(path, "a") as handle:  # one line, appended: readers never see half of one
        handle.write(json.dumps(entry) + "\n")


def batch_dir(run_dir: Union[str, Path]) -> Path:
    """The dir a job's batch shell writes to: the sweep's for a sweep task's run dir (the tasks of one job array
    share one batch script, so it cannot know its task's), else the run dir itself."""
    path = Path(run_dir)
    return path.parent if re.fullmatch(r"task-\d{3,}", path.name) else path


def job_records(path: Path, job_id: str) -> List[Dict[str, Any]]:
    """One job's records of a run dir's file (a sweep's tasks share their batch dir's)."""
    return [r for r in read_records(path) if str(r.get("job")) == str(job_id)]
