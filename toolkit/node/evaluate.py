"""One node's facts (toolkit.node.node_check) judged against what its queue declares: a list of checks.

Statuses: ok; FAIL (the queue needs it and it is missing or wrong: the doctor exits 1); warn (works, but not as
declared or not as recommended); absent (not present, and this queue does not need it); n/a (the check does not
apply, e.g. no FSx file system is declared). Every FAIL and warn carries the fix.

What a queue needs follows the catalog and the queue's settings: EFA and ib_uverbs when the instance type has EFA
and the queue's efa-stack is not `none`; GPUs, NCCL and aws-ofi-nccl on NVIDIA queues (the plugin only with EFA);
the FSx mount when the cluster config declares one. efa-stack `modern` means aws-ofi-nccl >= 1.7 with
libfabric >= 1.18 (they choose the provider, RDMA and protocol themselves); older stacks are `legacy`
(toolkit.job.env sets FI_PROVIDER=efa and friends for them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from .node_check import DEVICE_TOOLS
from .promise import Promise

Status = Literal["ok", "FAIL", "warn", "absent", "n/a"]
# after the GPUs' checks, one per accelerator counted by its own tool (node_check.DEVICE_TOOLS, named by its facts key)
CHECKS = ("efa", "ib_uverbs", "gpus", "gpu-health", *DEVICE_TOOLS, "fsx", "nccl", "aws-ofi-nccl", "efa-stack")
MODERN_OFI_NCCL = (1, 7)
MODERN_LIBFABRIC = (1, 18)

FIX_EFA_SOFTWARE = ("install the EFA software with the EFA installer (aws-efa-installer, `efa_installer.sh -y`); "
                    "ParallelCluster's official AMIs include it, a custom AMI must too")
FIX_OFI_NCCL = ("install aws-ofi-nccl: recent EFA installers put it in /opt/amazon/ofi-nccl, DLAMIs in "
                "/opt/aws-ofi-nccl (or build github.com/aws/aws-ofi-nccl against the node's NCCL); the loader must "
                "find libnccl-net.so on LD_LIBRARY_PATH or in its cache (a directory in /etc/ld.so.conf.d, then "
                "`ldconfig`): `hpc cluster doctor --recipe R` asks the loader in R's job")


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """(1, 18, 2) from "1.18.2amzn1.0" or "1.7.4-aws"; None when there is no leading version."""
    match = re.match(r"(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def _first(libraries: list[dict]) -> dict | None:
    return libraries[0] if libraries else None


def _plugin(facts: dict) -> dict | None:
    """The aws-ofi-nccl NCCL would load (node_check.plugin_facts), else the first copy installed."""
    ofi = facts["aws_ofi_nccl"]
    return ofi["loaded"] or _first(ofi["installed"])


def _library(lib: dict) -> str:
    return f"{lib['version'] or 'version unknown'} ({lib['path']})"


def check_efa(facts: dict, promise: Promise, needs_efa: bool) -> Check:
    efa, expected = facts["efa"], promise.efa_interfaces
    devices = efa["fi_info_devices"] if efa["fi_info_devices"] is not None else efa["sysfs_devices"]
    if not needs_efa:
        why = (f"{promise.instance_type} has no EFA" if not promise.has_efa
               else f"queue {promise.queue} declares efa-stack none (jobs use TCP)")
        if devices:
            return Check("efa", "ok", f"{len(devices)} EFA device(s) present ({', '.join(devices)}), not used: {why}")
        return Check("efa", "absent", f"not present; not needed: {why}")
    if efa["fi_info"] is None:
        found = f" (the kernel sees {', '.join(efa['sysfs_devices'])})" if efa["sysfs_devices"] else ""
        return Check("efa", "FAIL", f"fi_info not found on PATH or in /opt/amazon/efa/bin: no EFA software{found}",
                     FIX_EFA_SOFTWARE)
    if not devices:
        reason = f": {efa['fi_info_error']}" if efa["fi_info_error"] else ""
        return Check("efa", "FAIL", f"`fi_info -p efa` finds no EFA device{reason}",
                     "enable EFA on the queue's compute resource (Efa: Enabled: true, in a placement group) and "
                     "check the efa kernel module is loaded (`lsmod | grep efa`); re-run the EFA installer if not")
    if len(devices) < expected:
        return Check("efa", "FAIL", f"{len(devices)} of {expected} EFA devices ({', '.join(devices)})",
                     f"{promise.instance_type} has {expected} EFA interfaces: the node lost some; drain and replace it "
                     "(`scontrol update nodename=NODE state=drain reason=efa`)")
    return Check("efa", "ok", f"{len(devices)} EFA device(s): {', '.join(devices)}")


def check_ib_uverbs(facts: dict, needs_efa: bool) -> Check:
    loaded = facts["ib_uverbs"]
    if not needs_efa:
        return Check("ib_uverbs", "ok" if loaded else "absent",
                     "loaded (not needed here)" if loaded else "not loaded; not needed without EFA")
    if loaded:
        return Check("ib_uverbs", "ok", "loaded")
    return Check("ib_uverbs", "FAIL", "kernel module ib_uverbs is not loaded: libfabric cannot open the EFA device",
                 "`modprobe ib_uverbs` (the EFA installer sets it to load at boot; on Ubuntu the kernel must ship "
                 "ib_uverbs.ko, the installer upgrades the kernel if not)")


def check_gpus(facts: dict, promise: Promise) -> Check:
    gpus, instance = facts["gpus"], promise
    tool = next((t for t in DEVICE_TOOLS.values() if t["accelerator"] == promise.accelerator), None)
    if tool is not None:  # its own check counts them
        return Check("gpus", "n/a", f"{promise.instance_type} has {tool['name']} accelerators: check them with "
                                    f"{tool['program']}")
    if not instance.is_gpu:
        if gpus["count"]:
            return Check("gpus", "ok", f"{gpus['count']} GPU(s) present, not used by a CPU queue")
        return Check("gpus", "absent", "no NVIDIA GPU or nvidia-smi; not needed on a CPU queue")
    expected = promise.gpus
    driver_fix = ("install NVIDIA's driver" + (
        f": {instance.gpu_model} needs the proprietary driver, which official ParallelCluster AMIs (OpenRM, "
        "3.9 and later) lack: use a CustomAmi such as a Deep Learning AMI" if instance.proprietary_driver
        else ": ParallelCluster's official AMIs include it"))
    if gpus["nvidia_smi"] is None:
        return Check("gpus", "FAIL", "nvidia-smi not found: no NVIDIA driver", driver_fix)
    if gpus["error"]:
        return Check("gpus", "FAIL", f"nvidia-smi failed: {gpus['error']}", driver_fix)
    count = gpus["count"] or 0
    names = ", ".join(sorted(set(gpus["names"]))) or "none"
    if count < expected:
        return Check("gpus", "FAIL", f"{count} of {expected} GPUs visible ({names})",
                     "a GPU fell off the bus or its driver failed (look for Xid errors in `dmesg`): drain and "
                     "replace the node (`scontrol update nodename=NODE state=drain reason=gpu`)")
    if count > expected:
        return Check("gpus", "warn", f"{count} GPUs visible, the catalog says {expected} for {promise.instance_type}",
                     "check the queue's instance type in the cluster config and toolkit/catalog.yaml")
    return Check("gpus", "ok", f"{count} x {names}")


def check_gpu_health(facts: dict, promise: Promise) -> Check:
    """Uncorrected ECC errors and row remapping (NVIDIA's GPU memory error recovery guide: a pending remap needs a
    GPU reset, a failed one a new GPU); facts from toolkit.node.node_check.gpu_facts."""
    if not promise.is_gpu:
        return Check("gpu-health", "n/a", "no NVIDIA GPUs on this queue")
    health = facts["gpus"].get("health") or []
    if not health:
        return Check("gpu-health", "n/a", "nvidia-smi reported no per-GPU memory health")
    bad = []
    for gpu in health:
        what = [f"{gpu['ecc_uncorrected']} uncorrected ECC error(s)" if gpu["ecc_uncorrected"] else "",
                "row remapping failed" if gpu["remap_failure"] else "",
                "a row remap pending (needs a GPU reset)" if gpu["remap_pending"] else ""]
        if any(what):
            bad.append(f"GPU {gpu['index']} ({gpu['bus_id']}): {', '.join(w for w in what if w)}")
    if bad:
        return Check("gpu-health", "FAIL", "; ".join(bad),
                     "drain the node (`scontrol update nodename=NODE state=drain reason=gpu-ecc`): a pending remap "
                     "clears with a GPU reset (`nvidia-smi -r` with no process on it, or a reboot); a failed remap "
                     "or uncorrected errors that return mean the GPU must be replaced")
    return Check("gpu-health", "ok", f"{len(health)} GPU(s): no uncorrected ECC error, no row remap pending or failed")


def check_device_tool(facts: dict, promise: Promise, key: str) -> Check:
    """The devices of a DEVICE_TOOLS entry, as its tool counted them (node_check.device_tool_facts), against the
    catalog's count for the queue's instance type."""
    tool = DEVICE_TOOLS[key]
    if promise.accelerator != tool["accelerator"]:
        return Check(key, "n/a", f"no {tool['name']} accelerators on this queue")
    found, expected, fix = facts.get(key) or {}, promise.gpus, tool["fix"]
    if not found.get(tool["found_as"]):
        return Check(key, "FAIL", f"{tool['program']} not found: {tool['tools']}", fix)
    if found.get("error"):
        return Check(key, "FAIL", f"{tool['program']} failed: {found['error']}", fix)
    if (found.get("count") or 0) < expected:
        return Check(key, "FAIL", f"{found.get('count') or 0} of {expected} {tool['devices']} visible", fix)
    return Check(key, "ok", f"{found['count']} {tool['device']}(s)")


def check_fsx(facts: dict, promise: Promise) -> Check:
    mount = promise.fsx_mount
    if mount is None:
        return Check("fsx", "n/a", "the cluster config declares no FSx for Lustre storage")
    fstype = facts["mounts"].get(mount)
    if fstype == "lustre":
        return Check("fsx", "ok", f"{mount} mounted (lustre)")
    elsewhere = sorted(d for d, t in facts["mounts"].items() if t == "lustre" and d != mount)
    also = f"; Lustre is mounted at {', '.join(elsewhere)}" if elsewhere else ""
    state = f"is {fstype}, not lustre" if fstype else "is not mounted"
    return Check("fsx", "FAIL", f"{mount} {state}{also}",
                 f"FSx for Lustre did not mount at {mount}: check the file system is AVAILABLE, its security group "
                 "allows Lustre (TCP 988) from the nodes, and the node's Lustre client (`lsmod | grep lustre`); "
                 "ParallelCluster logs the mount in /var/log/cloud-init-output.log")


def check_nccl(facts: dict, promise: Promise) -> Check:
    lib = _first(facts["nccl"])
    if not promise.is_gpu:
        return Check("nccl", "ok" if lib else "absent",
                     f"{_library(lib)}, not used by a CPU queue" if lib else "not present; CPU queues use gloo")
    if lib is None:
        return Check("nccl", "warn", "no libnccl.so on LD_LIBRARY_PATH or in /opt/nccl, /usr/local/cuda or the "
                                     "system library dirs: PyTorch's pip wheels bring their own, nccl-tests and "
                                     "aws-ofi-nccl builds need one",
                     "install NCCL (NVIDIA's libnccl2 package, or a DLAMI which ships it with CUDA)")
    others = {x["version"] for x in facts["nccl"][1:]} - {lib["version"]}
    if others:
        return Check("nccl", "warn", f"{_library(lib)}; other versions also installed: {', '.join(map(str, others))}",
                     "keep one NCCL on the library path: mixed versions make ranks disagree")
    return Check("nccl", "ok", _library(lib))


def check_ofi_nccl(facts: dict, promise: Promise, needs_efa: bool) -> Check:
    """FAIL only when the loader would not give NCCL its plugin: not resolved by the names NCCL dlopens (through
    LD_LIBRARY_PATH, the ld.so cache, the system directories), nor installed where EFA jobs' LD_LIBRARY_PATH
    points (the promise's plugin_dirs, toolkit.job.env.OFI_NCCL_DIRS: the doctor runs without a job's environment,
    the pre-flight with it)."""
    ofi, lib = facts["aws_ofi_nccl"], _plugin(facts)
    if not (promise.is_gpu and needs_efa):
        why = "CPU queues do not use NCCL" if not promise.is_gpu else "NCCL uses TCP without EFA"
        return Check("aws-ofi-nccl", "ok" if lib else "absent",
                     f"{_library(lib)}, not used: {why}" if lib else f"not present; not needed: {why}")
    if ofi["loaded"]:
        return Check("aws-ofi-nccl", "ok", f"{_library(ofi['loaded'])}, found by the loader through "
                                           f"{ofi['loaded']['found_by']}")
    names = " or ".join(ofi["names"]) or "no name (NCCL_NET_PLUGIN=none)"
    cache = f"; the ld.so cache could not be read: {ofi['ld_cache_error']}" if ofi["ld_cache_error"] else ""
    on_job_path = [copy for copy in ofi["installed"] if copy["path"].rsplit("/", 1)[0] in promise.plugin_dirs]
    if on_job_path:
        return Check("aws-ofi-nccl", "ok", f"{_library(on_job_path[0])}: EFA jobs put its directory on "
                                           "LD_LIBRARY_PATH (whether a job loads it: `hpc cluster doctor --recipe R`)")
    if ofi["installed"]:
        return Check("aws-ofi-nccl", "FAIL", f"{_library(ofi['installed'][0])} is installed, but the loader "
                                             f"resolves no {names} (LD_LIBRARY_PATH, ld.so cache, system "
                                             f"directories){cache}: NCCL cannot load it",
                     "list its directory in /etc/ld.so.conf.d/ and run `ldconfig`, or add it to the recipe's "
                     "software.library_path")
    return Check("aws-ofi-nccl", "FAIL", f"the loader resolves no {names} (aws-ofi-nccl){cache}: NCCL falls back "
                                         "to TCP sockets, about a third of EFA's bandwidth, or stops where NCCL_NET "
                                         "names the plugin", FIX_OFI_NCCL)


def installed_stack(facts: dict) -> str | None:
    """modern | legacy from the aws-ofi-nccl and libfabric versions found; None when they cannot tell."""
    ofi = version_tuple((_plugin(facts) or {}).get("version"))
    fabric = version_tuple(facts["efa"]["libfabric_version"])
    if ofi is None:
        return None
    if ofi < MODERN_OFI_NCCL:
        return "legacy"
    return "modern" if fabric is None or fabric >= MODERN_LIBFABRIC else "legacy"


def check_efa_stack(facts: dict, promise: Promise) -> Check:
    declared, has_efa, gpu = promise.efa_stack, promise.has_efa, promise.is_gpu
    found = installed_stack(facts)
    versions = (f"aws-ofi-nccl {(_plugin(facts) or {}).get('version') or '-'}, "
                f"libfabric {facts['efa']['libfabric_version'] or '-'}")
    if not gpu:
        return Check("efa-stack", "n/a", f"declared {declared}; the EFA/NCCL environment only matters to NCCL jobs")
    if not has_efa:
        return Check("efa-stack", "n/a", f"{promise.instance_type} has no EFA: NCCL uses TCP")
    if declared == "none":
        if facts["efa"]["fi_info_devices"]:
            return Check("efa-stack", "warn", f"queue declares efa-stack none, but this node has working EFA "
                                              f"({versions}): jobs run over TCP at about a third of the bandwidth",
                         f"tag the queue hpc:efa-stack={found or 'modern'} in the cluster config")
        return Check("efa-stack", "ok", "declared none: jobs use TCP")
    if found is None:
        return Check("efa-stack", "warn", f"declared {declared}; cannot tell what is installed ({versions})",
                     "install aws-ofi-nccl (see the aws-ofi-nccl check); NCCL INFO logs print its version")
    if found == declared:
        return Check("efa-stack", "ok", f"declared {declared}, found {found} ({versions})")
    if declared == "modern" and (version_tuple((_plugin(facts) or {}).get("version")) or ()) < MODERN_OFI_NCCL:
        # NCCL loads and runs an older plugin: the job runs, without the FI_PROVIDER=efa and NCCL_PROTO=simple
        # that toolkit.job.env gives a legacy queue's jobs for it; not a reason to stop every job on the node.
        return Check("efa-stack", "warn", f"declared modern, found legacy ({versions}): the aws-ofi-nccl NCCL loads "
                                          "is older than modern's 1.7, and jobs will not set FI_PROVIDER=efa and "
                                          "NCCL_PROTO=simple, which it wants",
                     "upgrade the EFA installer and aws-ofi-nccl (>= 1.7), or tag the queue hpc:efa-stack=legacy")
    if declared == "modern":
        return Check("efa-stack", "FAIL", f"declared modern, found legacy ({versions}): this aws-ofi-nccl needs "
                                          "libfabric >= 1.18, which the node lacks",
                     "upgrade the EFA installer (it brings libfabric), or tag the queue hpc:efa-stack=legacy")
    return Check("efa-stack", "warn", f"declared legacy, found modern ({versions}): jobs set old FI_*/NCCL knobs "
                                      "that override the tuned defaults",
                 "tag the queue hpc:efa-stack=modern in the cluster config")


def evaluate(facts: dict[str, Any], promise: Promise) -> list[Check]:
    """The checks of one node, in CHECKS order."""
    needs_efa = promise.fabric != "none"
    return [
        check_efa(facts, promise, needs_efa),
        check_ib_uverbs(facts, needs_efa),
        check_gpus(facts, promise),
        check_gpu_health(facts, promise),
        *(check_device_tool(facts, promise, key) for key in DEVICE_TOOLS),
        check_fsx(facts, promise),
        check_nccl(facts, promise),
        check_ofi_nccl(facts, promise, needs_efa),
        check_efa_stack(facts, promise),
    ]
