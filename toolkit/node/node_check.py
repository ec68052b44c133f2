"""What one node has of the fabric and GPU software AWS guides tell admins to check by hand, as facts.

    python3 -m toolkit.node.node_check --json [--mount /fsx]

Standalone on purpose (standard library only, Python 3.7 syntax, no toolkit imports): `hpc cluster doctor`
sends this file's source to every node as `python3 -c SOURCE`, so a node needs only the python3 that every
ParallelCluster AMI has, not the toolkit. It reports facts and judges nothing: toolkit.node.evaluate compares
them with what the queue declares (catalog GPUs and EFA count, efa-stack tag, FSx mount).

Every path is read under `root` and programs are found through it, so tests run it on a fake tree.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import socket
import struct
import subprocess
import sys

EFA_BIN = "/opt/amazon/efa/bin"  # the EFA installer's libfabric tools (fi_info), not always on PATH
EFA_INSTALLED_PACKAGES = "/opt/amazon/efa_installed_packages"  # written by the EFA installer
# Where NCCL and the aws-ofi-nccl plugin are installed by NVIDIA's packages, DLAMIs, the EFA installer and
# source builds; LD_LIBRARY_PATH (what a job would load first) is searched before these.
NCCL_DIRS = ("/opt/nccl/build/lib", "/opt/nccl/lib", "/usr/local/nccl/lib", "/usr/local/cuda/lib64",
             "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
             "/usr/local/lib")
# aws-ofi-nccl's packages: the .deb put it in /opt/amazon/ofi-nccl/lib/<multiarch triplet> and listed that in
# /etc/ld.so.conf.d/100_ofinccl.conf until v1.17.0, /opt/amazon/ofi-nccl/lib since (aws/aws-ofi-nccl
# contrib/debian-template/rules, commit 6eb0870a "packaging/deb: remove multi-arch from lib path", first tag
# v1.17.0); the .rpm uses %{_libdir}, /opt/amazon/ofi-nccl/lib64 (contrib/fedora/aws-ofi-nccl.spec); the NGC
# variants /opt/amazon/aws-ofi-nccl/lib. These are only where copies are listed from: which one NCCL loads is the
# loader's answer (plugin_facts).
OFI_NCCL_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
                 "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu", "/opt/amazon/ofi-nccl/lib64",
                 "/opt/amazon/aws-ofi-nccl/lib", "/opt/aws-ofi-nccl/lib", "/opt/aws-ofi-nccl/lib64", "/usr/local/lib",
                 "/usr/lib64", "/usr/lib/x86_64-linux-gnu")
NCCL_NAMES = re.compile(r"^libnccl\.so(\.\d+)*$")
OFI_NCCL_NAMES = re.compile(r"^libnccl-net(-ofi|-aws-ofi)?\.so(\.\d+)*$")
# Version strings compiled into the libraries: NCCL's VERSION_STRING, aws-ofi-nccl's "Initializing " PACKAGE_STRING.
NCCL_VERSION = re.compile(rb"NCCL version (\d+\.\d+\.\d+)")
OFI_NCCL_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+\.\d+[A-Za-z0-9.-]*)")
# The loader's cache as `ldconfig -p` prints it: "\tlibnccl-net.so (libc6,x86-64) => /opt/amazon/ofi-nccl/lib/..."
LD_CACHE = "/etc/ld.so.cache"
LD_CACHE_LINE = re.compile(r"^\s+(\S+) \(([^)]*)\) => (\S.*?)\s*$", re.M)
# glibc's trusted directories, searched after the cache (elf/dl-load.c; Debian adds the multiarch ones first);
# ldconfig puts their libraries in the cache too, so this matters only for a node whose cache is stale.
SYSTEM_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                   "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
ET_DYN = 3
COMMAND_TIMEOUT = 30


class Node:
    """The node as seen under `root` ("/" for real), with `environ` for PATH and LD_LIBRARY_PATH."""

    def __init__(self, root: str = "/", environ=None):
        self.root = root
        self.environ = dict(os.environ if environ is None else environ)

    def path(self, absolute: str) -> str:
        return os.path.join(self.root, absolute.lstrip("/"))

    def read(self, absolute: str):
        try:
            with open(self.path(absolute), errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def which(self, program: str, extra_dirs=()):
        dirs = [d for d in self.environ.get("PATH", "").split(os.pathsep) if d] + list(extra_dirs)
        for d in dirs:
            candidate = self.path(os.path.join(d, program))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None

    def run(self, argv):
        """(exit code, stdout, stderr); an exit code of None when the program could not run or timed out."""
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=self.environ)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, "", str(exc)
        return res.returncode, res.stdout, res.stderr


def first_line(*texts: str) -> str:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return ""


def efa_facts(node: Node) -> dict:
    """EFA devices (sysfs and `fi_info -p efa`), the efa kernel module, libfabric and EFA installer versions."""
    ib = node.path("/sys/class/infiniband")
    sysfs = sorted(d for d in (os.listdir(ib) if os.path.isdir(ib) else [])
                   if os.path.basename(os.path.realpath(os.path.join(ib, d, "device", "driver"))) == "efa")
    facts = {"sysfs_devices": sysfs, "kernel_module": os.path.isdir(node.path("/sys/module/efa")),
             "fi_info": node.which("fi_info", [EFA_BIN]), "fi_info_devices": None, "fi_info_error": None,
             "libfabric_version": None, "installer_version": None}
    installed = node.read(EFA_INSTALLED_PACKAGES) or ""
    match = re.search(r"EFA installer version:\s*(\S+)", installed)
    facts["installer_version"] = match.group(1) if match else None
    if facts["fi_info"]:
        code, out, err = node.run([facts["fi_info"], "-p", "efa"])
        if code == 0:
            # one entry per device and endpoint type: "domain: rdmap16s27-rdm" and "...-dgrm"
            domains = re.findall(r"^\s*domain:\s*(\S+)", out, re.M)
            facts["fi_info_devices"] = sorted({re.sub(r"-(rdm|dgrm)$", "", d) for d in domains})
        else:
            facts["fi_info_devices"] = []
            facts["fi_info_error"] = first_line(err, out) or "exit {}".format(code)
        code, out, err = node.run([facts["fi_info"], "--version"])
        match = re.search(r"^libfabric:\s*(\S+)", out, re.M) if code == 0 else None
        facts["libfabric_version"] = match.group(1) if match else None
    return facts


def module_loaded(node: Node, name: str) -> bool:
    """/sys/module/NAME exists for loaded and built-in modules; /proc/modules lists loaded ones."""
    if os.path.isdir(node.path("/sys/module/" + name)):
        return True
    return any(line.split(" ", 1)[0] == name for line in (node.read("/proc/modules") or "").splitlines())


def _yes(text: str):
    """nvidia-smi's Yes/No (or 1/0) cell; None for [N/A] and the like."""
    word = text.strip().lower()
    return True if word in ("yes", "1", "true") else False if word in ("no", "0", "false") else None


def _count(text: str):
    return int(text) if text.strip().isdigit() else None


def gpu_facts(node: Node) -> dict:
    """NVIDIA GPUs as `nvidia-smi -L` lists them ("GPU 0: Tesla V100-SXM2-32GB (UUID: ...)"), and each one's memory
    health: uncorrected ECC errors since the driver loaded (`--query-gpu=ecc.errors.uncorrected.volatile.total`)
    and row remapping pending or failed (`--query-remapped-rows`, A100 and later), None where a GPU has no such
    counter. NVIDIA's guidance: either needs a GPU reset (pending) or the GPU replaced (failure)."""
    smi = node.which("nvidia-smi")
    facts = {"nvidia_smi": smi, "count": None, "names": [], "error": None, "health": []}
    if smi:
        code, out, err = node.run([smi, "-L"])
        if code == 0:
            names = [m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.*?)(?: \(UUID: [^)]*\))?$", out, re.M)]
            facts.update(count=len(names), names=names)
        else:
            facts["error"] = first_line(out, err) or "exit {}".format(code)
    if facts["count"]:
        health = {}
        code, out, _ = node.run([smi, "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total",
                                 "--format=csv,noheader,nounits"])
        for line in out.splitlines() if code == 0 else ():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 3 and cells[0].isdigit():
                health[cells[1].lower()] = {"index": int(cells[0]), "bus_id": cells[1],
                                            "ecc_uncorrected": _count(cells[2]), "remap_pending": None,
                                            "remap_failure": None}
        code, out, _ = node.run([smi, "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
                                      "remapped_rows.failure", "--format=csv,noheader"])
        for line in out.splitlines() if code == 0 else ():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 3 and cells[0].lower() in health:
                health[cells[0].lower()].update(remap_pending=_yes(cells[1]), remap_failure=_yes(cells[2]))
        facts["health"] = sorted(health.values(), key=lambda g: g["index"])
    return facts


# Accelerators that neither nvidia-smi nor Slurm's GRES count, each counted by its vendor's own tool: the node side's
# one table of them (toolkit.node.evaluate judges every entry alike; this file must stay standalone). Per facts key:
# the catalog accelerator it serves, the tool and where it lives beside PATH, the tool's nvidia-smi-like CSV query
# (one row per device, the bus id second), the facts key of the tool's path, and the words evaluate's check says
# (`devices` counts them, `tools` is what a missing tool means, `fix` installs or replaces).
DEVICE_TOOLS: dict = {
    "hpus": {
        "accelerator": "gaudi", "name": "Gaudi", "devices": "HPUs", "device": "HPU",
        "program": "hl-smi", "found_as": "hl_smi", "dirs": ("/usr/bin", "/opt/habanalabs/bin"),
        "query": ("-Q", "index,bus_id", "-f", "csv,noheader"), "tools": "no Habana driver tools",
        "fix": ("install the Habana driver and hl-smi (habanalabs-firmware-tools; the Habana DLAMI has them) or drain "
                "and replace the node (`scontrol update nodename=NODE state=drain reason=hpu`)"),
    },
}


def device_tool_facts(node: Node, tool: dict) -> dict:
    """A DEVICE_TOOLS entry's devices as its tool's CSV query lists them: the tool's path, how many, their bus ids."""
    program = node.which(tool["program"], tool["dirs"])
    facts = {tool["found_as"]: program, "count": None, "bus_ids": [], "error": None}
    if program:
        code, out, err = node.run([program, *tool["query"]])
        if code == 0:
            rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
            facts.update(count=len(rows), bus_ids=[r[1] for r in rows if len(r) > 1])
        else:
            facts["error"] = first_line(out, err) or "exit {}".format(code)
    return facts


def memory_facts(node: Node) -> dict:
    """MemTotal and MemAvailable (bytes) from /proc/meminfo: what a job can still have without swapping."""
    found = {}
    for line in (node.read("/proc/meminfo") or "").splitlines():
        match = re.match(r"^(MemTotal|MemAvailable):\s+(\d+) kB", line)
        if match:
            found[match.group(1)] = int(match.group(2)) * 1024
    return {"total": found.get("MemTotal"), "available": found.get("MemAvailable")}


def disk_facts(node: Node, paths) -> dict:
    """Free bytes (for an unprivileged user) of the file system holding each path; None when it is missing."""
    free: dict = {}
    for path in paths:
        try:
            st = os.statvfs(node.path(path))
            free[path] = st.f_bavail * st.f_frsize
        except OSError:
            free[path] = None
    return free


def write_probe(node: Node, directory: str, name: str) -> dict:
    """Write, read back and remove a file in `directory` (the job's run dir on the shared file system): whether
    this node sees it and may write there. The error names what failed."""
    path = node.path(os.path.join(directory, ".probe-{}-{}".format(name, os.getpid())))
    token = "{} {}".format(name, os.getpid())
    try:
        with open(path, "w") as f:
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
        with open(path) as f:
            same = f.read() == token
        os.unlink(path)
    except OSError as exc:
        return {"path": directory, "writable": False, "error": "{}: {}".format(type(exc).__name__, exc.strerror)}
    return {"path": directory, "writable": same, "error": None if same else "read back something else"}


def mount_facts(node: Node, wanted) -> dict:
    """Mount point -> file system type, for every Lustre mount and the `wanted` directories (None: not a mount)."""
    mounts = {}
    for line in (node.read("/proc/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts[fields[1].replace("\\040", " ")] = fields[2]
    found = {d: t for d, t in mounts.items() if t == "lustre"}
    found.update({d: mounts.get(d) for d in wanted})
    return found


def library_version(path: str, content_pattern):
    """The version in the file name (libnccl.so.2.18.3), else the one compiled into the library."""
    digits = re.findall(r"\.so((?:\.\d+)+)$", os.path.basename(path))
    if digits and digits[0].count(".") >= 3:
        return digits[0].lstrip(".")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            match = content_pattern.search(data)
            return match.group(1).decode() if match else None  # inside: the match reads the mapping
    except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
        return None


def find_libraries(node: Node, dirs, name_pattern, content_pattern, library_path=True) -> list:
    """Every matching library in LD_LIBRARY_PATH (unless not `library_path`), then `dirs`, in search order
    (symlinks to one file once)."""
    search = [d for d in node.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and library_path] + list(dirs)
    found, seen = [], set()
    for d in search:
        full = node.path(d)
        if not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            if not name_pattern.match(name):  # first: a library dir holds thousands of files, and realpath is a walk
                continue
            path = os.path.join(full, name)
            real = os.path.realpath(path)
            if os.path.isfile(path) and real not in seen:
                seen.add(real)
                version = library_version(real, content_pattern) or library_version(path, content_pattern)
                found.append({"path": os.path.join(d, name), "version": version})
    return found


def elf_kind(path: str):
    """(class, byte order, machine) of an ELF shared object, None for anything else: the loader passes over a
    file it cannot load (another machine's, not ELF) and searches on."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    e_type, machine = struct.unpack(("<" if head[5] == 1 else ">") + "HH", head[16:20])
    return (head[4], head[5], machine) if e_type == ET_DYN else None


def loadable(path: str) -> bool:
    """An ELF shared object of this node's own class and machine (its python3's), as a job's process loads."""
    kind = elf_kind(path)
    return kind is not None and kind == executable_kind()


def executable_kind():
    """(class, byte order, machine) of this python3 (an executable: elf_kind would refuse it)."""
    try:
        with open(sys.executable, "rb") as f:
            head = f.read(20)
        return (head[4], head[5], struct.unpack(("<" if head[5] == 1 else ">") + "H", head[18:20])[0])
    except (OSError, IndexError, struct.error):
        return (None, None, None)


def ld_cache(node: Node):
    """(soname -> node paths in the cache's order, error): the loader's cache, read by its own tool (`ldconfig -p`),
    which holds /etc/ld.so.conf(.d)'s directories (aws-ofi-nccl's package adds its own) and the system ones."""
    path = os.pathsep.join([node.environ.get("PATH", ""), "/sbin", "/usr/sbin"])
    ldconfig = shutil.which("ldconfig", path=path)
    if ldconfig is None:
        return {}, "ldconfig not found on PATH, /sbin or /usr/sbin"
    code, out, err = node.run([ldconfig, "-p", "-C", node.path(LD_CACHE)])
    if code != 0:
        return {}, "{} -p: {}".format(ldconfig, first_line(err, out) or "exit {}".format(code))
    cache: dict = {}
    for match in LD_CACHE_LINE.finditer(out):
        cache.setdefault(match.group(1), []).append(match.group(3))
    return cache, None


def loader_lookup(node: Node, name: str, cache):
    """(node path, where the loader found it) for dlopen(name), or None: a name with a '/' is opened as it is;
    else LD_LIBRARY_PATH, then the ld.so cache, then the system directories (glibc elf/dl-load.c _dl_map_object;
    the RUNPATH of NCCL's libnccl.so, which calls dlopen, is not read: NVIDIA's builds have none)."""
    if "/" in name:
        return (name, "path") if loadable(node.path(name)) else None
    tries = [(os.path.join(d, name), "LD_LIBRARY_PATH")
             for d in node.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    tries += [(path, "ld.so cache") for path in cache.get(name, [])]
    tries += [(os.path.join(d, name), "system directory") for d in SYSTEM_LIB_DIRS]
    for path, how in tries:
        if loadable(node.path(path)):
            return path, how
    return None


def net_plugin_names(setting):
    """The names NCCL dlopens for its net plugin, in order, for an NCCL_NET_PLUGIN value (None: unset):
    libnccl-net.so; "none": none; else each comma-separated NAME, then libnccl-net-NAME.so unless NAME has a
    '/' or is lib*.so (NVIDIA/nccl src/plugin/net.cc, src/plugin/plugin_open.cc openPluginLib)."""
    if setting is None:
        return ["libnccl-net.so"]
    if setting.lower() == "none":
        return []
    names = []
    for name in (n for n in setting.split(",") if n):
        names.append(name)
        if "/" not in name and not (name.startswith("lib") and name.endswith(".so")):
            names.append("libnccl-net-{}.so".format(name))
    return names


def plugin_facts(node: Node) -> dict:
    """aws-ofi-nccl as NCCL finds it: the first of NCCL's names the loader resolves here (with this environment's
    LD_LIBRARY_PATH and NCCL_NET_PLUGIN), its version, and the copies installed where packages put them."""
    names = net_plugin_names(node.environ.get("NCCL_NET_PLUGIN"))
    cache, cache_error = ld_cache(node)
    resolved = None
    for name in names:
        resolved = loader_lookup(node, name, cache)
        if resolved:
            break
    installed = find_libraries(node, OFI_NCCL_DIRS, OFI_NCCL_NAMES, OFI_NCCL_VERSION, library_path=False)
    loaded = None
    if resolved:
        loaded = {"path": resolved[0], "found_by": resolved[1],
                  "version": library_version(os.path.realpath(node.path(resolved[0])), OFI_NCCL_VERSION)}
    return {"names": names, "ld_cache_error": cache_error, "loaded": loaded, "installed": installed}


def enroot_facts(node: Node) -> dict:
    """enroot, which pyxis runs on the node for every containerized step (`srun --container-image`): where it is
    and its version (`enroot version`), or None where it is not installed."""
    path = node.which("enroot", ("/usr/bin", "/usr/local/bin"))
    if path is None:
        return {"path": None, "version": None}
    code, out, err = node.run([path, "version"])
    return {"path": path, "version": first_line(out) if code == 0 else None}


def gather(node: Node, mounts=(), probe_dir=None, disk_paths=()) -> dict:
    """All facts of this node, JSON-ready; with `probe_dir`, whether it can write there; with `disk_paths`, the
    free space where they are."""
    environ = node.environ
    name = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return {
        "node": name,
        "hostname": socket.gethostname(),
        "efa": efa_facts(node),
        "ib_uverbs": module_loaded(node, "ib_uverbs"),
        "gpus": gpu_facts(node),
        **{key: device_tool_facts(node, tool) for key, tool in DEVICE_TOOLS.items()},
        "mounts": mount_facts(node, mounts),
        "nccl": find_libraries(node, NCCL_DIRS, NCCL_NAMES, NCCL_VERSION),
        "aws_ofi_nccl": plugin_facts(node),
        "enroot": enroot_facts(node),
        "memory": memory_facts(node),
        "disk": disk_facts(node, disk_paths),
        "probe": write_probe(node, probe_dir, name) if probe_dir else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m toolkit.node.node_check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line (what `hpc cluster doctor` reads)")
    parser.add_argument("--mount", action="append", default=[], help="a mount point to report (e.g. /fsx)")
    parser.add_argument("--probe", help="a directory to write a file in and read it back (the run dir)")
    parser.add_argument("--disk", action="append", default=[], help="a path whose file system's free space to report")
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    facts = gather(Node(args.root), args.mount, args.probe, args.disk)
    if args.json:
        print(json.dumps(facts, sort_keys=True), flush=True)
    else:
        for key, value in facts.items():
            print("{}: {}".format(key, json.dumps(value)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
