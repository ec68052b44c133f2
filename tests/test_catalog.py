import re

import pytest

from tests.conftest import REPO
from toolkit.catalog import catalog, instance, nccl_floors
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
