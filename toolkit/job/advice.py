"""What a job's numbers imply that its flags do not say: the launcher's own findings (e.g. which limit ends a run,
toolkit.launchers) and large-batch limits.

Each finding is a Derived value (shown by `hpc recipes show`, in every plan) and, where the published setup
would not do what its flags suggest on this job, a warning (stderr, and `warnings` in --json). Flags are never
changed here: the recipe keeps what was published.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from toolkit.job.scaling import Derived
from toolkit.recipes.schema import ScalingRule

if TYPE_CHECKING:
    from toolkit.launchers.base import Launcher

# Linear LR scaling with plain SGD is published to hold up to a global batch of about 8k (Goyal et al. 2017)
# and, with warm-up and care, 16k; beyond that layer-wise optimizers (LARS, LAMB) are what the large-batch
# results (You et al. 2017; the P3dn ResNet50 post) used.
LINEAR_SCALING_LIMIT = 16384


def advise(launcher: Launcher, args: Mapping[str, Any], scaling: Mapping[str, ScalingRule], data_dir: str | None,
           world_size: int) -> tuple[list[Derived], list[str]]:
    """Every finding for a job whose program gets `args` (flag -> value, as derived) on `world_size` ranks."""
    derived, warnings = launcher.advice(args, data_dir, world_size)
    lr_rule = scaling.get("--lr")
    per_rank_arg = lr_rule.per_rank_arg if lr_rule is not None and lr_rule.rule == "linear" else None
    per_rank = args.get(per_rank_arg) if per_rank_arg is not None else None
    if isinstance(per_rank, (int, float)):
        warnings += large_batch(per_rank * world_size)
    return derived, warnings


def large_batch(global_batch: float) -> list[str]:
    """Linear LR scaling (a `linear` rule on --lr) beyond the global batch it is published to hold for."""
    if global_batch <= LINEAR_SCALING_LIMIT:
        return []
    return [f"global batch {global_batch:g} with the LR scaled linearly: linear scaling with plain SGD is published "
            f"to hold up to about 8k-16k images (Goyal et al.); beyond that accuracy drops. Use fewer ranks or a "
            f"smaller per-GPU batch (e.g. --set args.--batch-size=N so the global batch is <= "
            f"{LINEAR_SCALING_LIMIT}), or a layer-wise optimizer such as LARS (what the large-batch ResNet50 runs, "
            f"e.g. the P3dn post, used)"]
