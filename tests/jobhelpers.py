"""Queues and recipe files the recipe/job tests share."""

from __future__ import annotations

from pathlib import Path

import yaml

from toolkit.cluster.queues import Queue, default_queue

P3DN = default_queue()
CPU = Queue(name="cpu", instance_type="m5.xlarge", max_nodes=2, efa_stack="none", ranks_per_node=2,
            cpus_per_task_override=1)

CLUSTER_CONFIG = {
    "Region": "us-east-1",
    "Scheduling": {"Scheduler": "slurm", "SlurmQueues": [
        {"Name": "cpu", "ComputeResources": [{"Name": "cpu", "InstanceType": "m5.xlarge", "MaxCount": 2}],
         "Tags": [{"Key": "hpc:ranks-per-node", "Value": "2"}, {"Key": "hpc:cpus-per-task", "Value": "1"}]},
        {"Name": "gaudi", "ComputeResources": [{"Name": "dl1", "InstanceType": "dl1.24xlarge", "MaxCount": 4}]},
        {"Name": "p3", "ComputeResources": [{"Name": "p3", "InstanceType": "p3.16xlarge", "MaxCount": 4}]},
    ]},
    "SharedStorage": [{"MountDir": "/shared", "Name": "fsx", "StorageType": "FsxLustre"}],
}

MINIMAL_RECIPE = {
    "name": "mini",
    "description": "a small valid recipe",
    "source": "tests",
    "launcher": {"kind": "fairseq"},
    "args": {"--arch": "transformer", "--max-sentences": 4, "--fp16": True},
    "resources": {"nodes": 1, "time": "01:00:00"},
    "dirs": {"data": {"dir": "data", "arg": "positional"}},
    "scaling": {"--update-freq": {"rule": "accumulate", "per_rank_arg": "--max-sentences", "global_batch": 64,
                                  "why": "keep the global batch"}},
}


def write_cluster(directory: Path) -> Path:
    path = directory / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER_CONFIG))
    return path


def write_recipe(directory: Path, data: dict, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def parse_flags(argv: list[str]) -> dict[str, list[str]]:
    """argv -> {flag: [values]} (a word starting with '-' and not a number starts a flag)."""
    flags: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("-") and not word.lstrip("-").replace(".", "").isdigit():
            current = word
            flags[current] = []
        elif current is not None:
            flags[current].append(word)
    return flags
