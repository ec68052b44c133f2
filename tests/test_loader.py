"""`hpc cluster doctor --recipe`: the dynamic loader, in a rendered job's own environment, on a STAND-IN prefix.

The stand-in: tiny real shared objects compiled here with gcc, named like the real ones (libnccl.so.2, libmpi.so.40,
NCCL net plugins exporting ncclNetPlugin_v8, libhccl_ofi_wrapper.so) and a tiny program linked against libnccl and
libmpi standing in for nccl-tests' all_reduce_perf. Nothing here is NCCL, Open MPI or aws-ofi-nccl: only the
loader's answers are real. The job's environment is its set-up lines run by bash with the allow-listed
submitter variables (what srun --export=LIST gives a task); one test runs it through the local Slurm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import P3DN
from toolkit.cluster.queues import Queue
from toolkit.health import loader
from toolkit.node.loader_check import plugin_names
from toolkit.slurm.materialize import build_job_spec, loader_check_arguments
from toolkit.recipes.load import load_recipe

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the stand-in libraries are compiled with gcc")
DL1 = Queue("dl1", "dl1.24xlarge", 4, efa_stack="modern", fsx_mount="/fsx", efa_enabled=True)


def gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    """STAND-IN prefix: nccl/lib/libnccl.so.2, mpi/lib/libmpi.so.40, ofi/lib/libnccl-net.so (a plugin needing
    fabric/lib/libfabric.so.1), plugin/lib/libnccl-net-ofi.so (no dependencies), hccl/lib/libhccl_ofi_wrapper.so,
    and bin/all_reduce_perf linked against libnccl and libmpi."""
    root = tmp_path_factory.mktemp("standin")
    src = root / "src"
    src.mkdir()
    for d in ("nccl/lib", "mpi/lib", "ofi/lib", "fabric/lib", "plugin/lib", "hccl/lib", "bin"):
        (root / d).mkdir(parents=True)

    def library(path: str, soname: str, code: str, *link: str) -> None:
        c = src / (Path(path).name + ".c")
        c.write_text(code)
        gcc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(root / path), str(c), *link)

    library("nccl/lib/libnccl.so.2", "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 22105; return 0; }\n")
    os.symlink("libnccl.so.2", root / "nccl/lib/libnccl.so")
    library("mpi/lib/libmpi.so.40", "libmpi.so.40", "int MPI_Init(int *c, char ***v) { return 0; }\n")
    os.symlink("libmpi.so.40", root / "mpi/lib/libmpi.so")
    library("fabric/lib/libfabric.so.1", "libfabric.so.1", "int fi_version(void) { return 0x10016; }\n")
    os.symlink("libfabric.so.1", root / "fabric/lib/libfabric.so")
    plugin = ('struct net { const char *name; }; int fi_version(void);\n'
              'struct net ncclNetPlugin_v8 = { "AWS Libfabric" };\nint uses_fabric(void) { return fi_version(); }\n')
    library("ofi/lib/libnccl-net.so", "libnccl-net.so", plugin, f"-L{root}/fabric/lib", "-lfabric")
    library("plugin/lib/libnccl-net-ofi.so", "libnccl-net-ofi.so",
            'struct net { const char *name; } ncclNetPlugin_v8 = { "AWS Libfabric" };\n')
    library("hccl/lib/libhccl_ofi_wrapper.so", "libhccl_ofi_wrapper.so", "int create_ofi_plugin(void) { return 0; }\n")
    main = src / "all_reduce_perf.c"
    main.write_text("int ncclGetVersion(int *); int MPI_Init(int *, char ***);\n"
                    "int main(void) { int v; MPI_Init(0, 0); return ncclGetVersion(&v); }\n")
    gcc("-o", str(root / "bin/all_reduce_perf"), str(main), f"-L{root}/nccl/lib", f"-L{root}/mpi/lib", "-lnccl",
        "-lmpi")
    return root


def nccl_tests(standin: Path, queue: Queue = P3DN, *overrides: str):
    """nccl-tests (the real recipe) running the stand-in all_reduce_perf."""
    recipe = load_recipe("nccl-tests", overrides=[f"launcher.program={standin}/bin/all_reduce_perf", *overrides])
    return build_job_spec(recipe, queue, 1, run_dir="/fsx/runs/nccl-tests")


def check(spec, queue: Queue = P3DN) -> loader.JobLoaderReport:
    environ = dict(os.environ)
    return loader.check_job(spec, queue.fabric, lambda script: loader.run_here(script, environ, timeout=60))


def by_library(report) -> dict[str, loader.LibraryCheck]:
    return {c.library: c for c in report.checks}


def test_nccl_tests_libraries_resolve_with_the_jobs_path_and_not_without(standin, monkeypatch):
    # The submitter's own LD_LIBRARY_PATH finds everything; the job never gets it.
    monkeypatch.setenv("LD_LIBRARY_PATH",
                       f"{standin}/nccl/lib:{standin}/mpi/lib:{standin}/ofi/lib:{standin}/fabric/lib")
    bare = check(nccl_tests(standin))
    libs = by_library(bare)
    assert not bare.ok and bare.error is None
    assert {name: c.status for name, c in libs.items()} == {
        "libnccl.so.2": "does not resolve", "libmpi.so.40": "does not resolve", "nccl-net-plugin": "does not resolve"}
    assert "software.nccl_home" in libs["libnccl.so.2"].fix and "/opt/amazon/openmpi/lib" in libs["libmpi.so.40"].fix
    assert "libnccl-net.so" in libs["nccl-net-plugin"].detail and "aws-ofi-nccl" in libs["nccl-net-plugin"].fix
    assert bare.ld_library_path.startswith("/opt/amazon/efa/lib:")  # the EFA installer's dirs, the node's lack them

    fixed = check(nccl_tests(standin, P3DN, f"software.nccl_home={standin}/nccl",
                             f"software.library_path=[{standin}/mpi/lib, {standin}/ofi/lib, {standin}/fabric/lib]"))
    libs = by_library(fixed)
    assert fixed.ok, fixed
    assert {name: c.status for name, c in libs.items()} == dict.fromkeys(libs, "resolves")
    assert libs["libnccl.so.2"].path == f"{standin}/nccl/lib/libnccl.so.2"
    assert libs["libmpi.so.40"].path == f"{standin}/mpi/lib/libmpi.so.40"
    assert libs["nccl-net-plugin"].path == f"{standin}/ofi/lib/libnccl-net.so"
    assert libs["nccl-net-plugin"].detail == "net plugin API v8"
    assert fixed.ld_library_path.split(":")[:4] == [f"{standin}/mpi/lib", f"{standin}/ofi/lib", f"{standin}/fabric/lib",
                                                    f"{standin}/nccl/lib"]


def test_a_plugin_whose_libfabric_is_off_the_path_does_not_resolve(standin):
    """NCCL dlopens the plugin RTLD_NOW: a plugin found but missing its libfabric fails the same way."""
    spec = nccl_tests(standin, P3DN, f"software.nccl_home={standin}/nccl",
                      f"software.library_path=[{standin}/mpi/lib, {standin}/ofi/lib]")
    plugin = by_library(check(spec))["nccl-net-plugin"]
    assert plugin.status == "does not resolve" and "libfabric.so.1" in plugin.detail


def test_nccl_net_plugin_names_follow_nccls_rules(standin):
    assert plugin_names(None) == [["libnccl-net.so"]]
    assert plugin_names("none") == plugin_names("NONE") == []
    assert plugin_names("ofi,/x/libp.so,libnccl-net-x.so,libz") == [
        ["ofi", "libnccl-net-ofi.so"], ["/x/libp.so"], ["libnccl-net-x.so"], ["libz", "libnccl-net-libz.so"]]
    # NCCL_NET_PLUGIN=ofi finds libnccl-net-ofi.so by NCCL's second name
    spec = nccl_tests(standin, P3DN, f"software.nccl_home={standin}/nccl", "env.NCCL_NET_PLUGIN=ofi",
                      f"software.library_path=[{standin}/mpi/lib, {standin}/plugin/lib]")
    plugin = by_library(check(spec))["nccl-net-plugin"]
    assert plugin.status == "resolves" and plugin.path == f"{standin}/plugin/lib/libnccl-net-ofi.so"
    assert plugin.wanted_by == "NCCL_NET_PLUGIN=ofi"


def test_a_tcp_queue_needs_no_plugin_and_a_missing_program_is_a_failure(standin):
    tcp = Queue("p3", "p3.16xlarge", 2, efa_stack="none")
    assert loader_check_arguments(nccl_tests(standin, tcp), tcp.fabric) == [
        "--program", f"{standin}/bin/all_reduce_perf"]
    gone = check(build_job_spec(load_recipe("nccl-tests", overrides=["launcher.program=/nonexistent/all_reduce_perf"]),
                                tcp, 1, run_dir="/tmp/r"), tcp)
    (only,) = gone.checks
    assert only.status == "does not resolve" and "does not exist on this node" in only.detail and not gone.ok


def test_gaudi_efa_jobs_need_the_hccl_ofi_wrapper(standin):
    spec = build_job_spec(load_recipe("resnet50"), DL1, 1, run_dir="/fsx/runs/r")
    assert loader_check_arguments(spec, DL1.fabric) == ["--library", "libhccl_ofi_wrapper.so"]
    assert loader_check_arguments(spec, "none") == []  # no EFA: no HCCL scale-out through libfabric
    no_venv = check(spec, DL1)  # the recipe's venv is on /fsx, which this machine lacks: the set-up itself fails
    assert not no_venv.ok and not no_venv.checks and "/fsx/envs/train/bin/activate" in no_venv.error
    # software.venv null: the nodes use the venv the toolkit runs in (toolkit.job.spec.on_slurm)
    spec = build_job_spec(load_recipe("resnet50", overrides=["software.venv=null",
                                                             f"software.library_path=[{standin}/hccl/lib]"]),
                          DL1, 1, run_dir="/fsx/runs/r")
    wrapper = by_library(check(spec, DL1))["libhccl_ofi_wrapper.so"]
    assert wrapper.status == "resolves" and wrapper.path == f"{standin}/hccl/lib/libhccl_ofi_wrapper.so"


def test_the_check_runs_after_the_jobs_own_activation(standin, tmp_path):
    """A module/venv activation that sets LD_LIBRARY_PATH itself keeps its entries after the job's own."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/activate").write_text(f"export LD_LIBRARY_PATH={standin}/mpi/lib\n"
                                       f"export PATH={os.path.dirname(shutil.which('python3'))}:$PATH\n")
    spec = nccl_tests(standin, P3DN, f"software.venv={venv}", f"software.nccl_home={standin}/nccl")
    report = check(spec)
    libs = by_library(report)
    assert libs["libmpi.so.40"].status == libs["libnccl.so.2"].status == "resolves"
    assert report.ld_library_path.endswith(f":/opt/aws-ofi-nccl/lib:{standin}/mpi/lib")


@pytest.mark.training
def test_a_pytorch_gpu_job_asks_the_loader_for_torchs_own_nccl():
    """Not a stand-in: the venv's torch. A CUDA build finds libnccl.so.2 through its RUNPATH (the nvidia-nccl wheel),
    whatever LD_LIBRARY_PATH holds; a CPU build has no libtorch_cuda.so and nothing to check."""
    import importlib.util

    spec = build_job_spec(load_recipe("roberta", overrides=["software.venv=null"]), P3DN, 1, run_dir="/fsx/runs/r")
    assert loader_check_arguments(spec, P3DN.fabric) == ["--torch-nccl", "--nccl-net-plugin"]
    libs = check(spec).checks
    torch_lib = Path(importlib.util.find_spec("torch").origin).parent / "lib/libtorch_cuda.so"
    nccl = next(c for c in libs if c.library.startswith("libnccl"))
    if torch_lib.is_file():
        assert nccl.status == "resolves" and "nvidia/nccl/lib/libnccl.so" in nccl.path, nccl
    else:
        assert nccl.status == "n/a" and "no CUDA build" in nccl.detail


def test_doctor_cli_refuses_nodes_with_recipe():
    res = run_hpc("cluster", "doctor", "--cluster", "jobs/p3dn-cluster.yaml", "--recipe", "nccl-tests",
                  "--check-nodes", "2")
    assert res.returncode == 2 and "--check-nodes is for the node checks" in res.stderr


@pytest.mark.slurm
def test_doctor_on_the_local_slurm_reports_the_jobs_loader(standin, tmp_path, slurm_sandbox):
    """The real path: srun on a node of the local cluster's CPU queue, the job's environment only."""
    recipe = yaml.safe_load(Path("recipes/nccl-tests.yaml").read_text())
    recipe["launcher"]["program"] = f"{standin}/bin/all_reduce_perf"
    recipe["resources"]["runs_on"] = ["cpu"]
    del recipe["scaling"]  # -e is capped by GPU memory; the CPU queue has none
    recipe["resources"]["nodes"] = 8  # more than the queue has: the check runs on one node whatever the recipe says
    bare = tmp_path / "standin-nccl-tests.yaml"
    bare.write_text(yaml.safe_dump(recipe))
    res = run_hpc("cluster", "doctor", "--recipe", str(bare), "--queue", "cpu", "--json", timeout=120)
    assert res.returncode == 1, res.stderr
    (report,) = cli_json(res)
    assert {c["library"]: c["status"] for c in report["libraries"]} == {
        "libnccl.so.2": "does not resolve", "libmpi.so.40": "does not resolve"}
    assert report["node"] and report["queue"] == "cpu"
    recipe["software"] = {"nccl_home": f"{standin}/nccl", "library_path": [f"{standin}/mpi/lib"]}
    bare.write_text(yaml.safe_dump(recipe))
    res = run_hpc("cluster", "doctor", "--recipe", str(bare), "--queue", "cpu", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "libnccl.so.2  resolves" in res.stdout and f"{standin}/mpi/lib/libmpi.so.40" in res.stdout


def test_a_check_that_cannot_start_names_the_jobs_own_error_not_sruns():
    """A venv that does not exist on the node: the report names bash's error, not srun's 'task 0: Exited' after it."""
    spec = build_job_spec(load_recipe("roberta", overrides=["software.venv=/nowhere/venv"]), P3DN, 1,
                          run_dir="/fsx/runs/r")
    report = loader.check_job(spec, P3DN.fabric, lambda script: subprocess.CompletedProcess(
        [], 1, "", "bash: line 2: /nowhere/venv/bin/activate: No such file or directory\n"
                   "srun: error: c1: task 0: Exited with exit code 1\n"))
    assert report.error == "bash: line 2: /nowhere/venv/bin/activate: No such file or directory"
