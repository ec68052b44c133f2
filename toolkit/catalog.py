"""The instance catalog: public facts per EC2 instance type, read from catalog.yaml (the only place they live)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from toolkit.errors import HpcError

Accelerator = Literal["nvidia", "gaudi", "neuron", "qualcomm", "none"]


@dataclasses.dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: Accelerator
    gpus: int
    vcpus: int
    cores: int
    memory_gib: int
    network_gbps: int
    network_cards: int
    efa_interfaces: int
    gpudirect_rdma: bool
    proprietary_driver: bool
    gpu_model: str | None = None
    gpu_memory_gib: int | None = None
    instance_store_gb: int = 0
    network_interfaces: int | None = None
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    burstable: bool = False  # t2/t3: no cluster placement groups

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def is_gpu(self) -> bool:
        return self.accelerator == "nvidia"

    @property
    def threads_per_core(self) -> int:
        return self.vcpus // self.cores


@dataclasses.dataclass(frozen=True)
class FloorAtSize:
    """One message size of a floor: the published healthy busbw at that size and the floor set under it."""

    bytes: int
    published_busbw_gbs: float
    floor_busbw_gbs: float


@dataclasses.dataclass(frozen=True)
class NcclFloor:
    """The all-reduce bus bandwidth a healthy fabric reaches (see the nccl_floors comment in catalog.yaml)."""

    instance: str
    transport: Literal["efa", "tcp"]
    min_nodes: int
    sizes: tuple[FloorAtSize, ...]  # ascending by bytes
    source: str
    estimate: bool = False
    max_nodes: int | None = None  # None: any count from min_nodes

    def covers(self, nodes: int) -> bool:
        return self.min_nodes <= nodes and (self.max_nodes is None or nodes <= self.max_nodes)

    def at(self, size: int) -> FloorAtSize | None:
        """The floor for a run whose largest message is `size` bytes: the one measured at the largest size up to
        it (busbw rises with the message size, so a floor measured at a smaller size is the safe side), or None
        when the run stopped under every measured size."""
        return next((s for s in reversed(self.sizes) if s.bytes <= size), None)


# A type the packaged catalog lacks is added by the user, never by editing the installed package: a YAML file with
# the catalog's own layout (`instances: {TYPE: {field: value}}`), named by $HPC_INSTANCE_FACTS, else
# ~/.config/hpc/instances.yaml ($XDG_CONFIG_HOME/hpc/instances.yaml) when it exists.
FACTS_ENV = "HPC_INSTANCE_FACTS"
TYPE_NAME = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")  # EC2's form: family[-variant].size, e.g. p6-b200.48xlarge
_CHOICES = {"accelerator": ("nvidia", "gaudi", "neuron", "qualcomm", "none"), "architecture": ("x86_64", "arm64")}


@functools.cache
def _catalog_data() -> dict:
    from toolkit.cache import cached_json

    # Read on every plan: ~0.05 s even with libyaml's reader (PyYAML builds its ~4,000 objects in Python), ~1 ms
    # from the JSON the user's cache keeps of it (toolkit.cache; keyed by the file's content).
    return cached_json("catalog", resources.files("toolkit").joinpath("catalog.yaml").read_text(), _parse_yaml)


def _parse_yaml(text: str) -> dict:
    import yaml

    # libyaml's safe loader where PyYAML was built with it (its wheels are): PyYAML's pure-Python one is ~3x slower
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def user_facts_file() -> Path | None:
    """The user's instance facts file: $HPC_INSTANCE_FACTS (which must exist), else the default file if it exists."""
    named = os.environ.get(FACTS_ENV)
    if named:
        return Path(named)
    try:
        default = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hpc" / "instances.yaml"
    except RuntimeError:  # no home (no $HOME, a uid without a passwd entry): no default file
        return None
    return default if default.is_file() else None


def facts_hint() -> str:
    where = user_facts_file()
    return (f"add the type's facts to {where}" if where else
            f"put the type's facts in ~/.config/hpc/instances.yaml (or a file named by ${FACTS_ENV})") + \
        " under `instances:`, with the fields of toolkit/catalog.yaml's entries (from the EC2 instance type pages)"


def _field_types() -> dict[str, tuple[type, bool]]:
    """Each InstanceType field (but name) -> (its value type, required)."""
    kinds = {"int": int, "bool": bool, "str": str}
    found = {}
    for field in dataclasses.fields(InstanceType):
        if field.name == "name":
            continue
        text = str(field.type)
        kind = next((k for k in kinds if text.startswith(k)), "str")  # Literal[...] and str | None are text
        found[field.name] = (kinds[kind], field.default is dataclasses.MISSING)
    return found


def _entry_problem(name: Any, facts: Any) -> str | None:
    """What is wrong with one catalog entry, in words, or None."""
    if not isinstance(name, str) or not TYPE_NAME.match(name):
        return f"{name!r} is not an EC2 instance type name (family.size, lower case, e.g. p6-b200.48xlarge)"
    if not isinstance(facts, dict):
        return f"{name}: its facts must be a mapping of field: value"
    fields = _field_types()
    for key, value in facts.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            return f"{name}: unknown field {key!r}" + (f" (did you mean {close[0]}?)" if close else "")
        kind, _ = fields[key]
        if value is None and key in ("gpu_model", "gpu_memory_gib", "network_interfaces"):
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"{name}: {key} must be a whole number, 0 or more (got {value!r})"
        if kind is bool and not isinstance(value, bool):
            return f"{name}: {key} must be true or false (got {value!r})"
        if kind is str and not isinstance(value, str):
            return f"{name}: {key} must be text (got {value!r})"
        if key in _CHOICES and value not in _CHOICES[key]:
            return f"{name}: {key} must be one of {', '.join(_CHOICES[key])} (got {value!r})"
    missing = [key for key, (_, required) in fields.items() if required and key not in facts]
    if missing:
        return f"{name}: missing field(s) {', '.join(missing)}"
    if facts["cores"] < 1 or facts["vcpus"] % facts["cores"]:
        return f"{name}: vcpus ({facts['vcpus']}) must be a whole multiple of cores ({facts['cores']})"
    if (facts["gpus"] > 0) != (facts["accelerator"] != "none"):
        return f"{name}: gpus ({facts['gpus']}) and accelerator ({facts['accelerator']}) disagree"
    return None


def _entries(data: Any, source: str) -> dict[str, InstanceType]:
    """The instance types of a catalog document (`instances: {...}`), each entry checked; HpcError on the first
    problem, naming the file and the entry."""
    fix = "write it like toolkit/catalog.yaml's entries: `instances:` then TYPE: {accelerator, gpus, vcpus, ...}"
    if not isinstance(data, dict) or not isinstance(data.get("instances"), dict):
        raise HpcError(f"{source}: an instance facts file is a mapping with an `instances:` mapping of types", fix=fix)
    for name, facts in data["instances"].items():
        problem = _entry_problem(name, facts)
        if problem:
            raise HpcError(f"{source}: instances/{problem}", fix=fix)
    return {name: InstanceType(name=name, **facts) for name, facts in data["instances"].items()}


@functools.cache
def _packaged() -> dict[str, InstanceType]:
    return _entries(_catalog_data(), "toolkit/catalog.yaml")


@functools.lru_cache(maxsize=4)
def _user_entries(path: str, stamp: tuple[int, int]) -> dict[str, InstanceType]:
    import yaml

    from toolkit.textfile import read_text

    text = read_text(Path(path), "instance facts file", fix=f"point ${FACTS_ENV} at your instance facts file, "
                     "or unset it")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise HpcError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML",
                       fix="fix the YAML at that line (indentation, a missing ':')") from None
    entries = _entries(data, path)
    clash = sorted(set(entries) & set(_packaged()))
    if clash:
        raise HpcError(f"{path}: {', '.join(clash)} is already in the toolkit's catalog",
                       fix="remove it from your file (the packaged facts are used); if they are wrong, report it")
    return entries


def catalog() -> dict[str, InstanceType]:
    """Every known instance type: the packaged catalog, then the user's facts file (see user_facts_file)."""
    path = user_facts_file()
    if path is None:
        return _packaged()
    if not path.is_file():
        raise HpcError(f"${FACTS_ENV} names {path}, which is not a file",
                       fix=f"point ${FACTS_ENV} at your instance facts file, or unset it")
    stat = path.stat()
    return _packaged() | _user_entries(str(path), (stat.st_mtime_ns, stat.st_size))


@functools.cache
def nccl_floors() -> tuple[NcclFloor, ...]:
    floors = []
    for entry in _catalog_data().get("nccl_floors", []):
        sizes = tuple(sorted((FloorAtSize(**s) for s in entry["sizes"]), key=lambda s: s.bytes))
        floors.append(NcclFloor(**{**entry, "sizes": sizes}))
    return tuple(floors)


def nccl_floors_for(instance_type: str, transport: str) -> tuple[NcclFloor, ...]:
    """The floors of an instance type (validated against the catalog) over a transport, one per node-count range."""
    instance(instance_type)
    return tuple(f for f in nccl_floors() if f.instance == instance_type and f.transport == transport)


def nccl_floor(instance_type: str, transport: str, nodes: int) -> NcclFloor | None:
    """The floor for a run on `nodes` nodes (a 2-node figure does not hold for more nodes), or None if none is known."""
    return next((f for f in nccl_floors_for(instance_type, transport) if f.covers(nodes)), None)


@dataclasses.dataclass(frozen=True)
class Price:
    """An instance hour's price (catalog.yaml `prices`: USD, Linux, us-east-1), with its date and source."""

    instance: str
    usd_per_hour: float
    kind: Literal["on_demand", "capacity_block"]
    as_of: str
    source: str


def price(instance_type: str, kind: Literal["on_demand", "capacity_block"] = "on_demand") -> Price | None:
    """The catalog's price of an instance hour, or None where it lists none (the planner then says "no price")."""
    section = (_catalog_data().get("prices") or {}).get(kind) or {}
    value = (section.get("usd_per_hour") or {}).get(instance_type)
    if value is None:
        return None
    return Price(instance_type, float(value), kind, str(section.get("as_of")), " ".join(str(section.get("source"))
                                                                                        .split()))


# Families whose facts (accelerators per node, EFA interfaces) a queue cannot do without: GPUs (p, g, gr), Trainium,
# Inferentia, Gaudi (dl), FPGAs (f), video transcoders (vt).
ACCELERATED_FAMILY = re.compile(r"^(p|g|gr|trn|inf|dl|f|vt)\d")


@functools.cache
def ec2_type_names() -> frozenset[str]:
    """Every EC2 instance type name, offline: the InstanceType enum of botocore's EC2 service model (botocore comes
    with aws-parallelcluster, the admin extra; 1,437 names in botocore 1.44.8). Empty without botocore: the
    catalog alone is known then."""
    try:
        from botocore.exceptions import DataNotFoundError
        from botocore.loaders import Loader
    except ImportError:
        return frozenset()
    try:
        model = Loader().load_service_model("ec2", "service-2")
    except DataNotFoundError:
        return frozenset()
    return frozenset(model.get("shapes", {}).get("InstanceType", {}).get("enum", ()))


def is_accelerated(name: str) -> bool:
    return bool(ACCELERATED_FAMILY.match(name))


def suggestion(name: str) -> str | None:
    """The type the user probably meant: the same name in another case, else the closest spelling among every EC2
    type (the catalog's where botocore is missing). None for a real type: nothing to correct."""
    known = catalog()
    names = set(known) | ec2_type_names()
    if name in names:
        return None
    same = sorted(k for k in names if k.lower() == name.lower())
    if same:
        return same[0]
    close = difflib.get_close_matches(name.lower(), sorted(names), n=1, cutoff=0.8)
    return close[0] if close else None


def family_types(name: str) -> list[str]:
    """The catalog's types of the family of `name` (p5en.48xlarge -> p5en's), for a fix to point at."""
    family = name.split(".")[0]
    return sorted(k for k in catalog() if k.split(".")[0] == family)


def instance(name: str) -> InstanceType:
    """The catalog entry for an instance type, or an error with the type the user probably meant."""
    try:
        return catalog()[name]
    except KeyError:
        if name in ec2_type_names():
            same = family_types(name)
            raise HpcError(f"instance type {name} is a real EC2 type the toolkit's catalog lacks: its facts (vCPUs, "
                           "cores, accelerators, EFA) are unknown here", fix=facts_hint() + (
                               f"; or use a type the catalog has: {', '.join(same)}" if same else "")) from None
        guess = suggestion(name)
        hint = f"if {name} is a real EC2 instance type the catalog lacks, {facts_hint()}"
        fix = f"did you mean {guess}? ({hint})" if guess else f"use one of: {', '.join(sorted(catalog()))}; or, {hint}"
        raise HpcError(f"instance type {name!r} is not in the toolkit's catalog", fix=fix) from None
