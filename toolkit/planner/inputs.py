"""Figures a user types, for a first estimate before any calibration (or to stand in for what one did not measure).

`--throughput-1node R` and `--busbw GB/s` name the two that matter most; every figure, those two included, can
also be given as `--assume KEY=VALUE` (repeatable) or in a YAML file of KEY: VALUE (`--inputs FILE`), the flags
winning over the file. A value may be a range, LOW..HIGH: its middle is used and its half-width becomes the
uncertainty band (the spread a calibration would have measured).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

from toolkit.errors import UsageError

# key -> what it is (the help text and the error messages say these)
KEYS: dict[str, str] = {
    "throughput_1node": "samples/s of one node (images/s, words/s), e.g. 5700..6000",
    "busbw": "all-reduce bus bandwidth between nodes in GB/s (nccl-tests' busbw), e.g. 12.5",
    "parameters": "the model's parameters (gradient bytes = parameters x 4), e.g. 25557032",
    "samples_per_epoch": "samples in one epoch of the data set, e.g. 1281167 (ImageNet-1k's training set)",
    "samples_per_rank_step": "samples each rank takes per step (per-rank batch x accumulation)",
    "hidden": "fraction of the all-reduce hidden behind backward, 0..1 (default 0: none assumed)",
    "latency_us": "the ring's per-hop latency in microseconds (default 0)",
    "loader_rate_1node": "samples/s the input pipeline of one node delivers",
    "bytes_per_sample": "bytes read per sample (e.g. 110000 for an ImageNet JPEG)",
    "fsx_mbps": "the shared file system's throughput in MB/s (default: the cluster config's FSx)",
    "shared_host": "true where all nodes share one host's cores (the local test bench)",
}


@dataclasses.dataclass(frozen=True)
class Typed:
    """A typed figure: its value and the relative half-width of its range (0 for a single number)."""

    value: float
    spread: float = 0.0
    text: str = ""


def _number(key: str, text: str, option: str | None = None) -> Typed:
    """A figure from --assume KEY=VALUE or the file, or from its own option (`option`: --throughput-1node): the
    errors name what the user wrote."""
    raw = str(text).strip()
    said = f"{option} {raw!r}" if option else f"{key}={raw!r}"
    if key == "shared_host":
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise UsageError(f"{said} is not true or false", fix="write shared_host=true")
        return Typed(1.0 if raw.lower() in ("true", "1", "yes") else 0.0, text=raw)
    try:
        if ".." in raw:
            low_text, high_text = raw.split("..", 1)
            low, high = float(low_text.replace(",", "")), float(high_text.replace(",", ""))
            if not 0 < low <= high:
                raise ValueError
            middle = (low + high) / 2
            return Typed(middle, (high - low) / 2 / middle, raw)
        value = float(raw.replace(",", ""))
    except ValueError:
        example = f"{option} 1300 or 1200..1400" if option else f"--assume {key}=1300 or {key}=1200..1400"
        raise UsageError(f"{said} is not a positive number or a range LOW..HIGH",
                         fix=f"e.g. {example} ({KEYS[key]})") from None
    if value < 0 or (value == 0 and key not in ("hidden", "latency_us")):
        raise UsageError(f"{said} must be above 0", fix=f"{key}: {KEYS[key]}")
    if key == "hidden" and value > 1:
        raise UsageError(f"{said} is a fraction: 0..1", fix="e.g. --assume hidden=0.5")
    return Typed(value, text=raw)


def parse(assume: Sequence[str], file: Path | None = None, **flags: str | float | None) -> dict[str, Typed]:
    """The typed figures: the file's, then each --assume, then the named flags (the last word wins)."""
    given: dict[str, Any] = {}
    if file is not None:
        import yaml

        try:
            data = yaml.safe_load(file.read_text())
        except OSError as exc:
            raise UsageError(f"cannot read --inputs {file}: {exc.strerror}", fix="give an existing YAML file") from None
        except yaml.YAMLError as exc:
            raise UsageError(f"--inputs {file} is not YAML: {exc}", fix="write KEY: VALUE lines") from None
        if not isinstance(data, Mapping):
            raise UsageError(f"--inputs {file} is not a mapping of KEY: VALUE", fix=f"keys: {', '.join(KEYS)}")
        given.update(data)
    for item in assume:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--assume {item!r} is not KEY=VALUE", fix="e.g. --assume parameters=25557032")
        given[key.strip()] = value
    given.update({k: v for k, v in flags.items() if v is not None})
    options = {k: "--" + k.replace("_", "-") for k, v in flags.items() if v is not None}
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(KEYS), n=1)
        raise UsageError(f"unknown input {unknown[0]!r}" + (f" (did you mean {close[0]}?)" if close else ""),
                         fix=f"the inputs: {', '.join(KEYS)}")
    return {key: _number(key, str(value), options.get(key)) for key, value in given.items()}
