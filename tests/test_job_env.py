"""The job environment per instance kind and EFA stack, the submit allow-list, and no leaked credentials."""

import os

import pytest

from tests.conftest import run_hpc
from tests.jobhelpers import CPU, P3DN
from toolkit.catalog import instance
from toolkit.cluster.queues import Queue, queues_from_config
from toolkit.accelerators.nvidia import communication_env
from toolkit.job.env import filter_submit_env, submit_env_allowlist
from toolkit.slurm.render import render_script
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe


def names(env):
    return [v.name for v in env]


MODERN = ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_NET"]
LEGACY = MODERN + ["FI_PROVIDER", "FI_EFA_TX_MIN_CREDITS", "NCCL_SOCKET_IFNAME", "NCCL_PROTO"]
TCP = ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"]


def config_queue(itype: str, efa: bool, stack: str | None) -> Queue:
    """A queue as read from a ParallelCluster file: Efa/Enabled as given, the hpc:efa-stack tag if any."""
    queue = {"Name": "q", "ComputeResources": [{"Name": "r", "InstanceType": itype, "MaxCount": 2,
                                                "Efa": {"Enabled": efa}}]}
    if stack:
        queue["Tags"] = [{"Key": "hpc:efa-stack", "Value": stack}]
    return queues_from_config({"Scheduling": {"SlurmQueues": [queue]}})["q"]


@pytest.mark.parametrize("itype,efa,stack,expected", [
    ("p3dn.24xlarge", True, None, MODERN),  # EFA on: modern by default
    ("p5.48xlarge", True, "modern", MODERN),
    ("p3dn.24xlarge", True, "legacy", LEGACY),
    ("p4d.24xlarge", True, "legacy", LEGACY + ["FI_EFA_USE_DEVICE_RDMA"]),
    ("p3.16xlarge", False, None, TCP),
    ("p3.16xlarge", True, "legacy", TCP),  # the instance has no EFA: TCP whatever the tag says
    ("p3dn.24xlarge", True, "none", TCP),
    ("p3dn.24xlarge", False, None, TCP),  # EFA disabled on the queue
    ("p4d.24xlarge", False, "legacy", TCP),  # EFA disabled: no FI_* even with a legacy stack tag
])
def test_communication_env_follows_the_queue(itype, efa, stack, expected):
    queue = config_queue(itype, efa, stack)
    env = build_job_spec(load_recipe("roberta"), queue, 1).env
    got = [v.name for v in env if v.name.startswith(("NCCL_", "FI_"))]
    assert got == expected
    assert all(v.doc for v in env)
    values = {v.name: v.value for v in env}
    threads = {n: int(values[n]) for n in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD") if n in values}
    if threads:
        assert threads["NCCL_SOCKET_NTHREADS"] <= 16
        assert threads["NCCL_SOCKET_NTHREADS"] * threads["NCCL_NSOCKS_PERTHREAD"] <= 64


def test_efa_queues_fail_closed_on_the_plugin_and_tcp_queues_do_not():
    for fabric in ("modern", "legacy"):
        env = {v.name: v.value for v in communication_env(instance("p4d.24xlarge"), fabric)}
        assert env["NCCL_NET"] == "AWS Libfabric"  # NCCL errors out if no network of that name loaded
    assert "NCCL_NET" not in names(communication_env(instance("p4d.24xlarge"), "none"))
    script = render_script(build_job_spec(load_recipe("roberta"), config_queue("p4d.24xlarge", True, None), 1))
    assert "export NCCL_NET='AWS Libfabric'" in script


def test_nccl_proto_simple_only_for_the_legacy_plugin():
    assert {v.name: v.value for v in communication_env(instance("p4d.24xlarge"), "legacy")}["NCCL_PROTO"] == "simple"
    for fabric in ("modern", "none"):  # it would bypass a modern plugin's tuner
        assert "NCCL_PROTO" not in names(communication_env(instance("p4d.24xlarge"), fabric))


def test_cpu_queue_gets_threads_and_no_nccl():
    spec = build_job_spec(load_recipe("resnet50"), CPU, 2)
    assert spec.environ["OMP_NUM_THREADS"] == "1" == str(spec.cpus_per_task)
    assert not [n for n in spec.environ if n.startswith(("NCCL_", "FI_"))]
    words = [w for w in spec.command if isinstance(w, str)]
    assert words[words.index("--threads") + 1] == "1"


def test_gpu_queue_leaves_thread_count_to_the_libraries():
    assert "OMP_NUM_THREADS" not in build_job_spec(load_recipe("roberta"), P3DN, 1).environ


def test_recipe_env_overrides_and_every_variable_is_documented_above_its_export():
    recipe = load_recipe("roberta", overrides=["env.NCCL_DEBUG=WARN", "env.MY_SETTING=a b"])
    spec = build_job_spec(recipe, Queue(name="q", instance_type="p3dn.24xlarge", max_nodes=8, efa_stack="legacy"), 1)
    assert spec.environ["NCCL_DEBUG"] == "WARN" and spec.environ["MY_SETTING"] == "a b"
    lines = render_script(spec).splitlines()
    for var in spec.env:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"export {var.name}="))
        assert lines[at - 1] == f"# {var.doc}"


def test_the_job_prints_the_communication_values_in_effect():
    script = render_script(build_job_spec(load_recipe("nccl-tests"), P3DN, 2))
    assert "env | grep -E '^(NCCL_|FI_|RDMAV_|HCCL_|OMP_NUM_THREADS|LD_LIBRARY_PATH=)' | sort" in script


def test_only_allow_listed_submitter_variables_pass():
    allowed = submit_env_allowlist()
    assert "PATH" in allowed and not [n for n in allowed if n.startswith("AWS") or "TOKEN" in n]
    assert filter_submit_env({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x", "HOME": "/h"}) == {"PATH": "/bin",
                                                                                              "HOME": "/h"}


def test_a_planted_credential_never_reaches_the_render():
    secrets = {"AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234", "AWS_SECRET_ACCESS_KEY": "fake/secret+KEY0987654321",
               "AWS_SESSION_TOKEN": "FakeSessionToken123", "GITHUB_TOKEN": "ghp_fakefakefake", "HF_TOKEN": "hf_fake"}
    env = {**os.environ, **secrets, "HPC_CLUSTER_CONFIG": ""}
    for name in ("roberta", "resnet50", "nccl-tests"):
        res = run_hpc("recipes", "render", name, env=env)
        assert res.returncode == 0, res.stderr
        export = next(line for line in res.stdout.splitlines() if line.startswith("#SBATCH --export="))
        assert export == "#SBATCH --export=" + ",".join(submit_env_allowlist())
        for name_, value in secrets.items():
            assert value not in res.stdout and value not in res.stderr
            assert name_ not in res.stdout


EFA_DIRS = ["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib", "/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib"]


def library_path_line(lines) -> str:
    return next(line for line in lines if line.startswith("export LD_LIBRARY_PATH="))


def loader_path_in_bash(spec, nodes_value: str | None) -> str:
    """LD_LIBRARY_PATH after the job's environment lines run in bash, on a node whose own value is `nodes_value`."""
    import subprocess

    from toolkit.slurm.render import export_line

    var = next(v for v in spec.env if v.name == "LD_LIBRARY_PATH")
    env = {"PATH": os.environ["PATH"]} | ({"LD_LIBRARY_PATH": nodes_value} if nodes_value is not None else {})
    res = subprocess.run(["bash", "-c", f"set -eu; {export_line(var)}; printf %s \"$LD_LIBRARY_PATH\""],
                         capture_output=True, text=True, env=env, check=True)
    return res.stdout


def test_efa_jobs_put_the_efa_installers_libraries_before_the_nodes_own_path():
    """AWS's nccl-tests job: libfabric, Open MPI, aws-ofi-nccl before the node's LD_LIBRARY_PATH; nothing of the
    submitter's (LD_LIBRARY_PATH stays off the allow-list)."""
    spec = build_job_spec(load_recipe("nccl-tests"), P3DN, 2)
    var = next(v for v in spec.env if v.name == "LD_LIBRARY_PATH")
    assert var.prepend and var.value.split(":") == EFA_DIRS and "aws-ofi-nccl" in var.doc
    assert "LD_LIBRARY_PATH" not in submit_env_allowlist()
    assert loader_path_in_bash(spec, "/node/lib:/cuda/lib") == ":".join(EFA_DIRS) + ":/node/lib:/cuda/lib"
    assert loader_path_in_bash(spec, None) == ":".join(EFA_DIRS)  # no empty entry (the current directory)
    assert loader_path_in_bash(spec, "") == ":".join(EFA_DIRS)


def test_the_library_path_is_exported_after_the_nodes_software_is_activated():
    spec = build_job_spec(load_recipe("roberta"), P3DN, 1)
    lines = render_script(spec).splitlines()
    activate = next(i for i, line in enumerate(lines) if "/bin/activate" in line)
    export = lines.index(library_path_line(lines))
    assert activate < export
    assert lines[export] == ("export LD_LIBRARY_PATH=" + ":".join(EFA_DIRS) + '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"')


def test_recipe_library_dirs_and_nccl_home_come_first_resolved_under_the_root():
    recipe = load_recipe("nccl-tests", overrides=["software.nccl_home=nccl/build",
                                                  "software.library_path=[/usr/local/cuda/lib64, mpi/lib]"])
    spec = build_job_spec(recipe, P3DN, 2)  # dirs root: the queue's FSx mount, /fsx
    assert spec.environ["LD_LIBRARY_PATH"].split(":") == [
        "/usr/local/cuda/lib64", "/fsx/mpi/lib", "/fsx/nccl/build/lib", *EFA_DIRS]
    doc = next(v.doc for v in spec.env if v.name == "LD_LIBRARY_PATH")
    assert "software.library_path" in doc and "software.nccl_home /fsx/nccl/build" in doc


def test_tcp_and_cpu_queues_get_only_what_the_recipe_names():
    tcp = config_queue("p3.16xlarge", False, None)
    assert "LD_LIBRARY_PATH" not in build_job_spec(load_recipe("nccl-tests"), tcp, 1).environ
    assert "LD_LIBRARY_PATH" not in build_job_spec(load_recipe("resnet50"), CPU, 1).environ
    own = load_recipe("resnet50", overrides=["software.library_path=[/opt/x/lib]"])
    assert build_job_spec(own, CPU, 1).environ["LD_LIBRARY_PATH"] == "/opt/x/lib"


def test_a_recipe_sets_ld_library_path_itself_and_replaces_the_computed_one():
    recipe = load_recipe("nccl-tests", overrides=["env.LD_LIBRARY_PATH=/only/this"])
    (var,) = [v for v in build_job_spec(recipe, P3DN, 2).env if v.name == "LD_LIBRARY_PATH"]
    assert var.value == "/only/this" and not var.prepend
    assert "export LD_LIBRARY_PATH=/only/this" in render_script(build_job_spec(recipe, P3DN, 2)).splitlines()


def test_a_library_dir_is_one_directory():
    from toolkit.errors import HpcError

    with pytest.raises(HpcError, match="one directory per entry"):
        load_recipe("nccl-tests", overrides=["software.library_path=[/a:/b]"])
    with pytest.raises(HpcError, match="one directory per entry"):
        load_recipe("nccl-tests", overrides=["software.nccl_home=/a:/b"])


def test_dl1_efa_jobs_get_the_hccl_ofi_wrapper_on_the_path_and_hccls_interface():
    """HabanaAI/Model-References 1.8.0 deepspeed-bert README (DL1): HCCL_SOCKET_IFNAME=eth0 and
    LD_LIBRARY_PATH=/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib."""
    dl1 = config_queue("dl1.24xlarge", True, None)
    env = build_job_spec(load_recipe("resnet50"), dl1, 1).environ
    assert env["HCCL_SOCKET_IFNAME"] == "eth0"
    assert env["LD_LIBRARY_PATH"].split(":") == ["/usr/lib/habanalabs", "/root/hccl_ofi_wrapper",
                                                  "/opt/amazon/openmpi/lib", "/opt/amazon/efa/lib"]
    no_efa = build_job_spec(load_recipe("resnet50"), config_queue("dl1.24xlarge", False, None), 1).environ
    assert "HCCL_SOCKET_IFNAME" not in no_efa and "LD_LIBRARY_PATH" not in no_efa


def test_both_submission_paths_give_ranks_the_same_library_path(tmp_path):
    """The rendered script and submitit's batch script (made by submitit's own code) export the same line."""
    from toolkit.slurm.executors import slurm_parameters, submitit_batch_script

    recipe = load_recipe("roberta", overrides=["software.library_path=[/opt/cuda/lib]"])
    spec = build_job_spec(recipe, P3DN, 2, run_dir=str(tmp_path / "run"))
    rendered = library_path_line(render_script(spec).splitlines())
    assert rendered.startswith("export LD_LIBRARY_PATH=/opt/cuda/lib:/opt/amazon/efa/lib:")
    assert library_path_line(slurm_parameters(spec)["setup"]) == rendered
    assert library_path_line(submitit_batch_script(spec, tmp_path / "submitit").splitlines()) == rendered


def test_kubernetes_pods_keep_their_images_library_path():
    """A pod's env can only replace the image's LD_LIBRARY_PATH (AWS's EFA images set their own): not sent."""
    from toolkit.k8s.manifests import _env, mpirun_args

    spec = build_job_spec(load_recipe("nccl-tests"), P3DN, 2)
    assert "LD_LIBRARY_PATH" in spec.environ
    assert "LD_LIBRARY_PATH" not in [e["name"] for e in _env(spec)]
    # forwarded once, the launcher's own
    assert mpirun_args(spec, "/opt/nccl-tests/build/all_reduce_perf").count("LD_LIBRARY_PATH") == 1
