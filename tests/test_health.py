"""The node check on fake node trees (/sys, /proc, /opt, fake fi_info and nvidia-smi), and its judgement per queue."""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cluster.queues import Queue
from toolkit.health import doctor
from toolkit.node import standalone_source
from toolkit.node.evaluate import CHECKS, evaluate, version_tuple
from toolkit.node.node_check import Node, gather
from toolkit.node.preflight import judge

P3DN = Queue("p3dn", "p3dn.24xlarge", 8, efa_stack="modern", fsx_mount="/fsx", efa_enabled=True)
P4D = Queue("p4d", "p4d.24xlarge", 8, efa_stack="modern", fsx_mount="/fsx", efa_enabled=True)
CPU = Queue("cpu", "m5.xlarge", 2, efa_stack="none", ranks_per_node=2)
FI_INFO_EFA = """provider: efa
    fabric: efa
    domain: rdmap0s6-rdm
    version: 120.10
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap0s6-dgrm
    version: 120.10
    type: FI_EP_DGRAM
    protocol: FI_PROTO_EFA
"""
V100 = "Tesla V100-SXM2-32GB"


def write(path: Path, text: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    if mode is not None:
        path.chmod(mode)
    return path


def fake_program(path: Path, outputs: dict[str, tuple[int, str]]) -> None:
    """A shell script answering each argument string with (exit code, stdout)."""
    cases = "".join(f"  {shlex.quote(args)}) printf '%s' {shlex.quote(out)}; exit {code};;\n"
                    for args, (code, out) in outputs.items())
    write(path, f'#!/bin/sh\ncase "$*" in\n{cases}  *) exit 3;;\nesac\n', 0o755)


ECC_QUERY = "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits"
REMAP_QUERY = "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure --format=csv,noheader"


def fake_nvidia_smi(root: Path, gpus: int, ecc: dict[int, int] | None = None,
                    remap: dict[int, tuple[str, str]] | None = None) -> None:
    """A stand-in for nvidia-smi (no GPU here): `-L`, and the ECC and remapped-rows queries as the real one answers
    them (per GPU `index, bus id, count`; `bus id, pending, failure`); V100s have no row remapper: [N/A]."""
    ecc, remap = ecc or {}, remap or {}
    bus = [f"00000000:{16 + i:02X}:1C.0" for i in range(gpus)]
    fake_program(root / "usr/bin/nvidia-smi", {
        "-L": (0, "".join(f"GPU {i}: {V100} (UUID: GPU-{i:08d})\n" for i in range(gpus))),
        ECC_QUERY: (0, "".join(f"{i}, {bus[i]}, {ecc.get(i, 0)}\n" for i in range(gpus))),
        REMAP_QUERY: (0, "".join(f"{bus[i]}, {', '.join(remap.get(i, ('[N/A]', '[N/A]')))}\n" for i in range(gpus))),
    })


def healthy_tree(root: Path, *, gpus: int = 8, ofi_version: str = "1.7.4-aws", libfabric: str = "1.18.2amzn1.0",
                 efa_devices: tuple[str, ...] = ("rdmap0s6",)) -> Path:
    """A p3dn-like node: EFA device + driver, ib_uverbs, fi_info, 8 V100s, FSx on /fsx, NCCL and aws-ofi-nccl."""
    (root / "sys/bus/pci/drivers/efa").mkdir(parents=True)
    for dev in efa_devices:
        (root / f"sys/class/infiniband/{dev}/device").mkdir(parents=True)
        os.symlink(root / "sys/bus/pci/drivers/efa", root / f"sys/class/infiniband/{dev}/device/driver")
    (root / "sys/module/ib_uverbs").mkdir(parents=True)
    (root / "sys/module/efa").mkdir(parents=True)
    domains = "".join(FI_INFO_EFA.replace("rdmap0s6", d) for d in efa_devices)
    fake_program(root / "opt/amazon/efa/bin/fi_info",
                 {"-p efa": (0, domains),
                  "--version": (0, f"fi_info: {libfabric}\nlibfabric: {libfabric}\nlibfabric api: 1.18\n")})
    fake_nvidia_smi(root, gpus)
    write(root / "opt/amazon/efa_installed_packages",
          "# EFA installer version: 1.26.1\n# Debug packages installed: no\n")
    write(root / "proc/mounts", "/dev/nvme0n1p1 / ext4 rw 0 0\n10.0.0.5@tcp:/abcdefgh /fsx lustre rw,flock 0 0\n")
    lib = write(root / "usr/local/cuda/lib64/libnccl.so.2.18.3", b"\x7fELF...")
    os.symlink(lib.name, root / "usr/local/cuda/lib64/libnccl.so.2")
    write(root / "opt/amazon/ofi-nccl/lib/libnccl-net.so",
          b"\x7fELF\0Initializing aws-ofi-nccl " + ofi_version.encode() + b"\0")
    return root


def plugin_library(path: Path, version: str, soname: str = "libnccl-net.so") -> Path:
    """A real ELF shared library standing in for aws-ofi-nccl: its SONAME, the net plugin symbol NCCL looks up,
    and the string the real one compiles in ("Initializing " PACKAGE_STRING: aws/aws-ofi-nccl
    src/nccl_ofi_net.cpp, PACKAGE_STRING from configure.ac's AC_INIT([aws-ofi-nccl], [VERSION]))."""
    # cc: the container lane's build installs it (testbench.containers), as `make test` runs it
    assert shutil.which("cc"), "no C compiler: `make container-lane` installs gcc"
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "plugin.c"
    source.write_text(f'const char *banner = "Initializing aws-ofi-nccl {version}";\nint ncclNetPlugin_v9 = 1;\n')
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path


def ld_so_conf(root: Path, *dirs: str) -> None:
    """/etc/ld.so.conf as Debian/Ubuntu and Amazon Linux have it, a package's file in ld.so.conf.d, and the real
    ldconfig building ROOT/etc/ld.so.cache from them (chrooted: the cache's paths are the node's)."""
    write(root / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    # the file aws-ofi-nccl's .deb installs (aws/aws-ofi-nccl contrib/debian-template/rules, before v1.17.0:
    # "/opt/amazon/ofi-nccl/lib/$(MULTIARCH_DIR)/")
    write(root / "etc/ld.so.conf.d/100_ofinccl.conf", "".join(f"{d}\n" for d in dirs))
    ldconfig = shutil.which("ldconfig", path="/sbin:/usr/sbin:/usr/bin:/bin")
    assert ldconfig, "no ldconfig (Debian's libc-bin, an essential package)"
    argv = [ldconfig, "-X", "-r", str(root)]  # -X: no symlinks made in the tree
    if os.geteuid() != 0:  # -r chroots: a user namespace gives an unprivileged user that right
        argv = ["unshare", "-r", *argv]
    res = subprocess.run(argv, capture_output=True, text=True)
    assert res.returncode == 0, f"cannot build an ld.so cache: {res.stderr.strip()}"


def node(root: Path, **env: str) -> Node:
    return Node(str(root), {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "p3dn-st-p3dn-24xl-1", **env})


def statuses(facts: dict, queue: Queue) -> dict[str, str]:
    return {c.name: c.status for c in evaluate(facts, queue.promise())}


def check(facts: dict, queue: Queue, name: str):
    return next(c for c in evaluate(facts, queue.promise()) if c.name == name)


def test_healthy_p3dn_node_passes_every_check(tmp_path):
    facts = gather(node(healthy_tree(tmp_path)), ["/fsx"])
    assert facts["node"] == "p3dn-st-p3dn-24xl-1"
    assert facts["efa"]["sysfs_devices"] == ["rdmap0s6"] and facts["efa"]["fi_info_devices"] == ["rdmap0s6"]
    assert (facts["efa"]["libfabric_version"], facts["efa"]["installer_version"]) == ("1.18.2amzn1.0", "1.26.1")
    assert facts["gpus"]["count"] == 8 and set(facts["gpus"]["names"]) == {V100}
    assert facts["nccl"] == [{"path": "/usr/local/cuda/lib64/libnccl.so.2", "version": "2.18.3"}]
    assert facts["aws_ofi_nccl"]["installed"] == [{"path": "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
                                                   "version": "1.7.4-aws"}]
    assert facts["aws_ofi_nccl"]["loaded"] is None  # a stand-in, not an ELF library: no loader takes it
    assert facts["mounts"] == {"/fsx": "lustre"}
    checks = evaluate(facts, P3DN.promise())
    assert [c.name for c in checks] == list(CHECKS)
    assert {c.name: c.status for c in checks} == {**dict.fromkeys(CHECKS, "ok"), "hpus": "n/a"}, checks
    assert "8 x Tesla V100-SXM2-32GB" in check(facts, P3DN, "gpus").detail


def test_bare_node_on_an_efa_gpu_queue_gets_findings_with_fixes_not_crashes(tmp_path):
    facts = gather(node(tmp_path), ["/fsx"])
    assert statuses(facts, P3DN) == {"efa": "FAIL", "ib_uverbs": "FAIL", "gpus": "FAIL", "gpu-health": "n/a",
                                     "hpus": "n/a", "fsx": "FAIL", "nccl": "warn", "aws-ofi-nccl": "FAIL",
                                     "efa-stack": "warn"}
    efa = check(facts, P3DN, "efa")
    assert "fi_info not found" in efa.detail and "EFA installer" in efa.fix
    gpus = check(facts, P3DN, "gpus")
    assert "nvidia-smi not found" in gpus.detail and "proprietary driver" in gpus.fix and "CustomAmi" in gpus.fix
    assert check(facts, P3DN, "fsx").detail == "/fsx is not mounted"
    assert "TCP" in check(facts, P3DN, "aws-ofi-nccl").detail
    assert all(c.fix for c in evaluate(facts, P3DN.promise()) if c.status in ("FAIL", "warn"))


def test_bare_node_on_a_cpu_queue_says_not_present_and_not_applicable(tmp_path):
    facts = gather(node(tmp_path), [])
    assert statuses(facts, CPU) == {"efa": "absent", "ib_uverbs": "absent", "gpus": "absent", "gpu-health": "n/a",
                                    "hpus": "n/a", "fsx": "n/a", "nccl": "absent", "aws-ofi-nccl": "absent",
                                    "efa-stack": "n/a"}
    assert "m5.xlarge has no EFA" in check(facts, CPU, "efa").detail


def test_gpu_memory_errors_fail_the_node_naming_each_gpu(tmp_path):
    """Stand-in GPUs (a fake nvidia-smi answering as a GPU with memory errors does): uncorrected ECC errors, a row
    remap pending or failed each fail gpu-health with the GPU's index and bus id; clean counters pass."""
    root = healthy_tree(tmp_path)
    fake_nvidia_smi(root, 8, ecc={3: 2}, remap={5: ("Yes", "No"), 6: ("0", "1")})
    facts = gather(node(root), ["/fsx"])
    assert facts["gpus"]["health"][3] == {"index": 3, "bus_id": "00000000:13:1C.0", "ecc_uncorrected": 2,
                                          "remap_pending": None, "remap_failure": None}
    health = check(facts, P3DN, "gpu-health")
    assert health.status == "FAIL" and "drain" in health.fix
    assert "GPU 3 (00000000:13:1C.0): 2 uncorrected ECC error(s)" in health.detail
    assert "GPU 5 (00000000:15:1C.0): a row remap pending" in health.detail
    assert "GPU 6 (00000000:16:1C.0): row remapping failed" in health.detail
    assert "GPU 0" not in health.detail


def test_gaudi_hpus_counted_with_hl_smi(tmp_path):
    """Stand-in hl-smi (no Gaudi here), answering `-Q index,bus_id -f csv,noheader` as the real one does."""
    dl1 = Queue("dl1", "dl1.24xlarge", 4, efa_stack="modern", efa_enabled=True)
    assert check(gather(node(tmp_path / "bare"), []), dl1, "hpus").status == "FAIL"
    for count, status in ((8, "ok"), (7, "FAIL")):
        root = tmp_path / str(count)
        fake_program(root / "usr/bin/hl-smi", {"-Q index,bus_id -f csv,noheader": (
            0, "".join(f"{i}, 0000:{16 + i:02x}:00.0\n" for i in range(count)))})
        hpus = check(gather(node(root), []), dl1, "hpus")
        assert hpus.status == status and hpus.detail.startswith(f"{count}"), hpus
    assert check(gather(node(root), []), P3DN, "hpus").status == "n/a"
    gpus = check(gather(node(root), []), dl1, "gpus")
    assert (gpus.status, gpus.detail) == ("n/a", "dl1.24xlarge has Gaudi accelerators: check them with hl-smi")


def test_accelerators_counted_by_their_own_tool_are_one_table_and_one_check_each(tmp_path):
    """node_check.DEVICE_TOOLS is the node side's one table of them: its facts keys are the checks' names (after
    the GPUs'), and a queue of another family says each does not apply, in that family's words."""
    from toolkit.node.node_check import DEVICE_TOOLS

    assert CHECKS == ("efa", "ib_uverbs", "gpus", "gpu-health", *DEVICE_TOOLS, "fsx", "nccl", "aws-ofi-nccl",
                      "efa-stack")
    assert list(DEVICE_TOOLS) == ["hpus"] and DEVICE_TOOLS["hpus"]["accelerator"] == "gaudi"
    facts = gather(node(tmp_path), [])
    assert facts["hpus"] == {"hl_smi": None, "count": None, "bus_ids": [], "error": None}
    hpus = check(facts, P3DN, "hpus")
    assert (hpus.status, hpus.detail) == ("n/a", "no Gaudi accelerators on this queue")
    dl1 = Queue("dl1", "dl1.24xlarge", 4, efa_stack="modern", efa_enabled=True)
    hpus = check(facts, dl1, "hpus")
    assert (hpus.status, hpus.detail) == ("FAIL", "hl-smi not found: no Habana driver tools")
    assert hpus.fix is not None and "habanalabs-firmware-tools" in hpus.fix


def test_efa_device_missing_or_fewer_than_the_catalog_says(tmp_path):
    root = healthy_tree(tmp_path)
    fake_program(root / "opt/amazon/efa/bin/fi_info",
                 {"-p efa": (1, "fi_getinfo: -61 (No data available)\n"), "--version": (0, "libfabric: 1.18.2\n")})
    efa = check(gather(node(root), ["/fsx"]), P3DN, "efa")
    assert efa.status == "FAIL" and "-61 (No data available)" in efa.detail and "Efa: Enabled: true" in efa.fix
    # p4d has 4 EFA interfaces: one is not enough
    one = check(gather(node(healthy_tree(tmp_path / "p4d")), ["/fsx"]), P4D, "efa")
    assert one.status == "FAIL" and one.detail.startswith("1 of 4 EFA devices")
    four = gather(node(healthy_tree(tmp_path / "p4d4", efa_devices=tuple(f"rdmap{i}s0" for i in range(4)))), ["/fsx"])
    assert check(four, P4D, "efa").status == "ok" and len(four["efa"]["fi_info_devices"]) == 4


def test_missing_gpu_and_failing_driver(tmp_path):
    seven = gather(node(healthy_tree(tmp_path / "a", gpus=7)), ["/fsx"])
    gpus = check(seven, P3DN, "gpus")
    assert gpus.status == "FAIL" and gpus.detail.startswith("7 of 8 GPUs") and "drain" in gpus.fix
    root = healthy_tree(tmp_path / "b")
    fake_program(root / "usr/bin/nvidia-smi", {"-L": (9, "NVIDIA-SMI has failed because it couldn't communicate "
                                                          "with the NVIDIA driver.\n")})
    broken = check(gather(node(root), ["/fsx"]), P3DN, "gpus")
    assert broken.status == "FAIL" and "couldn't communicate" in broken.detail


def test_ib_uverbs_from_proc_modules_and_missing(tmp_path):
    root = healthy_tree(tmp_path)
    (root / "sys/module/ib_uverbs").rmdir()
    assert check(gather(node(root), ["/fsx"]), P3DN, "ib_uverbs").status == "FAIL"
    write(root / "proc/modules", "efa 131072 0 - Live 0x0\nib_uverbs 163840 1 efa, Live 0x0\n")
    assert check(gather(node(root), ["/fsx"]), P3DN, "ib_uverbs").status == "ok"


def test_fsx_wrong_type_or_mounted_elsewhere(tmp_path):
    root = healthy_tree(tmp_path)
    write(root / "proc/mounts",
          "/dev/root / ext4 rw 0 0\nhead:/fsx /fsx nfs4 rw 0 0\nfs@tcp:/x /scratch lustre rw 0 0\n")
    fsx = check(gather(node(root), ["/fsx"]), P3DN, "fsx")
    assert fsx.status == "FAIL" and fsx.detail == "/fsx is nfs4, not lustre; Lustre is mounted at /scratch"
    assert "TCP 988" in fsx.fix


@pytest.mark.parametrize("declared, ofi, libfabric, expected", [
    ("modern", "1.7.4-aws", "1.18.2amzn1.0", "ok"),
    ("modern", "1.5.0-aws", "1.11.1amzn1.0", "warn"),  # NCCL loads the old plugin, without the FI_* it wants
    ("modern", "1.7.4-aws", "1.14.0", "FAIL"),  # new plugin on an old libfabric
    ("legacy", "1.5.0-aws", "1.11.1amzn1.0", "ok"),
    ("legacy", "1.9.1-aws", "1.19.0", "warn"),
    ("none", "1.9.1-aws", "1.19.0", "warn"),  # EFA works but the queue sends jobs over TCP
])
def test_declared_efa_stack_against_installed_versions(tmp_path, declared, ofi, libfabric, expected):
    facts = gather(node(healthy_tree(tmp_path, ofi_version=ofi, libfabric=libfabric)), ["/fsx"])
    queue = Queue("p3dn", "p3dn.24xlarge", 8, efa_stack=declared, fsx_mount="/fsx")
    stack = check(facts, queue, "efa-stack")
    assert stack.status == expected, stack
    assert (stack.fix is None) == (expected == "ok")


def test_library_search_order_versions_from_content_and_skew(tmp_path):
    root = healthy_tree(tmp_path)
    write(root / "opt/nccl/build/lib/libnccl.so.2", b"junk NCCL version 2.21.5+cuda12.4 junk")
    facts = gather(node(root, LD_LIBRARY_PATH="/opt/nccl/build/lib"), ["/fsx"])
    assert [lib["version"] for lib in facts["nccl"]] == ["2.21.5", "2.18.3"]
    nccl = check(facts, P3DN, "nccl")
    assert nccl.status == "warn" and "2.21.5" in nccl.detail and "2.18.3" in nccl.detail
    (root / "opt/amazon/ofi-nccl/lib/libnccl-net.so").unlink()
    write(root / "opt/aws-ofi-nccl/lib/libnccl-net.so", b"")  # unreadable version: reported, not a crash
    facts = gather(node(root, LD_LIBRARY_PATH="/opt/aws-ofi-nccl/lib"), ["/fsx"])
    assert facts["aws_ofi_nccl"]["installed"] == [{"path": "/opt/aws-ofi-nccl/lib/libnccl-net.so", "version": None}]
    assert check(facts, P3DN, "efa-stack").status == "warn"


def test_plugin_in_the_multiarch_dir_of_older_debs_resolves_through_the_ld_so_cache(tmp_path):
    """aws-ofi-nccl's .deb before v1.17.0: /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu, listed in ld.so.conf.d; not
    on LD_LIBRARY_PATH. NCCL's dlopen("libnccl-net.so") finds it in the cache, so neither check may fail the node."""
    root = healthy_tree(tmp_path)
    (root / "opt/amazon/ofi-nccl/lib/libnccl-net.so").unlink()
    plugin_library(root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so", "1.16.3")
    ld_so_conf(root, "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/")
    facts = gather(node(root), ["/fsx"])
    assert facts["aws_ofi_nccl"]["loaded"] == {"path": "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so",
                                               "found_by": "ld.so cache", "version": "1.16.3"}
    ofi = check(facts, P3DN, "aws-ofi-nccl")
    assert ofi.status == "ok" and "through ld.so cache" in ofi.detail, ofi
    assert check(facts, P3DN, "efa-stack").status == "ok"
    expect = P3DN.promise()
    assert [c for c in judge(facts, None, expect, "/run") if c.name in ("aws-ofi-nccl", "efa-stack")
            and c.status != "ok"] == []


def test_plugin_nowhere_the_loader_looks_fails_with_a_fix(tmp_path):
    root = healthy_tree(tmp_path)
    (root / "opt/amazon/ofi-nccl/lib/libnccl-net.so").unlink()
    ld_so_conf(root)
    facts = gather(node(root), ["/fsx"])
    assert facts["aws_ofi_nccl"] == {"names": ["libnccl-net.so"], "ld_cache_error": None, "loaded": None,
                                     "installed": []}
    ofi = check(facts, P3DN, "aws-ofi-nccl")
    assert ofi.status == "FAIL" and "the loader resolves no libnccl-net.so" in ofi.detail
    assert "/etc/ld.so.conf.d" in ofi.fix and "install aws-ofi-nccl" in ofi.fix
    # installed where neither the cache nor EFA jobs' LD_LIBRARY_PATH reaches (the .rpm's lib64, unlisted)
    plugin_library(root / "opt/amazon/ofi-nccl/lib64/libnccl-net.so", "1.18.0")
    ofi = check(gather(node(root), ["/fsx"]), P3DN, "aws-ofi-nccl")
    assert ofi.status == "FAIL" and "1.18.0 (/opt/amazon/ofi-nccl/lib64/libnccl-net.so) is installed" in ofi.detail
    assert "ldconfig" in ofi.fix


def test_an_older_plugin_than_the_queue_promises_warns_and_does_not_stop_the_job(tmp_path):
    root = healthy_tree(tmp_path)
    (root / "opt/amazon/ofi-nccl/lib/libnccl-net.so").unlink()
    plugin_library(root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so", "1.5.0-aws")
    ld_so_conf(root, "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/")
    facts = gather(node(root), ["/fsx"])
    stack = check(facts, P3DN, "efa-stack")
    assert stack.status == "warn" and "aws-ofi-nccl 1.5.0-aws" in stack.detail and "upgrade" in stack.fix
    expect = P3DN.promise()
    assert [c.name for c in judge(facts, None, expect, "/run") if c.status == "FAIL"
            and c.name in ("aws-ofi-nccl", "efa-stack")] == []


def test_plugin_lookup_follows_ld_library_path_then_the_cache_and_nccl_net_plugin(tmp_path):
    root = healthy_tree(tmp_path)
    plugin_library(root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so", "1.16.3")
    plugin_library(root / "home/u/ofi/lib/libnccl-net.so", "1.18.0")
    plugin_library(root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so", "1.16.3",
                   soname="libnccl-net-ofi.so")
    ld_so_conf(root, "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/")
    loaded = gather(node(root, LD_LIBRARY_PATH="/nowhere:/home/u/ofi/lib"), [])["aws_ofi_nccl"]["loaded"]
    assert (loaded["path"], loaded["found_by"], loaded["version"]) == ("/home/u/ofi/lib/libnccl-net.so",
                                                                       "LD_LIBRARY_PATH", "1.18.0")
    # NCCL_NET_PLUGIN=ofi: NCCL tries "ofi", then libnccl-net-ofi.so (NVIDIA/nccl src/plugin/plugin_open.cc)
    ofi = gather(node(root, NCCL_NET_PLUGIN="ofi"), [])["aws_ofi_nccl"]
    assert ofi["names"] == ["ofi", "libnccl-net-ofi.so"]
    assert ofi["loaded"]["path"] == "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"
    assert gather(node(root, NCCL_NET_PLUGIN="none"), [])["aws_ofi_nccl"]["loaded"] is None


@pytest.mark.parametrize("name", ["node_check", "loader_check"])
def test_standalone_checks_parse_as_python_3_9(name):
    """Compute nodes run these with their own python3, which may be 3.9."""
    ast.parse(standalone_source(name), feature_version=(3, 9))


def test_node_check_runs_under_python_3_9(node_lane):
    """The 3.9 grammar is not all: the standard library's 3.10+ calls fail only when run. Run by the node lane's own
    python3 (Debian bullseye's 3.9, in its root file system, which `make test` builds), chrooted there with the
    fake node tree inside it."""
    from testbench.layout import NODE_LANES

    rootfs = NODE_LANES["bullseye"].rootfs
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin")
    assert rootfs is not None and chroot
    inside = Path("/tmp") / f"hpc-node-check-{os.getpid()}"
    root = healthy_tree(rootfs / inside.relative_to("/"))
    try:
        (root / "opt/amazon/ofi-nccl/lib/libnccl-net.so").unlink()
        plugin_library(root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so", "1.16.3")
        ld_so_conf(root, "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/")
        version = subprocess.run([chroot, str(rootfs), "python3", "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60)
        assert version.stdout.strip() == "(3, 9)", version.stderr
        res = subprocess.run([chroot, str(rootfs), "python3", "-I", "-c", doctor.node_check_source(), "--json",
                              "--mount", "/fsx", "--root", str(inside)], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n9"})
        assert res.returncode == 0, res.stderr
        facts = json.loads(res.stdout)
        assert facts["aws_ofi_nccl"]["loaded"]["found_by"] == "ld.so cache" and facts["gpus"]["count"] == 8
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_version_tuple():
    assert version_tuple("1.18.2amzn1.0") == (1, 18, 2) and version_tuple("1.7.4-aws") == (1, 7, 4)
    assert version_tuple(None) is None and version_tuple("v1") is None


def test_node_check_runs_standalone_as_the_doctor_sends_it(tmp_path):
    """`python3 -I -c SOURCE` outside the repo: no toolkit import, one JSON line, the fake tree read."""
    healthy_tree(tmp_path / "root")
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n7"}
    res = subprocess.run([sys.executable, "-I", "-c", doctor.node_check_source(), "--json", "--mount", "/fsx",
                          "--root", str(tmp_path / "root")], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    facts = json.loads(line)
    assert facts["node"] == "n7" and facts["gpus"]["count"] == 8 and facts["mounts"]["/fsx"] == "lustre"


@pytest.mark.parametrize("state, bad", [("idle", False), ("mixed", False), ("allocated", False), ("idle~", False),
                                        ("completing", False), ("drained", True), ("draining", True),
                                        ("down*", True), ("idle*", True), ("down~", True), ("fail", True)])
def test_unusable_node_states(state, bad):
    assert doctor.unusable(state) is bad


def test_srun_argv_and_report_parsing():
    argv = doctor.srun_argv(P3DN, 2, ["a", "b"])
    assert argv[:7] == ["srun", "--partition=p3dn", "--nodes=2", "--ntasks-per-node=1", "--time=5",
                        "--job-name=hpc-doctor", "--nodelist=a,b"]
    assert "--gpus-per-node=8" in argv and argv[-3:] == ["--json", "--mount", "/fsx"]
    assert "--export=PATH,HOME,USER,LOGNAME,SHELL,LANG,LC_ALL,LC_CTYPE,TZ,TMPDIR" in argv  # not the submitter's all
    assert argv[argv.index("-c") - 1] == "python3"
    cpu = doctor.srun_argv(CPU, 1, None)
    assert not any(a.startswith(("--gpus", "--nodelist")) for a in cpu) and cpu[-1] == "--json"
    out = 'srun: noise\n{"node": "c2", "x": 1}\n{not json\n{"other": 1}\n{"node": "c1"}\n'
    assert doctor.parse_reports(out) == {"c2": {"node": "c2", "x": 1}, "c1": {"node": "c1"}}


def fake_slurm(monkeypatch, states, stdout: str, returncode: int = 0, stderr: str = "", lacks: tuple = ()):
    """run_doctor against given sinfo states, srun output and Slurm version facts (stand-ins for Slurm's
    answers); returns the srun argvs it was asked to run."""
    calls = []
    monkeypatch.setattr(doctor, "partition_nodes", lambda partition: states)
    monkeypatch.setattr(doctor, "slurm_facts", lambda queue: ("24.11.5", lacks))

    def srun(argv, timeout):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    monkeypatch.setattr(doctor, "run_srun", srun)
    return calls


def test_doctor_reports_unusable_and_silent_nodes_as_failures(monkeypatch, tmp_path):
    line = json.dumps(gather(node(tmp_path, SLURMD_NODENAME="c1"), []))
    calls = fake_slurm(monkeypatch, [("c1", "idle"), ("c2", "drained"), ("c3", "idle~")], line + "\n",
                       returncode=1, stderr="srun: error: c3: task 0: Exited with exit code 127\n")
    report = doctor.run_doctor(CPU)
    assert calls[0][2:3] == ["--nodes=2"] and "--nodelist=c1,c3" in calls[0]  # drained c2 is not waited for
    by_node = {n.node: n for n in report.nodes}
    assert list(by_node) == ["c1", "c2", "c3"] and not report.ok
    assert by_node["c1"].ok and by_node["c1"].checks
    assert by_node["c2"].error == "Slurm state drained: not checked"
    assert by_node["c3"].error == "no report: srun: error: c3: task 0: Exited with exit code 127"
    data = report.as_dict()
    assert data["ok"] is False and data["job_error"].startswith("srun: error: c3")


def test_doctor_with_a_node_count_and_usage_errors(monkeypatch, tmp_path):
    from toolkit.errors import UsageError

    line = json.dumps(gather(node(tmp_path, SLURMD_NODENAME="c2"), []))
    calls = fake_slurm(monkeypatch, [("c1", "idle"), ("c2", "mixed"), ("c3", "down*")], line + "\n")
    report = doctor.run_doctor(CPU, nodes=1)
    assert report.ok and [n.node for n in report.nodes] == ["c2"]  # only the nodes checked are reported
    assert not any(a.startswith("--nodelist") for a in calls[0])
    with pytest.raises(UsageError, match="has 2 usable node"):
        doctor.run_doctor(CPU, nodes=3)
    fake_slurm(monkeypatch, [("c1", "down*")], "")
    dead = doctor.run_doctor(CPU)
    assert not dead.ok and dead.nodes[0].error == "Slurm state down*: not checked"


def test_doctor_fails_a_slurm_that_lacks_what_rendered_jobs_use_even_when_nodes_pass(monkeypatch, tmp_path):
    line = json.dumps(gather(node(tmp_path, SLURMD_NODENAME="c1"), []))
    fake_slurm(monkeypatch, [("c1", "idle")], line + "\n", lacks=("no pmix MPI plugin",))
    report = doctor.run_doctor(CPU)
    assert report.nodes[0].ok and not report.ok
    assert report.as_dict()["slurm"] == {"version": "24.11.5", "missing": ["no pmix MPI plugin"]}


def test_plugin_lookup_answers_as_the_real_loader_does_on_this_machine():
    """node_check's search (LD_LIBRARY_PATH, `ldconfig -p`, system dirs) against dlopen itself, for libraries
    this machine has: the same file for each, through the real /etc/ld.so.cache."""
    from toolkit.node.loader_check import dlopen
    from toolkit.node.node_check import ld_cache, loader_lookup

    here = Node("/", {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    cache, error = ld_cache(here)
    assert error is None and cache
    for name in ("libz.so.1", "libm.so.6", "libpthread.so.0"):
        opened, _, _ = dlopen(name)
        if opened is None:
            continue
        assert loader_lookup(here, name, cache) == (opened, "ld.so cache")
    assert loader_lookup(here, "libnccl-net-nowhere.so", cache) is None
