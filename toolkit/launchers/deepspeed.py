"""A training script under DeepSpeed (launcher kind deepspeed): `python SCRIPT` per rank under srun, reading the rank
contract, with the config hpc generates from the recipe's deepspeed: section (toolkit.job.deepspeed). The config is
checked through DeepSpeed's own DeepSpeedConfig (microsoft/DeepSpeed deepspeed/runtime/config.py and its pydantic
section models), where DeepSpeed loads; the training script's own flags (e.g. an accelerator vendor's model
references) have no parser here. No Kubernetes form yet.
"""

from __future__ import annotations

import difflib
import functools
import json
from typing import Any

from toolkit.errors import HpcError
from toolkit.job.argcheck import quiet
from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.launchers.base import Launcher, under


class DeepSpeed(Launcher):
    kind = "deepspeed"
    parser = "DeepSpeed's config parser"

    def what(self, section) -> str:
        return f"the script {section.script}"

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        return ["python", under(root, section.script or "")], []

    def check_arguments(self, recipe, spec, argv: list[str]) -> list[str]:
        return check_config(recipe, spec, argv)


LAUNCHER = DeepSpeed()


@functools.lru_cache(maxsize=None)
def _deepspeed() -> tuple[Any, str]:
    with quiet():
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig
    return DeepSpeedConfig, getattr(deepspeed, "__version__", "?")


def check_config(recipe, spec, argv: list[str]) -> list[str]:
    """The generated config through DeepSpeed's own parser; the script's flags are not checked (no parser here)."""
    script = f"the script's own flags ({recipe.launcher.script}) were not checked: hpc has no parser for them"
    config_arg = recipe.deepspeed.config_arg
    path = argv[argv.index(config_arg) + 1]
    config = json.loads(next(f.text for f in spec.files if f.path == path))
    try:
        parse, version = _deepspeed()
    except Exception as exc:
        reason = "DeepSpeed is not installed" if isinstance(exc, ImportError) else f"DeepSpeed does not load ({exc})"
        return [f"arguments: not checked: {reason} where hpc runs, so neither the DeepSpeed config nor {script}"]
    # torch.distributed is not initialised here, so DeepSpeedConfig sees one rank (world size 1, whatever mpu
    # says): give it the batch keys of one rank; the job's own arithmetic for its world size is
    # toolkit.job.deepspeed's, which follows the same assertion.
    one_rank = {**config, "train_batch_size": config["train_micro_batch_size_per_gpu"]
                * config["gradient_accumulation_steps"]}
    unknown = _deepspeed_parse(parse, one_rank, version)
    notes = [f"arguments: {script}"]
    if unknown:
        notes.append(f"arguments: DeepSpeed {version} here does not know {', '.join(unknown)} (a key of another "
                     "DeepSpeed, e.g. an accelerator vendor's fork): those were not checked")
    return notes


def _deepspeed_parse(parse, config: dict[str, Any], version: str) -> list[str]:
    """Parse, setting aside keys this DeepSpeed does not know (another DeepSpeed's, e.g. an accelerator vendor's
    fork's); returns their key paths. Any other refusal is an error naming DeepSpeed's own complaint."""
    from pydantic import ValidationError

    config = json.loads(json.dumps(config))
    unknown: list[str] = []
    for _ in range(32):
        try:
            with quiet():
                parse(config)
            return unknown
        except ValidationError as exc:
            extra = [e for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not extra or len(extra) != len(exc.errors()):
                from toolkit.recipes.load import plain_error

                bad = next(e for e in exc.errors() if e["type"] != "extra_forbidden")
                where = _path_of(config, str(bad["loc"][-1])) or ".".join(str(p) for p in bad["loc"])
                raise HpcError(f"deepspeed.config.{where}: {plain_error(bad)} (DeepSpeed {version}'s own config "
                               f"parser, {exc.title})",
                               fix=f"--set deepspeed.config.{where}=VALUE with a value DeepSpeed accepts") from None
            for error in extra:  # a misspelt key of a section this DeepSpeed knows: did you mean...?
                key = str(error["loc"][-1])
                close = difflib.get_close_matches(key, _deepspeed_fields(exc.title), n=1, cutoff=0.8)
                if close:
                    where = _path_of(config, key) or key
                    raise HpcError(f"deepspeed.config.{where}: DeepSpeed {version} has no such key ({exc.title}); "
                                   f"did you mean {close[0]}?",
                                   fix=f"rename it in the recipe's deepspeed.config, or --set deepspeed.config.{where}"
                                       f"=null --set deepspeed.config.{where.rsplit(key, 1)[0]}{close[0]}=VALUE"
                                   ) from None
            popped = [path for error in extra for path in _pop_key(config, str(error["loc"][-1]))]
            if not popped:
                raise HpcError(f"the generated DeepSpeed config: DeepSpeed {version} refuses it: {exc.title} has "
                               f"no {', '.join(str(e['loc'][-1]) for e in extra)}",
                               fix="change the recipe's deepspeed: section") from None
            unknown += popped
        except (AssertionError, ValueError, KeyError, TypeError) as exc:
            raise HpcError(f"the generated DeepSpeed config: DeepSpeed {version} refuses it: {exc}",
                           fix="change the recipe's deepspeed: section") from None
    return unknown


def _deepspeed_fields(model_name: str) -> list[str]:
    """The keys (field names and aliases) of DeepSpeed's config model named `model_name`."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    stack = [DeepSpeedConfigModel]
    while stack:
        model = stack.pop()
        if model.__name__ == model_name:
            return [key for name, field in model.model_fields.items() for key in (name, field.alias) if key]
        stack += model.__subclasses__()
    return []


def _path_of(config: dict[str, Any], key: str, prefix: str = "") -> str | None:
    """The dotted path of the first `key` in the nested config."""
    for name, value in config.items():
        if name == key:
            return f"{prefix}{name}"
        if isinstance(value, dict) and (found := _path_of(value, key, f"{prefix}{name}.")):
            return found
    return None


def _pop_key(config: dict[str, Any], key: str, prefix: str = "") -> list[str]:
    """Remove `key` wherever it sits in the nested config; its dotted paths."""
    found = []
    for name, value in list(config.items()):
        path = f"{prefix}{name}"
        if name == key:
            found.append(path)
            del config[name]
        elif isinstance(value, dict):
            found += _pop_key(value, key, f"{path}.")
    return found
