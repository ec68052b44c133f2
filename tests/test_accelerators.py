"""Accelerator families (toolkit.accelerators): each family's answers, the registry keyed by the catalog's
`accelerator` field, Neuron refused in one place, and no catalog accelerator without a module or a refusal."""

from __future__ import annotations

import re
import typing

import pytest

from toolkit import catalog as catalog_module
from toolkit.accelerators import FAMILIES, REFUSED, family, family_or_none, of_device
from toolkit.accelerators.cpu import CPU
from toolkit.accelerators.gaudi import GAUDI, HCCL_OFI_WRAPPER, HCCL_OFI_WRAPPER_DIRS
from toolkit.accelerators.nvidia import NVIDIA, OFI_NCCL_DIRS
from toolkit.catalog import catalog, instance
from toolkit.errors import HpcError

P4D, P3, DL1, C5N, TRN1 = (instance(t) for t in ("p4d.24xlarge", "p3.16xlarge", "dl1.24xlarge", "c5n.18xlarge",
                                                 "trn1.32xlarge"))


def names(env) -> list[str]:
    return [v.name for v in env]


def test_nvidia_gpus_are_gres_unbound_nccl_with_aws_ofi_nccl_and_dcgm():
    assert (NVIDIA.device, NVIDIA.torch_device, NVIDIA.collective, NVIDIA.slurm_gres) == ("gpu", "cuda", "nccl", True)
    options, notes = NVIDIA.srun_binding(P4D, 8, smt_off=False, holds_node=True)
    assert options == ("--cpu-bind=none",) and [n.key for n in notes] == ["srun cpu binding"]
    assert "NCCL_NET" in names(NVIDIA.job_env(P4D, "modern")) and "NCCL_NET" not in names(NVIDIA.job_env(P4D, "none"))
    assert "NCCL_PROTO" in names(NVIDIA.job_env(P4D, "legacy"))
    dirs, why = NVIDIA.library_dirs(P4D, "modern")
    assert set(OFI_NCCL_DIRS) <= set(dirs) and "aws-ofi-nccl" in (why or "")
    assert NVIDIA.library_dirs(P4D, "none") == ((), None)
    checks = NVIDIA.loader_checks(fabric="modern", python_ranks=True, gpus_per_node=8, environ={"NCCL_NET": "x"})
    assert checks == ["--torch-nccl", "--nccl-net-plugin"]
    assert NVIDIA.loader_checks(fabric="none", python_ranks=False, gpus_per_node=8, environ={}) == []
    assert "aws-ofi-nccl" in (NVIDIA.loader_fix("nccl-net-plugin", binary=False) or "")
    assert "nccl_home" in (NVIDIA.loader_fix("libnccl.so.2", binary=True) or "")
    assert NVIDIA.loader_fix(HCCL_OFI_WRAPPER, binary=False) is None
    assert NVIDIA.kubernetes_resource == "nvidia.com/gpu" and NVIDIA.kubernetes_form and NVIDIA.prolog_health_check
    assert NVIDIA.collective_reference is None  # judged against the catalog's NCCL floors
    # the AMI trap is V100's (proprietary driver), not every NVIDIA GPU's
    assert NVIDIA.official_ami_trap(P4D) is None
    trap = NVIDIA.official_ami_trap(P3)
    assert trap is not None and "p3.16xlarge has V100" in trap.trap and trap.reminder


def test_gaudi_hpus_are_no_gres_pinned_to_their_cores_with_hccl_over_efa():
    assert (GAUDI.device, GAUDI.torch_device, GAUDI.collective, GAUDI.slurm_gres) == ("hpu", "hpu", "hccl", False)
    options, notes = GAUDI.srun_binding(DL1, 8, smt_off=False, holds_node=True)
    assert options[0].startswith("--cpu-bind=mask_cpu:") and len(options[0].split(",")) == 8
    assert [n.key for n in notes] == ["srun cpu binding", "--gpus-per-node"]
    assert GAUDI.srun_binding(DL1, 8, smt_off=False, holds_node=False)[0] == ("--cpu-bind=cores",)
    assert GAUDI.srun_binding(DL1, 1, smt_off=False, holds_node=True)[0] == ("--cpu-bind=none",)
    efa = names(GAUDI.job_env(DL1, "modern"))
    assert efa == ["PT_HPU_LAZY_MODE", "RDMAV_FORK_SAFE", "FI_EFA_USE_DEVICE_RDMA", "HCCL_SOCKET_IFNAME"]
    assert names(GAUDI.job_env(DL1, "none")) == ["PT_HPU_LAZY_MODE"] and not any(n.startswith("NCCL_") for n in efa)
    assert GAUDI.library_dirs(DL1, "modern")[0][:2] == HCCL_OFI_WRAPPER_DIRS
    assert GAUDI.loader_checks(fabric="modern", python_ranks=True, gpus_per_node=0, environ={}) == [
        "--library", HCCL_OFI_WRAPPER]
    assert GAUDI.loader_checks(fabric="none", python_ranks=True, gpus_per_node=0, environ={}) == []
    assert "hccl_ofi_wrapper" in (GAUDI.loader_fix(HCCL_OFI_WRAPPER, binary=False) or "")
    assert not GAUDI.kubernetes_form and not GAUDI.prolog_health_check
    # its collectives are judged against the DL1 post, not catalog floors (toolkit.reports.nccl.verdict_for)
    ref = GAUDI.collective_reference
    assert ref is not None and ref.ranks == 32 and ref.figures_mbs["all_reduce"] == (12110, 21136)
    trap = GAUDI.official_ami_trap(DL1)
    assert "dl1.24xlarge has Habana Gaudi" in trap.trap and trap.reminder is None


def test_cpu_nodes_get_gloo_and_nothing_else():
    assert (CPU.device, CPU.torch_device, CPU.collective, CPU.slurm_gres) == ("cpu", "cpu", "gloo", False)
    assert CPU.srun_binding(C5N, 1, smt_off=False, holds_node=True) == ((), ())
    assert CPU.job_env(C5N, "modern") == [] and CPU.library_dirs(C5N, "modern") == ((), None)
    assert CPU.loader_checks(fabric="modern", python_ranks=True, gpus_per_node=0, environ={"NCCL_NET": "x"}) == []
    assert CPU.kubernetes_resource is None and CPU.official_ami_trap(C5N) is None


def test_each_family_names_the_runtime_module_its_devices_need_in_a_rank_or_none():
    """toolkit.workloads.devices loads a family's workload_runtime for its torch device; the module answers the
    questions the workloads ask (that module's docstring)."""
    import importlib

    assert (NVIDIA.workload_runtime, CPU.workload_runtime, GAUDI.workload_runtime) == (None, None,
                                                                                       "toolkit.workloads.hpu")
    for accel in FAMILIES.values():
        if accel.workload_runtime is not None:
            runtime = importlib.import_module(accel.workload_runtime)
            assert runtime.DEVICE == accel.torch_device
            assert all(hasattr(runtime, name) for name in ("LABEL", "NEEDS", "AMP_DTYPE", "AMP_NAME", "LAZY",
                                                           "load_bridge", "synchronize", "reduce_dtype"))


def test_the_registry_answers_by_the_catalogs_accelerator_field():
    assert family(P4D) is NVIDIA and family(DL1) is GAUDI and family(C5N) is CPU
    assert family("nvidia") is NVIDIA and family("gaudi") is GAUDI and family("none") is CPU
    assert [of_device(d) for d in ("gpu", "hpu", "cpu")] == [NVIDIA, GAUDI, CPU]
    assert all(kind == f.kind for kind, f in FAMILIES.items())
    assert len({f.device for f in FAMILIES.values()}) == len(FAMILIES)  # of_device finds one family per form


def test_neuron_is_refused_in_one_clear_error_naming_the_instance_and_what_to_do():
    with pytest.raises(HpcError) as raised:
        family(TRN1)
    assert raised.value.message == ("trn1.32xlarge has Trainium (neuron) accelerators: hpc makes no jobs for them "
                                 "(only GPU, Gaudi HPU and CPU jobs)")
    fix = raised.value.fix or ""
    assert fix.startswith("choose a GPU, Gaudi or CPU queue") and "torch-neuronx" in fix
    with pytest.raises(HpcError, match=r"^queue trn1 \(trn1.32xlarge\) has Trainium"):
        family(TRN1, "queue trn1 (trn1.32xlarge)")
    with pytest.raises(HpcError, match="accelerator 'neuron' accelerators"):
        family("neuron")
    # the cluster side still builds and validates Trainium clusters: it asks without the refusal
    assert family_or_none(TRN1) is None and family_or_none(P4D) is NVIDIA


def test_every_trainium_and_inferentia_type_is_refused_by_name():
    """Trn1, Trn2, Trn2u, Inf1 and Inf2 alike (catalog accelerator neuron): a job on any of them is refused naming
    the instance and its chip; the cluster side asks without the refusal."""
    neuron = sorted(name for name, it in catalog().items() if it.accelerator == "neuron")
    assert {name.split(".")[0] for name in neuron} == {"trn1", "trn1n", "trn2", "trn2u", "inf1", "inf2"}
    for name in neuron:
        it = instance(name)
        with pytest.raises(HpcError, match=rf"^{re.escape(name)} has (Trainium2?|Inferentia2?) \(neuron\) "):
            family(it)
        assert family_or_none(it) is None


def test_dl2q_qualcomm_cards_are_refused_as_neuron_is():
    """dl2q.24xlarge's Cloud AI 100 cards have no family: the same one refusal, its own reason."""
    dl2q = instance("dl2q.24xlarge")
    with pytest.raises(HpcError) as raised:
        family(dl2q)
    assert raised.value.message.startswith("dl2q.24xlarge has Qualcomm AI 100 (qualcomm) accelerators: hpc makes no")
    assert "Qualcomm's Cloud AI SDKs" in (raised.value.fix or "")
    assert family_or_none(dl2q) is None and dl2q.gpus == 8


def test_every_catalog_accelerator_has_a_family_module_or_a_refusal():
    """A new `accelerator` value in the catalog's schema (catalog.Accelerator, the values catalog.yaml may hold)
    fails here until toolkit/accelerators gets its module (or REFUSED its reason)."""
    allowed = set(typing.get_args(catalog_module.Accelerator))
    assert allowed == set(catalog_module._CHOICES["accelerator"])
    assert allowed == set(FAMILIES) | set(REFUSED) and not set(FAMILIES) & set(REFUSED)
    for it in catalog().values():
        assert family_or_none(it) is not None or it.accelerator in REFUSED, it.name
    # an accelerator the registry does not know is refused, not mistaken for another family
    with pytest.raises(HpcError, match="which it lacks"):
        family("tpu")


def family_branches(source: str) -> list[int]:
    """Lines comparing an `accelerator` (the catalog's field) with a family's name: what family() answers instead.
    `accelerator != "none"` (has it devices at all) is a catalog fact, not a family's behaviour."""
    import ast

    named = (set(FAMILIES) | set(REFUSED)) - {"none"}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "accelerator" for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value in named for s in sides):
                found.append(node.lineno)
    return found


def test_outside_the_node_side_callers_ask_the_family_instead_of_branching_on_its_name():
    """Exempt: toolkit/node, the node-side room (it cannot import toolkit.accelerators: its promise carries the
    kind), and the catalog's own InstanceType.is_gpu fact."""
    from tests.conftest import REPO

    exempt = (REPO / "toolkit" / "node", REPO / "toolkit" / "catalog.py")
    branching = {str(p.relative_to(REPO)): lines for p in sorted((REPO / "toolkit").rglob("*.py"))
                 if not any(p == e or p.is_relative_to(e) for e in exempt)
                 and (lines := family_branches(p.read_text()))}
    assert branching == {}  # before the families: job/env, slurm/materialize, k8s/manifests, cluster/*, reports
    # the check sees one where there is one (as toolkit/job/env.py branched before the families)
    assert family_branches('if instance.accelerator == "gaudi":\n    pass\nif it.accelerator != "none":\n    pass\n') \
        == [1]
