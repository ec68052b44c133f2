"""jobs/k8s/: reviewed Kubernetes renders that pass offline validation and match today's rendering."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import REPO, run_hpc

# The Training Operator v1 forms (--api v1) and Kubeflow Trainer v2's (the default), the same setups in each.
K8S_JOBS = REPO / "jobs" / "k8s"
EXAMPLES = sorted(K8S_JOBS.glob("*.yaml")) + sorted((K8S_JOBS / "trainer-v2").glob("*.yaml"))


def test_the_examples_cover_the_published_setups():
    setups = ["nccl-tests-2xp4d.yaml", "resnet50-3xp4d.yaml", "roberta-8xp5.yaml"]
    assert [str(p.relative_to(K8S_JOBS)) for p in EXAMPLES] == setups + [f"trainer-v2/{s}" for s in setups]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(K8S_JOBS)))
def test_example_matches_its_recorded_command_and_validates(path, tmp_path):
    text = path.read_text()
    recorded = str(path.relative_to(REPO))
    command = shlex.split(re.search(r"^# Rendered by `([^`]+)`", text, re.M)[1])
    assert command[:3] == ["hpc", "k8s", "render"] and command[command.index("-o") + 1] == recorded
    out = tmp_path / path.name
    words = command[1:]
    words[words.index("-o") + 1] = str(out)
    res = run_hpc(*words)
    assert res.returncode == 0, res.stderr
    assert out.read_text().replace(str(out), recorded) == text, \
        f"{path} is stale: run `make k8s-jobs` and review the diff"
    res = run_hpc("k8s", "validate", str(path), "--json")
    assert res.returncode == 0, res.stdout
