"""The planner (`hpc plan`, toolkit.planner): the model's arithmetic by hand, the seed 004 row against its published
figures, the calibration reader on run dirs a real short run on the local Slurm made (tests/data/planner: the
smoke ResNet at 1 and 2 nodes of the `wide` partition and a collectives run, their logs, heartbeats and
metadata as written), and the CLI: table, JSON envelope, plot, and one clear exit-2 error per bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, cli_json, run_hpc
from toolkit.planner import model
from toolkit.planner.calibration import read_collectives, read_training

DATA = REPO / "tests" / "data" / "planner"
SEED = ["plan", "resnet50", "--instance-type", "p3.16xlarge", "--nodes", "1,2,4,8", "--throughput-1node",
        "5700..6000", "--assume", "samples_per_epoch=1281167", "--target", "epochs"]


def wide_cluster(tmp_path: Path) -> Path:
    """The local test cluster's `wide` queue as its config says it (c5.large, 1 rank of 1 CPU per node)."""
    config = {"Region": "us-east-1", "Image": {"Os": "ubuntu2204"},
              "HeadNode": {"InstanceType": "m5.xlarge", "Networking": {"SubnetId": "subnet-0"}},
              "Scheduling": {"Scheduler": "slurm", "SlurmQueues": [
                  {"Name": "wide", "CapacityType": "ONDEMAND", "Networking": {"SubnetIds": ["subnet-0"]},
                   "ComputeResources": [{"Name": "c5-l", "Instances": [{"InstanceType": "c5.large"}],
                                         "MinCount": 16, "MaxCount": 16}],
                   "Tags": [{"Key": "hpc:ranks-per-node", "Value": "1"}, {"Key": "hpc:cpus-per-task", "Value": "1"},
                            {"Key": "hpc:efa-stack", "Value": "none"}]}]}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# The model, by hand ------------------------------------------------------------------------------------------------

def test_the_ring_all_reduce_costs_2_n_minus_1_over_n_times_the_bytes_over_the_bus_bandwidth():
    # ResNet-50's fp32 gradients over 64 ranks at 3.125 GB/s: 2 x 63/64 x 102,228,128 B / 3.125e9 B/s
    assert model.ring_allreduce_s(25_557_032 * 4, 64, 3.125) == pytest.approx(0.0644037, rel=1e-5)
    assert model.ring_allreduce_s(1e9, 2, 1.0) == pytest.approx(1.0)  # 2 x 1/2 x 1 GB at 1 GB/s
    assert model.ring_allreduce_s(1e9, 1, 1.0) == 0.0


def test_a_step_is_the_wait_and_the_own_work_plus_the_unhidden_all_reduce():
    inputs = model.ModelInputs(ranks_per_node=2, samples_per_rank_step=10, node_step_s=1.0, data_wait_s=0.1,
                               gradient_bytes=1e9, busbw_gbs=1.0, hidden=0.5)
    one, four = model.step_at(inputs, 1), model.step_at(inputs, 4)
    assert (one.step_s, one.throughput, one.bound) == (1.0, 20.0, "compute")
    # 8 ranks: the ring moves 2 x 7/8 GB at 1 GB/s = 1.75 s, half of it hidden
    assert four.allreduce_s == pytest.approx(1.75) and four.exposed_s == pytest.approx(0.875)
    assert four.step_s == pytest.approx(1.875) and four.throughput == pytest.approx(80 / 1.875)
    assert four.bound == "compute"  # 0.9 s of own work against 0.875 s exposed
    assert model.efficiency(inputs, 4) == pytest.approx(1 / 1.875)
    slow = model.step_at(inputs, 16)  # 32 ranks: 2 x 31/32 s x 0.5 = 0.96875 s > 0.9 s
    assert slow.bound == "gradient all-reduce"


def test_the_input_pipeline_and_the_shared_file_system_bound_the_step_when_slower():
    loader = model.ModelInputs(1, 100, node_step_s=1.0, loader_samples_per_s_node=50)
    assert model.step_at(loader, 2).step_s == 2.0 and model.step_at(loader, 2).bound == "input pipeline"
    # 8 nodes x 100 samples x 1 MB each = 800 MB per step at 400 MB/s: 2 s
    fsx = model.ModelInputs(1, 100, node_step_s=1.0, fsx_bytes_per_s=400e6, bytes_per_sample=1e6)
    assert model.step_at(fsx, 8).step_s == pytest.approx(2.0) and model.step_at(fsx, 8).bound == "FSx throughput"
    assert model.step_at(fsx, 2).bound == "compute"  # 0.5 s of reading


def test_the_overlap_and_latency_come_from_the_one_to_two_node_difference():
    assert model.fit_overlap(0.30, 0.35, 0.10, 2) == pytest.approx((0.5, 0.0))  # half of 0.1 s shown
    hidden, latency = model.fit_overlap(0.30, 0.50, 0.10, 2)  # grew 0.2 s: all of 0.1 s and 0.1 s more
    assert hidden == 0.0 and latency == pytest.approx(0.05)  # over 2(n-1) = 2 hops
    assert model.fit_overlap(0.30, 0.29, 0.10, 2) == (1.0, 0.0)  # no growth: all hidden


def test_nodes_sharing_a_hosts_cores_slow_each_other_as_the_forward_pass_did():
    inputs = model.ModelInputs(1, 16, node_step_s=0.2, shared_host=True, forward_ratio=2.0, fit_nodes=2)
    assert [model.sharing_factor(inputs, n) for n in (1, 2, 4, 8)] == [1.0, 2.0, 4.0, 8.0]
    assert model.sharing_factor(model.ModelInputs(1, 16, 0.2, forward_ratio=2.0), 8) == 1.0  # separate nodes
    # the exposed all-reduce (here its latency: 2(n-1) x 10 ms) slows with them, relative to the 2-node fit
    slowed = model.ModelInputs(1, 16, node_step_s=0.2, latency_s=0.01, shared_host=True, forward_ratio=2.0)
    assert model.step_at(slowed, 2).exposed_s == pytest.approx(0.02)
    assert model.step_at(slowed, 8).exposed_s == pytest.approx(14 * 0.01 * 8 / 2)
    assert model.step_at(slowed, 8).step_s == pytest.approx(0.2 * 8 + 0.56)


def test_spreads_are_one_sigma_over_the_mean_combined_in_quadrature():
    assert model.relative_spread([9.0, 11.0]) == pytest.approx(2 ** 0.5 / 10)
    assert model.relative_spread([5.0]) == 0.0
    assert model.combined_spread(0.03, 0.04) == pytest.approx(0.05)


# The seed's published run ------------------------------------------------------------------------------------------

def test_the_seed_004_row_lands_within_15_percent_of_its_published_time_and_throughput():
    """Seed 004: ResNet-50, 90 epochs of ImageNet (1,281,167 images), 64 V100 on 8 p3.16xlarge, 47-50 min at about
    41-44k images/s; from one p3.16xlarge's 5,700-6,000 images/s and the catalog's 25 Gbps alone."""
    res = run_hpc(*SEED, "--json")
    assert res.returncode == 0, res.stderr
    data = cli_json(res)
    row = next(r for r in data["rows"] if r["nodes"] == 8)
    assert row["ranks"] == 64 and row["global_batch"] == 16384
    assert abs(row["throughput"] / 42_500 - 1) < 0.15, row["throughput"]
    assert abs(row["time_s"] / 60 / 48.5 - 1) < 0.15, row["time_s"] / 60
    assert row["cost_usd"] == pytest.approx(24.48 * 8 * row["time_s"] / 3600)
    assert {"flag": "--lr", "value": "6.4"} in row["scaling"]  # the recipe's reference: 6.4 at 64 ranks
    sources = {i["name"]: i["source"] for i in data["inputs"]}
    assert "25 Gbps" in sources["bus bandwidth (GB/s)"] and "typed" in sources["throughput at 1 node"]


# The calibration reader, on a real run's files ----------------------------------------------------------------------

def test_a_calibration_runs_measurements_are_read_from_its_run_dir():
    one = read_training(DATA / "one")
    assert (one.recipe, one.profile, one.queue, one.nodes, one.ranks_per_node) == ("resnet50", "smoke", "wide", 1, 1)
    assert one.samples_per_rank_step == 16 and one.samples_per_epoch == 89 * 16
    assert one.step_s == pytest.approx(16 / one.throughput)
    assert 0 < one.data_s < one.step_s and one.forward_s and 0 < one.forward_s < one.step_s
    assert 0 < one.spread < 0.5
    busbw = read_collectives(DATA / "collectives")
    assert busbw.nodes == 2 and busbw.busbw_gbs > 0 and busbw.size <= 25 * 2**20


def test_predicting_from_calibration_runs_prints_a_table_and_draws_time_and_cost(tmp_path):
    png = tmp_path / "plan.png"
    res = run_hpc("plan", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)), "--queue",
                  "wide", "--nodes", "1,2,4,8", "--from", str(DATA / "one"), "--from", str(DATA / "two"),
                  "--from", str(DATA / "collectives"), "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert "NODES" in res.stdout and "BOUND" in res.stdout and "no goodput records" in res.stdout
    assert "$0.085/h per c5.large" in res.stdout  # the catalog's price, dated
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = cli_json(run_hpc("plan", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)),
                            "--queue", "wide", "--nodes", "1,2", "--from", str(DATA / "one"), "--from",
                            str(DATA / "two"), "--json"))
    one, two = data["rows"]
    measured_two = read_training(DATA / "two")
    # the fit reproduces the 2-node step it was fitted to
    assert two["step_s"] == pytest.approx(measured_two.step_s, rel=1e-6)
    assert one["throughput"] == pytest.approx(read_training(DATA / "one").throughput, rel=1e-6)


@pytest.mark.parametrize("args,words", [
    (["--from", "one"], "a fit needs two"),
    (["--from", "one", "--from", "other"], "not resnet50 --profile smoke"),
    (["--from", "one", "--from", "two", "--target", "updates"], "defines no update target"),
    (["--from", "one", "--from", "two", "--assume", "paramters=1"], "did you mean parameters"),
])
def test_bad_input_is_one_clear_error_with_exit_2(tmp_path, args, words):
    other = tmp_path / "other"
    shutil.copytree(DATA / "two", other)
    meta = json.loads((other / "metadata.json").read_text())
    (other / "metadata.json").write_text(json.dumps({**meta, "recipe": "roberta"}))
    resolved = [str(DATA / a) if a in ("one", "two") else str(other) if a == "other" else a for a in args]
    res = run_hpc("plan", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)), "--queue",
                  "wide", "--nodes", "1,2,4", *resolved)
    assert res.returncode == 2, res.stdout + res.stderr
    assert words in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("nodes,words", [("0,2", "--nodes 0,2: the least a node count takes is 1"),
                                         ("two", "--nodes 'two' is not a list of node counts"),
                                         ("1,,2", "--nodes '1,,2' is not a list of node counts")])  # was 1,2
def test_bad_node_counts_say_what_is_wrong(tmp_path, nodes, words):
    res = run_hpc("plan", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)), "--queue",
                  "wide", "--nodes", nodes, "--throughput-1node", "100")
    assert res.returncode == 2 and words in res.stderr, res.stderr


def test_calibrating_at_one_node_count_is_refused_before_anything_is_submitted(tmp_path):
    res = run_hpc("plan", "calibrate", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)),
                  "--queue", "wide", "--nodes", "2")
    assert res.returncode == 2 and "calibration needs 1 node and at least one more" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_plan_help_lists_predict_and_calibrate():
    res = run_hpc("plan", "--help")
    assert res.returncode == 0 and "predict" in res.stdout and "calibrate" in res.stdout


def test_a_figure_given_by_its_own_option_is_named_by_it(tmp_path):
    """--throughput-1node -5 was "throughput_1node='-5' must be above 0", the planner's internal key."""
    res = run_hpc("plan", "resnet50", "--profile", "smoke", "--cluster", str(wide_cluster(tmp_path)), "--queue",
                  "wide", "--nodes", "1,2", "--throughput-1node", "-5")
    assert res.returncode == 2 and "--throughput-1node '-5' must be above 0" in res.stderr, res.stderr
