"""What the dynamic loader answers, in a job's own environment, for the libraries the job will load, as facts.

    python3 loader_check.py --json [--program PATH] [--torch-nccl] [--nccl-net-plugin] [--library NAME]...

Standalone on purpose (standard library only, Python 3.7 syntax, no toolkit imports): `hpc cluster doctor --recipe`
runs this file's source with `python3 -c SOURCE` on a node, after the job's own set-up (its modules, venv and
exports: toolkit.slurm.render.environment_lines), so LD_LIBRARY_PATH and everything else are the job's. The answers
come from the loader itself, never from a search of directories of ours:
- a program (nccl-tests): its own ELF interpreter (ld.so) traces what it would load, as ldd has it do;
- PyTorch's NCCL: the same trace of torch's libtorch_cuda.so (it finds libnccl.so.2 through its RUNPATH);
- NCCL's net plugin: dlopen of the names NCCL itself tries, in its order (NVIDIA/nccl src/plugin/net.cc
  initPluginLibsOnceFunc, src/plugin/plugin_open.cc openPluginLib): NCCL_NET_PLUGIN unset -> libnccl-net.so;
  "none" -> no plugin; else each comma-separated name as given, then libnccl-net-NAME.so unless NAME has a '/' or
  is already lib*.so. dlopen is NCCL's RTLD_NOW | RTLD_LOCAL, so a missing dependency (libfabric) fails here too;
- any other library (the HCCL OFI wrapper): dlopen by name.
It reports facts and judges nothing: toolkit.health.loader says what a missing library means and how to fix it.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import socket
import struct
import subprocess
import sys

COMMAND_TIMEOUT = 60
PT_INTERP = 3
# the trace's lines: "\tlibmpi.so.40 => not found", "\tlibnccl.so.2 => /opt/nccl/lib/libnccl.so.2 (0x7f...)"
LISTED = re.compile(r"^\s*(\S+) => (?:(not found)|(\S+)(?: \(0x[0-9a-f]+\))?)\s*$", re.M)
# The symbol a net plugin exports per plugin API version (NVIDIA/nccl src/plugin/net/net_v*.cc: ncclNetPlugin_vN)
PLUGIN_SYMBOL = "ncclNetPlugin_v{}"
PLUGIN_API_VERSIONS = range(12, 5, -1)
RTLD_DI_LINKMAP = 2


class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


def elf_interpreter(path):
    """The program's PT_INTERP (its dynamic loader), or None when it is no dynamically linked ELF file."""
    try:
        with open(path, "rb") as f:
            ident = f.read(16)
            if ident[:4] != b"\x7fELF":
                return None
            wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
            f.seek(0x20 if wide else 0x1C)
            (phoff,) = struct.unpack(order + ("Q" if wide else "I"), f.read(8 if wide else 4))
            f.seek(0x36 if wide else 0x2A)
            phentsize, phnum = struct.unpack(order + "HH", f.read(4))
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                header = f.read(phentsize)
                if struct.unpack(order + "I", header[:4])[0] != PT_INTERP:
                    continue
                offset, size = (struct.unpack(order + "QQ", header[8:16] + header[32:40]) if wide
                                else struct.unpack(order + "II", header[4:8] + header[16:20]))
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def loader_list(path):
    """(soname -> resolved path or None, error): what the loader resolves for PATH in this environment."""
    interpreter = elf_interpreter(path) or elf_interpreter(sys.executable)  # a shared library has none of its own
    if not os.path.isfile(path):
        return {}, "{} does not exist on this node".format(path)
    if interpreter is None:
        return {}, "{} is not a dynamically linked ELF file".format(path)
    # ldd's way (glibc elf/ldd.bash.in): the loader traces with LD_TRACE_LOADED_OBJECTS=1 and lists every missing
    # library as "not found" (`ld.so --list` stops at the first one).
    env = dict(os.environ, LD_TRACE_LOADED_OBJECTS="1")
    try:
        res = subprocess.run([interpreter, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             universal_newlines=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return {}, "{} {}: {}".format(interpreter, path, exc)
    listed = {m.group(1): (None if m.group(2) else m.group(3)) for m in LISTED.finditer(res.stdout)}
    if not listed and res.returncode != 0:
        return {}, (res.stderr.strip() or "exit {}".format(res.returncode)).splitlines()[0]
    return listed, None


def dlopen(name):
    """(path the loader opened, handle, error): dlopen(name, RTLD_NOW | RTLD_LOCAL) as NCCL and HCCL do."""
    try:
        handle = ctypes.CDLL(name, mode=os.RTLD_LOCAL)  # ctypes adds RTLD_NOW
    except OSError as exc:
        return None, None, str(exc)
    path = name
    try:
        libdl = ctypes.CDLL(None)
        if not hasattr(libdl, "dlinfo"):  # glibc < 2.34 keeps it in libdl
            libdl = ctypes.CDLL("libdl.so.2")
        link = ctypes.POINTER(LinkMap)()
        if libdl.dlinfo(ctypes.c_void_p(handle._handle), RTLD_DI_LINKMAP, ctypes.byref(link)) == 0 and link:
            path = link.contents.l_name.decode()
    except (OSError, AttributeError):
        pass
    return path, handle, None


def entry(library, wanted_by, path=None, error=None, applicable=True):
    return {"library": library, "wanted_by": wanted_by, "resolves": (path is not None) if applicable else None,
            "path": path, "detail": error}


def is_script(path):
    """A file that starts with #! (its interpreter loads what it needs, not the loader at exec)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def program_facts(program):
    """Every library the program needs that is NCCL or MPI, or that the loader does not find."""
    wanted_by = "ld.so trace of " + program
    if not os.path.isfile(program):  # the job's own program, not a library: its own check (preflight.loader_checks)
        return [entry("program", wanted_by, error="{} does not exist on this node".format(program))]
    if is_script(program):
        return [entry("libnccl", wanted_by, error="{} is a script: no loader trace".format(program),
                      applicable=False)]
    listed, error = loader_list(program)
    if error:
        return [entry("libnccl", wanted_by, error=error)]
    found = []
    for name, path in sorted(listed.items()):
        if name.startswith(("libnccl.", "libmpi.")) or path is None:
            found.append(entry(name, wanted_by, path, None if path else "not found"))
    for kind in ("libnccl.", "libmpi."):
        if not any(name.startswith(kind) for name in listed):
            found.append(entry(kind.rstrip("."), wanted_by, error="{} does not need it".format(program),
                               applicable=False))
    return found


def torch_nccl_facts():
    """libnccl.so.2 as PyTorch's CUDA library loads it (through its RUNPATH: the nvidia-nccl wheel)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return [entry("libnccl", sys.executable, error="torch is not installed in the job's Python")]
    cuda = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cuda.so")
    if not os.path.isfile(cuda):
        return [entry("libnccl", cuda, error="torch has no CUDA build here (no lib/libtorch_cuda.so)",
                      applicable=False)]
    listed, error = loader_list(cuda)
    wanted_by = "ld.so trace of " + cuda
    names = [name for name in listed if name.startswith("libnccl.")]
    if error:
        return [entry("libnccl", wanted_by, error=error)]
    if not names:
        return [entry("libnccl", wanted_by, error="libtorch_cuda.so does not need it", applicable=False)]
    return [entry(names[0], wanted_by, listed[names[0]], None if listed[names[0]] else "not found")]


def plugin_names(setting):
    """NCCL's tries per plugin: [[name, fallback?], ...] for an NCCL_NET_PLUGIN value (None: unset)."""
    if setting is None:
        return [["libnccl-net.so"]]
    if setting.lower() == "none":
        return []
    tries = []
    for name in (n for n in setting.split(",") if n):
        names = [name]
        if "/" not in name and not (name.startswith("lib") and name.endswith(".so")):
            names.append("libnccl-net-{}.so".format(name))
        tries.append(names)
    return tries


def nccl_net_plugin_facts(setting):
    """The first plugin NCCL would load, and the net plugin API versions it exports."""
    wanted_by = "NCCL_NET_PLUGIN=" + (setting if setting is not None else "(unset)")
    errors = []
    for names in plugin_names(setting):
        for name in names:
            path, handle, error = dlopen(name)
            if handle is None:
                errors.append(error)
                continue
            versions = [v for v in PLUGIN_API_VERSIONS if hasattr(handle, PLUGIN_SYMBOL.format(v))]
            if not versions:
                errors.append("{} loads but exports no {}".format(path, PLUGIN_SYMBOL.format("N")))
                continue
            found = entry("nccl-net-plugin", wanted_by, path)
            found["detail"] = "net plugin API v{}".format(versions[0])
            return [found]
    return [entry("nccl-net-plugin", wanted_by, error="; ".join(errors) or "NCCL_NET_PLUGIN=none: no plugin")]


def gather(program=None, torch_nccl=False, nccl_net_plugin=False, libraries=()):
    facts: dict = {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
             "python": sys.executable, "ld_library_path": os.environ.get("LD_LIBRARY_PATH"), "libraries": []}
    if program:
        facts["libraries"] += program_facts(program)
    if torch_nccl:
        facts["libraries"] += torch_nccl_facts()
    if nccl_net_plugin:
        facts["libraries"] += nccl_net_plugin_facts(os.environ.get("NCCL_NET_PLUGIN"))
    for name in libraries:
        path, _, error = dlopen(name)
        facts["libraries"].append(entry(name, "dlopen", path, error))
    return facts


def main(argv=None):
    parser = argparse.ArgumentParser(prog="loader_check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line (what `hpc cluster doctor` reads)")
    parser.add_argument("--program", help="a program the job runs (traced by its ld.so)")
    parser.add_argument("--torch-nccl", action="store_true", help="PyTorch's libnccl")
    parser.add_argument("--nccl-net-plugin", action="store_true", help="NCCL's net plugin, as NCCL looks it up")
    parser.add_argument("--library", action="append", default=[], help="another library to dlopen by name")
    args = parser.parse_args(argv)
    facts = gather(args.program, args.torch_nccl, args.nccl_net_plugin, args.library)
    print(json.dumps(facts, sort_keys=True) if args.json else json.dumps(facts, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
