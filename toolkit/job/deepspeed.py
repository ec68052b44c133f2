"""A recipe's `deepspeed:` section -> the DeepSpeed config file of one job, and the args that point at it.

The config is generated per job because its batch arithmetic depends on the world size: DeepSpeed asserts
train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size, so the
accumulation is derived (global / (micro x world)) and a node count that does not divide is refused with the
node counts that do. Everything else in `config` is passed through for DeepSpeed itself to validate.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.job.scaling import Derived, exact_accumulation
from toolkit.recipes.schema import DeepSpeed

# DeepSpeed's activation_checkpointing section with its own defaults written out: the section configures
# deepspeed.checkpointing; the training script's switch (checkpointing_arg) is what wraps the layers.
ACTIVATION_CHECKPOINTING = {"partition_activations": False, "contiguous_memory_optimization": False,
                            "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False, "profile": False}


def deepspeed_config(ds: DeepSpeed, *, nodes: int, ranks_per_node: int, max_nodes: int) -> tuple[dict[str, Any], int]:
    """The config dict for `nodes` nodes, and its gradient accumulation steps."""
    steps = exact_accumulation("gradient_accumulation_steps", ds.global_batch, ds.micro_batch,
                               "micro_batch", "samples", nodes=nodes, ranks_per_node=ranks_per_node,
                               max_nodes=max_nodes)
    config: dict[str, Any] = {"train_batch_size": ds.global_batch, "train_micro_batch_size_per_gpu": ds.micro_batch,
                              "gradient_accumulation_steps": steps}
    config.update(ds.config)
    config["zero_optimization"] = {"stage": ds.zero_stage, **(ds.config.get("zero_optimization") or {})}
    if ds.activation_checkpointing:
        config["activation_checkpointing"] = {**ACTIVATION_CHECKPOINTING,
                                              **(ds.config.get("activation_checkpointing") or {})}
    return config, steps


def deepspeed_parts(ds: DeepSpeed, config_path: str, *, nodes: int, ranks_per_node: int,
                    max_nodes: int) -> tuple[str, dict[str, Any], list[Derived]]:
    """(config file text, args to add, derived values) for a job of `nodes` nodes."""
    config, steps = deepspeed_config(ds, nodes=nodes, ranks_per_node=ranks_per_node, max_nodes=max_nodes)
    world = nodes * ranks_per_node
    args: dict[str, Any] = {ds.config_arg: config_path}
    derived = [
        Derived("gradient_accumulation_steps", str(steps), f"{ds.global_batch} samples per update / (micro_batch "
                f"{ds.micro_batch} x {world} ranks): keeps the global batch when --nodes changes"),
        Derived("zero stage", str(ds.zero_stage), "deepspeed.zero_stage of the recipe"),
        Derived(ds.config_arg, config_path, "the generated DeepSpeed config, written by the job's set-up"),
    ]
    if ds.activation_checkpointing:
        args[ds.checkpointing_arg] = True
        derived.append(Derived(ds.checkpointing_arg, "set", "deepspeed.activation_checkpointing: the script wraps "
                                                          "its layers; the config's section tunes DeepSpeed's side"))
    return json.dumps(config, indent=2), args, derived
