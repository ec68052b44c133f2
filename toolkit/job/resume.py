"""What a rank does before fairseq starts so that a requeued fairseq job can resume: its `checkpoint_last.pt` whole.

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
"""

from __future__ import annotations

import shlex

RESTORED_NAME = "checkpoint_last.pt"


def checkpoint_repair_script(launcher: str, checkpoint_dir: str | None) -> str:
    """A bash line for a fairseq rank with a checkpoint dir (else ""): replace a truncated `checkpoint_last.pt` with
    the newest complete checkpoint there, or move it aside if there is none."""
    if launcher != "fairseq" or not checkpoint_dir:
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
        f"echo \"hpc: {RESTORED_NAME} was cut short and no whole checkpoint is left: moved aside, training starts "
        "over\" >&2; fi; fi",
    ])
