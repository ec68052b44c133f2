import re

import pytest

from tests.conftest import REPO
from toolkit.catalog import catalog, ec2_type_names, instance, is_accelerated, nccl_floors
from toolkit.errors import HpcError

INSTANCE_NAME = re.compile(r"(?<![\w-])[a-z]+\d+[a-z]*(?:-[a-z0-9]+)?\.(?:\d*xlarge|large|medium|metal)\b")


def test_every_instance_type_the_project_names_is_in_the_catalog():
    """The shipped cluster configs, recipes, Makefile targets and the toolkit's own defaults resolve: a type
    missing from catalog.yaml would make their checks skip it."""
    files = [*(REPO / "cluster-configs").glob("*.yaml"), *(REPO / "recipes").rglob("*.yaml"), REPO / "Makefile",
             *(REPO / "toolkit").rglob("*.py"), *(REPO / "toolkit").rglob("*.j2")]
    named = {name: path for path in files for name in INSTANCE_NAME.findall(path.read_text())}
    assert len(named) >= 3, named  # the pattern finds them
    assert {name: str(path) for name, path in named.items() if name not in catalog()} == {}


@pytest.mark.parametrize("name", sorted(catalog()))
def test_each_entry_holds_the_facts_the_toolkit_derives_from(name):
    it = instance(name)
    assert it.vcpus % it.cores == 0  # threads_per_core is whole
    assert (it.gpus > 0) == (it.accelerator != "none") == (it.gpu_model is not None)
    assert not it.gpudirect_rdma or it.has_efa  # GPUDirect RDMA is over EFA
    assert not it.proprietary_driver or it.is_gpu


# Accelerated families in EC2's list (botocore's model) that the catalog leaves out, and why. Previous generation:
# in the EC2 Instance Types guide's previous generation page (pg.html), not its accelerated computing one (ac.html).
LEFT_OUT = {
    "p2": "previous generation (K80)",
    "g2": "previous generation",
    "g3": "previous generation",
    "g3s": "previous generation",
    "f1": "previous generation FPGA",
    "f2": "FPGAs: no accelerator kind in the catalog's schema",
    "vt1": "video transcoders: no accelerator kind in the catalog's schema",
    "g4ad": "AMD Radeon Pro V520 graphics GPUs: no accelerator family, and no training queue",
    "g6f": "a fraction of an L4 (0.125-0.5, ac.html): gpus is a whole number",
    "gr6f": "half an L4 (ac.html): gpus is a whole number",
    "g7": "no G7 figures (GPUs, vCPUs, memory) in the specification tables the catalog cites",
}


def test_every_current_accelerated_family_has_a_catalog_entry_or_a_reason():
    """Each GPU, Gaudi, Trainium, Inferentia (and FPGA, video) family EC2 sells has at least one type in the
    catalog, or its reason in LEFT_OUT; a family botocore adds fails here until it is one or the other."""
    accelerated = {name.split(".")[0] for name in ec2_type_names() if is_accelerated(name)}
    catalogued = {name.split(".")[0] for name in catalog()}
    assert {"p6-b300", "p6e-gb200", "trn2u", "inf2", "dl2q"} <= accelerated  # botocore's model is the one read
    assert sorted(accelerated - catalogued - set(LEFT_OUT)) == []
    assert sorted(set(LEFT_OUT) & catalogued) == []  # catalogued now: drop its reason
    assert sorted(set(LEFT_OUT) - accelerated) == []  # gone from EC2's list: drop its reason


def test_unknown_instance_type_names_the_known_ones():
    with pytest.raises(HpcError) as err:
        instance("p9.mega")
    assert "p9.mega" in err.value.message and "p3dn.24xlarge" in err.value.fix


def test_nccl_floors_of_one_instance_and_transport_cover_disjoint_node_counts():
    # nccl_floor() takes the first entry that covers a node count: overlapping ranges would hide one
    floors = nccl_floors()
    for f in floors:
        assert f.max_nodes is None or f.max_nodes >= f.min_nodes >= 2, f
        assert f.sizes and f.source, f
        assert [s.bytes for s in f.sizes] == sorted({s.bytes for s in f.sizes}), f  # ascending, one per size
        assert all(s.floor_busbw_gbs < s.published_busbw_gbs for s in f.sizes), f
        for g in floors:
            if g is not f and (g.instance, g.transport) == (f.instance, f.transport):
                assert not any(f.covers(n) and g.covers(n) for n in range(2, 257)), (f, g)
