import dataclasses

from tests.jobhelpers import CPU
from toolkit.cluster.queues import queues_from_config
from toolkit.slurm.render import sbatch_directives
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe


def test_wait_all_nodes_only_where_nodes_boot_on_demand():
    recipe = load_recipe("resnet50")
    dynamic = build_job_spec(recipe, CPU, 2)  # MinCount 0: ParallelCluster powers nodes up per job
    static = build_job_spec(recipe, dataclasses.replace(CPU, static_nodes=CPU.max_nodes), 2)
    assert "--wait-all-nodes=1" in sbatch_directives(dynamic)
    assert not any(d.startswith("--wait-all-nodes") for d in sbatch_directives(static))
    # Read from a ParallelCluster file: MinCount < MaxCount boots nodes on demand; MinCount = MaxCount does not.
    for min_count, dynamic in ((0, True), (4, True), (8, False)):
        config = {"Scheduling": {"SlurmQueues": [{"Name": "q", "ComputeResources": [
            {"Name": "r", "InstanceType": "p3dn.24xlarge", "MinCount": min_count, "MaxCount": 8}]}]}}
        queue = queues_from_config(config)["q"]
        assert queue.has_dynamic_nodes is dynamic
        assert ("--wait-all-nodes=1" in sbatch_directives(build_job_spec(recipe, queue, 2))) is dynamic
