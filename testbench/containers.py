"""Containers for the container lane: NVIDIA enroot and pyxis built from the pinned sources, one enroot per
simulated node, and a small image made without a registry. Dev and test only.

Everything is cached under /var/tmp/hpc-containers (a stamp per step names what it was built from), so a second
`up` costs a few checks. What was measured on this kind of machine (traps included): FIELD-NOTES.md, section
"Containers". The sources cannot come from any registry; they are kept as tarballs (SOURCES.md beside them).

  enroot  its default build: static against its bundled musl (the three submodules unpacked into deps/), then
          `make install` once per node with its own prefix: pyxis passes enroot only PATH, so each node's slurmd
          PATH picks its own enroot, whose enroot.conf keeps that node's containers apart (pyxis names them
          alike on every node) on tmpfs (unpacking onto this disk took 2-6 s per step, on /dev/shm 0.2-0.6 s).
  pyxis   built against this machine's Slurm headers (/usr/include/slurm/spank.h from libslurm-dev: it must
          match the running Slurm exactly), loaded through the lane's plugstack.conf.
  image   `debootstrap --variant=minbase --include=python3 bookworm` then `mksquashfs -comp lz4`. No torch in
          it: jobs mount the host's Python and venv (as users mount an environment kept on FSx), which keeps
          the build near a minute. Its /etc/environment sets MASTER_ADDR and PYTORCH_VERSION, a stand-in for the
          images (NGC's PyTorch) whose environment would override the job's rendezvous: enroot's
          50-slurm-pytorch.sh hook, enabled on every node, then also writes its own MASTER_PORT.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit.errors import HpcError
from testbench import install, rootfs
from testbench.layout import Layout, Node

SOURCES_ENV = "HPC_CONTAINER_SOURCES"
CACHE = Path("/var/tmp/hpc-containers")
TMPFS = Path("/dev/shm/hpc-enroot")  # enroot's data, runtime and cache paths per node
# SOURCES.md: the pinned commits (enroot v4.1.2, pyxis v0.24.0, enroot's submodules at that tag).
PINNED = {
    "enroot": "bd51f53b6fa954805ae3e1985c5dc7594ff66d05",
    "pyxis": "107519944221822ea1dace4db8e7234b2eaa4cd5",
    "musl": "0784374d561435f7c787a555aeab8ede699ed298",
    "makeself": "5742be6410bfad2c619fb1e98bf795e8fa0913c7",
    "kernel-headers": "c79004ad7f82165c86396b11bc6958ee53febb63",
}
ENROOT_SUBMODULES = {"musl": "deps/musl", "makeself": "deps/makeself", "kernel-headers": "deps/linux-headers"}
# Build: gcc/make (enroot's musl build, pyxis), libslurm-dev (spank.h). Run: enroot's runtime dependencies
# (enroot doc/installation.md: curl gawk jq squashfs-tools parallel; optional fuse-overlayfs pigz squashfuse).
PACKAGES = ("gcc", "make", "libc6-dev", "libslurm-dev", "squashfs-tools", "squashfuse", "fuse-overlayfs", "fuse3",
            "jq", "parallel", "curl", "gawk", "pigz", "libcap2-bin", "debootstrap")
IMAGE_SUITE = "bookworm"
# The image's own environment: what a PyTorch image's would do to a job that does not pass its variables with
# --container-env (203.0.113.1 is TEST-NET-3: nothing answers there).
IMAGE_ENVIRONMENT = "MASTER_ADDR=203.0.113.1\nPYTORCH_VERSION=0.0.0-stand-in\n"
PYTORCH_HOOK = "50-slurm-pytorch.sh"
BUILD_TIMEOUT = 900


def sources_candidates() -> list[Path]:
    """Where the tarballs may be: $HPC_CONTAINER_SOURCES, else ../shared/containers beside the checkout (or beside
    the worktrees' folder)."""
    if os.environ.get(SOURCES_ENV):
        return [Path(os.environ[SOURCES_ENV])]
    checkout = Path(__file__).resolve().parents[1]
    return [checkout.parent / "shared/containers", checkout.parent.parent / "shared/containers"]


def tarball(sources: Path, name: str) -> Path:
    return sources / f"{name}-{PINNED[name]}.tar.gz"


def find_sources() -> Path | None:
    """The directory holding every pinned tarball, or None."""
    for d in sources_candidates():
        if all(tarball(d, name).is_file() for name in PINNED):
            return d
    return None


def missing_sources() -> str:
    """One line: what to provide where the sources are absent."""
    names = ", ".join(f"{name}-{PINNED[name][:8]}....tar.gz" for name in PINNED)
    return (f"container lane: no enroot/pyxis sources ({names}) in {' or '.join(map(str, sources_candidates()))}; "
            f"set {SOURCES_ENV} to a directory holding them (git archive of NVIDIA/enroot v4.1.2 with its "
            "submodules and NVIDIA/pyxis v0.24.0, see SOURCES.md)")


def node_prefix(node: Node) -> Path:
    """A node's own enroot install (bin/ goes first on its slurmd's PATH)."""
    return CACHE / "nodes" / node.name


def image_path() -> Path:
    return CACHE / "images" / f"{IMAGE_SUITE}-python3.sqsh"


def plugin_path() -> Path:
    return CACHE / "pyxis" / "spank_pyxis.so"


def pyxis_runtime() -> Path:
    return TMPFS / "pyxis"


def plugstack_text() -> str:
    """pyxis's plugstack.conf line (pyxis README: `required /usr/local/lib/slurm/spank_pyxis.so`, options from
    config.c): its runtime dir on tmpfs, and `#SBATCH --container-image` allowed (its default, said here)."""
    return (f"# Written by `python -m testbench up --slurm 22.05-pyxis`: NVIDIA pyxis v0.24.0 built from the pinned "
            f"sources.\nrequired {plugin_path()} runtime_path={pyxis_runtime()} sbatch_support=1\n")


def enroot_conf(node: Node) -> str:
    base = TMPFS / node.name
    return "\n".join([
        f"# Written by `python -m testbench up --slurm 22.05-pyxis`: node {node.name}'s enroot; its containers on "
        "tmpfs, apart from the other nodes' (pyxis names containers alike on every node).",
        f"ENROOT_RUNTIME_PATH {base}/runtime/${{UID}}",
        f"ENROOT_CACHE_PATH {base}/cache/${{UID}}",
        f"ENROOT_DATA_PATH {base}/data/${{UID}}",
        "ENROOT_TEMP_PATH /dev/shm",
        "ENROOT_SQUASH_OPTIONS -comp lz4 -noD",
        "",
    ])


def _stamp_ok(stamp: Path, text: str) -> bool:
    return stamp.is_file() and stamp.read_text() == text


def _run(args: list[str], log: Path, what: str, cwd: Path | None = None, env: dict | None = None) -> None:
    res = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                         env=dict(os.environ, **(env or {})))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
        raise HpcError(f"{what} failed:\n{tail}", fix=f"see {log}")


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")


def build_enroot(sources: Path, nodes: tuple[Node, ...], log_dir: Path) -> bool:
    """enroot's default (static, musl) build, installed once per node; False when cached."""
    stamp_text = " ".join(f"{n}={PINNED[n]}" for n in ("enroot", *ENROOT_SUBMODULES)) + \
        " nodes=" + ",".join(n.name for n in nodes) + "\n"
    stamp = CACHE / "nodes" / ".stamp"
    if _stamp_ok(stamp, stamp_text):
        return False
    src = CACHE / "build" / "enroot"
    shutil.rmtree(src, ignore_errors=True)
    _unpack(tarball(sources, "enroot"), src)
    for name, where in ENROOT_SUBMODULES.items():
        _unpack(tarball(sources, name), src / where)
    # `make install` builds first; its `deps` step tries `git submodule update`, which fails harmlessly here
    # (no .git): the submodules are unpacked above.
    _run(["make", f"-j{os.cpu_count() or 1}", "all"], log_dir / "enroot-build.log", "building enroot", cwd=src)
    for node in nodes:
        prefix = node_prefix(node)
        shutil.rmtree(prefix, ignore_errors=True)
        for generated in ("enroot", "conf/enroot.conf"):  # made from *.in with the prefix's paths: per node
            (src / generated).unlink(missing_ok=True)
        _run(["make", "install", f"prefix={prefix}"], log_dir / f"enroot-install-{node.name}.log",
             f"installing enroot for node {node.name}", cwd=src)
        sysconf = prefix / "etc/enroot"
        (sysconf / "enroot.conf").write_text(enroot_conf(node))
        # The optional hook many GPU clusters enable (enroot doc/standard-hooks.md): it is what overrides a
        # job's rendezvous unless the job passes it with --container-env.
        shutil.copy(prefix / "share/enroot/hooks.d" / PYTORCH_HOOK, sysconf / "hooks.d" / PYTORCH_HOOK)
    shutil.rmtree(src, ignore_errors=True)
    stamp.write_text(stamp_text)
    return True


def build_pyxis(sources: Path, log_dir: Path) -> bool:
    """pyxis against this machine's spank.h; False when cached (stamp: its commit and the Slurm it matches)."""
    slurm = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libslurm-dev"], capture_output=True, text=True,
                           timeout=30).stdout.strip()
    stamp_text = f"pyxis={PINNED['pyxis']} libslurm-dev={slurm}\n"
    stamp = plugin_path().with_name(".stamp")
    if _stamp_ok(stamp, stamp_text) and plugin_path().is_file():
        return False
    src = CACHE / "build" / "pyxis"
    shutil.rmtree(src, ignore_errors=True)
    _unpack(tarball(sources, "pyxis"), src)
    _run(["make", f"-j{os.cpu_count() or 1}"], log_dir / "pyxis-build.log", "building pyxis", cwd=src)
    plugin_path().parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "spank_pyxis.so", plugin_path())
    shutil.rmtree(src, ignore_errors=True)
    stamp.write_text(stamp_text)
    return True


def build_image(log_dir: Path) -> bool:
    """The image, from Debian's archive (no container registry); False when cached."""
    image = image_path()
    stamp = image.with_name(image.name + ".stamp")
    stamp_text = f"debootstrap --variant=minbase --include=python3 {IMAGE_SUITE}\n{IMAGE_ENVIRONMENT}"
    if _stamp_ok(stamp, stamp_text) and image.is_file():
        return False
    root = image.with_suffix(".root")
    shutil.rmtree(root, ignore_errors=True)
    image.parent.mkdir(parents=True, exist_ok=True)
    _run(["debootstrap", "--variant=minbase", "--include=python3", IMAGE_SUITE, str(root), rootfs.debian_mirror()],
         log_dir / "image-debootstrap.log", f"debootstrap {IMAGE_SUITE}")
    (root / "etc/environment").write_text(IMAGE_ENVIRONMENT)
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    image.unlink(missing_ok=True)
    # lz4: 0.3-0.7 s here, gzip 15-22 s (FIELD-NOTES); pyxis unpacks it on every step.
    _run(["mksquashfs", str(root), str(image), "-comp", "lz4", "-noappend", "-quiet"],
         log_dir / "image-mksquashfs.log", "mksquashfs")
    shutil.rmtree(root, ignore_errors=True)
    stamp.write_text(stamp_text)
    return True


def ensure(layout: Layout) -> dict:
    """Packages, enroot per node, pyxis, the image and the plugstack.conf (idempotent, cached); what it did."""
    sources = find_sources()
    if sources is None:
        raise HpcError(missing_sources(), fix=f"set {SOURCES_ENV}")
    t0 = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    log_dir = layout.log
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (parallel test sessions)
        installed = install.install_packages(PACKAGES)
        # The image (network + disk) and enroot's compile (CPU) overlap.
        with ThreadPoolExecutor(2) as pool:
            image = pool.submit(build_image, log_dir)
            enroot = build_enroot(sources, layout.lane.cpu_nodes, log_dir)
            built = {"enroot": enroot, "pyxis": build_pyxis(sources, log_dir), "image": image.result()}
    text = plugstack_text()
    if not layout.plugstack_conf.is_file() or layout.plugstack_conf.read_text() != text:
        layout.plugstack_conf.parent.mkdir(parents=True, exist_ok=True)
        layout.plugstack_conf.write_text(text)
    for node in layout.lane.cpu_nodes:
        (TMPFS / node.name).mkdir(parents=True, exist_ok=True)
    pyxis_runtime().mkdir(parents=True, exist_ok=True)
    return {"installed": installed, "built": [k for k, v in built.items() if v],
            "seconds": round(time.monotonic() - t0, 1), "image": str(image_path())}


def node_path(node: Node, base: str) -> str:
    """The PATH a node's slurmd runs with: its own enroot first."""
    return f"{node_prefix(node) / 'bin'}{os.pathsep}{base}"
