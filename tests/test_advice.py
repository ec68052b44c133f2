"""What a job's numbers imply: which fairseq limit ends a run (token counts from real fairseq index files), and
the large-batch warning for linearly scaled learning rates."""

from __future__ import annotations

import pytest

from tests.conftest import run_hpc
from tests.jobhelpers import P3DN
from toolkit.launchers.fairseq import idx_tokens
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe


def write_index(prefix, sentence_lengths: list[int], impl: str) -> None:
    """A fairseq dataset written by fairseq's own builders (`mmap`, or the legacy `cached` format)."""
    import torch
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl=impl, vocab_size=1000)
    for length in sentence_lengths:
        builder.add_item(torch.arange(4, 4 + length, dtype=torch.int32))
    builder.finalize(f"{prefix}.idx")


@pytest.mark.training
@pytest.mark.parametrize("impl", ["mmap", "cached"])
def test_token_count_equals_fairseqs_own_reading(tmp_path, impl):
    from fairseq.data import data_utils

    lengths = [5, 17, 1, 300, 42]
    write_index(tmp_path / "train", lengths, impl)
    dataset = data_utils.load_indexed_dataset(str(tmp_path / "train"), None, dataset_impl=impl)
    assert idx_tokens(tmp_path / "train.idx") == int(dataset.sizes.sum()) == sum(lengths)


@pytest.mark.training
def test_an_epoch_cap_that_ends_the_run_before_warmup_is_warned(tmp_path):
    # 1,000 sentences x 512 tokens: 1,000 samples of 512; 8 nodes x 8 GPUs x 16 sentences x update-freq 8
    # = 8,192 per update, so 1 update per epoch and --max-epoch 2 ends the run after 2 of 500,000 updates.
    write_index(tmp_path / "train", [512] * 1000, "mmap")
    spec = build_job_spec(load_recipe("roberta", overrides=[f"dirs.data.dir={tmp_path}", "args.--max-epoch=2"]),
                          P3DN, 8)
    [warning] = spec.warnings
    assert "--max-epoch 2 ends this run after about 2 updates" in warning
    assert "before --max-update 500000" in warning and "--warmup-updates 30000" in warning
    length = next(d for d in spec.derived if d.key == "run length")
    assert length.value == "about 2 updates" and "1 updates per epoch" in length.rule
    # The flags stay as they are set.
    words = [w for w in spec.command if isinstance(w, str)]
    assert words[words.index("--max-epoch") + 1] == "2" and words[words.index("--max-update") + 1] == "500000"


@pytest.mark.training
def test_roberta_as_shipped_trains_to_max_update_on_a_corpus_of_one_update_per_epoch(tmp_path):
    """Issue 18: `--max-epoch 2` on a small corpus ended the run inside the warm-up, exit 0. The recipe now stops
    at --max-update only, as fairseq's examples/roberta/config/pretraining/base.yaml does (no max_epoch)."""
    write_index(tmp_path / "train", [512] * 1000, "mmap")
    spec = build_job_spec(load_recipe("roberta", overrides=[f"dirs.data.dir={tmp_path}"]), P3DN, 8)
    words = [w for w in spec.command if isinstance(w, str)]
    assert spec.warnings == () and "--max-epoch" not in words
    assert words[words.index("--max-update") + 1] == words[words.index("--total-num-update") + 1] == "500000"


@pytest.mark.training
def test_enough_data_means_max_update_ends_the_run_and_no_warning(tmp_path):
    write_index(tmp_path / "train", [512] * 300_000, "mmap")  # 37 updates per epoch on 64 ranks
    recipe = load_recipe("roberta", overrides=[f"dirs.data.dir={tmp_path}", "args.--max-update=200",
                                               "args.--max-epoch=10",
                                               "args.--total-num-update=200", "args.--warmup-updates=10"])
    spec = build_job_spec(recipe, P3DN, 8)
    assert spec.warnings == ()
    length = next(d for d in spec.derived if d.key == "run length")
    assert length.value == "200 updates" and "--max-update ends it" in length.rule


@pytest.mark.training
def test_show_render_and_dry_run_all_say_it(tmp_path):
    write_index(tmp_path / "train", [512] * 1000, "mmap")
    env_args = ("--set", f"dirs.data.dir={tmp_path}", "--set", "args.--max-epoch=2", "--nodes", "8")
    env = {"HPC_CLUSTER_CONFIG": "", "PATH": "/usr/bin:/bin", "HPC_RUNS_DIR": str(tmp_path / "runs")}
    for command in (("recipes", "show", "roberta"), ("recipes", "render", "roberta"),
                    ("recipes", "submit", "roberta", "--dry-run", "--executor", "sbatch")):
        res = run_hpc(*command, *env_args, "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert "warning: --max-epoch 2 ends this run" in res.stderr
        assert "--max-epoch 2 ends this run" in " ".join(__import__("json").loads(res.stdout)["warnings"])


def test_unreadable_data_says_the_run_length_is_unknown_and_does_not_warn(tmp_path):
    spec = build_job_spec(load_recipe("roberta", overrides=[f"dirs.data.dir={tmp_path / 'missing'}",
                                                            "args.--max-epoch=2"]), P3DN, 8)
    assert spec.warnings == ()
    assert next(d for d in spec.derived if d.key == "run length").value == "unknown"


def test_not_an_index_file_is_refused(tmp_path):
    (tmp_path / "train.idx").write_bytes(b"not an index")
    with pytest.raises(ValueError):
        idx_tokens(tmp_path / "train.idx")


@pytest.mark.parametrize("nodes,batch,warns", [(8, 256, False), (32, 256, True), (32, 64, False)])
def test_resnet50_global_batch_above_16k_with_linear_lr_warns(nodes, batch, warns):
    queue = P3DN.__class__(**{**P3DN.__dict__, "max_nodes": 32})
    spec = build_job_spec(load_recipe("resnet50", overrides=[f"args.--batch-size={batch}"]), queue, nodes)
    assert bool(spec.warnings) is warns
    if warns:  # 32 nodes x 8 GPUs x 256 = 65,536, LR 25.6
        assert "global batch 65536" in spec.warnings[0] and "LARS" in spec.warnings[0]
