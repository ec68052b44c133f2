"""The recipes reproduce the published setups flag for flag (fairseq 0.12 spelling)."""

import shlex

import pytest

from tests.jobhelpers import P3DN, parse_flags
from toolkit.job.rank import preview_argv
from toolkit.slurm.render import render_script
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe

RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "h0", "MASTER_PORT": "1"}

PUBLISHED = {
    "transformer": "--arch transformer_vaswani_wmt_en_de_big --share-all-embeddings --optimizer adam "
                   "--adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 0.001 --lr-scheduler inverse_sqrt "
                   "--warmup-init-lr 1e-07 --warmup-updates 4000 --dropout 0.3 --attention-dropout 0.1 "
                   "--weight-decay 0.0 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
                   "--max-tokens 3584 --fp16 --upsample-primary 16 --max-update 500000 "
                   "--save-interval-updates 1000 --keep-interval-updates 2 --no-epoch-checkpoints --seed 3 "
                   "--log-interval 100 --stop-min-lr 1e-09",
    "roberta": "--task masked_lm --criterion masked_lm --arch roberta_large --fp16 --memory-efficient-fp16 "
               "--optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-06 --lr 0.0004 "
               "--lr-scheduler polynomial_decay --warmup-updates 30000 --clip-norm 0.0 --tokens-per-sample 512 "
               "--sample-break-mode complete --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.01 "
               "--ddp-backend pytorch_ddp --bucket-cap-mb 200 --fast-stat-sync --num-workers 2 --log-format json "
               "--log-interval 25 --max-sentences 16 --total-num-update 500000 --max-update 500000 "
               "--save-interval-updates 500 --keep-interval-updates 2 --no-epoch-checkpoints",
    "resnet50": "--arch resnet50 --epochs 90 --batch-size 256 --warmup-lr 0.001 --lr-decay-power 2 --momentum 0.9 "
                "--nesterov --weight-decay 1e-4 --zero-init-last-bn --amp --image-size 224 --channels-last",
    "nccl-tests": "-b 16 -e 8192M -f 2 -g 1 -c 1 -n 100",
}
# What the toolkit adds to a published command on a GPU queue: scaling results, rendezvous, dirs, devices.
ADDED = {
    "transformer": {"--update-freq", "--distributed-backend", "--distributed-world-size", "--distributed-no-spawn",
                    "--distributed-rank", "--device-id", "--distributed-init-method", "--save-dir"},
    "resnet50": {"--lr", "--warmup-epochs", "--device", "--backend", "--data", "--checkpoint-dir", "--log-dir",
                 "--workers", "--checkpoint-every-steps", "--seed", "--loader"},
    "nccl-tests": set(),
}
ADDED["roberta"] = ADDED["transformer"]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_rank_command_has_the_published_flags_exactly(name):
    recipe = load_recipe(name)
    spec = build_job_spec(recipe, P3DN, recipe.resources.nodes)
    argv = preview_argv(spec.command, RANK0)
    flags = parse_flags(argv[3:] if argv[:2] == ["python", "-m"] else argv[1:])
    published = parse_flags(shlex.split(PUBLISHED[name]))
    assert {flag: flags.get(flag) for flag in published} == published
    assert set(flags) - set(published) == ADDED[name]


def test_transformer_renders_the_renamed_min_lr():
    argv = preview_argv(build_job_spec(load_recipe("transformer"), P3DN, 4).command, RANK0)
    assert "--min-lr" not in argv and argv[argv.index("--stop-min-lr") + 1] == "1e-09"
    assert "--stop-min-lr" in load_recipe("transformer").notes


@pytest.mark.parametrize("name,data", [("transformer", "/fsx/data-bin/wmt18_en_de_bpej32k"),
                                       ("roberta", "/fsx/data-bin/wikitext-103")])
def test_fairseq_gets_data_first_and_an_explicit_rendezvous(name, data):
    spec = build_job_spec(load_recipe(name), P3DN, 2)
    argv = preview_argv(spec.command, {"RANK": "11", "LOCAL_RANK": "3", "MASTER_ADDR": "h0", "MASTER_PORT": "777"})
    assert argv[:2] == ["fairseq-train", data]
    flags = parse_flags(argv)
    assert flags["--distributed-rank"] == ["11"] and flags["--device-id"] == ["3"]
    assert flags["--distributed-init-method"] == ["tcp://h0:777"]
    assert flags["--distributed-world-size"] == ["16"] and flags["--distributed-no-spawn"] == []
    assert "CUDA_VISIBLE_DEVICES" not in spec.environ  # every GPU of the node stays visible to each rank


def test_resnet_runs_our_trainer_as_a_module():
    argv = preview_argv(build_job_spec(load_recipe("resnet50"), P3DN, 8).command, RANK0)
    assert argv[:3] == ["python", "-m", "toolkit.workloads.resnet"]


def test_the_no_huge_pages_profile_exports_fi_efa_use_huge_page_0_with_its_reason():
    """Issue 18: a knob for fork-heavy loaders on EFA (libfabric fi_efa(7): the provider keeps its buffers in huge
    pages unless told not to; forked workers can exhaust the pool). Off unless the profile is chosen."""
    assert "FI_EFA_USE_HUGE_PAGE" not in build_job_spec(load_recipe("resnet50"), P3DN, 2).environ
    spec = build_job_spec(load_recipe("resnet50", profile="no-huge-pages"), P3DN, 2, profile="no-huge-pages")
    assert spec.environ["FI_EFA_USE_HUGE_PAGE"] == "0"
    lines = render_script(spec).splitlines()
    doc = lines[lines.index("export FI_EFA_USE_HUGE_PAGE=0") - 1]
    assert doc.startswith("# set by recipe resnet50's profile no-huge-pages (env.FI_EFA_USE_HUGE_PAGE): 0 keeps the "
                          "EFA provider's buffers "
                          "out of huge pages") and "Cannot allocate memory" in doc
