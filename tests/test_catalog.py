import pytest

from toolkit.catalog import catalog, instance
from toolkit.errors import HpcError

REQUIRED = ["p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "dl1.24xlarge",
            "c5n.18xlarge", "c5n.9xlarge", "c5.18xlarge", "m5.xlarge", "m5.8xlarge"]


def test_catalog_has_the_instance_types_the_toolkit_supports():
    assert set(REQUIRED) <= set(catalog())


@pytest.mark.parametrize("name,gpus,efa,v100", [
    ("p3dn.24xlarge", 8, 1, True), ("p3.16xlarge", 8, 0, True), ("p4d.24xlarge", 8, 4, False),
    ("p5.48xlarge", 8, 32, False), ("dl1.24xlarge", 8, 4, False), ("c5n.18xlarge", 0, 1, False),
])
def test_catalog_facts(name, gpus, efa, v100):
    it = instance(name)
    assert (it.gpus, it.efa_interfaces, it.proprietary_driver) == (gpus, efa, v100)
    assert it.vcpus % it.cores == 0


def test_unknown_instance_type_names_the_known_ones():
    with pytest.raises(HpcError) as err:
        instance("p9.mega")
    assert "p9.mega" in err.value.message and "p3dn.24xlarge" in err.value.fix
