"""What `pip install .` gives a user: a wheel of the product alone (no test bench) whose `hpc` finds the built-in
recipes from any directory. Built from a copy of the checkout (so a stale build/ dir cannot leak into it),
installed with --target outside the checkout; its dependencies come from this environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO

BUILTIN = {"bert-5b", "collectives", "nccl-tests", "resnet50", "roberta", "transformer"}
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", "runs", "smoke")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, site, elsewhere = tmp / "src", tmp / "dist", tmp / "site", tmp / "elsewhere"
    shutil.copytree(REPO, src, symlinks=True, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], check=True,
                   capture_output=True, timeout=120)
    (wheel,) = dist.glob("*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=120)
    elsewhere.mkdir()
    # A clean environment: no cluster, no recipes dir, no checkout on the path; the wheel's files first.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "PYTHONPATH": str(site), "HPC_RUNS_DIR": str(tmp / "runs")}
    return {"wheel": wheel, "site": site, "cwd": elsewhere, "env": env}


def run(installed: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=installed["cwd"], env=installed["env"],
                          timeout=60)


def test_the_wheel_holds_the_product_and_its_recipes_but_no_test_bench(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert not [n for n in names if n.startswith(("testbench/", "toolkit/sandbox/", "tests/"))]
    assert {f"toolkit/builtin_recipes/{name}.yaml" for name in BUILTIN} <= set(names)
    assert "toolkit/builtin_recipes/examples/ddp_train.py" in names
    # the run pages' templates (`hpc report html`)
    assert {"toolkit/reports/templates/run.html.j2", "toolkit/reports/templates/index.html.j2"} <= set(names)
    # the operators' CRDs that `hpc k8s validate` checks custom resources against
    assert {"toolkit/k8s/crds/kubeflow.org_pytorchjobs.yaml", "toolkit/k8s/crds/kubeflow.org_mpijobs.yaml",
            "toolkit/k8s/crds/SOURCES.md"} <= set(names)
    # the recipes' JSON Schema for editors, also beside the built-in recipes their modeline names (a link in the
    # checkout, a copy in the wheel)
    wheel = zipfile.ZipFile(installed["wheel"])
    assert wheel.read("toolkit/builtin_recipes/recipe.schema.json") == wheel.read("toolkit/recipes/recipe.schema.json")
    res = run(installed, sys.executable, "-c", "import toolkit.sandbox")
    assert res.returncode == 1 and "No module named 'toolkit.sandbox'" in res.stderr, res.stderr
    res = run(installed, sys.executable, "-c", "import testbench")
    assert res.returncode == 1 and "No module named 'testbench'" in res.stderr, res.stderr


def test_installed_hpc_lists_the_builtin_recipes_from_any_directory(installed):
    res = run(installed, str(installed["site"] / "bin" / "hpc"), "recipes", "list", "--json")
    assert res.returncode == 0, res.stderr
    rows = cli_json(res)
    assert {r["name"] for r in rows} == BUILTIN
    # read from the installed package, not from the checkout
    packaged = installed["site"].resolve() / "toolkit" / "builtin_recipes"
    assert all(Path(r["path"]).parent == packaged for r in rows), [r["path"] for r in rows]


def test_installed_hpc_renders_a_recipe_without_any_cluster_config(installed):
    res = run(installed, str(installed["site"] / "bin" / "hpc"), "recipes", "render", "roberta", "--nodes", "2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in res.stdout
    # no cluster config anywhere: it says which queue it assumed (ParallelCluster's head node path is absent)
    assert "assumed the default queue p3dn" in res.stderr, res.stderr
