"""Scaling arithmetic against the published reference values, for several node counts."""

import pytest

from tests.jobhelpers import CPU, P3DN
from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.job.scaling import accumulation, apply_scaling, memory_cap


def derived(spec, key):
    return next(d.value for d in spec.derived if d.key == key)


@pytest.mark.parametrize("name", ["transformer", "roberta", "resnet50"])
def test_every_rule_reproduces_its_published_reference(name):
    recipe = load_recipe(name)
    for flag, rule in recipe.scaling.items():
        if rule.reference is None:  # no published per-GPU split (roberta: the paper gives the global batch only)
            continue
        world = rule.reference.world_size
        args, _ = apply_scaling({flag: rule}, recipe.args, nodes=world // 8, ranks_per_node=8, max_nodes=64,
                                gpu_memory_gib=32, cpus_per_rank=12)
        assert float(args[flag]) == pytest.approx(rule.reference.value)


@pytest.mark.parametrize("nodes,update_freq", [(1, 64), (2, 32), (4, 16), (8, 8), (16, 4)])
def test_roberta_keeps_the_papers_8192_sequences_per_update(nodes, update_freq):
    spec = build_job_spec(load_recipe("roberta"), P3DN, nodes)
    assert derived(spec, "--update-freq") == str(update_freq)
    assert 16 * update_freq * spec.world_size == 8192


@pytest.mark.parametrize("nodes,update_freq", [(1, 16), (2, 8), (4, 4), (16, 1)])
def test_transformer_keeps_128_gpus_worth_of_tokens(nodes, update_freq):
    spec = build_job_spec(load_recipe("transformer"), P3DN, nodes)
    assert derived(spec, "--update-freq") == str(update_freq)
    assert 3584 * update_freq * spec.world_size == 3584 * 128


@pytest.mark.parametrize("nodes,lr,warmup", [(1, "0.8", "1.25"), (2, "1.6", "2.5"), (4, "3.2", "5"),
                                             (8, "6.4", "10"), (3, "2.4", "3.75")])
def test_resnet_lr_and_warmup_follow_the_global_batch(nodes, lr, warmup):
    spec = build_job_spec(load_recipe("resnet50"), P3DN, nodes)
    assert (derived(spec, "--lr"), derived(spec, "--warmup-epochs")) == (lr, warmup)


def test_a_fractional_update_freq_is_an_error_listing_the_node_counts_that_work():
    with pytest.raises(HpcError) as err:
        build_job_spec(load_recipe("roberta"), P3DN, 3)
    assert "not a whole number" in err.value.message
    assert err.value.fix == "use --nodes 1 | 2 | 4 | 8 | 16"


def test_cpu_queue_world_size_drives_the_same_rule():
    spec = build_job_spec(load_recipe("roberta"), CPU, 2)
    assert spec.world_size == 4 and derived(spec, "--update-freq") == "128"


def test_accumulation_is_none_when_not_whole():
    assert accumulation(2048, 16, 8) == 16
    assert accumulation(2048, 16, 24) is None
    assert accumulation(16, 16, 2) is None  # less than one step per update


@pytest.mark.parametrize("instance,expected", [("p3dn.24xlarge", "8192M"), ("p3.16xlarge", "4096M"),
                                               ("p4d.24xlarge", "8192M")])
def test_nccl_tests_max_size_is_capped_by_gpu_memory(instance, expected):
    queue = Queue(name="q", instance_type=instance, max_nodes=4)
    spec = build_job_spec(load_recipe("nccl-tests"), queue, 2)
    assert spec.command[spec.command.index("-e") + 1] == expected
    assert memory_cap(16, 3, 0.8) * 3 <= 16 * 2**30 * 0.8 < memory_cap(16, 3, 0.8) * 2 * 3


@pytest.mark.parametrize("queue,cpus,workers", [
    (P3DN, 12, 11), (Queue(name="p5", instance_type="p5.48xlarge", max_nodes=4), 24, 23),
    (Queue(name="dl1", instance_type="dl1.24xlarge", max_nodes=4), 12, 11),
    (Queue(name="c", instance_type="m5.xlarge", max_nodes=2, efa_stack="none", ranks_per_node=1), 4, 3), (CPU, 1, 0)])
def test_resnet_loader_workers_are_the_ranks_cpus_but_one(queue, cpus, workers):
    """Issue 18: 8 workers whatever the queue (p5 gives each rank 24 CPUs). One worker per CPU of the rank, one CPU
    left to the rank's own process; `hpc recipes show` prints why."""
    spec = build_job_spec(load_recipe("resnet50"), queue, 1)
    argv = list(spec.command)
    assert spec.cpus_per_task == cpus and argv[argv.index("--workers") + 1] == str(workers)
    assert derived(spec, "--workers") == str(workers)
    rule = next(d.rule for d in spec.derived if d.key == "--workers")
    assert rule.startswith(f"{cpus} CPUs per rank - 1 for the rank's own process")


def test_the_smoke_profile_keeps_its_one_forked_worker():
    spec = build_job_spec(load_recipe("resnet50", profile="smoke"), CPU, 1, profile="smoke")
    argv = list(spec.command)
    assert argv[argv.index("--workers") + 1] == "1" and "--workers" not in {d.key for d in spec.derived}


@pytest.mark.parametrize("instance,expected", [
    ("p5.48xlarge", "16G"), ("p5en.48xlarge", "16G"), ("p6-b200.48xlarge", "16G"), ("p4de.24xlarge", "16G"),
    ("p4d.24xlarge", "8192M"), ("p3dn.24xlarge", "8192M"), ("dl1.24xlarge", "8192M"), ("g5.12xlarge", "4096M")])
def test_collectives_reach_16_gib_where_the_accelerator_memory_allows(instance, expected):
    # report nccl judges a run at its largest size, and busbw on p5-class fabrics still rises past 1 GiB
    queue = Queue(name="q", instance_type=instance, max_nodes=4)
    spec = build_job_spec(load_recipe("collectives"), queue, 2)
    assert spec.command[spec.command.index("-e") + 1] == expected


def test_collectives_on_a_cpu_queue_stop_at_the_rules_cpu_cap():
    spec = build_job_spec(load_recipe("collectives"), CPU, 2)
    assert spec.command[spec.command.index("-e") + 1] == "1G"
    rule = next(d.rule for d in spec.derived if d.key == "-e")
    assert "capped from 16384M: at most 1G on a queue without GPUs" in rule
    smoke = build_job_spec(load_recipe("collectives", profile="smoke"), CPU, 2)
    assert smoke.command[smoke.command.index("-e") + 1] == "1M"  # under the cap: kept


def test_a_gpu_memory_cap_without_cpu_cap_refuses_a_cpu_queue():
    rule = load_recipe("collectives").scaling["-e"].model_copy(update={"cpu_cap": None})
    with pytest.raises(HpcError, match="needs a GPU's memory"):
        apply_scaling({"-e": rule}, {"-e": "16G"}, nodes=2, ranks_per_node=1, max_nodes=2, gpu_memory_gib=None,
                      cpus_per_rank=1)
