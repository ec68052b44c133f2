"""`hpc k8s render --image`: a reference the kubelet cannot parse (the pods would wait in InvalidImageName) is a
usage error at render. toolkit/k8s/image.py ports distribution/reference's grammar; the Docker CLI parses with that
same library before it talks to a daemon, so where it is installed the references below are held to it (with
DOCKER_HOST a socket that does not exist: nothing is pulled, nothing leaves the machine)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import run_hpc
from toolkit.k8s.image import image_problem

VALID = ["ubuntu", "ubuntu:22.04", "library/ubuntu", "nvcr.io/nvidia/pytorch:24.01-py3", "Nvcr.io/nvidia/pytorch:1",
         "localhost:5000/team/train:v1", "registry:5000/x", "[::1]:5000/x:y", "a_b", "a__b", "a-----b",
         "public.ecr.aws/hpc/train@sha256:" + "ab" * 32, "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "0" * 64,
         "x:" + "t" * 128, "nvcr.io/" + "a" * 253 + "/b"]
INVALID = ["nvcr.io/Nvidia/pytorch:1", "Ubuntu", "a___b", "x:.bad", "x:" + "t" * 129, "nvcr.io/nvidia/pytorch:1 ",
           " ubuntu", "nvcr.io/nvidia/pytorch@sha256:abc", "x@sha256:" + "0" * 63, "x@md5:" + "0" * 32,
           "https://nvcr.io/nvidia/pytorch", "0123456789abcdef" * 4, "-x", "x/",
           "x//y", "nvcr.io/" + "a" * 254 + "/b"]


@pytest.mark.parametrize("image", VALID + INVALID)
def test_the_grammar_takes_what_distribution_reference_takes(image):
    assert (image_problem(image) is None) == (image in VALID), image_problem(image)


@pytest.mark.skipif(shutil.which("docker") is None, reason="no Docker CLI to compare with")
def test_the_docker_cli_parses_each_reference_the_same_way(tmp_path):
    """`docker pull REF` parses REF (distribution/reference ParseNormalizedNamed) before it dials the daemon: an
    invalid one is refused there ("invalid reference format", go-digest's "invalid checksum digest length"...), a
    valid one goes on and fails to connect to a socket that does not exist."""
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock", "DOCKER_CONFIG": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for image in VALID + INVALID:
        done = subprocess.run([shutil.which("docker") or "docker", "pull", image], env=env, capture_output=True,
                              text=True, timeout=60)
        refused = "Cannot connect to the Docker daemon" not in done.stderr
        assert done.returncode != 0 and refused == (image in INVALID), (image, done.stderr)


def test_render_refuses_an_image_the_kubelet_cannot_parse(tmp_path):
    out = tmp_path / "m.yaml"
    res = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "--image",
                  "nvcr.io/Nvidia/pytorch:24.01-py3", "-o", str(out))
    assert res.returncode == 2 and not out.exists()
    assert res.stderr.startswith("error: --image 'nvcr.io/Nvidia/pytorch:24.01-py3' names the repository "
                                 "'Nvidia/pytorch', which must be lowercase: the kubelet could not pull it"), res.stderr
    ok = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "--image",
                 "nvcr.io/nvidia/pytorch:24.01-py3", "-o", str(out))
    assert ok.returncode == 0 and "image: nvcr.io/nvidia/pytorch:24.01-py3" in out.read_text()
