"""A container image reference as the kubelet reads it: the API server takes any image without surrounding spaces,
and the kubelet then parses it (kubernetes/kubernetes pkg/kubelet/images/image_manager.go applyDefaultImageTag:
distribution/reference ParseNormalizedNamed); one it cannot parse leaves the pod in InvalidImageName and the job
waiting. The grammar is distribution/reference's (vendor/github.com/distribution/reference regexp.go, normalize.go,
reference.go: paths at most 255 characters; go-digest's lengths for its algorithms)."""

from __future__ import annotations

import re

_ALPHANUMERIC = "[a-z0-9]+"
_SEPARATOR = "(?:[._]|__|[-]+)"
_PATH_COMPONENT = f"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_DOMAIN_COMPONENT = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
# What is matched is always DOMAIN/PATH: the domain is put first as ParseNormalizedNamed does (Docker Hub's if none)
_NAME = rf"{_HOST}(?::[0-9]+)?/({_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # Go's \w is ASCII
_DIGEST = r"([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):([0-9A-Fa-f]{32,})"
_REFERENCE = re.compile(rf"{_NAME}(?::{_TAG})?(?:@{_DIGEST})?")
_IDENTIFIER = re.compile(r"[a-f0-9]{64}")
_DIGEST_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}  # opencontainers/go-digest algorithm.go
NAME_MAX = 255
FORM = "[REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], NAME in lowercase (e.g. nvcr.io/nvidia/pytorch:24.01-py3)"


def _split_domain(name: str) -> tuple[str, str]:
    """splitDockerDomain: the registry part, or Docker Hub's where the first part cannot be one."""
    first, slash, rest = name.partition("/")
    if not slash:
        return "docker.io", "library/" + name
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        return ("docker.io" if first == "index.docker.io" else first), rest
    return "docker.io", name


def image_problem(image: str) -> str | None:
    """Why the kubelet would refuse `image` (in its words, shortened), or None."""
    if image != image.strip():
        return "has spaces around it"  # the API server's own check (ValidateContainers)
    if _IDENTIFIER.fullmatch(image):
        return "is a 64-character hexadecimal id, not a repository name"
    domain, remainder = _split_domain(image)
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        return f"names the repository {remote!r}, which must be lowercase"
    found = _REFERENCE.fullmatch(f"{domain}/{remainder}")
    if found is None:
        return "is not an image reference"
    if len(found.group(1)) > NAME_MAX:  # the path, without the registry (Parse: RepositoryNameTotalLengthMax)
        return f"has a repository path over {NAME_MAX} characters"
    algorithm, encoded = found.group(2), found.group(3)
    if algorithm and algorithm in _DIGEST_LENGTH and len(encoded) != _DIGEST_LENGTH[algorithm]:
        return f"has a {algorithm} digest of {len(encoded)} hex digits, not {_DIGEST_LENGTH[algorithm]}"
    if algorithm and algorithm not in _DIGEST_LENGTH:
        return f"has a digest of algorithm {algorithm!r} (sha256, sha384 or sha512)"
    return None
