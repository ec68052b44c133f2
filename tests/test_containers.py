"""Jobs in containers (software.container, `hpc run --container`): what reaches srun's pyxis options, the rank
program inside the container, the refusal where pyxis is missing, `hpc cluster config --pyxis`, and the container
lane of the test bench kept apart from the other lanes. No Slurm here: tests/test_containers_slurm.py runs them."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.conftest import REPO, cli_json, run_hpc
from tests.jobhelpers import CPU, P3DN
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError, UsageError
from toolkit.job.container import CONTRACT_ENV
from toolkit.slurm.render import render_script
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.slurm.executors import slurm_parameters, submitit_batch_script

IMAGE = "/fsx/images/train.sqsh"


def container_spec(*overrides: str, queue=CPU, profile="smoke", run_dir="/fsx/runs/r"):
    recipe = load_recipe("resnet50", profile=profile, overrides=[
        f"software.container.image={IMAGE}", 'software.container.mounts=["/fsx", "data:/data:ro"]',
        "software.venv=/fsx/envs/train", *overrides])
    return build_job_spec(recipe, queue, 2, profile=profile, run_dir=run_dir)


def srun_words(script: str, marker: str) -> list[str]:
    """The words bash would give srun on the script's line starting with MARKER."""
    [line] = [ln for ln in script.splitlines() if ln.startswith(marker)]
    return shlex.split(line.rstrip("&"))


def option(words: list[str], name: str) -> str:
    [value] = [w.split("=", 1)[1] for w in words if w.startswith(f"{name}=")]
    return value


def test_every_rank_runs_in_the_container_with_the_jobs_variables_passed_over_the_images():
    spec = container_spec(run_dir="/scratch/runs/r")
    script = render_script(spec)
    words = srun_words(script, "srun --label")
    assert option(words, "--container-image") == IMAGE
    # relative mount sources resolve under the dirs root; the run dir (outside every mount) is mounted too
    root = spec.root
    assert option(words, "--container-mounts").split(",") == [
        "/fsx:/fsx", f"{root}/data:/data:ro", "/scratch/runs/r:/scratch/runs/r"]
    passed = option(words, "--container-env").split(",")
    assert passed[:len(CONTRACT_ENV)] == list(CONTRACT_ENV)
    assert {"OMP_NUM_THREADS", "PYTHONUNBUFFERED"} <= set(passed)
    assert "--container-readonly" in words and "--container-writable" not in words
    # the rank program activates the venv inside the container before the contract and the workload
    program = words[words.index("bash") + 2]
    # the heartbeat dir (the run dir's) and the staged node-side code on PYTHONPATH (the run dir is mounted), then
    # the software's activation inside the container, then the contract
    heartbeats, bundle, activation = program.split("; ", 2)
    assert heartbeats == "export HPC_HEARTBEAT_DIR=/scratch/runs/r/heartbeats"
    assert bundle.startswith("export PYTHONPATH=/scratch/runs/r/.hpc/hpc-node-")
    assert activation.startswith("set +u; source /fsx/envs/train/bin/activate; set -u; export RANK=")
    # the batch shell (on the host) does not activate it; the data is made by one task inside the container
    assert not any(line.startswith("set +u; source") for line in script.splitlines())
    prepare = srun_words(script, "srun --export=ALL --nodes=1 --ntasks=1")
    assert option(prepare, "--container-image") == IMAGE and prepare[-5:] == [
        "python", "-m", "toolkit.workloads.smoke_data", "images", spec.dirs["data"]]
    assert prepare[-6].startswith("set +u; source /fsx/envs/train/bin/activate; set -u; exec")
    assert subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True).returncode == 0


def test_the_submitit_submission_runs_its_ranks_in_the_same_container():
    spec = container_spec()
    parameters = slurm_parameters(spec)
    assert [a for a in parameters["srun_args"] if a.startswith("--container")] == [
        w for w in srun_words(render_script(spec), "srun --label") if w.startswith("--container")]
    batch = submitit_batch_script(spec, REPO / "runs" / "x")
    assert "--container-image=/fsx/images/train.sqsh" in batch and "/fsx/envs/train/bin/python -u -m submitit" in batch


def test_a_value_with_shell_characters_reaches_srun_as_one_word():
    image = "/fsx/images/x$(touch${IFS}/tmp/pwned)'q.sqsh"
    script = render_script(container_spec(f"software.container.image={image}"))
    assert option(srun_words(script, "srun --label"), "--container-image") == image
    assert subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True).returncode == 0


def test_a_path_list_the_job_prepends_to_is_prepended_inside_to_the_images_value():
    spec = container_spec(queue=P3DN, profile=None)  # EFA queue: LD_LIBRARY_PATH gets the EFA installer's dirs
    words = srun_words(render_script(spec), "srun --label")
    assert "LD_LIBRARY_PATH" not in option(words, "--container-env").split(",")
    program = words[words.index("bash") + 2]
    assert 'export LD_LIBRARY_PATH=/opt/amazon/efa/lib:' in program and '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' \
        in program
    assert {"NCCL_DEBUG", "MASTER_PORT"} <= set(option(words, "--container-env").split(","))
    assert "--cpu-bind=none" in words  # the GPU ranks' binding is kept


def test_writable_workdir_and_extra_variables_are_pyxis_options():
    spec = container_spec("software.container.writable=true", "software.container.workdir=/workspace",
                          'software.container.env=["HF_TOKEN_PATH"]')
    words = srun_words(render_script(spec), "srun --label")
    assert "--container-writable" in words and option(words, "--container-workdir") == "/workspace"
    assert option(words, "--container-env").endswith(",HF_TOKEN_PATH")


def test_an_image_reference_is_passed_as_it_is_and_a_relative_sqsh_goes_under_the_dirs_root():
    ref = container_spec("software.container.image=registry.example.com#team/pytorch:25.01")
    assert ref.software.container.image == "registry.example.com#team/pytorch:25.01"
    rel = container_spec("software.container.image=images/train.sqsh")
    assert rel.software.container.image == f"{rel.root}/images/train.sqsh"


# References as researchers write them, each as enroot v4.1.2 judges it once pyxis has put docker:// before it
# (tests below hold this list to enroot's own docker::_parse_uri, from the pinned sources).
ENROOT_ACCEPTS = ["nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3", "ubuntu", "ubuntu:22.04",
                  "library/ubuntu:22.04", "ubuntu@sha256:0123abcdef", "nvcr.io/nvidia/pytorch:24.01-py3@sha256:ab12",
                  "registry.example.com:5000/team/train:v1.2", "$oauthtoken@nvcr.io#nvidia/pytorch:24.01-py3",
                  "docker://nvcr.io/nvidia/pytorch:24.01-py3", "public.ecr.aws/hpc/train:latest", "NVIDIA/cuda:12",
                  "Ubuntu", "nvcr.io/nvidia/pytorch@sha1:ab"]  # the last: user, image sha1, tag ab
ENROOT_REFUSES = ["nvcr.io/nvidia/PyTorch:24.01", "nvcr.io/nvidia/pytorch:24.01 py3", "nvcr.io/nvidia/pytorch:24.01,b",
                  "nvcr.io/nvidia/pytorch:tag!", "a/#pytorch", "docker://", "ubuntu:", "docker://ubuntu:",
                  "nvcr.io/Nvidia/pytorch"]


def enroot_parse_uri():
    """enroot's docker::_parse_uri (src/docker.sh), as a bash function text, from the pinned enroot sources."""
    import re
    import tarfile

    from testbench import containers

    sources = containers.find_sources()
    if sources is None:
        pytest.skip(containers.missing_sources())
    with tarfile.open(containers.tarball(sources, "enroot")) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("src/docker.sh"))
        text = tar.extractfile(member).read().decode()
    return re.search(r"^docker::_parse_uri\(\) \{\n.*?^\}\n", text, re.S | re.M).group(0)


@pytest.mark.parametrize("image", ENROOT_ACCEPTS + ENROOT_REFUSES)
def test_an_image_reference_is_judged_as_enroot_judges_it(image):
    """A reference enroot would refuse on the node ("Invalid image reference", after the job has started and taken
    its nodes) is refused when the recipe is loaded, naming the key; every reference it accepts is accepted."""
    overrides = [f"software.container.image={image}"]
    if image in ENROOT_ACCEPTS:
        assert load_recipe("resnet50", profile="smoke", overrides=overrides).software.container.image == image
    else:
        with pytest.raises(HpcError, match=r"software\.container\.image: .* is not an image pyxis can start"):
            load_recipe("resnet50", profile="smoke", overrides=overrides)


def test_the_references_above_are_judged_so_by_enroots_own_parser():
    """enroot's docker::_parse_uri run by bash on each reference, as pyxis hands it over (docker:// added where it
    is missing: NVIDIA/pyxis v0.24.0 pyxis_slurmstepd.c enroot_container_create)."""
    function = enroot_parse_uri()
    for image in ENROOT_ACCEPTS + ENROOT_REFUSES:
        uri = image if image.startswith("docker://") else f"docker://{image}"
        done = subprocess.run(["bash", "-c", 'common::err() { echo "$*" >&2; exit 1; }\n' + function
                               + '\ndocker::_parse_uri "$1"', "bash", uri], capture_output=True, text=True, timeout=30)
        expected = 0 if image in ENROOT_ACCEPTS else 1
        assert done.returncode == expected, (image, done.stdout, done.stderr)
        if expected:
            assert "Invalid image reference" in done.stderr


def test_a_url_is_refused_with_the_scheme_named():
    """pyxis would make https://nvcr.io/... the registry `https:` (docker://https://...), which enroot parses."""
    with pytest.raises(HpcError, match="pyxis imports docker:// and dockerd:// references .*not https://"):
        load_recipe("resnet50", profile="smoke", overrides=["software.container.image=https://nvcr.io/nvidia/x:1"])


def test_hpc_run_names_the_option_that_gave_a_bad_image_or_mount(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cluster = ["--cluster", str(REPO / "jobs" / "p3dn-cluster.yaml"), "--dry-run"]
    res = run_hpc("run", str(script), *cluster, "--container", "nvcr.io/nvidia/PyTorch:24.01")
    assert res.returncode == 2 and res.stderr.startswith("error: --container: 'nvcr.io/nvidia/PyTorch:24.01' is not "
                                                         "an image pyxis can start"), res.stderr
    assert "recipes validate" not in res.stderr
    res = run_hpc("run", str(script), *cluster, "--container", "img", "--container-mount", "/a,/b")
    assert res.returncode == 2 and "--container-mount: '/a,/b' is not a mount as pyxis takes it" in res.stderr
    # the doctor's image too, before any step starts on the queue's nodes (no Slurm is asked here)
    res = run_hpc("cluster", "doctor", "--cluster", str(REPO / "jobs" / "p3dn-cluster.yaml"), "--container-image",
                  "nvcr.io/Nvidia/x")
    assert res.returncode == 2 and res.stderr.startswith("error: --container-image: 'nvcr.io/Nvidia/x' is not"), \
        res.stderr


@pytest.mark.parametrize("mount", ["/a,/b", "/a:/b:RO", "/a b", "/a:"])
def test_a_mount_pyxis_would_misread_is_refused_with_the_key(mount):
    with pytest.raises(HpcError, match="software.container.mounts"):
        load_recipe("resnet50", profile="smoke", overrides=[f"software.container.image={IMAGE}",
                                                             f'software.container.mounts=["{mount}"]'])


def test_without_a_container_nothing_changes():
    spec = build_job_spec(load_recipe("resnet50", profile="smoke"), CPU, 2, profile="smoke", run_dir="/fsx/runs/r")
    assert "--container" not in render_script(spec) and spec.software.container is None


def test_the_reviewed_container_render_matches_todays_rendering():
    """jobs/containers/ (make jobs): resnet50's `container` profile on the p3dn queue."""
    path = REPO / "jobs" / "containers" / "resnet50-8xp3dn.sbatch"
    queue = load_queues(REPO / "jobs" / "p3dn-cluster.yaml")["p3dn"]
    spec = build_job_spec(load_recipe("resnet50", profile="container"), queue, 8, profile="container",
                          run_dir="/fsx/runs/resnet50-container-8xp3dn")
    assert path.read_text() == render_script(spec), "jobs/ is stale: run `make jobs` and review the diff"
    assert "--container-image=/fsx/images/resnet50.sqsh --container-mounts=/fsx:/fsx" in path.read_text()


def test_hpc_run_container_options(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = run_hpc("run", str(script), "--cluster", str(REPO / "jobs" / "p3dn-cluster.yaml"), "--queue", "p3dn",
                  "--container", "/fsx/images/t.sqsh", "--container-mount", "/fsx", "--executor", "sbatch",
                  "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    words = srun_words(cli_json(res)["script"], "srun --label")
    assert option(words, "--container-image") == "/fsx/images/t.sqsh"
    assert option(words, "--container-mounts").startswith("/fsx:/fsx")
    # planned on a ParallelCluster config without pyxis: said at once (the submission itself asks srun)
    assert any("does not enable pyxis" in w for w in cli_json(res)["warnings"])
    from toolkit.recipes.user import user_recipe
    with pytest.raises(UsageError, match="--container IMAGE"):
        user_recipe(str(script), [], container_mounts=["/fsx"])


def test_a_container_job_is_refused_where_srun_has_no_pyxis(monkeypatch):
    from toolkit.slurm import pyxis

    monkeypatch.setattr(pyxis, "pyxis_loaded", lambda: False)  # stand-in for a cluster without pyxis
    with pytest.raises(HpcError, match="pyxis is not loaded") as err:
        pyxis.require_pyxis()
    assert "--pyxis" in err.value.fix


def test_cluster_config_pyxis_adds_aws_custom_actions(tmp_path):
    out = tmp_path / "c.yaml"
    res = run_hpc("cluster", "config", "--name", "c", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
                  "--key-name", "k", "--queue-spec", "gpu=p4d.24xlarge:2", "--queue-spec", "cpu=c5.xlarge:2", "--pyxis",
                  "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr
    import yaml

    from toolkit.cluster.build import PYXIS_COMMIT, PYXIS_COMPUTE_SCRIPT, PYXIS_HEAD_SCRIPT

    doc = yaml.safe_load(out.read_text())
    assert doc["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"] == PYXIS_HEAD_SCRIPT
    assert all(q["CustomActions"]["OnNodeStart"]["Script"] == PYXIS_COMPUTE_SCRIPT
               for q in doc["Scheduling"]["SlurmQueues"])
    # run as root on every node: pinned to a commit of aws-samples/aws-parallelcluster-post-install-scripts where
    # enable-pyxis/head-node/postscript.sh and compute-node/postscript.sh exist (its main branch has no enable-pyxis/)
    assert PYXIS_COMMIT == "5f87e2af8e3bce3c5dc2e699336b3cd36e3aaa1f"
    prefix = f"https://raw.githubusercontent.com/aws-samples/aws-parallelcluster-post-install-scripts/{PYXIS_COMMIT}/"
    assert PYXIS_HEAD_SCRIPT == prefix + "enable-pyxis/head-node/postscript.sh"
    assert PYXIS_COMPUTE_SCRIPT == prefix + "enable-pyxis/compute-node/postscript.sh"
    valid = run_hpc("cluster", "validate", str(out), "--json")
    assert not [f for f in cli_json(valid)["findings"] if "not a commit" in f["message"]]
    assert " --pyxis -o " in out.read_text().splitlines()[1]  # the header's command makes the same file
    from toolkit.health.containers import config_enables_pyxis

    assert config_enables_pyxis(doc)
    assert not config_enables_pyxis(yaml.safe_load((REPO / "jobs" / "p3dn-cluster.yaml").read_text()))


def test_the_container_lane_shares_nothing_with_the_other_lanes(tmp_path):
    from testbench import cluster, containers, procs
    from testbench.layout import CONTAINER_LANES, LANES, Layout

    lane = CONTAINER_LANES["22.05-pyxis"]
    ports = lambda lay: {lay.slurmctld_port, lay.slurmdbd_port, *(n.port for n in lay.nodes)}  # noqa: E731
    for other in LANES.values():
        assert lane.state_dir != other.state_dir and not ports(lane) & ports(other)
        assert not {n.addr for n in lane.nodes} & {n.addr for n in other.nodes}
        assert lane.first_job_id != other.first_job_id
        assert {lane.comm(d) for d in procs.GUARDED_DAEMONS}.isdisjoint(other.comm(d) for d in procs.GUARDED_DAEMONS)
    assert all(len(lane.comm(d)) <= 15 for d in procs.GUARDED_DAEMONS)
    configs = cluster.render_configs(Layout(tmp_path, lane))
    assert f"PlugStackConfig={tmp_path}/etc/plugstack.conf\n" in configs[Layout(tmp_path, lane).slurm_conf]
    default = cluster.render_configs(Layout(tmp_path / "d"))
    assert "PlugStackConfig" not in default[Layout(tmp_path / "d").slurm_conf]
    # one enroot per node, each with its own data path (pyxis names containers alike on every node)
    confs = [containers.enroot_conf(n) for n in lane.cpu_nodes]
    assert len({c.split("ENROOT_DATA_PATH ")[1].split()[0] for c in confs}) == len(confs)
    assert "runtime_path=" in containers.plugstack_text() and "sbatch_support=1" in containers.plugstack_text()


def test_without_the_sources_the_lane_says_what_to_provide(monkeypatch, tmp_path):
    from testbench import containers

    monkeypatch.setenv(containers.SOURCES_ENV, str(tmp_path))
    assert containers.find_sources() is None
    line = containers.missing_sources()
    assert "\n" not in line and containers.SOURCES_ENV in line and "enroot-bd51f53b" in line


def test_the_node_check_reports_enroots_version(tmp_path):
    from toolkit.node.node_check import Node, gather

    enroot = tmp_path / "usr/bin/enroot"
    enroot.parent.mkdir(parents=True)
    enroot.write_text('#!/bin/sh\n[ "$1" = version ] && echo 4.1.2\n')
    enroot.chmod(0o755)
    assert gather(Node(str(tmp_path), {"PATH": "/usr/bin"}))["enroot"] == {"path": str(enroot), "version": "4.1.2"}
    assert gather(Node(str(tmp_path / "bare"), {"PATH": "/usr/bin"}))["enroot"] == {"path": None, "version": None}


def test_pyxis_script_writes_the_toolkits_script_and_the_config_runs_it_from_s3(tmp_path):
    import subprocess

    import yaml

    from toolkit.cluster.build import pyxis_script_text

    res = run_hpc("cluster", "pyxis-script", "-o", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    script = tmp_path / "enable-pyxis.sh"
    assert script.read_text() == pyxis_script_text() and script.stat().st_mode & 0o111
    assert cli_json(res)["upload"].startswith("aws s3 cp ")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    wrong = subprocess.run(["bash", str(script), "login-node"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "head-node or compute-node" in wrong.stderr  # refused before touching anything
    assert "curl" not in script.read_text() and "wget" not in script.read_text()  # it downloads nothing

    url = "s3://my-bucket/tools/enable-pyxis.sh"
    out = tmp_path / "c.yaml"
    res = run_hpc("cluster", "config", "--name", "c", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
                  "--key-name", "k", "--queue-spec", "gpu=p4d.24xlarge:2", "--pyxis-script", url, "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load(out.read_text())
    read_only = [{"BucketName": "my-bucket", "EnableWriteAccess": False}]
    assert doc["HeadNode"]["CustomActions"]["OnNodeConfigured"] == {"Script": url, "Args": ["head-node"]}
    assert doc["HeadNode"]["Iam"]["S3Access"] == read_only
    queue = doc["Scheduling"]["SlurmQueues"][0]
    assert queue["CustomActions"]["OnNodeStart"] == {"Script": url, "Args": ["compute-node"]}
    assert queue["Iam"]["S3Access"] == read_only
    assert f" --pyxis-script {url} -o " in out.read_text().splitlines()[1]
    from toolkit.health.containers import config_enables_pyxis

    assert config_enables_pyxis(doc)
    bad = run_hpc("cluster", "config", "--name", "c", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
                  "--key-name", "k", "--queue-spec", "gpu=p4d.24xlarge:2", "--pyxis-script",
                  "https://raw.githubusercontent.com/o/r/main/x.sh", "-o", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and "hpc cluster pyxis-script" in bad.stderr
