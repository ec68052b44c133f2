"""`hpc cluster diff OLD NEW`: what `pcluster update-cluster` would say about moving a cluster from OLD to NEW.

Computed offline by ParallelCluster's own code: pcluster.config.config_patch.ConfigPatch lists the changes and
checks each with the UpdatePolicy its schema attaches to the key. The policies ask the cluster a few things
that pcluster would read from AWS (is compute capacity running, are login nodes running, is the head node
stopped); here a stand-in cluster answers what the admin declares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

from toolkit.cluster.configfile import read_config
from toolkit.errors import HpcError, UsageError

STATES = ("running", "stopped")
CLUSTER_NAME = "hpc-offline"  # pcluster only uses the name to build its schema


class DeclaredCluster:
    """Stands in for pcluster.models.cluster.Cluster in ConfigPatch: the states pcluster would ask EC2 and
    the compute fleet status table for are the ones the admin declares."""

    def __init__(self, fleet: str, login_nodes: str, head_node: str, name: str = CLUSTER_NAME):
        self.name = self.stack_name = name
        self.fleet, self.login_nodes = fleet, login_nodes
        self.head_node_instance = type("DeclaredHeadNode", (), {"state": head_node})()

    def has_running_capacity(self) -> bool:
        return self.fleet == "running"

    def has_running_login_nodes(self, pool_name: str | None = None) -> bool:
        return self.login_nodes == "running"


@dataclasses.dataclass
class Change:
    path: str  # key path, list items by name: Scheduling/SlurmQueues[gpu]/ComputeResources[p5]/MaxCount
    old: Any  # None: added
    new: Any  # None: removed
    policy: str  # pcluster's UpdatePolicy name
    check: str  # pcluster's verdict: SUCCEEDED, ACTION NEEDED, FAILED
    reason: str | None
    action: str | None  # what to do so that update-cluster accepts it

    @property
    def accepted(self) -> bool:
        return self.check == "SUCCEEDED"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"accepted_now": self.accepted}


@dataclasses.dataclass
class UpdatePlan:
    old_file: str
    new_file: str
    declared: dict[str, str]  # fleet, login_nodes, head_node
    changes: list[Change]
    appliable: bool  # pcluster's patch_allowed: update-cluster accepts the whole update now
    notes: list[str]  # what the comparison could not check, or found wrong in OLD

    def as_dict(self) -> dict:
        return {"old_file": self.old_file, "new_file": self.new_file, "declared": self.declared,
                "appliable": self.appliable, "changes": [c.as_dict() for c in self.changes], "notes": self.notes}


def _schema_errors(config: dict, file: str) -> tuple[list[str], list[str]]:
    """(pcluster's schema errors, notes on what could not be checked) for one file, offline."""
    from toolkit.cluster.pcluster_offline import OfflineAccessError, validate

    try:
        outcome = validate(config, semantic=False)
    except OfflineAccessError as exc:  # loading wanted AWS (e.g. an existing FSx): the schema itself passed
        return [], [f"{file}: pcluster's load needs AWS ({exc.service}.{exc.operation}): not fully checked offline"]
    except Exception as exc:  # pcluster's loader failing on this input: the patch itself does not need it
        return [], [f"{file}: pcluster's schema load failed to run ({type(exc).__name__}: {exc})"]
    return ([f"{r.path or '(file)'}: {r.message}" for r in outcome.results if r.level == "error"],
            [f"{file}: pcluster logged: {message}" for message in outcome.logged])


@contextlib.contextmanager
def _region(config: dict):
    """pcluster's ADC-region rule reads the region from boto3's session: give it the config's own."""
    from toolkit.cluster.pcluster_offline import region_of

    saved = os.environ.get("AWS_DEFAULT_REGION")
    os.environ["AWS_DEFAULT_REGION"] = region_of(config)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("AWS_DEFAULT_REGION", None)
        else:
            os.environ["AWS_DEFAULT_REGION"] = saved


def _label(item: Any) -> str:
    if isinstance(item, dict):
        for key in ("Name", "Key"):
            if isinstance(item.get(key), str):
                return f"[{item[key]}]"
    return ""


def _change(row: list) -> Change:
    path, key, old, new, check, reason, action, policy = row
    old, new = (None if value == "-" else value for value in (old, new))  # pcluster's "section absent"
    added_or_removed = (old is None) != (new is None)
    item = _label(new if old is None else old) if added_or_removed else ""  # name the list item
    full = "/".join([*path, f"{key}{item}"])
    return Change(full, old, new, policy, str(check), None if reason in (None, "-") else str(reason),
                  None if action is None else str(action))


def plan_update(old: str | Path, new: str | Path, fleet: str = "running", login_nodes: str | None = None,
                head_node: str = "running") -> UpdatePlan:
    """Every change from OLD to NEW with pcluster's update policy and verdict, for the declared cluster state.
    login_nodes defaults to running when OLD declares login node pools, else stopped."""
    for option, value in (("--fleet", fleet), ("--login-nodes", login_nodes), ("--head-node-state", head_node)):
        if value is not None and value not in STATES:
            raise UsageError(f"{option} {value!r} is not a state", fix=f"use one of: {', '.join(STATES)}")
    try:
        from pcluster.config.config_patch import ConfigPatch
    except ImportError:
        from toolkit.cluster.validate import INSTALL_FIX

        raise HpcError("aws-parallelcluster is not installed: the diff uses its update policies",
                       fix=INSTALL_FIX) from None
    _, base = read_config(old)
    _, target = read_config(new)
    errors, notes = _schema_errors(target, str(new))
    if errors:  # update-cluster validates the target first and stops there
        raise HpcError(f"{new} is not a valid ParallelCluster v3 config: {errors[0]}"
                       + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                       fix=f"run `hpc cluster validate {new}` and fix what it reports")
    old_errors, old_notes = _schema_errors(base, str(old))  # e.g. written for an older ParallelCluster
    notes += old_notes + [f"{old} (the cluster's current config) fails pcluster 3.16's schema: {e}"
                          for e in old_errors]
    if login_nodes is None:
        pools = (base.get("LoginNodes") or {}).get("Pools") or []
        login_nodes = "running" if any(isinstance(p, dict) and p.get("Count", 1) for p in pools) else "stopped"
    cluster = DeclaredCluster(fleet, login_nodes, head_node)
    from toolkit.cluster.pcluster_offline import pcluster_logs

    try:
        with _region(target), pcluster_logs() as logged:
            appliable, rows = ConfigPatch(cluster, base, target).check()
        notes += [f"pcluster logged: {message}" for message in dict.fromkeys(logged)]
    except Exception as exc:  # pcluster's own code failing on this pair: say so, with what made it fail
        raise HpcError(f"pcluster's update check failed to run on {old} -> {new}: {type(exc).__name__}: {exc}",
                       fix="check both files with `hpc cluster validate`; if they are valid, this is a pcluster "
                           "bug: compare the files by hand") from None
    return UpdatePlan(str(old), str(new), {"fleet": fleet, "login_nodes": login_nodes, "head_node": head_node},
                      [_change(row) for row in rows[1:]], bool(appliable), notes)
