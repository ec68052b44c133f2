"""fairseq-train (launcher kind fairseq): one process per rank under srun, explicit rendezvous, fairseq's own
device flags, its parser, its checkpoint repair and its run-length advice. This package is all hpc knows of
fairseq: the launcher here, its training log's formats in toolkit.launchers.fairseq.log (the reports ask for them
through the launcher's log_reader()).

Arguments: fairseq-train's argparse, built as fairseq_cli/train.py builds it (facebookresearch/fairseq v0.12,
fairseq/options.py: get_training_parser(), then parse_args_and_arch(), which parses twice and adds the options of
the chosen --task, --arch, --optimizer, --lr-scheduler, --criterion... in between, and post-checks a few
combinations). Importing fairseq costs seconds: it happens only in the check, once per process.

Resume: what a rank does before fairseq starts so that a requeued job can resume: its `checkpoint_last.pt` whole.
fairseq 0.12 writes each checkpoint atomically (a `.tmp` file, then a rename: fairseq/checkpoint_utils.py
`torch_persistent_save`), but it writes only the first of a save's names that way and copies that file in place to
the others, `checkpoint_last.pt` among them (`save_checkpoint`: `PathManager.copy(checkpoints[0], cp,
overwrite=True)`). A job stopped during the copy (`scontrol requeue`, a node lost, the time limit) leaves a
truncated `checkpoint_last.pt`, and the requeued job, which restores from it by default (`--restore-file`), fails in
torch.load. So each rank, before it execs fairseq, checks it and puts the newest complete checkpoint in its place.
A complete checkpoint is a whole zip file (torch.save's format since torch 1.6): it ends with the zip's 22-byte
end-of-central-directory record, signature `PK\\x05\\x06` (PKWARE APPNOTE.TXT 4.3.16; torch's writer adds no
comment after it). The check is plain shell, since the nodes' Python need not have hpc installed. It runs in the
rank program (toolkit.job.rank), not the batch shell's set-up: the tasks of a sweep share one set-up but each has
its own checkpoint dir. Every rank may repair at once: each copies to its own temporary name and renames, so a
reader sees the cut file or a whole one, never a half-copied one.

Advice: fairseq stops at whichever of --max-epoch and --max-update comes first. When the data-bin is readable, its
token count (fairseq's .idx index files) gives the updates per epoch:
    masked LM     samples = tokens / --tokens-per-sample (a lower bound with --sample-break-mode complete)
                  updates = samples / (--max-sentences x world size x --update-freq)
    translation   updates = max(source, target) tokens / (--max-tokens x world size x --update-freq)
Both are estimates from below (padding and block packing only add batches), said as "about".
"""

from __future__ import annotations

import argparse
import array
import functools
import math
import shlex
import struct
from pathlib import Path
from typing import Any, Mapping

from toolkit.job.env import EnvVar
from toolkit.job.rank import Arg, RankVar
from toolkit.job.scaling import Derived
from toolkit.launchers.base import PYTORCH_JOB, DeviceForm, Launcher, LogReader

PROGRAM = "fairseq-train"
HALF_PRECISION = ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16", "--amp")
DISTRIBUTED = ("--distributed-world-size", "--distributed-rank", "--device-id", "--distributed-init-method",
               "--distributed-backend", "--distributed-no-spawn", "--distributed-port", "--cpu")
# fairseq's registry flags: the options they add depend on the value, so the help that lists them needs them too
CHOICE_FLAGS = ("--task", "--arch", "--criterion", "--optimizer", "--lr-scheduler")
RESTORED_NAME = "checkpoint_last.pt"
MMAP_MAGIC = b"MMIDIDX\x00\x00"  # fairseq.data.indexed_dataset.MMapIndexedDataset
CACHED_MAGIC = b"TNTIDX\x00\x00"  # fairseq.data.indexed_dataset.IndexedDataset (the legacy "cached"/"lazy")


class Fairseq(Launcher):
    kind = "fairseq"
    owned_flags = DISTRIBUTED
    kubernetes = PYTORCH_JOB
    parser = "fairseq-train's"
    devices = ("gpu", "cpu")  # fairseq 0.12 has CUDA and CPU forms only

    def what(self, section) -> str:
        return PROGRAM

    def device_args(self, args: Mapping[str, Any], device: str, threads: int | None,
                    world: int) -> tuple[dict, list[Derived]]:
        from toolkit.accelerators import of_device

        accel = of_device(device)  # the queue's accelerator family: its collective backend, whether fairseq runs there
        self.refuse_device(device, fix="run fairseq recipes on a GPU or CPU queue")
        form = DeviceForm(args, device)
        if device == "cpu":
            form.drop(HALF_PRECISION, "no half precision on CPU")
            form.put("--cpu", True, "train on CPU")
        form.put("--distributed-backend", accel.collective, accel.collective_why)
        if device == "cpu":
            form.put("--ddp-backend", "legacy_ddp", "pytorch_ddp/c10d pass GPU device_ids and fail on CPU")
        form.put("--distributed-world-size", world, "world size = nodes x ranks per node")
        form.put("--distributed-no-spawn", True, "srun starts one process per rank; fairseq must not spawn more")
        return form.args, form.derived

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        return [PROGRAM], []

    def trailer(self) -> list[Arg]:
        # explicit rendezvous: fairseq's own Slurm auto-detection is unsafe
        return ["--distributed-rank", RankVar.RANK, "--device-id", RankVar.LOCAL_RANK,
                "--distributed-init-method", ("tcp://", RankVar.MASTER_ADDR, ":", RankVar.MASTER_PORT)]

    def env(self) -> list[EnvVar]:
        return [EnvVar("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1",
                       "torch >= 2.6 refuses fairseq's own checkpoints (resume, generate) without it")]

    def resume_script(self, checkpoint_dir: str | None) -> str:
        """Replace a truncated `checkpoint_last.pt` with the newest complete checkpoint in the checkpoint dir, or
        move it aside if there is none ("" without a checkpoint dir)."""
        if not checkpoint_dir:
            return ""
        return " ".join([
            "whole() { [ \"$(tail -c 22 \"$1\" 2>/dev/null | od -An -tx1 -N4 | tr -d ' \\n')\" = 504b0506 ]; };",
            f"last={shlex.quote(f'{checkpoint_dir}/{RESTORED_NAME}')};",
            "if [ -e \"$last\" ] && ! whole \"$last\"; then newest=;",
            f"for f in {shlex.quote(checkpoint_dir)}/checkpoint*.pt; do",
            "if [ \"$f\" != \"$last\" ] && whole \"$f\" && { [ -z \"$newest\" ] || [ \"$f\" -nt \"$newest\" ]; };",
            "then newest=$f; fi; done;",
            "if [ -n \"$newest\" ]; then cp \"$newest\" \"$last.$$.tmp\" && mv -f \"$last.$$.tmp\" \"$last\" &&",
            f"echo \"hpc: {RESTORED_NAME} was cut short (a stop during fairseq's copy): resuming from $newest\" >&2;",
            "else mv -f \"$last\" \"$last.incomplete\" 2>/dev/null &&",
            f"echo \"hpc: {RESTORED_NAME} was cut short and no whole checkpoint is left: moved aside, training "
            "starts over\" >&2; fi; fi",
        ])

    def advice(self, args: Mapping[str, Any], data_dir: str | None,
               world_size: int) -> tuple[list[Derived], list[str]]:
        return run_length(args, data_dir, world_size)

    def check_arguments(self, recipe, spec, argv: list[str]) -> list[str]:
        from toolkit.job.argcheck import Program, check_argparse, quiet

        argv = argv[argv.index(PROGRAM) + 1:]
        try:
            options, version = _fairseq()
        except Exception as exc:  # not installed here, or fairseq 0.12.2's import failure on Python 3.11
            reason = "fairseq is not installed" if isinstance(exc, ImportError) else f"fairseq does not load ({exc})"
            return [f"arguments: not checked: {reason} where hpc runs, so fairseq-train's parser is not available "
                    "(the nodes' fairseq will check them when the job starts)"]
        if "--user-dir" in argv:  # a researcher's tasks and models, in a dir on the cluster
            return ["arguments: not checked: --user-dir adds the researcher's own fairseq tasks and models, which "
                    "hpc does not load"]

        def parse(parser: argparse.ArgumentParser, words: list[str]):
            return options.parse_args_and_arch(parser, input_args=words, parse_known=True)

        with quiet():
            parser = options.get_training_parser()
        check_argparse(recipe, Program(PROGRAM, _help(argv), f"fairseq {version}"), parser, argv, parse)
        return []

    def log_reader(self) -> LogReader:
        from toolkit.launchers.fairseq.log import READER

        return READER



LAUNCHER = Fairseq()

@functools.lru_cache(maxsize=None)
def _fairseq() -> tuple[Any, str]:
    """(fairseq.options, fairseq's version), imported once; ImportError (or fairseq's own import failure) when
    fairseq cannot load here."""
    from toolkit.job.argcheck import quiet

    with quiet():
        import fairseq
        from fairseq import options
    return options, getattr(fairseq, "__version__", "?")


def _help(argv: list[str]) -> str:
    """fairseq-train's help with the registry choices the job makes: the options it lists depend on them."""
    chosen: list[str] = []
    for flag in CHOICE_FLAGS:
        if flag in argv and argv.index(flag) + 1 < len(argv):
            chosen += [flag, argv[argv.index(flag) + 1]]
    return shlex.join([PROGRAM, *chosen, "--help"])


def _int(args: Mapping[str, Any], flag: str) -> int | None:
    """A flag's value as a whole number, or None (unset, a switch, or not a number)."""
    value = args.get(flag)
    if value is None or isinstance(value, (bool, list)):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def idx_tokens(path: Path) -> int:
    """The number of tokens in one fairseq .idx index (the sum of its sentence sizes)."""
    data = path.read_bytes()
    if data.startswith(MMAP_MAGIC):  # magic, version <Q, dtype <B, count <Q, sizes int32[count], pointers
        offset = len(MMAP_MAGIC) + 8 + 1
        (count,) = struct.unpack_from("<Q", data, offset)
        sizes = array.array("i")
        start = offset + 8
        sizes.frombytes(data[start:start + 4 * count])
        return sum(sizes)
    if data.startswith(CACHED_MAGIC):  # magic, version <Q, (code, element size) <QQ, (count, s) <QQ,
        count, total = struct.unpack_from("<QQ", data, len(CACHED_MAGIC) + 24)  # then int64 offsets, sizes
        start = len(CACHED_MAGIC) + 40 + 2 * 8 * (count + 1)
        sizes = array.array("q")
        sizes.frombytes(data[start:start + 8 * total])
        return sum(sizes)
    raise ValueError(f"{path} is not a fairseq index file")


def _train_tokens(data_dir: Path, task: str | None) -> int | None:
    """Tokens per epoch of the train split (translation: the longer side), or None if the data is unreadable."""
    try:
        if task == "translation":
            sides = [idx_tokens(p) for p in sorted(data_dir.glob("train.*-*.*.idx"))]
            return max(sides) if sides else None
        idx = data_dir / "train.idx"
        return idx_tokens(idx) if idx.is_file() else None
    except (OSError, ValueError, struct.error):
        return None
def run_length(args: Mapping[str, Any], data_dir: str | None,
                       world_size: int) -> tuple[list[Derived], list[str]]:
    """Which of --max-epoch / --max-update ends a fairseq run, from the data's token count."""
    max_epoch, max_update = _int(args, "--max-epoch"), _int(args, "--max-update")
    if not max_epoch or not max_update or not data_dir:
        return [], []
    task = args.get("--task")
    tokens = _train_tokens(Path(data_dir), task)
    if tokens is None:
        return [Derived("run length", "unknown", f"--max-epoch {max_epoch} or --max-update {max_update}, whichever "
                        f"comes first; {data_dir} has no readable train index here to tell which")], []
    update_freq = _int(args, "--update-freq") or 1
    if task == "translation":
        per_update = (_int(args, "--max-tokens") or 0) * world_size * update_freq
        basis = f"{tokens} tokens / (--max-tokens x {world_size} ranks x update-freq {update_freq})"
        per_epoch = math.ceil(tokens / per_update) if per_update else None
    else:
        block = _int(args, "--tokens-per-sample") or 512
        sentences = _int(args, "--max-sentences") or _int(args, "--batch-size")
        per_update = (sentences or 0) * world_size * update_freq
        basis = (f"{tokens} tokens / {block} per sample / ({sentences} sentences x {world_size} ranks x "
                 f"update-freq {update_freq})")
        per_epoch = math.ceil(tokens / block / per_update) if per_update else None
    if not per_epoch:
        return [], []
    by_epochs = per_epoch * max_epoch
    if by_epochs >= max_update:
        return [Derived("run length", f"{max_update} updates", f"--max-update ends it: --max-epoch {max_epoch} "
                        f"x about {per_epoch} updates per epoch ({basis}) is later")], []
    derived = [Derived("run length", f"about {by_epochs} updates", f"--max-epoch {max_epoch} ends it first: about "
                       f"{per_epoch} updates per epoch ({basis}); --max-update is {max_update}")]
    warmup = _int(args, "--warmup-updates")
    warning = (f"--max-epoch {max_epoch} ends this run after about {by_epochs} updates ({per_epoch} per epoch on "
               f"{data_dir}), before --max-update {max_update}"
               + (f" and before its warm-up ends (--warmup-updates {warmup})" if warmup and by_epochs < warmup else "")
               + ": the LR schedule will not reach its end; raise --max-epoch (or --set args.--max-epoch=null) to "
                 "train for the full update schedule")
    return derived, [warning]
