"""jobs/k8s/: reviewed Kubernetes renders that pass offline validation and match today's rendering."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import REPO, run_hpc

EXAMPLES = sorted((REPO / "jobs" / "k8s").glob("*.yaml"))


def test_the_examples_cover_the_published_setups():
    assert [p.name for p in EXAMPLES] == ["nccl-tests-2xp4d.yaml", "resnet50-3xp4d.yaml", "roberta-8xp5.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_matches_its_recorded_command_and_validates(path, tmp_path):
    text = path.read_text()
    command = shlex.split(re.search(r"^# Rendered by `([^`]+)`", text, re.M)[1])
    assert command[:3] == ["hpc", "k8s", "render"] and command[command.index("-o") + 1] == f"jobs/k8s/{path.name}"
    out = tmp_path / path.name
    words = command[1:]
    words[words.index("-o") + 1] = str(out)
    res = run_hpc(*words)
    assert res.returncode == 0, res.stderr
    assert out.read_text().replace(str(out), f"jobs/k8s/{path.name}") == text, \
        f"{path} is stale: run `make k8s-jobs` and review the diff"
    res = run_hpc("k8s", "validate", str(path), "--json")
    assert res.returncode == 0, res.stdout
