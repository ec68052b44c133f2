"""Flag values that `hpc cluster config` and `hpc cluster queue add|set` share, checked in one place.

A bad value given on the command line is a usage error (exit 2) that names the flag and the value; a problem
found in a file is exit 1. Instance types are looked up in the catalog (toolkit.catalog: the packaged facts plus
the user's facts file) in any case, and written in the catalog's spelling.
"""

from __future__ import annotations

import re

from toolkit.catalog import (InstanceType, catalog, ec2_type_names, facts_hint, family_types, is_accelerated,
                             suggestion)
from toolkit.errors import UsageError

# ParallelCluster's rule for queue names (pcluster/validators/cluster_validators.py, QueueNameValidator): lower case,
# digits and '-', starting with a letter, at most 25 characters.
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,24}$")
# ParallelCluster's schema pattern for subnet ids (pcluster/schemas/common_schema.py, "subnet_id").
SUBNET_ID = re.compile(r"^subnet-[0-9a-z]{8}$|^subnet-[0-9a-z]{17}$")
RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")  # a capacity reservation id, Capacity Blocks' too


def instance_type(value: str, option: str, given: str | None = None) -> InstanceType:
    """The catalog entry for an instance type given as `option` (`given`: the whole flag value it came in)."""
    known = catalog()
    found = known.get(value) or next((it for name, it in known.items() if name.lower() == value.lower()), None)
    if found is None:
        if value in ec2_type_names():
            raise _lacks_facts(value, option, given)
        raise _not_a_type(value, option, given)
    return found


def _not_a_type(value: str, option: str, given: str | None) -> UsageError:
    """A name neither the catalog nor EC2's full list (botocore's) has: a typo, with the closest real name."""
    guess = suggestion(value)
    listed = "the toolkit's catalog" + (" nor among EC2's instance types" if ec2_type_names() else "")
    hint = f"if {value} is a real EC2 instance type the catalog lacks, {facts_hint()}"
    return UsageError(f"{option} {given or value!r}: instance type {value!r} is not in {listed}",
                      fix=f"did you mean {option} {(given or value).replace(value, guess, 1)}?" + (
                          "" if ec2_type_names() else f" ({hint})") if guess else hint)


def _lacks_facts(value: str, option: str, given: str | None) -> UsageError:
    """A real EC2 type the catalog lacks where its facts are needed (a new queue's EFA and GPUs; an accelerator)."""
    same = family_types(value)
    return UsageError(f"{option} {given or value!r}: {value} is a real EC2 instance type the toolkit's catalog lacks; "
                      + ("its accelerators per node and EFA interfaces, which a GPU (accelerator) queue needs, are "
                         "unknown here" if is_accelerated(value) else "its facts (vCPUs, cores, EFA) are needed here"),
                      fix=facts_hint() + (f"; or use a type the catalog has: {', '.join(same)}" if same else ""))


def queue_instance_type(value: str, option: str) -> tuple[str, InstanceType | None]:
    """An instance type for an existing queue's compute resource: (its name, its catalog facts). A real EC2 type the
    catalog lacks (EC2's full list: catalog.ec2_type_names) is accepted for a CPU queue without facts (the config's
    validation says once what is unknown: checks.unknown_instance_types); an accelerated one is refused, as is a
    typo."""
    known = catalog()
    found = known.get(value) or next((it for name, it in known.items() if name.lower() == value.lower()), None)
    if found is not None:
        return found.name, found
    if value not in ec2_type_names():
        raise _not_a_type(value, option, None)
    if is_accelerated(value):
        raise _lacks_facts(value, option, None)
    return value, None


def queue_name(name: str, option: str, given: str) -> str:
    if QUEUE_NAME.match(name):
        return name
    fixed = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    fixed = (fixed if fixed[:1].isalpha() else f"q-{fixed}")[:25].rstrip("-")
    raise UsageError(f"{option} {given!r}: queue name {name!r} is not allowed by ParallelCluster (lower-case "
                     "letters, digits and '-', starting with a letter, at most 25 characters)",
                     fix=f"e.g. {option} {given.replace(name, fixed, 1)}")


def subnet_id(value: str, option: str) -> str:
    if not SUBNET_ID.match(value):
        raise UsageError(f"{option} {value!r} is not a subnet id ('subnet-' and 8 or 17 lower-case letters or "
                         "digits)", fix=f"give the id the VPC console or `aws ec2 describe-subnets` shows, e.g. "
                         f"{option} subnet-0123456789abcdef0")
    return value


def reservation_id(value: str, option: str) -> str:
    if not RESERVATION.match(value):
        what = "the Capacity Block you bought" if option == "--capacity-block" else \
            "a targeted On-Demand Capacity Reservation"
        raise UsageError(f"{option} {value!r} is not a capacity reservation id",
                         fix=f"give the reservation id of {what}, e.g. {option} cr-0123456789abcdef0")
    return value
