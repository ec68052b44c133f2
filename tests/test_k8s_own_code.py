"""`hpc k8s render SCRIPT.py|-m MODULE -- ARGS`: a researcher's own code on Kubernetes, as `hpc run` takes it.

The script comes from a ConfigMap of its bytes (no --image) or from the image (--image); a module always from the
image. Checked here: the manifests read back with kubectl's YAML rules and pass the offline validator for both
Kubeflow APIs, the ConfigMap holds the file's exact bytes, the pods' command line runs the script with the user's
arguments (run through the container's own bash), the world size is the nodes x the instance's GPUs, and real
torchrun (PET_* variables as the Training Operator sets them) starts the user's script from the rendered command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_envelope, cli_json, run_hpc
from tests.jobhelpers import run_pods_torchrun
from toolkit.catalog import instance
from toolkit.k8s.kubeyaml import load_all
from toolkit.k8s.usercode import ANNOTATIONS_MAX_BYTES, CODE_DIR, CONFIGMAP_MAX_BYTES

APIS = ("trainer-v2", "v1")
# bytes a YAML writer could mangle: quotes, a tab, trailing spaces, CRLF, non-ASCII, a kubelet $(VAR), no final \n
SCRIPT = ('import json, os, sys\n# it\'s "quoted"\t and trailing  \r\nprint("caf\u00e9 $(HOME)", sys.argv)\n'
          'x = 1').encode("utf-8")
USER_ARGS = ["--name", "it's a b", "$(HOME)", "--lr=0.1"]
NODES, INSTANCE = 2, "p4d.24xlarge"


def _render(tmp_path: Path, *args: str, api: str = "v1", cwd: Path | None = None):
    out = tmp_path / f"out-{api}.yaml"
    res = run_hpc("k8s", "render", "--nodes", str(NODES), "--instance", INSTANCE, "--api", api, "-o", str(out),
                  "--force", "--json", *args, cwd=cwd)
    return res, out


def _job(docs: list[dict]) -> dict:
    return docs[-1]


def _container(job: dict) -> dict:
    """The node container's command, args, env and image, in either API's form."""
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return job["spec"]["trainer"]


def _pod(job: dict) -> tuple[dict, list[dict]]:
    """The node pod's spec (volumes) and its container's volume mounts, in either API's form."""
    if job["kind"] == "PyTorchJob":
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        return pod, pod["containers"][0]["volumeMounts"]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    return pod, pod["containers"][0]["volumeMounts"]


def _world(job: dict) -> int:
    if job["kind"] == "PyTorchJob":
        spec = job["spec"]
        return spec["pytorchReplicaSpecs"]["Worker"]["replicas"] * int(spec["nprocPerNode"])
    return job["spec"]["trainer"]["numNodes"] * job["spec"]["trainer"]["numProcPerNode"]


def _program(container: dict) -> list[str]:
    """The words the pod's torchrun starts: after `--no-python bash -c SCRIPT`."""
    args = container["args"]
    assert container["command"] == ["torchrun"]
    start = args.index("--no-python")
    assert args[start + 1:start + 3] == ["bash", "-c"]
    return args[start + 3:]


def _as_kubelet_passes(word: str) -> str:
    """A container arg as the process gets it: the kubelet turns `$$(` into `$(` (no variable of ours is named)."""
    return word.replace("$$(", "$(")


def _run_program_shell(program: list[str]) -> list[str]:
    """The container's bash run as a worker runs it, the Python program replaced by one that prints its argv."""
    script, words = program[0], [_as_kubelet_passes(w) for w in program[1:]]
    assert words[:2] == ["python", "-c"]
    words[0], words[2] = sys.executable, "import json, sys; print(json.dumps(sys.argv[1:]))"
    res = subprocess.run(["bash", "-c", script, *words], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _valid(path: Path) -> dict:
    res = run_hpc("k8s", "validate", str(path), "--json")
    report = cli_json(res)
    assert res.returncode == 0 and report["valid"], report["findings"]
    return report


@pytest.mark.parametrize("api", APIS)
def test_a_script_without_an_image_comes_in_a_configmap_of_its_bytes(tmp_path, api):
    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT)
    res, out = _render(tmp_path, str(script), "--", *USER_ARGS, api=api)
    assert res.returncode == 0, res.stderr
    docs = load_all(out.read_text())  # as kubectl reads the file
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob" if api == "v1" else "TrainJob"]
    configmap, job = docs
    assert configmap["data"] == {"train.py": SCRIPT.decode("utf-8")}
    assert configmap["data"]["train.py"].encode("utf-8") == script.read_bytes()
    pod, mounts = _pod(job)
    assert {"name": "code", "configMap": {"name": configmap["metadata"]["name"]}} in pod["volumes"]
    assert {"name": "code", "mountPath": CODE_DIR, "readOnly": True} in mounts
    program = _program(_container(job))
    # each worker runs `python -c USER_MAIN TIMEOUT SCRIPT ARGS...`: the script as mounted, the arguments as given
    assert _run_program_shell(program) == ["300", f"{CODE_DIR}/train.py", *USER_ARGS]
    assert "$$(HOME)" in program  # written so that the kubelet passes `$(HOME)` on, unexpanded
    gpus = instance(INSTANCE).gpus
    data = cli_json(res)
    assert _world(job) == data["world_size"] == NODES * gpus == 16
    assert data["script"] == {"source": "configmap", "path": f"{CODE_DIR}/train.py",
                              "configmap": configmap["metadata"]["name"]}
    assert any("ConfigMap train-code (no --image given)" in note for note in data["notes"])
    assert "torchrun per pod, 8 ranks each" in out.read_text()  # not the Slurm form's "srun: one process per rank"
    _valid(out)


@pytest.mark.parametrize("api", APIS)
def test_with_an_image_the_pods_run_the_script_at_the_path_given_and_no_configmap(tmp_path, api):
    (tmp_path / "train.py").write_bytes(SCRIPT)
    res, out = _render(tmp_path, "train.py", "--image", "registry.example/train:1", "--", *USER_ARGS, api=api,
                       cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    docs = load_all(out.read_text())
    assert [d["kind"] for d in docs] == ["PyTorchJob" if api == "v1" else "TrainJob"]
    container = _container(docs[0])
    assert container["image"] == "registry.example/train:1"
    assert _run_program_shell(_program(container)) == ["300", "train.py", *USER_ARGS]  # the image's WORKDIR
    data = cli_json(res)
    assert data["script"] == {"source": "image", "path": "train.py", "configmap": None}
    assert any("registry.example/train:1 must hold it at train.py under its working directory" in note
               for note in data["notes"])
    _valid(out)
    # an absolute path stays; --script-from configmap carries the file even with an image
    res, out = _render(tmp_path, str(tmp_path / "train.py"), "--image", "registry.example/train:1", api=api)
    assert cli_json(res)["script"]["path"] == str(tmp_path / "train.py")
    res, out = _render(tmp_path, str(tmp_path / "train.py"), "--image", "torch:2", "--script-from", "configmap",
                       api=api)
    docs = load_all(out.read_text())
    assert docs[0]["kind"] == "ConfigMap" and _container(docs[1])["image"] == "torch:2"
    assert _program(_container(docs[1]))[5] == f"{CODE_DIR}/train.py"
    _valid(out)


@pytest.mark.parametrize("api", APIS)
def test_a_module_comes_from_the_image(tmp_path, api):
    res, out = _render(tmp_path, "-m", "mypkg.train", "--image", "registry.example/train:1", "--", *USER_ARGS,
                       api=api)
    assert res.returncode == 0, res.stderr
    docs = load_all(out.read_text())
    assert [d["kind"] for d in docs] == ["PyTorchJob" if api == "v1" else "TrainJob"]
    assert _run_program_shell(_program(_container(docs[0]))) == ["300", "-m", "mypkg.train", *USER_ARGS]
    assert _world(docs[0]) == 16 and docs[0]["metadata"]["name"] == "train"
    data = cli_json(res)
    assert data["script"] is None
    assert any("the module mypkg.train comes from the image: registry.example/train:1 must hold it" in note
               for note in data["notes"])
    # the header records the command that renders it again
    header = re.search(r"^# Rendered by `([^`]+)`", out.read_text(), re.M)[1]
    assert shlex.split(header)[:5] == ["hpc", "k8s", "render", "--module", "mypkg.train"]
    assert shlex.split(header)[-5:] == ["--", *USER_ARGS]
    _valid(out)


def _one_error(res, code: int, says: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code and res.stdout == "", res.stdout + res.stderr
    assert lines[0].startswith(f"error: {says}") and lines[1].startswith("  fix: ") and len(lines) == 2, res.stderr


def test_a_script_over_a_configmaps_limit_is_refused_with_the_way_out(tmp_path):
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (CONFIGMAP_MAX_BYTES + 1))
    out = tmp_path / "big.yaml"
    res = run_hpc("k8s", "render", str(big), "--nodes", "2", "--instance", INSTANCE, "-o", str(out))
    _one_error(res, 2, f"script {big} is {CONFIGMAP_MAX_BYTES + 1} bytes: a ConfigMap carries at most "
                       f"{CONFIGMAP_MAX_BYTES} bytes")
    assert "bake the script into an image and give --image IMAGE" in res.stderr and not out.exists()
    # with an image it is not carried, so its size does not matter
    res = run_hpc("k8s", "render", str(big), "--nodes", "2", "--instance", INSTANCE, "--image", "img:1")
    assert res.returncode == 0, res.stderr


def test_a_script_over_client_side_applys_annotation_limit_renders_with_a_note_and_a_warning(tmp_path):
    """A ConfigMap under 1 MiB passes the API server, but client-side `kubectl apply` keeps a copy of the object in
    an annotation, and annotations are limited to 256 KiB: `hpc k8s apply` would be refused."""
    script = tmp_path / "mid.py"
    script.write_bytes(b"x = 1\n" * (ANNOTATIONS_MAX_BYTES // 6 + 1))
    res, out = _render(tmp_path, str(script), "--image", "img:1", "--script-from", "configmap")
    assert res.returncode == 0, res.stderr
    assert any("kubectl apply --server-side -f FILE" in note for note in cli_json(res)["notes"])
    report = _valid(out)
    assert [(f["level"], f["path"]) for f in report["findings"] if f["level"] == "warning"] == [
        ("warning", "document 1 (ConfigMap/mid-code): metadata.annotations")]


def test_validate_refuses_a_configmap_over_the_api_servers_limit(tmp_path):
    from toolkit.k8s.kubeyaml import dump_all

    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                 "data": {"a.py": "#" * (CONFIGMAP_MAX_BYTES // 2)},
                 "binaryData": {"b.bin": "AAAA" * (CONFIGMAP_MAX_BYTES // 6 + 1)}}  # 3 bytes per 4 characters
    path = tmp_path / "big.yaml"
    path.write_text(dump_all([configmap]))
    res = run_hpc("k8s", "validate", str(path), "--json")
    report = cli_envelope(res)["data"]
    assert res.returncode == 1 and not report["valid"]
    error = [f for f in report["findings"] if f["level"] == "error"]
    assert [(f["path"], f["message"].split(":")[0]) for f in error] == [
        ("document 1 (ConfigMap/big): data", f"{CONFIGMAP_MAX_BYTES // 2 + 3 * (CONFIGMAP_MAX_BYTES // 6 + 1)} "
                                              "bytes of data")]


@pytest.mark.parametrize("args,says", [
    (["-m", "mypkg.train"], "--module mypkg.train: the pods import the module from the image, and no --image"),
    (["nothere.py"], "script nothere.py does not exist here"),
    (["resnet50", "--", "--lr", "1"], "resnet50 is a recipe: arguments after it (--lr 1) are for a script"),
    (["resnet50", "--script-from", "configmap"], "--script-from configmap: the module toolkit.workloads.resnet is "
                                                 "no script of yours"),
    (["-m", "mypkg.train", "--image", "i:1", "--script-from", "image"], "--script-from image: the module"),
    (["-m", "my-pkg", "--image", "i:1"], "'my-pkg' is not a module name"),
    ([], "no recipe, script or module given"),
])
def test_bad_own_code_input_gets_one_clear_usage_error(args, says):
    _one_error(run_hpc("k8s", "render", "--nodes", "2", "--instance", INSTANCE, *args), 2, says)


def test_a_script_from_the_image_needs_an_image(tmp_path):
    (tmp_path / "s.py").write_text("print(1)\n")
    _one_error(run_hpc("k8s", "render", "s.py", "--nodes", "2", "--instance", INSTANCE, "--script-from", "image",
                       cwd=tmp_path), 2, "--script-from image: no --image is given")
    _one_error(run_hpc("k8s", "render", "s.py", "--nodes", "2", "--instance", INSTANCE, "--profile", "smoke",
                       cwd=tmp_path), 2, "--profile: your script has no recipe profiles")


@pytest.mark.parametrize("launcher", ["script", "torchrun"])
def test_a_recipe_from_recipes_new_script_renders_for_kubernetes(tmp_path, launcher):
    """`hpc recipes new --script` writes a python-script recipe; it had no Kubernetes form. Style torchrun renders
    under the pod's torchrun alone (its own torchrun would be nested under the operator's)."""
    (tmp_path / "s.py").write_bytes(SCRIPT)
    new = run_hpc("recipes", "new", "mine", "--script", "s.py", "--launcher", launcher,
                  *(["--max-restarts", "2"] if launcher == "torchrun" else []), "-o", str(tmp_path), "--",
                  "--epochs", "3", cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    for api in APIS:
        res, out = _render(tmp_path, str(tmp_path / "mine.yaml"), api=api)
        assert res.returncode == 0, res.stderr
        docs = load_all(out.read_text())
        assert docs[0]["data"] == {"s.py": SCRIPT.decode("utf-8")}
        program = _program(_container(docs[-1]))
        assert not any("torch.distributed.run" in word for word in program)
        assert _run_program_shell(program) == ["300", f"{CODE_DIR}/s.py", "--epochs", "3"]
        _valid(out)


def test_a_user_module_recipe_of_style_torchrun_runs_one_torchrun(tmp_path):
    new = run_hpc("recipes", "new", "mod", "--module", "mypkg.train", "--launcher", "torchrun", "-o", str(tmp_path))
    assert new.returncode == 0, new.stderr
    res, out = _render(tmp_path, str(tmp_path / "mod.yaml"), "--image", "img:1")
    assert res.returncode == 0, res.stderr
    program = _program(_container(load_all(out.read_text())[-1]))
    assert _run_program_shell(program) == ["300", "-m", "mypkg.train"]
    derived = {d["key"]: d["value"] for d in cli_json(res)["derived"]}
    assert derived["launcher"] == "torchrun per pod, 8 ranks each, max 3 restarts"


DOCS = REPO / "docs" / "kubernetes.md"
DOCS_SECTION = "## Your own script or module"


def test_the_docs_commands_for_your_own_code_run_as_written(tmp_path):
    section = DOCS.read_text().split(DOCS_SECTION, 1)[1].split("\n## ", 1)[0]
    commands = [line.strip().split("  #", 1)[0].strip() for line in section.splitlines()
                if line.startswith("    hpc k8s render")]
    assert len(commands) == 3 and any(" -m " in c for c in commands)
    (tmp_path / "train.py").write_text("print('train')\n")
    for command in commands:
        words = shlex.split(command)
        assert words[:3] == ["hpc", "k8s", "render"]
        res = run_hpc("k8s", "render", "-o", str(tmp_path / "out.yaml"), "--force", *words[3:], cwd=tmp_path)
        assert res.returncode == 0, (command, res.stderr)
        _valid(tmp_path / "out.yaml")


WORKER = """\
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: the variables torchrun sets, as under `hpc run`
total = torch.ones(1)
dist.all_reduce(total)
json.dump({"argv": sys.argv, "rank": dist.get_rank(), "world": dist.get_world_size(), "sum": total.item()},
          open(os.path.join(os.environ["OUT_DIR"], os.environ["RANK"]), "w"))
dist.destroy_process_group()  # a gloo group left to the interpreter's exit may abort the rank
"""


@pytest.mark.training
def test_real_torchrun_runs_the_configmaps_script_with_the_users_args(tmp_path):
    """The PyTorchJob's container command line, run with torch's own torchrun and the PET_* variables the Training
    Operator sets (one node of 2 workers; PET_STANDALONE stands in for the operator's rendezvous Service), the
    ConfigMap's file where the pod mounts it (a local dir here): each worker is the user's script, joined in one
    process group, with the user's arguments."""
    (tmp_path / "train.py").write_text(WORKER)
    res = run_hpc("k8s", "render", str(tmp_path / "train.py"), "--nodes", "1", "--instance", "p3dn.24xlarge",
                  "--api", "v1", "-o", str(tmp_path / "job.yaml"), "--", *USER_ARGS)
    assert res.returncode == 0, res.stderr
    configmap, job = load_all((tmp_path / "job.yaml").read_text())
    code = tmp_path / "code"
    code.mkdir()
    for key, text in configmap["data"].items():
        (code / key).write_text(text)
    container = _container(job)
    args = [_as_kubelet_passes(a).replace(f"{CODE_DIR}/", f"{code}/") for a in container["args"]]
    args[args.index("python")] = sys.executable
    (tmp_path / "out").mkdir()
    run_pods_torchrun(container, args, 180, OUT_DIR=str(tmp_path / "out"))
    for rank in (0, 1):
        seen = json.loads((tmp_path / "out" / str(rank)).read_text())
        assert seen == {"argv": [str(code / "train.py"), *USER_ARGS], "rank": rank, "world": 2, "sum": 2.0}
