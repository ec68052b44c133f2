import dataclasses

from tests.jobhelpers import CPU, P3DN
from toolkit.job.render import sbatch_directives
from toolkit.job.spec import build_job_spec
from toolkit.recipes.load import load_recipe


def test_wait_all_nodes_only_where_nodes_boot_on_demand():
    recipe = load_recipe("resnet50")
    dynamic = build_job_spec(recipe, CPU, 2)  # MinCount 0: ParallelCluster powers nodes up per job
    static = build_job_spec(recipe, dataclasses.replace(CPU, static_nodes=CPU.max_nodes), 2)
    assert "--wait-all-nodes=1" in sbatch_directives(dynamic)
    assert not any(d.startswith("--wait-all-nodes") for d in sbatch_directives(static))
    assert P3DN.has_dynamic_nodes
