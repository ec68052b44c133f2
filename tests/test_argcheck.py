"""Training arguments checked against the launchers' own parsers at plan time (toolkit.job.argcheck): fairseq-train's
real parser (fairseq 0.12, with the options its task/arch/optimizer add), our trainers' parsers, DeepSpeed's own
config parser; sweep ranges; conflicting options; did-you-mean for recipe names, keys and profiles."""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import REPO, cli_json, run_hpc
from tests.jobhelpers import CPU, P3DN, write_recipe
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError, UsageError
from toolkit.launchers import check_arguments
from toolkit.launchers import fairseq as fairseq_launcher
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import list_recipe_files, load_recipe
from toolkit.submit import sweep
from toolkit.submit.plan import SubmitRequest, plan_job

DL1 = load_queues(REPO / "jobs" / "dl1-cluster.yaml")["dl1"]
NOT_CHECKED = "arguments: not checked"


def refusal(name: str, *overrides: str, **request) -> HpcError:
    with pytest.raises(HpcError) as err:
        plan_job(SubmitRequest(name, overrides=overrides, **request))
    return err.value


@pytest.mark.training
def test_a_misspelt_fairseq_flag_is_refused_with_the_flag_that_exists():
    err = refusal("roberta", "args.--lrr=0.1")
    assert err.exit_code == 1
    assert err.message.startswith("unknown argument --lrr (from --set args.--lrr=0.1): fairseq-train")
    assert err.message.endswith("did you mean --lr?")
    assert err.fix.startswith("--set args.--lr=0.1 ")
    load_recipe("roberta", overrides=["args.--lr=0.1"])  # the fix's override is one the recipe takes


@pytest.mark.training
def test_fairseq_checks_the_options_its_task_and_arch_add():
    """--tokens-per-sample comes from the masked_lm task and --encoder-layers from the roberta arch: accepted;
    --share-all-embeddings is the translation transformer's, which roberta does not have."""
    plan_job(SubmitRequest("roberta", overrides=("args.--encoder-layers=2", "args.--tokens-per-sample=128")))
    plan_job(SubmitRequest("transformer", overrides=("args.--share-all-embeddings=true",)))
    err = refusal("roberta", "args.--share-all-embeddings=true")
    assert "unknown argument --share-all-embeddings" in err.message


@pytest.mark.parametrize("override, words, fix", [
    ("args.--lr=abc", "--lr abc (from --set args.--lr=abc) is not a value fairseq-train (fairseq 0.12",
     "--set args.--lr=0.25"),  # fairseq's own default
    ("args.--max-update=1.5", "--max-update 1.5 (from --set args.--max-update=1.5) is not a value",
     "--set args.--max-update=1"),
    ("args.--arch=roberta_lage", "--arch roberta_lage", "--set args.--arch=roberta_large"),
    ("args.--sample-break-mode=bogus", "accepts one of none, complete, complete_doc, eos", "--set args."),
    ("args.--bf16=true", "Cannot combine --fp16 and --tpu", "fairseq-train --task masked_lm --arch roberta_large"),
    ("args.--fp16=1", "--fp16 is a switch and takes no value, got '1'", "--set args.--fp16=true"),
])
@pytest.mark.training
def test_fairseq_values_are_checked_by_fairseqs_types(override, words, fix):
    err = refusal("roberta", override)
    assert words in err.message and fix in (err.fix + err.message), (err.message, err.fix)
    if "max-update" in override:
        assert "it wants a whole number" in err.message


def test_our_trainers_parsers_answer_for_their_args():
    err = refusal("resnet50", "args.--batch-sizee=128")
    assert "unknown argument --batch-sizee" in err.message and err.message.endswith("did you mean --batch-size?")
    assert err.fix.startswith("--set args.--batch-size=128")
    err = refusal("resnet50", "args.--loader=pill")
    assert "accepts one of pil, gpu, dali; did you mean pil?" in err.message and err.fix == "--set args.--loader=pil"
    err = refusal("resnet50", "args.--image-size=0")  # the trainer's own post-parse check
    assert "--image-size must be at least 1" in err.message
    err = refusal("collectives", "args.-n=many")
    assert "-n many" in err.message and "a whole number" in err.message


def test_a_flag_from_the_recipe_file_gets_a_rename_fix(tmp_path):
    data = load_recipe("collectives").model_dump(mode="json", exclude_defaults=True)
    data["args"]["--opps"] = "all_reduce"
    with pytest.raises(HpcError) as err:
        plan_job(SubmitRequest(str(write_recipe(tmp_path, data)), overrides=("args.-n=3",)))
    # the file's flag, not the --set beside it
    assert "unknown argument --opps (args.--opps of recipe collectives)" in err.value.message
    assert err.value.fix == ("rename --opps to --ops in the recipe's args, or override it: --set args.--opps=null "
                             "--set args.--ops=all_reduce")


@pytest.mark.training
def test_deepspeed_config_goes_through_deepspeeds_own_parser():
    request = dict(cluster=str(REPO / "jobs" / "dl1-cluster.yaml"))
    notes = plan_job(SubmitRequest("bert-5b", **request))[4]
    said = [n for n in notes if n.startswith("arguments:")]
    assert len(said) == 2 and "the script's own flags" in said[0] and "not checked" in said[0]
    assert "zero_optimization.max_group_size" in said[1]  # Habana's fork's key: set aside, said
    err = refusal("bert-5b", "deepspeed.config.bf16.enabld=true", **request)
    assert err.message.startswith("deepspeed.config.bf16.enabld: DeepSpeed") and "did you mean enabled?" in err.message
    err = refusal("bert-5b", "deepspeed.config.bf16.enabled=maybe", **request)
    assert "deepspeed.config.bf16.enabled: must be true or false, got 'maybe'" in err.message


def test_where_no_parser_loads_it_is_said_once(monkeypatch, tmp_path):
    """A stand-in for a machine without fairseq: its import fails; the plan goes ahead with one note."""
    fairseq_launcher._fairseq.cache_clear()
    monkeypatch.setitem(sys.modules, "fairseq", None)
    try:
        notes = plan_job(SubmitRequest("roberta", overrides=("args.--lrr=0.1",)))[4]
    finally:
        fairseq_launcher._fairseq.cache_clear()
    assert [n for n in notes if n.startswith(NOT_CHECKED)] == [
        "arguments: not checked: fairseq is not installed where hpc runs, so fairseq-train's parser is not available "
        "(the nodes' fairseq will check them when the job starts)"]
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = run_hpc("run", str(script), "--dry-run", "--json", "--", "--anything", "1")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count(NOT_CHECKED) == 1 and f"the script {script}" in res.stderr
    assert [n for n in cli_json(res)["notes"] if n.startswith(NOT_CHECKED)]


@pytest.mark.training
def test_every_recipe_profile_and_reviewed_render_passes_the_check():
    """No false positives: every built-in recipe and profile on each queue kind it runs on, and every reviewed
    render in jobs/ (as `make jobs` makes them), is accepted by its launcher's parser."""
    checked = 0
    for path in list_recipe_files():
        for profile in [None, *load_recipe(path).profiles]:
            recipe = load_recipe(path, profile=profile)
            for queue in (P3DN, CPU, DL1):
                device = "hpu" if queue is DL1 else "gpu" if queue.gpus_per_node else "cpu"
                if device not in recipe.resources.runs_on or (device != "gpu" and recipe.args.get("--loader") == "gpu"):
                    continue
                spec = build_job_spec(recipe, queue, 2 if recipe.launcher.kind == "binary" else 1, profile=profile)
                notes = check_arguments(recipe, spec)
                assert bool(notes) == (recipe.launcher.kind in ("binary", "deepspeed")), (path.stem, profile, notes)
                checked += 1
    for path in sorted((REPO / "jobs").glob("*.sbatch")):
        name, nodes, queue = re.fullmatch(r"(.+)-(\d+)x(p3dn|dl1)\.sbatch", path.name).groups()
        plan_job(SubmitRequest(name, int(nodes), str(REPO / "jobs" / f"{queue}-cluster.yaml"), queue))
        checked += 1
    assert checked >= 25


@pytest.mark.parametrize("item, values", [
    ("args.--lr=0.1..0.4:0.1", ["0.1", "0.2", "0.3", "0.4"]),  # exact decimals, not 0.30000000000000004
    ("args.--lr=1e-4..3e-4:1e-4", ["0.0001", "0.0002", "0.0003"]),
    ("args.--seed=1..3", ["1", "2", "3"]), ("args.--n=10..100:30", ["10", "40", "70", "100"]),
    ("dirs.data.dir=../data", ["../data"]),  # a path is no range
])
def test_sweep_ranges(item, values):
    assert sweep.parse_sweep(item)[1] == values


@pytest.mark.parametrize("item, words", [
    ("args.--lr=0.1..0.4", "has no step, and only integer ranges step by 1"),
    ("args.--lr=1..x", "1..x is not a range"), ("args.--lr=1..2:0", "must be above 0"),
    ("args.--lr=0..1:1e-9", "1000000001 values"),
])
def test_sweep_ranges_that_cannot_be_meant_literally_are_refused(item, words):
    with pytest.raises(UsageError, match=re.escape(words)) as err:
        sweep.parse_sweep(item)
    assert ".." in err.value.fix


@pytest.mark.training
def test_each_sweep_point_goes_through_the_parser():
    with pytest.raises(HpcError) as err:
        sweep.plan(SubmitRequest("roberta"), ["args.--lr=0.1,abc"])
    assert err.value.message.startswith("sweep point 1 (args.--lr=abc): --lr abc (from --sweep args.--lr=abc)")
    assert err.value.fix == "--sweep args.--lr=0.25"  # fairseq's default, with the option the user typed


def test_nodes_and_a_node_override_conflict():
    with pytest.raises(UsageError) as err:
        sweep.plan(SubmitRequest("roberta", nodes=2), ["resources.nodes=1,2,4"])
    assert err.value.message == "--nodes 2 and --sweep resources.nodes=1,2,4 both set the node count"
    assert "--nodes 1" in err.value.fix
    with pytest.raises(UsageError, match="--nodes 2 and --set resources.nodes=4 both set the node count"):
        plan_job(SubmitRequest("roberta", nodes=2, overrides=("resources.nodes=4",)))


def test_a_derived_value_names_the_key_that_sets_it():
    err = refusal("resnet50", "args.--lr=0.2")
    assert err.message.startswith("--set args.--lr=0.2: --lr is derived by the recipe's scaling rule scaling.--lr")
    assert "--set scaling.--lr.base=0.2" in err.fix and "edit" not in err.fix
    plan_job(SubmitRequest("resnet50", overrides=("args.--lr=0.2", "scaling.--lr=null")))  # the fix's other way
    plan_job(SubmitRequest("resnet50", overrides=("scaling.--lr.base=0.2",)))
    err = refusal("roberta", "args.--update-freq=4")
    assert "--set scaling.--update-freq.global_batch=N" in err.fix


def test_a_swept_derived_value_is_answered_in_sweep_words():
    res = run_hpc("recipes", "submit", "resnet50", "--nodes", "2", "--sweep", "args.--lr=0.1,0.2", "--dry-run")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "fix: set the rule's input instead: --sweep scaling.--lr.base=0.1 " in res.stderr


def test_did_you_mean_for_recipe_names_keys_and_profiles(tmp_path):
    assert refusal("robera").message == "no recipe named 'robera'; did you mean roberta?"
    err = refusal("roberta", "resources.nodez=2")
    assert "resources.nodez: unknown key; did you mean resources.nodes?" in err.message
    assert err.fix == "--set resources.nodes=2"
    assert refusal("roberta", "time=01:00:00").fix == "--set resources.time=01:00:00"  # one level down
    assert "did you mean smoke?" in refusal("roberta", profile="smok").message
    data = load_recipe("collectives").model_dump(mode="json", exclude_defaults=True)
    data["resources"]["tme"] = "00:10:00"
    with pytest.raises(HpcError) as err:
        load_recipe(write_recipe(tmp_path, data))
    assert "resources.tme: unknown key; did you mean resources.time?" in err.value.message
    assert "Input should" not in err.value.message and err.value.fix.startswith("write resources.tme as resources.time")


@pytest.mark.parametrize("module, words", [("toolkit.workloads.nope", "does not import where hpc runs"),
                                           ("toolkit.workloads.smoke_data", "exposes no parser()")])
def test_a_toolkit_module_without_a_parser_here_is_said_not_checked(module, words):
    notes = plan_job(SubmitRequest("resnet50", overrides=(f"launcher.module={module}",)))[4]
    [said] = [n for n in notes if n.startswith(NOT_CHECKED)]
    assert module in said and words in said
