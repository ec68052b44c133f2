"""What a job does before its ranks start so that a requeued fairseq job can resume: its `checkpoint_last.pt` whole.

fairseq 0.12 writes each checkpoint atomically (a `.tmp` file, then a rename: fairseq/checkpoint_utils.py
`torch_persistent_save`), but it writes only the first of a save's names that way and copies that file in place to
the others, `checkpoint_last.pt` among them (`save_checkpoint`: `PathManager.copy(checkpoints[0], cp,
overwrite=True)`). A job stopped during the copy (`scontrol requeue`, a node lost, the time limit) leaves a
truncated `checkpoint_last.pt`, and the requeued job, which restores from it by default (`--restore-file`), fails in
torch.load. So the batch shell, before srun, checks it and puts the newest complete checkpoint in its place.

A complete checkpoint is a whole zip file (torch.save's format since torch 1.6): it ends with the zip's 22-byte
end-of-central-directory record, signature `PK\\x05\\x06` (PKWARE APPNOTE.TXT 4.3.16; torch's writer adds no
comment after it). The check is plain shell, since the nodes' Python need not have hpc installed.
"""

from __future__ import annotations

import shlex

RESTORED_NAME = "checkpoint_last.pt"


def checkpoint_repair_lines(launcher: str, checkpoint_dir: str | None) -> list[str]:
    """Shell lines for the job's set-up: for a fairseq job with a checkpoint dir, replace a truncated
    `checkpoint_last.pt` with the newest complete checkpoint there (or move it aside if there is none)."""
    if launcher != "fairseq" or not checkpoint_dir:
        return []
    return [
        "# fairseq copies its newest checkpoint to checkpoint_last.pt in place: a job stopped during the copy leaves",
        "# it truncated and the restart fails to load it. Put the newest complete checkpoint there (toolkit.job.resume).",
        "hpc_whole_zip() { [ \"$(tail -c 22 \"$1\" 2>/dev/null | head -c 4 | od -An -tx1 | tr -d ' \\n')\" = 504b0506 ]; }",
        f"last={shlex.quote(f'{checkpoint_dir}/{RESTORED_NAME}')}",
        "if [ -e \"$last\" ] && ! hpc_whole_zip \"$last\"; then",
        "  newest=\"\"",
        f"  for candidate in {shlex.quote(checkpoint_dir)}/checkpoint*.pt; do",
        "    if [ \"$candidate\" != \"$last\" ] && hpc_whole_zip \"$candidate\" && "
        "{ [ -z \"$newest\" ] || [ \"$candidate\" -nt \"$newest\" ]; }; then newest=$candidate; fi",
        "  done",
        "  if [ -n \"$newest\" ]; then",
        "    cp \"$newest\" \"$last.tmp\" && mv \"$last.tmp\" \"$last\"",
        f"    echo \"hpc: {RESTORED_NAME} was incomplete (a stop during fairseq's copy): resuming from $newest\"",
        "  else",
        "    mv \"$last\" \"$last.incomplete\"",
        f"    echo \"hpc: {RESTORED_NAME} was incomplete and no complete checkpoint is left: moved aside to "
        f"{RESTORED_NAME}.incomplete, training starts over\"",
        "  fi",
        "fi",
    ]
