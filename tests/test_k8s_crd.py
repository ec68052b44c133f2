"""kubectl's YAML reading (toolkit.k8s.kubeyaml) and the API server's CRD validation (toolkit.k8s.crd), offline.

No API server here: the stand-in for it is the operators' published CRDs (vendored byte for byte, checked below)
read with go-yaml v2's rules and validated with the structural-schema semantics of the apiextensions-apiserver.
The reader is checked against kubectl itself where it is installed (the machine image has kubectl 1.32):
`kubectl annotate --local -f FILE -o json` parses a manifest with kubectl's own YAML-to-JSON path and prints the
JSON it would send, without a cluster.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.k8s import kubeyaml
from toolkit.k8s.crd import CRD_DIR, Crd, crd_named, find_crd, validate_against_crd
from toolkit.k8s.violations import UNKNOWN_FIELD


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: the reader is compared with it")


def _api_number(text: str):
    """A JSON integer as the API server decodes it (k8s.io/apimachinery pkg/util/json: int64, else float64)."""
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else float(value)


def kubectl_json(text: str) -> list:
    """The documents as kubectl sends them: `kubectl annotate --local` reads the file as `kubectl apply` does and
    prints the JSON (its annotation taken out again). A YAML kubectl refuses raises ValueError with its message."""
    res = subprocess.run([KUBECTL, "annotate", "--local", "-f", "-", "hpc-toolkit/probe=1", "-o", "json"],
                         input=text, capture_output=True, text=True, timeout=60)
    if res.returncode:
        raise ValueError(res.stderr.strip())
    decoder, docs, at = json.JSONDecoder(parse_int=_api_number), [], 0
    while res.stdout[at:].strip():
        doc, at = decoder.raw_decode(res.stdout, at + len(res.stdout[at:]) - len(res.stdout[at:].lstrip()))
        annotations = doc["metadata"]["annotations"]
        del annotations["hpc-toolkit/probe"]
        if not annotations:
            del doc["metadata"]["annotations"]
        docs.append(doc)
    return docs


def same_json(a, b) -> bool:
    """Equal, type for type (1 is not 1.0, True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_vendored_crds_are_the_published_files_byte_for_byte():
    rows = re.findall(r"^\| (\S+\.yaml) \| (\S+) \| (\S+) \| ([0-9a-f]{40}) \| (\S+) \| ([0-9a-f]{40}) \|$",
                      (CRD_DIR / "SOURCES.md").read_text(), re.M)
    assert {r[0] for r in rows} == {p.name for p in CRD_DIR.glob("*.yaml")}
    for name, _repo, _tag, _commit, _path, blob in rows:
        assert _git_blob((CRD_DIR / name).read_bytes()) == blob, name
    assert find_crd("kubeflow.org/v1", "PyTorchJob").api_versions == ["kubeflow.org/v1"]
    assert crd_named("pytorchjobs.kubeflow.org") == find_crd("kubeflow.org/v1", "PyTorchJob")
    assert crd_named(str(CRD_DIR / "kubeflow.org_mpijobs.yaml")) == find_crd("kubeflow.org/v2beta1", "MPIJob")
    assert find_crd("kubeflow.org/v2beta1", "MPIJob").api_versions == ["kubeflow.org/v2beta1"]


# ---- kubectl's reader: go-yaml v2 resolve.go -------------------------------------------------------------------

@pytest.mark.parametrize("plain,value", [
    ("1e-4", 0.0001), ("1e-06", 1e-06), ("1e-09", 1e-09), ("1E5", 100000),  # no dot needed; integral -> integer
    ("3.0", 3), ("0.5", 0.5), (".5", 0.5), ("+12", 12), ("0o17", 15), ("017", 15), ("0x1F", 31), ("0b101", 5),
    ("-0b101", -5), ("1_000", 1000), ("08", 8), ("99999999999999999999", 1e20),
    ("y", True), ("Y", True), ("on", True), ("yes", True), ("n", False), ("off", False), ("NO", False),
    ("~", None), ("null", None), ("", None),
    ("2026-11-24", "2026-11-24"),  # a timestamp stays a string when decoded into interface{} (decode.go)
    ("1e999", "1e999"), ("1:30", "1:30"), ("0x", "0x"), ("--lr", "--lr"), ("o", "o"), ("=", "="),
    (".8_7", 0.87), ("1_0.5", 10.5), (".5_", ".5_"), ("<<", "<<"),  # Go float literals take underscores
])
def test_plain_scalars_read_as_kubectl_reads_them(plain, value):
    got = kubeyaml.load(f"v: {plain}\n")["v"]
    assert got == value and type(got) is type(value), (plain, got)


def test_pyyaml_reads_the_failing_args_as_strings_and_kubectl_as_numbers():
    text = "args: [--weight-decay, 1e-4, --adam-eps, 1e-06, --adam-betas, '(0.9, 0.98)']\n"
    assert yaml.safe_load(text)["args"][1] == "1e-4"
    assert kubeyaml.load(text)["args"] == ["--weight-decay", 0.0001, "--adam-eps", 1e-06, "--adam-betas",
                                          "(0.9, 0.98)"]
    if KUBECTL:
        [sent] = kubectl_json(_toy_doc("  " + text))
        assert sent["spec"]["args"] == kubeyaml.load(text)["args"]


def test_keys_become_json_keys_and_merges_follow_go_yaml():
    doc = kubeyaml.load("on: 1\n1.5: x\n2: y\n1e-7: z\n.inf: i\nbase: &b {a: 1}\nm: {<<: *b, c: 2}\n")
    assert doc == {"true": 1, "1.5": "x", "2": True, "1e-07": "z", ".inf": "i", "base": {"a": 1},  # y: a boolean
                   "m": {"a": 1, "c": 2}}


@pytest.mark.parametrize("text,message,line", [
    ("a: .inf\n", "JSON cannot hold", 1), ("a: !!int 1.5\n", "cannot decode float `1.5` as a int", 1),
    ("a: [b\n", "not valid YAML", 2), ("? [a]\n: b\n", "", 1)])
def test_what_kubectl_cannot_send_is_an_error_with_a_line(text, message, line):
    with pytest.raises(kubeyaml.KubectlYamlError) as caught:
        kubeyaml.load(text)
    assert message in caught.value.message and caught.value.line == line


@pytest.mark.parametrize("text", ["1e-4", "1e-07", "y", "n", "on", "NO", "~", "null", "", "2026-1-2", "2026-11-24",
                                  "2026-11-24 10:00:00", "1:30", "190:20:30.15", "0o17", "017", "0x1F", "08",
                                  "1_000", ".5", "+.5", "1e999", ".inf", "<<", "=", "3", "-3.0"])
def test_dump_quotes_every_string_some_reader_takes_for_another_type(text):
    written = kubeyaml.dump_all([{"args": [text]}])
    assert f"- '{text}'" in written or f'- "{text}"' in written, written
    assert kubeyaml.load(written)["args"] == [text] and yaml.safe_load(written)["args"] == [text]


def _toy_doc(body: str) -> str:
    return f"apiVersion: example.com/v1\nkind: Toy\nmetadata:\n  name: toy\nspec:\n{body}"


@needs_kubectl
def test_the_reader_agrees_with_kubectl_on_the_table_above():
    cases = test_plain_scalars_read_as_kubectl_reads_them.pytestmark[0].args[1]
    text = _toy_doc("".join(f"  k{i}: {plain}\n" for i, (plain, _) in enumerate(cases)))
    [sent] = kubectl_json(text)
    assert same_json(kubeyaml.load(text), sent)
    assert same_json(sent["spec"], {f"k{i}": value for i, (_, value) in enumerate(cases)})


PLAIN_CHARS = "0123456789+-._:eExob yYnNtTfFoO~<=aZ"


def _plain(text: str) -> bool:
    """Whether `- text` is a block sequence item holding exactly `text` as a plain scalar."""
    try:
        node = yaml.compose(f"- {text}\n")
    except yaml.YAMLError:
        return False
    return (isinstance(node, yaml.SequenceNode) and len(node.value) == 1
            and isinstance(node.value[0], yaml.ScalarNode) and node.value[0].style is None
            and node.value[0].value == text)


@needs_kubectl
@settings(max_examples=20, deadline=None)
@given(st.lists(st.text(PLAIN_CHARS, min_size=1, max_size=9).filter(_plain), min_size=1, max_size=60))
def test_plain_scalars_read_as_kubectl_itself_reads_them(scalars):
    """Random plain scalars: the reader gives what kubectl sends, type for type, or both refuse the file."""
    text = _toy_doc("  values:\n" + "".join(f"  - {s}\n" for s in scalars))
    try:
        sent = kubectl_json(text)
    except ValueError as refused:  # e.g. .inf: JSON has no infinity
        with pytest.raises(kubeyaml.KubectlYamlError):
            kubeyaml.load_all(text)
        assert "json: unsupported value" in str(refused) or "yaml:" in str(refused)
        return
    assert same_json(kubeyaml.load_all(text), sent), (scalars, sent)


@needs_kubectl
@settings(max_examples=20, deadline=None)
@given(st.lists(st.one_of(st.text(PLAIN_CHARS, max_size=9), st.text(max_size=12)), min_size=1, max_size=60))
def test_every_string_written_reaches_kubectl_as_that_string(strings):
    [sent] = kubectl_json(kubeyaml.dump_all([{"apiVersion": "example.com/v1", "kind": "Toy",
                                              "metadata": {"name": "toy"}, "spec": {"values": strings}}]))
    assert sent["spec"]["values"] == strings


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=12), st.from_regex(r"[-+]?[0-9_.:eEoxb]{1,8}", fullmatch=True),
                          st.sampled_from(["y", "N", "on", "Off", "~", "null", "2026-1-2"])), max_size=6))
def test_every_string_written_reads_back_as_itself_under_both_readers(strings):
    written = kubeyaml.dump_all([{"args": strings}])
    assert kubeyaml.load(written)["args"] == strings
    assert yaml.safe_load(written)["args"] == strings


def test_numbers_booleans_and_nulls_are_written_plain():
    written = kubeyaml.dump_all([{"replicas": 3, "ratio": 0.5, "suspend": False, "x": None, "name": "a-b"}])
    assert written == "replicas: 3\nratio: 0.5\nsuspend: false\nx: null\nname: a-b\n"
    assert kubeyaml.load(written) == {"replicas": 3, "ratio": 0.5, "suspend": False, "x": None, "name": "a-b"}


# ---- the API server's structural-schema semantics --------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
    "spec": {"type": "object", "required": ["size", "mode"], "properties": {
        "size": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
        "count": {"type": "integer", "format": "int32", "minimum": 1},
        "note": {"type": "string", "nullable": True},
        "args": {"type": "array", "items": {"type": "string"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"], "properties": {
                      "name": {"type": "string"}, "port": {"type": "integer"}}}},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "inner": {"type": "object", "x-kubernetes-embedded-resource": True,
                  "properties": {"spec": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        "queue": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]},
        "ratio": {"type": "string", "x-kubernetes-validations": [{"rule": "self != ''", "message": "not empty"}]},
    }}}}
TOY = Crd("example.com", "Toy", {"v1": SCHEMA}, "test")


def _toy(spec: dict, **meta) -> list[tuple[str, str, str]]:
    obj = {"apiVersion": "example.com/v1", "kind": "Toy", "metadata": {"name": "toy", **meta}, "spec": spec}
    return [(v.path, v.message, v.level) for v in validate_against_crd(obj, TOY)]


def test_a_valid_object_passes_with_defaults_nulls_and_preserved_fields():
    assert _toy({"size": "10Gi", "note": None, "count": None, "free": {"any": {"thing": 1}},
                 "inner": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}},
                 "labels": {"a": "b"}, "ports": [{"name": "a", "port": 1}, {"name": "b"}], "tags": ["x", "y"],
                 "queue": "q"}) == []


def test_each_structural_rule_is_enforced_at_its_path():
    found = _toy({"size": 1.5, "mode": "C", "count": 0, "args": ["--lr", 0.0001], "colour": "red",
                  "labels": {"a": 1}, "ports": [{"name": "a"}, {"name": "a"}], "tags": ["x", "x"],
                  "inner": {"kind": "Pod", "metadata": {"nam": "p"}, "spec": {"x": "1", "y": 2}},
                  "ratio": "1"}, lables={})
    assert [f[:2] for f in found if f[2] == "error"] == [
        ("metadata.lables", UNKNOWN_FIELD),
        ("spec.args[1]", "must be a string, not the number 0.0001"),
        ("spec.colour", UNKNOWN_FIELD),
        ("spec.count", "must be at least 1"),
        ("spec.inner.apiVersion", "required: an embedded resource names its apiVersion and kind"),
        ("spec.inner.metadata.nam", UNKNOWN_FIELD),
        ("spec.inner.spec.x", 'must be an integer, not the string "1"'),
        ("spec.inner.spec.y", UNKNOWN_FIELD),
        ("spec.labels.a", "must be a string, not the integer 1"),
        ("spec.mode", "must be one of 'A', 'B', not 'C'"),
        ("spec.ports[1]", "duplicate entry (name='a'): the list is a map keyed by name"),
        ("spec.size", "must be an integer or a string, not the number 1.5"),
        ("spec.tags[1]", "duplicate value 'x'"),
    ]
    assert [f for f in found if f[2] == "info"] == [
        ("spec.ratio", "not checked offline: CEL rule `self != ''` (not empty)", "info")]


def test_required_fields_names_and_versions():
    assert _toy({"mode": None}) == [("spec.size", "required", "error")]  # a pruned null is absent; mode defaults
    assert _toy({"size": 1}, name="Toy_1")[0][:2] == ("metadata.name", "'Toy_1' is not a DNS subdomain (lower-case "
                                                      "letters, digits, '-' and '.', starting and ending with a letter "
                                                      "or digit, at most 253 characters)")
    assert [f[:2] for f in _toy({"size": 1}, namespace="Team_A", labels={"app": "my app", "example.com/ok": "x",
                                                                       "-bad": "x"})] == [
        ("metadata.labels.-bad", "not a valid label key (an optional DNS-subdomain prefix and '/', then at most 63 "
                                 "letters, digits, '-', '_' or '.', starting and ending alphanumeric)"),
        ("metadata.labels.app", "'my app' is not a valid label value (at most 63 letters, digits, '-', '_' or '.', "
                                "starting and ending alphanumeric)"),
        ("metadata.namespace", "'Team_A' is not a DNS-1123 label")]
    wrong = validate_against_crd({"apiVersion": "example.com/v2", "kind": "Toy", "metadata": {"name": "t"}}, TOY)
    assert [str(v) for v in wrong] == ["apiVersion: Toy is served as example.com/v1, not example.com/v2"]
    unknown = validate_against_crd({"apiVersion": "example.com/v1", "kind": "Gadget"})
    assert [str(v) for v in unknown] == ["kind: no vendored CRD defines Gadget in example.com"]
    assert math.isclose(0.0001, kubeyaml.load("x: 1e-4")["x"])


# ---- what is rejected after the schema: core pod validation, the operators' admission rules --------------------

@pytest.mark.parametrize("text,value", [("5120Mi", 5120 * 2**20), ("1.5", 1.5), ("500m", 0.5), ("1e3", 1000),
                                        ("2k", 2000), (8, 8), ("abc", None), (True, None)])
def test_quantities_parse_as_the_api_machinery_reads_them(text, value):
    from toolkit.k8s.admission import quantity

    assert quantity(text) == value


@pytest.mark.parametrize("resources,found", [
    ({"limits": {"nvidia.com/gpu": 8}}, []),  # a request defaults to the limit
    ({"requests": {"nvidia.com/gpu": 8}}, [('limits["nvidia.com/gpu"]',
                                            "Limit must be set for non overcommitable resources")]),
    ({"requests": {"cpu": "1.5", "nvidia.com/gpu": "0.5"}, "limits": {"nvidia.com/gpu": "0.5"}},
     [('limits["nvidia.com/gpu"]', "0.5 must be an integer (an extended resource is counted in whole devices)"),
      ('requests["nvidia.com/gpu"]', "0.5 must be an integer (an extended resource is counted in whole devices)")]),
    ({"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}, [("requests.cpu", "must be less than or equal to cpu "
                                                                            "limit (2)")]),
    ({"requests": {"hugepages-2Mi": "4Mi"}, "limits": {"hugepages-2Mi": "4Mi"}}, [("(document)", "HugePages "
                                                                                     "require cpu or memory")]),
])
def test_container_resources_follow_the_core_pod_validation(resources, found):
    from toolkit.k8s.admission import resource_violations

    assert [(v.path, v.message) for v in resource_violations(resources, ())] == found


def test_operator_rules_beyond_the_crds():
    from toolkit.k8s.admission import operator_violations

    pod = {"containers": [{"name": "main", "image": "i"}]}
    pytorch = {"kind": "PyTorchJob", "metadata": {"name": "job"}, "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 2, "template": {"spec": pod}}}}}
    assert [str(v) for v in operator_violations(pytorch)] == [
        "spec.pytorchReplicaSpecs.Master.template.spec.containers: must have at least one container with name pytorch "
        "(the operator sets the PET_* variables in that one)",
        "spec.pytorchReplicaSpecs.Master.replicas: must be 1"]
    mpi = {"kind": "MPIJob", "metadata": {"name": "a" * 60}, "spec": {"launcherCreationPolicy": "WaitForWorkers",
                                                                      "mpiReplicaSpecs": {
        "Launcher": {"replicas": 2, "template": {"spec": pod}}, "Worker": {"replicas": 12, "template": {"spec": {
            "containers": [{"name": "w", "image": "i", "volumeMounts": [{"name": "fsx", "mountPath": "/fsx"}]}]}}}}}}
    assert [str(v) for v in operator_violations(mpi)] == [
        f"metadata.name: the last worker's host name '{'a' * 60}-worker-11' is not a DNS-1035 label: the operator "
        "cannot create its pod and service",
        "spec.launcherCreationPolicy: unsupported value 'WaitForWorkers': AtStartup or WaitForWorkersReady (the "
        "operator treats any other value as waiting for all workers)",
        "spec.mpiReplicaSpecs.Launcher.replicas: must be 1",
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].volumeMounts[0].name: not found: no volume named "
        "'fsx' in the pod"]


def test_labels_and_annotations_of_another_type_are_schema_errors_not_a_crash():
    """Found by the any-value property test: labels given as a string crashed the label rules after the schema
    had already said what was wrong."""
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "r", "labels": "app=r", "annotations": ["a", 1]},
           "spec": {"pytorchReplicaSpecs": {}}}
    paths = {v.path for v in validate_against_crd(job, crd_named("pytorchjobs.kubeflow.org")) if v.level == "error"}
    assert {"metadata.labels", "metadata.annotations"} <= paths
