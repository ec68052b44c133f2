"""Bring the local test cluster up, down, and report on it: munge, MariaDB, slurmdbd, slurmctld, slurmd nodes.

`up` is idempotent: daemons that run are left alone, dead ones are started again (in dependency order), and a
changed config restarts the Slurm daemons that read it. Every daemon is ours only through its pid file; a
Slurm or munge that we did not start makes `up` refuse before it changes anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError
from testbench import chroot, containers, install, procs, rootfs
from testbench.discovery import RUNS_SUBDIR
from testbench.layout import CLUSTER_NAME, DEFAULT_QUEUE, FAKE_GPUS_PER_NODE, SHARED_MOUNT, Layout, Node

MIN_JOB_AGE = 30  # seconds a finished job stays in squeue/scontrol (sacct keeps it for good)
# Below Slurm's default 1001, as many sites set it: a sweep of a few hundred tasks is split into arrays. Both the
# slurm.conf and the cluster config say it, as ParallelCluster writes CustomSlurmSettings into its slurm.conf.
MAX_ARRAY_SIZE = 101
START_TIMEOUT = 60.0
SLURM_TIMEOUT = 20  # every Slurm command gets one
# What a chroot lane's root file system holds (its Python runs payloads that need only the standard library).
ROOTFS_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "python3")
# The node lane's: a compute node's Slurm (slurmd, srun for steps inside jobs) and its own python3, with venv so
# that tests can make a job venv on the shared dir with the node's Python.
NODE_ROOTFS_PACKAGES = ("slurmd", "slurm-client", "munge", "python3", "python3-venv")
# What the node lane runs of this machine's own: munge, the controller and the clients (no accounting).
NODE_LANE_HOST_PACKAGES = ("slurmctld", "slurm-client", "munge")
# A node lane's slurmd starts with this environment only, not the environment of whoever ran `up`.
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_MAJOR = 195


@dataclasses.dataclass(frozen=True)
class Daemon:
    key: str  # how status names it
    comm: str  # the process name /proc shows
    pid_file: Path
    config: tuple[Path, ...] = ()  # files it reads at start: a change means a restart
    node: Node | None = None  # the node a slurmd serves


def daemons(layout: Layout) -> list[Daemon]:
    """Every daemon in start order."""
    slurm = (layout.slurm_conf, layout.gres_conf, layout.cgroup_conf)
    comm = layout.lane.comm
    accounting = [
        Daemon("mariadbd", comm("mariadbd"), layout.pid_file("mariadbd")),
        Daemon("slurmdbd", comm("slurmdbd"), layout.pid_file("slurmdbd"), (layout.slurmdbd_conf,)),
    ] if layout.lane.accounting else []
    return [
        Daemon("munged", comm("munged"), layout.pid_file("munged")),
        *accounting,
        Daemon("slurmctld", comm("slurmctld"), layout.pid_file("slurmctld"), slurm),
        *(Daemon(f"slurmd-{n.name}", comm("slurmd"), layout.pid_file("slurmd", n.name), slurm, n)
          for n in layout.lane.slurmd_nodes),
    ]


def render_configs(layout: Layout) -> dict[Path, str]:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("testbench", "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    lane = layout.lane
    values = dict(layout=layout, cluster_name=CLUSTER_NAME, slurmctld_port=lane.slurmctld_port,
                  slurmdbd_port=lane.slurmdbd_port, min_job_age=MIN_JOB_AGE, max_array_size=MAX_ARRAY_SIZE,
                  cpu_nodes=lane.cpu_nodes, p3dn_nodes=lane.p3dn_nodes, wide_nodes=lane.wide_nodes,
                  gpus_per_node=FAKE_GPUS_PER_NODE,
                  accounting=lane.accounting, first_job_id=lane.first_job_id,
                  expedited_requeue=tuple(map(int, lane.slurm.split("."))) >= (25, 11),
                  plugstack=lane.containers and layout.plugstack_conf)
    configs = {
        layout.slurm_conf: env.get_template("slurm.conf.j2").render(values),
        layout.gres_conf: env.get_template("gres.conf.j2").render(values),
        layout.cgroup_conf: env.get_template("cgroup.conf.j2").render(values),
        layout.cluster_config: env.get_template("cluster-config.yaml.j2").render(values),
    }
    if lane.accounting:
        configs[layout.slurmdbd_conf] = env.get_template("slurmdbd.conf.j2").render(values)
    return configs


def write_configs(layout: Layout) -> set[Path]:
    """Write the rendered configs; returns the files whose content changed."""
    changed = set()
    for path, text in render_configs(layout).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.add(path)
    if layout.slurmdbd_conf.exists():
        layout.slurmdbd_conf.chmod(0o600)  # slurmdbd refuses a config others can read
    return changed


def _prepare_dirs(layout: Layout) -> None:
    for d in (layout.root, layout.etc, layout.run, layout.log, layout.spool, layout.gpu_devices,
              layout.spool / "slurmctld", *(layout.spool / f"slurmd-{n.name}" for n in layout.lane.slurmd_nodes)):
        d.mkdir(parents=True, exist_ok=True)
    layout.root.chmod(0o755)  # munge and mysql users must reach their dirs
    if layout.lane.containers or layout.lane.rootfs_nodes_only:  # this machine's daemons, named as Lane.comm says
        layout.sbin.mkdir(exist_ok=True)
        for name, target in chroot.DAEMONS.items():
            link = layout.sbin / layout.lane.comm(name)
            if not link.is_symlink():
                link.symlink_to(target)
    for i in range(FAKE_GPUS_PER_NODE):
        dev = layout.gpu_devices / f"nvidia{i}"
        if not dev.exists():  # gres.conf File= must be a character device: plain files are rejected
            os.mknod(dev, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, i))


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = SLURM_TIMEOUT) -> str:
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise HpcError(f"`{' '.join(args)}` failed: {(res.stderr or res.stdout).strip()}",
                       fix="see the logs under the sandbox state dir's log/ folder")
    return res.stdout


def _slurm(layout: Layout, args: list[str]) -> str:
    """A Slurm program of the layout's lane (inside its root file system for a chroot lane)."""
    return _run(chroot.argv(layout, args), env=slurm_env(layout))


def _daemon(layout: Layout, name: str, *args: str) -> list[str]:
    """How to start a daemon: by name on this machine's Slurm; in a chroot lane from its version-named symlink
    (its process name) with argv[0] the plain name, which Slurm 24.11 checks (e.g. only a program called
    `slurmctld` may load the certmgr plugin)."""
    lane = layout.lane
    if lane.rootfs is None and not lane.containers:
        return [name, *args]
    in_rootfs = lane.rootfs is not None and (not lane.rootfs_nodes_only or name == "slurmd")
    path = chroot.daemon_path(layout, name) if in_rootfs else str(layout.sbin / lane.comm(name))
    return ["/bin/bash", "-c", 'exec -a "$0" "$@"', name, path, *args]


def slurm_env(layout: Layout) -> dict[str, str]:
    return dict(os.environ, SLURM_CONF=str(layout.slurm_conf), MYSQL_UNIX_PORT=str(layout.mysql_socket))


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _unix_socket_open(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(0.2)
        return s.connect_ex(str(path)) == 0


def _munge_owner(layout: Layout) -> tuple[int, int] | tuple[str, str]:
    """The munge user as the daemon sees it: a root file system has its own /etc/passwd (other ids)."""
    if layout.lane.rootfs is None or layout.lane.rootfs_nodes_only:
        return "munge", "munge"
    for line in (layout.lane.rootfs / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "munge":
            return int(fields[2]), int(fields[3])
    raise HpcError(f"no munge user in {layout.lane.rootfs}", fix=f"remove {layout.lane.rootfs} to rebuild it")


def _start_munge(layout: Layout) -> None:
    layout.munge.mkdir(exist_ok=True)
    if not layout.munge_key.exists():
        _run(chroot.argv(layout, ["mungekey", "--create", "--keyfile", str(layout.munge_key)]))
    user, group = _munge_owner(layout)
    shutil.chown(layout.munge, user, group)
    shutil.chown(layout.munge_key, user, group)
    layout.munge.chmod(0o755)  # munged insists that every client can reach its socket
    layout.munge_key.chmod(0o600)
    _run(chroot.argv(layout, [
        "runuser", "-u", "munge", "--", *_daemon(
            layout, "munged", f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
            f"--pid-file={layout.pid_file('munged')}", f"--log-file={layout.munge / 'munged.log'}",
            f"--seed-file={layout.munge / 'munged.seed'}")]))


def _start_mariadb(layout: Layout) -> None:
    layout.mysql.mkdir(exist_ok=True)
    shutil.chown(layout.mysql, "mysql", "mysql")
    if not (layout.mysql_data / "mysql").is_dir():
        _run(["mariadb-install-db", "--no-defaults", f"--datadir={layout.mysql_data}", "--user=mysql",
              "--auth-root-authentication-method=socket", "--skip-test-db", "--skip-name-resolve"], timeout=120)
    layout.mysql_socket.unlink(missing_ok=True)
    log_path = layout.log / "mariadb.log"
    with open(log_path, "ab") as log:
        # No network: slurmdbd reaches it through its socket (MYSQL_UNIX_PORT).
        server = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={layout.mysql_data}", f"--socket={layout.mysql_socket}",
             f"--pid-file={layout.pid_file('mariadbd')}", "--skip-networking", "--skip-name-resolve",
             "--user=mysql", "--performance-schema=OFF",
             # slurmdbd's recommended values (it warns below them)
             "--innodb-buffer-pool-size=128M", "--innodb-lock-wait-timeout=900"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    def ready() -> bool:
        if server.poll() is not None:
            raise HpcError(f"MariaDB exited with code {server.returncode}", fix=f"see {log_path}")
        return _unix_socket_open(layout.mysql_socket)

    procs.wait_for(ready, START_TIMEOUT, "MariaDB", log_path)


def _start_slurmdbd(layout: Layout) -> None:
    _slurm(layout, _daemon(layout, "slurmdbd"))
    procs.wait_for(lambda: _port_open(layout.lane.slurmdbd_port), START_TIMEOUT, "slurmdbd",
                   layout.log / "slurmdbd.log")


def _start_slurmctld(layout: Layout) -> None:
    _slurm(layout, _daemon(layout, "slurmctld"))
    procs.wait_for(lambda: _port_open(layout.lane.slurmctld_port), START_TIMEOUT, "slurmctld",
                   layout.log / "slurmctld.log")


def _start_slurmd(layout: Layout, node: Node) -> None:
    # Its own UTS namespace: `hostname` inside the node's jobs says the node's name.
    if layout.lane.rootfs_nodes_only:
        _run([str(layout.node_enter), *_daemon(layout, "slurmd", "-N", node.name)],
             env={"PATH": NODE_PATH, "SLURM_CONF": str(layout.slurm_conf), "HPC_LANE_HOSTNAME": node.name})
        return
    if layout.lane.rootfs is not None:
        _run(chroot.argv(layout, _daemon(layout, "slurmd", "-N", node.name)),
             env=dict(slurm_env(layout), HPC_LANE_HOSTNAME=node.name))
        return
    env = slurm_env(layout)
    if layout.lane.containers:  # pyxis passes enroot only PATH: the node's own enroot comes first on it
        env["PATH"] = containers.node_path(node, env.get("PATH", os.defpath))
    start = 'node="$1"; shift; hostname "$node" && exec "$@" -N "$node"'
    # Its own mount namespace too (mounts of this machine still reach it: slave propagation): a fault can take a
    # file system away from one node (testbench.faults.missing_mount), and its steps inherit that view.
    _run(["unshare", "--uts", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", start, "sh", node.name,
          *_daemon(layout, "slurmd")], env=env)


def _start(layout: Layout, daemon: Daemon) -> None:
    if daemon.node is not None:
        _start_slurmd(layout, daemon.node)
    else:
        {"munged": _start_munge, "mariadbd": _start_mariadb, "slurmdbd": _start_slurmdbd,
         "slurmctld": _start_slurmctld}[daemon.key](layout)


def running(layout: Layout) -> dict[str, int | None]:
    """Daemon key -> pid if running, else None."""
    return {d.key: procs.running_pid(d.pid_file, d.comm) for d in daemons(layout)}


def refuse_foreign(layout: Layout) -> None:
    """Raise if a Slurm or munge daemon runs that this state dir's pid files do not name."""
    ours = [pid for pid in running(layout).values() if pid is not None]
    foreign = procs.foreign_daemons(ours, {layout.lane.comm(name) for name in procs.GUARDED_DAEMONS})
    if foreign:
        found = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(foreign.items()))
        raise HpcError(
            f"another Slurm or munge runs on this machine, not started by the sandbox in {layout.root}: {found}",
            fix="stop it first, or set HPC_SANDBOX_DIR to the state dir of the sandbox that started it",
        )


def node_states(layout: Layout) -> dict[str, str]:
    """Node name -> Slurm state (e.g. idle, alloc, down*) as sinfo reports it."""
    out = _slurm(layout, ["sinfo", "-h", "-N", "-o", "%N %t"])
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def _wait_for_nodes(layout: Layout) -> None:
    names = [n.name for n in layout.lane.slurmd_nodes]

    def ready() -> bool:  # registered and usable: no flag suffix such as * (not responding)
        states = node_states(layout)
        return all(states.get(n) in ("idle", "mix", "alloc", "comp") for n in names)

    try:
        procs.wait_for(ready, START_TIMEOUT, "cpu nodes", interval=0.2)
    except HpcError:
        # A node left down or drained by an earlier crash: its slurmd runs, so return it to service.
        _slurm(layout, ["scontrol", "update", f"NodeName={','.join(names)}", "State=RESUME"])
        procs.wait_for(ready, 10, "cpu nodes", layout.log / f"slurmd-{names[0]}.log", interval=0.2)


def _forget_node_state(layout: Layout) -> None:
    """Nodes take their state from the new config, not from the saved one (jobs are kept)."""
    for name in ("node_state", "node_state.old"):
        (layout.spool / "slurmctld" / name).unlink(missing_ok=True)


@contextlib.contextmanager
def _exclusive(layout: Layout):
    """One `up` or `down` of a sandbox at a time: two racing ones (test sessions in parallel) each restarted
    daemons the other had just started, and left pid files naming the wrong processes."""
    import fcntl

    lock = layout.root.parent / f".{layout.root.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def up(layout: Layout | None = None) -> dict[str, Any]:
    """Start whatever is not running; a fast no-op when everything is. Returns what it did."""
    layout = layout or Layout.current()
    if os.geteuid() != 0:
        raise HpcError("the sandbox starts system daemons and needs root", fix="run it as root (e.g. sudo)")
    with _exclusive(layout):
        return _up(layout)


def _up(layout: Layout) -> dict[str, Any]:
    t0 = time.monotonic()
    refuse_foreign(layout)
    _prepare_dirs(layout)
    lane = layout.lane
    if lane.rootfs_nodes_only:
        installed = install.install_packages(NODE_LANE_HOST_PACKAGES)
        built = rootfs.ensure(lane.rootfs or Path(), lane.suite or "", NODE_ROOTFS_PACKAGES, layout.log)
        installed += [f"rootfs {lane.suite}"] * built["built"] + built["installed"]
        rootfs.write_hosts(lane.rootfs or Path(), lane.nodes)
        chroot.write_node_entry(layout)
        shared_mount(layout)
    elif lane.rootfs is None:
        installed = install.install_packages()
        install.add_hosts(lane.nodes)
        if lane.containers:
            built = containers.ensure(layout)
            installed += built["installed"] + built["built"]
    else:
        built = rootfs.ensure(lane.rootfs, lane.suite or "", ROOTFS_PACKAGES, layout.log)
        installed = [f"rootfs {lane.suite}"] * built["built"] + built["installed"]
        rootfs.write_hosts(lane.rootfs, lane.nodes)
        chroot.write(layout)
    changed = write_configs(layout)
    pids = running(layout)
    restart: set[str] = set()
    started: list[str] = []
    for daemon in daemons(layout):
        needs_restart = daemon.key in restart or any(c in changed for c in daemon.config)
        if pids[daemon.key] is not None and needs_restart:
            procs.stop(daemon.pid_file, daemon.comm)
            pids[daemon.key] = None
        if pids[daemon.key] is None:
            if daemon.key == "slurmctld" and layout.slurm_conf in changed:
                _forget_node_state(layout)
            _start(layout, daemon)
            started.append(daemon.key)
            if daemon.key == "mariadbd":
                restart.add("slurmdbd")  # its database connection went away with the old server
    if started:
        _wait_for_nodes(layout)
    return {**summary(layout), "installed": installed, "started": started,
            "seconds": round(time.monotonic() - t0, 2)}


def down(layout: Layout | None = None) -> list[str]:
    """Stop our daemons by their pid files, nodes first; returns those that were running."""
    layout = layout or Layout.current()
    with _exclusive(layout):
        return [d.key for d in reversed(daemons(layout)) if procs.stop(d.pid_file, d.comm)]


def summary(layout: Layout) -> dict[str, Any]:
    chrooted = layout.lane.rootfs is not None  # the node lane: its srun (chroot.NODE_LANE_CLIENTS)
    data = {"slurm": layout.lane.slurm, "state_dir": str(layout.root), "slurm_conf": str(layout.slurm_conf),
            "cluster_config": str(layout.cluster_config), "default_queue": DEFAULT_QUEUE,
            "bin": str(layout.bin) if chrooted else None, "accounting": layout.lane.accounting}
    if layout.lane.rootfs_nodes_only:
        shared = shared_path(layout)
        data.update(shared_dir=str(shared), runs_dir=str(shared / RUNS_SUBDIR), node_rootfs=str(layout.lane.rootfs))
    return data


def shared_path(layout: Layout) -> Path:
    """Where this machine and the node lane's nodes both see the shared dir: SHARED_MOUNT when it is our symlink
    (as a login node and its compute nodes both mount the shared file system at /fsx), else the host dir, which
    the nodes see too (chroot.node_binds)."""
    host = layout.lane.shared_dir
    assert host is not None
    if SHARED_MOUNT.is_symlink() and Path(os.readlink(SHARED_MOUNT)) == host:
        return SHARED_MOUNT
    return host


def shared_mount(layout: Layout) -> Path:
    """Create the shared dir, and SHARED_MOUNT on this machine as a symlink to it unless SHARED_MOUNT exists
    already (a real shared file system is never shadowed); returns shared_path()."""
    host = layout.lane.shared_dir
    assert host is not None
    host.mkdir(parents=True, exist_ok=True)
    host.chmod(0o1777)  # every user's runs, like a scratch file system
    if not SHARED_MOUNT.exists() and not SHARED_MOUNT.is_symlink():
        SHARED_MOUNT.symlink_to(host)
    return shared_path(layout)


def status(layout: Layout | None = None) -> dict[str, Any]:
    layout = layout or Layout.current()
    pids = running(layout)
    nodes: dict[str, str] = {}
    if pids["slurmctld"] is not None:
        try:
            nodes = node_states(layout)
        except (HpcError, subprocess.TimeoutExpired):
            nodes = {}
    return {**summary(layout), "up": all(p is not None for p in pids.values()),
            "daemons": [{"name": k, "pid": p, "running": p is not None} for k, p in pids.items()],
            "nodes": nodes}
