"""The node lane (`python -m testbench up --slurm bullseye`): compute nodes unlike the submitter, as on a real
ParallelCluster, where compute nodes share only the shared file systems with the login node.

This machine's Slurm 22.05 controller and clients; three slurmd 20.11 nodes in Debian bullseye's root file system
(python3 3.9) that see none of this machine's checkout, venv, Python, /root, /home or /tmp, and one shared dir at
/fsx, which this machine sees at the same path. The submit side's srun is the nodes' 20.11 (a wrapper first on
PATH). A test submits with `node_lane.env()` (conftest: SLURM_CONF, HPC_CLUSTER_CONFIG, PATH, HPC_RUNS_DIR=
/fsx/hpc-runs) and puts what jobs read or write under `shared_tmp` (on /fsx).
The unit tests check what the lane is made of; the `slurm` ones that it is what it claims.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until
from testbench import chroot, cluster, procs
from testbench.discovery import Sandbox
from testbench.layout import CONTAINER_LANES, LANES, NODE_LANES, SHARED_MOUNT, Layout, lane

NODE_LANE = NODE_LANES["bullseye"]
PAYLOADS = REPO / "tests" / "payloads"


def test_the_node_lane_shares_nothing_with_the_other_lanes():
    ports = lambda ln: {ln.slurmctld_port, ln.slurmdbd_port, *(n.port for n in ln.nodes)}  # noqa: E731
    for other in [*LANES.values(), *CONTAINER_LANES.values()]:
        assert NODE_LANE.state_dir != other.state_dir and NODE_LANE.rootfs != other.rootfs
        assert not ports(NODE_LANE) & ports(other)
        assert not {n.addr for n in NODE_LANE.nodes} & {n.addr for n in other.nodes}
        assert NODE_LANE.first_job_id != other.first_job_id
        assert {NODE_LANE.comm(d) for d in procs.GUARDED_DAEMONS}.isdisjoint(
            other.comm(d) for d in procs.GUARDED_DAEMONS)
    assert all(len(NODE_LANE.comm(d)) <= 15 for d in procs.GUARDED_DAEMONS)
    # one node and a spare for the spares tests, and one more that a pre-flight can fail
    assert [n.name for n in NODE_LANE.cpu_nodes] == ["c1", "c2", "c3"]
    assert lane("bullseye") is NODE_LANE and Layout.current("bullseye").root == NODE_LANE.state_dir


def test_only_the_nodes_and_srun_run_in_the_root_file_system(tmp_path):
    layout = Layout(tmp_path / "state", NODE_LANE)
    assert chroot.argv(layout, ["sbatch", "x"]) == ["sbatch", "x"]  # the submitter's clients: this machine's
    # but its srun: the nodes' (this machine's 22.05 srun cannot read their slurmstepd 20.11's I/O set-up)
    assert chroot.NODE_LANE_CLIENTS == ("srun",)
    wrapper = chroot.wrapper_script(layout, "srun")
    assert "bullseye's `srun`" in wrapper and f"exec {layout.bin / '.enter'} /usr/bin/srun" in wrapper
    enter = chroot.enter_script(layout)
    assert f'mount --bind {NODE_LANE.shared_dir} "$root"/fsx' in enter  # the submit side sees /fsx too
    assert cluster._daemon(layout, "slurmd", "-N", "c1")[-3:] == ["/usr/local/sbin/slurmd-bullseye", "-N", "c1"]
    assert cluster._daemon(layout, "slurmctld")[-1] == str(layout.sbin / "slurmctld-bulls")
    assert cluster._munge_owner(layout) == ("munge", "munge")
    assert cluster.summary(layout)["bin"] == str(layout.bin)
    configs = cluster.render_configs(layout)
    conf = configs[layout.slurm_conf]
    assert "SlurmctldPort=7317\n" in conf and "FirstJobId=40000\n" in conf
    assert "NodeName=c3 NodeAddr=127.0.5.13 NodeHostname=c3 Port=7323 " in conf
    assert "AccountingStorageType=accounting_storage/none" in conf and layout.slurmdbd_conf not in configs
    assert "enable_expedited_requeue" not in conf  # the controller is 22.05


def test_a_node_sees_only_the_lanes_state_its_spool_dir_and_the_shared_dir(tmp_path):
    layout = Layout.current("bullseye")  # its real paths (nothing is written): a tmp_path would be under /tmp
    assert chroot.NODE_SYSTEM_BINDS == ("/dev", "/sys")
    assert set(chroot.node_binds(layout)) == {str(p) for p in (
        layout.etc, layout.munge, layout.run, layout.log, NODE_LANE.shared_dir)}
    script = chroot.node_enter_script(layout)
    for hidden in (str(REPO), sys.prefix, sys.base_prefix, "/work", "/home", " /tmp", "/var/tmp "):
        assert hidden not in script, hidden
    assert f'mount --bind {NODE_LANE.shared_dir} "$root"{SHARED_MOUNT}' in script
    assert f'{layout.spool}/slurmd-"$HPC_LANE_HOSTNAME"' in script  # its own spool dir only
    assert 'mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"' in script  # a private /tmp per node
    enter = tmp_path / "enter-node"
    enter.write_text(script)
    assert subprocess.run(["sh", "-n", str(enter)]).returncode == 0
    # without a node name it refuses before entering anything
    res = subprocess.run(["sh", str(enter), "true"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and "HPC_LANE_HOSTNAME" in res.stderr


def test_the_submit_side_enters_an_overlay_so_its_mount_points_stay_off_the_nodes_root():
    layout = Layout.current("bullseye")
    enter = chroot.enter_script(layout)
    overlay = 'mount -t overlay overlay -o lowerdir="$root",upperdir="$scratch/upper",workdir="$scratch/work"'
    assert overlay in enter and enter.index(overlay) < enter.index("mount --rbind")
    assert 'root="$scratch/root"' in enter
    for other in LANES.values():  # the other lanes' roots are their own: their scripts are as they were
        assert "overlay" not in chroot.enter_script(Layout(layout.root, other))


def test_stale_mount_points_are_removed_and_nothing_else(tmp_path):
    root = tmp_path / "rootfs"
    for d in ("usr/bin", "home", "tmp", "check/work/main", "work", "fsx/tests", "opt"):
        (root / d).mkdir(parents=True)
    (root / "fsx" / "tests" / "out.txt").write_text("a job's output")
    (root / "bin").symlink_to("usr/bin")
    (root / ".hpc-packages").write_text("python3\n")
    (root / "fsx" / "empty").mkdir()
    assert chroot.remove_stale_mount_points(root) == [root / "check", root / "work"]
    assert sorted(p.name for p in root.iterdir()) == [".hpc-packages", "bin", "fsx", "home", "opt", "tmp", "usr"]
    assert (root / "fsx" / "tests" / "out.txt").exists()
    assert chroot.remove_stale_mount_points(root) == []


def test_the_shared_dir_appears_at_fsx_unless_something_is_there(tmp_path, monkeypatch):
    host = tmp_path / "state" / "fsx"
    layout = Layout(tmp_path / "state", dataclasses.replace(NODE_LANE, shared_dir=host))
    mount = tmp_path / "fsx"
    monkeypatch.setattr(cluster, "SHARED_MOUNT", mount)
    assert cluster.shared_mount(layout) == mount and mount.resolve() == host and host.is_dir()
    assert cluster.shared_mount(layout) == mount  # idempotent
    mount.unlink()
    mount.mkdir()  # a real shared file system there is never shadowed: the host dir is used, which nodes see too
    assert cluster.shared_mount(layout) == host and not any(mount.iterdir())


def test_its_environment_puts_runs_on_the_shared_dir(tmp_path):
    from testbench.cli import _exports

    sandbox = Sandbox(tmp_path, tmp_path / "slurm.conf", tmp_path / "c.yaml", shared_dir=Path("/fsx"))
    env = sandbox.env({"PATH": "/usr/bin", "HPC_RUNS_DIR": "/tmp/elsewhere"})
    assert env["HPC_RUNS_DIR"] == "/fsx/hpc-runs" and env["PATH"] == "/usr/bin"
    with_srun = Sandbox(tmp_path, tmp_path / "s", tmp_path / "c", bin_dir=Path("/b"), shared_dir=Path("/fsx"))
    assert with_srun.env({"PATH": "/usr/bin"})["PATH"] == "/b:/usr/bin"
    assert "HPC_RUNS_DIR" not in Sandbox(tmp_path, tmp_path / "s", tmp_path / "c").env({})
    line = _exports({"slurm_conf": "/s", "cluster_config": "/c", "bin": None, "runs_dir": "/fsx/hpc-runs"})
    assert line == "export SLURM_CONF=/s HPC_CLUSTER_CONFIG=/c HPC_RUNS_DIR=/fsx/hpc-runs"


# What each task reports from its node: Python 3.9's standard library only.
PROBE = """\
import json, os, socket, sys
host = socket.gethostname()
out = os.path.join(sys.argv[1], "from-" + host)
with open(out, "w") as f:
    f.write(host + "\\n")
print(json.dumps({"host": host, "rank": int(os.environ["SLURM_PROCID"]), "python": list(sys.version_info[:2]),
                  "executable": sys.executable, "seen": [p for p in sys.argv[2:] if os.path.exists(p)],
                  "wrote": out}), flush=True)
"""


def sbatch(node_lane, env: dict[str, str], cwd: Path, *args: str) -> str:
    res = subprocess.run(["sbatch", "--parsable", "--chdir", str(cwd), "--output", str(cwd / "out.txt"), *args],
                         env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def wait_for_end(env: dict[str, str], job_id: str, timeout: float = 120) -> str:
    def state() -> str | None:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                             timeout=30).stdout
        fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
        done = fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        return fields["JobState"] if done else None

    return wait_until(state, timeout, f"job {job_id} to end")


@pytest.mark.slurm
def test_jobs_run_on_bullseye_nodes_that_see_only_the_shared_dir(node_lane, shared_tmp, tmp_path):
    # What exists here and must not on a node: the checkout, the venv, this Python, /root's own files (not the
    # ones bullseye's root has too), this machine's /tmp.
    rootfs_home = {p.name for p in (NODE_LANE.rootfs / "root").iterdir()}
    own_home = sorted(str(p) for p in Path("/root").iterdir() if p.name not in rootfs_home)[:5]
    marker = tmp_path / "host-only"
    marker.write_text("x")
    # the checkout's top dir too: the submit side's binds once left empty mount points in the shared root file
    # system, so CI's nodes saw its clone's path (/check/work/main) as an empty dir
    top = [] if REPO.parts[1] in chroot.ROOTFS_OWN_TOP else ["/" + REPO.parts[1]]  # (a node has its own /tmp)
    hidden = [str(REPO), *top, "/work/main", sys.prefix, sys.base_prefix, sys.executable, str(marker), *own_home]
    assert all(Path(p).exists() for p in hidden)
    (shared_tmp / "probe.py").write_text(PROBE)
    # The submitter's PATH names its venv first, as a login node's user's would; the nodes have no such venv.
    env = node_lane.env() | {"PATH": f"{Path(sys.executable).parent}:{node_lane.env()['PATH']}"}
    job_id = sbatch(node_lane, env, shared_tmp, "--nodes=2", "--ntasks-per-node=1", "--wrap",
                    " ".join(["srun", "python3", str(shared_tmp / "probe.py"), str(shared_tmp), *hidden]))
    state = wait_for_end(env, job_id)
    output = (shared_tmp / "out.txt").read_text()
    assert state == "COMPLETED", output
    tasks = sorted((json.loads(line) for line in output.splitlines() if line.startswith("{")),
                   key=lambda t: t["rank"])
    assert [t["rank"] for t in tasks] == [0, 1]
    assert len({t["host"] for t in tasks}) == 2 and {t["host"] for t in tasks} <= {"c1", "c2", "c3"}
    for task in tasks:
        assert task["python"] == [3, 9] and task["executable"] == "/usr/bin/python3"
        assert task["seen"] == [], f"{task['host']} sees this machine's {task['seen']}"
        wrote = Path(task["wrote"])  # the path the node wrote is the path this machine reads
        assert wrote.parent == shared_tmp and wrote.read_text() == f"{task['host']}\n"
    # the nodes' Slurm is bullseye's, under this machine's controller
    nodes = subprocess.run(["scontrol", "-o", "show", "node", "c1,c2,c3"], env=env, capture_output=True, text=True,
                           timeout=30, check=True).stdout
    assert nodes.count("Version=20.11") == 3
    version = subprocess.run(["sbatch", "--version"], env=env, capture_output=True, text=True, timeout=30).stdout
    assert version.split()[-1].startswith("22.05")


@pytest.mark.slurm
def test_the_submit_sides_srun_reaches_the_nodes(node_lane, shared_tmp):
    # hpc's health checks and the bad-node search run srun from the login node: it must get the tasks' output
    env = node_lane.env()
    version = subprocess.run(["srun", "--version"], env=env, capture_output=True, text=True, timeout=30).stdout
    assert version.split()[-1].startswith("20.11")
    res = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "--time=1", "sh", "-c",
                          'echo "$(hostname) $(python3 -c "import sys; print(sys.version_info[:2])") $PWD"'],
                         env=env, cwd=shared_tmp, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    tasks = [line.split(" ", 3) for line in sorted(res.stdout.splitlines())]
    assert len(tasks) == 2 and len({host for host, *_ in tasks}) == 2
    # a cwd given to subprocess is the symlink's target (the kernel keeps no other): nodes see that path too
    assert all(f"{major} {minor}" == "(3, 9)" and Path(cwd).resolve() == shared_tmp.resolve()
               for _, major, minor, cwd in tasks)
    # its binds (the checkout, the venv) were mounted on an overlay: the nodes' root file system gained nothing
    assert chroot.remove_stale_mount_points(NODE_LANE.rootfs) == []


@pytest.mark.slurm
def test_two_nodes_rendezvous_over_tcp_through_the_first_nodes_name(node_lane, shared_tmp):
    # The payload must be on the shared dir: the nodes cannot read the checkout.
    shutil.copy(PAYLOADS / "rendezvous.py", shared_tmp / "rendezvous.py")
    env = node_lane.env()
    job_id = sbatch(node_lane, env, shared_tmp, "--nodes=2", "--ntasks-per-node=1", "--wrap",
                    f"srun python3 {shared_tmp / 'rendezvous.py'}")
    state = wait_for_end(env, job_id)
    output = (shared_tmp / "out.txt").read_text()
    assert state == "COMPLETED", output
    heard = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    assert heard["job_id"] == job_id and heard["self"]["host"] == heard["master"]
    assert heard["master_addr"] == next(n.addr for n in NODE_LANE.cpu_nodes if n.name == heard["master"])
    assert [p["rank"] for p in heard["peers"]] == [1] and heard["peers"][0]["host"] != heard["master"]
