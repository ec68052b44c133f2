"""The local test cluster's pieces without running it: configs, discovery, process checks, machine set-up."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_testbench
from testbench import Sandbox, cluster, discover, discovery, install, procs
from testbench.layout import CPU_NODES, Layout
from toolkit.cluster.queues import load_queues


def conf_lines(text: str) -> list[dict[str, str]]:
    """slurm.conf lines as key=value dicts (comments and blanks dropped)."""
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append(dict(item.split("=", 1) for item in line.split()))
    return rows


@pytest.fixture
def rendered(tmp_path):
    layout = Layout(tmp_path / "state")
    return layout, cluster.render_configs(layout)


def test_slurm_conf_has_the_fast_and_fake_hardware_settings(rendered):
    layout, files = rendered
    settings = {k: v for row in conf_lines(files[layout.slurm_conf]) if len(row) == 1 for k, v in row.items()}
    assert settings["SchedulerParameters"] == "batch_sched_delay=0,sched_min_interval=0,sched_interval=1"
    assert settings["AuthInfo"] == f"socket={layout.munge_socket},cred_expire=5"
    assert (settings["MailProg"], settings["ProctrackType"], settings["TaskPlugin"]) == (
        "/bin/true", "proctrack/linuxproc", "task/affinity,task/cgroup")
    assert settings["SlurmdParameters"] == "config_overrides"
    assert 0 < int(settings["MinJobAge"]) <= 60
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert all(str(layout.root) in settings[k] for k in ("StateSaveLocation", "SlurmctldPidFile", "SlurmctldLogFile"))


def test_the_cluster_config_declares_the_array_limit_the_slurm_conf_sets(rendered):
    """Sweeps planned with --cluster read MaxArraySize from the config's CustomSlurmSettings, as ParallelCluster
    writes them into its slurm.conf: the two files must agree."""
    from toolkit.submit.sweep import array_limit

    layout, files = rendered
    settings = {k: v for row in conf_lines(files[layout.slurm_conf]) if len(row) == 1 for k, v in row.items()}
    layout.cluster_config.parent.mkdir(parents=True)
    layout.cluster_config.write_text(files[layout.cluster_config])
    assert array_limit(str(layout.cluster_config))[0] == int(settings["MaxArraySize"]) < 1001


def test_slurm_conf_declares_both_partitions(rendered):
    layout, files = rendered
    rows = conf_lines(files[layout.slurm_conf])
    nodes = {r["NodeName"]: r for r in rows if "NodeName" in r}
    parts = {r["PartitionName"]: r for r in rows if "PartitionName" in r}
    assert parts["cpu"]["Nodes"] == "c1,c2" and parts["cpu"]["Default"] == "YES"
    p3dn = parts["p3dn"]["Nodes"].split(",")
    assert p3dn == [f"p3dn-st-p3dn-24xl-{i}" for i in range(1, 9)]
    assert all(nodes[n]["CPUs"] == "2" for n in ("c1", "c2"))
    assert all((nodes[n]["CPUs"], nodes[n]["Gres"], nodes[n]["State"]) == ("96", "gpu:8", "CLOUD") for n in p3dn)
    addrs = [nodes[n]["NodeAddr"] for n in nodes]
    assert len(set(addrs)) == len(addrs) and all(a.startswith("127.0.1.") for a in addrs)


def test_gres_conf_points_at_character_devices(rendered):
    layout, files = rendered
    rows = conf_lines(files[layout.gres_conf])
    assert len(rows) == 8 and all(r["File"] == f"{layout.gpu_devices}/nvidia[0-7]" for r in rows)


def test_cluster_config_describes_the_queues_as_queues_py_reads_them(rendered):
    layout, files = rendered
    layout.root.mkdir(parents=True)
    layout.cluster_config.write_text(files[layout.cluster_config])
    queues = load_queues(layout.cluster_config)
    cpu, p3dn = queues["cpu"], queues["p3dn"]
    assert (cpu.instance_type, cpu.max_nodes, cpu.tasks_per_node, cpu.cpus_per_task, cpu.efa_stack) == (
        "m5.xlarge", 2, 2, 1, "none")
    assert (p3dn.instance_type, p3dn.max_nodes, p3dn.tasks_per_node, p3dn.gpus_per_node) == (
        "p3dn.24xlarge", 8, 8, 8)


def fake_proc(root: Path, pid: int, name: str, state: str = "S") -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "comm").write_text(name + "\n")
    (root / str(pid) / "stat").write_text(f"{pid} ({name}) {state} 1 1 1 0 -1\n")


def test_foreign_daemons_are_live_slurm_or_munge_processes_not_ours(tmp_path):
    fake_proc(tmp_path, 100, "slurmctld")
    fake_proc(tmp_path, 101, "munged", state="Z")  # exited, not reaped yet
    fake_proc(tmp_path, 102, "slurmd")
    fake_proc(tmp_path, 103, "python3")
    fake_proc(tmp_path, 104, "slurmstepd")
    assert procs.foreign_daemons([], proc=tmp_path) == {100: "slurmctld", 102: "slurmd"}
    assert procs.foreign_daemons([100], proc=tmp_path) == {102: "slurmd"}


def test_a_pid_file_naming_another_process_is_not_ours(tmp_path):
    pid_file = tmp_path / "slurmctld.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # a recycled pid: alive, but not a slurmctld
    assert procs.running_pid(pid_file, "slurmctld") is None
    assert procs.running_pid(pid_file, procs.comm(os.getpid())) == os.getpid()
    assert procs.running_pid(tmp_path / "absent.pid", "slurmctld") is None


def test_stop_leaves_an_unrelated_process_alone(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        procs.wait_for(lambda: procs.comm(sleeper.pid) == "sleep", 5, "sleep")  # exec'd, not still python
        pid_file = tmp_path / "slurmd.pid"
        pid_file.write_text(str(sleeper.pid))
        assert procs.stop(pid_file, "slurmd") is False
        assert sleeper.poll() is None and not pid_file.exists()
        pid_file.write_text(str(sleeper.pid))
        assert procs.stop(pid_file, "sleep") is True
        assert sleeper.wait(timeout=5) is not None
    finally:
        sleeper.kill()


def test_hosts_lines_are_added_once(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.11 c1\n")
    added = install.add_hosts(CPU_NODES, hosts)
    assert [line.split()[:2] for line in added] == [["127.0.1.12", "c2"]]
    assert install.add_hosts(CPU_NODES, hosts) == []
    assert hosts.read_text().splitlines()[:2] == ["127.0.0.1 localhost", "127.0.1.11 c1"]


def test_policy_rc_is_temporary_and_an_existing_one_is_left_alone(tmp_path, monkeypatch):
    policy = tmp_path / "policy-rc.d"
    monkeypatch.setattr(install, "POLICY_RC", policy)
    with install.services_not_started():
        assert subprocess.run([str(policy)]).returncode == 101
    assert not policy.exists()
    policy.write_text("#!/bin/sh\nexit 0\n")
    with install.services_not_started():
        pass
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def no_subprocess(*args, **kwargs):
    raise AssertionError("discover() must not start a process")


def test_discover_is_none_without_a_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_SANDBOX_DIR", str(tmp_path / "absent"))
    assert discover() is None


def written_state_dir(root: Path) -> Layout:
    """A state dir with its configs and a pid file for slurmctld, as `up` leaves it (no daemon started)."""
    layout = Layout(root)
    for path, text in cluster.render_configs(layout).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    layout.run.mkdir()
    layout.pid_file("slurmctld").write_text(f"{os.getpid()}\n")
    return layout


def test_discover_ignores_a_state_dir_whose_controller_is_gone(tmp_path, monkeypatch):
    written_state_dir(tmp_path)  # its pid file names a live process, but not a slurmctld
    monkeypatch.setenv("HPC_SANDBOX_DIR", str(tmp_path))
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    assert discover() is None


def test_discover_finds_a_running_controller_cheaply_and_env_points_slurm_and_hpc_at_it(tmp_path, monkeypatch):
    layout = written_state_dir(tmp_path)
    # Whether a pid is a live slurmctld is procs' test (above); here: that discover asks it about this file.
    monkeypatch.setattr(discovery.procs, "running_pid",
                        lambda pid_file, comm: 4242 if (pid_file, comm) == (layout.pid_file("slurmctld"),
                                                                             "slurmctld") else None)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    sandbox = discover(layout)
    assert sandbox == Sandbox(tmp_path, layout.slurm_conf, layout.cluster_config, slurm="22.05")
    assert sandbox.env({"PATH": "/usr/bin"}) == {
        "PATH": "/usr/bin", "SLURM_CONF": str(layout.slurm_conf), "HPC_CLUSTER_CONFIG": str(layout.cluster_config)}
    chrooted = Sandbox(tmp_path, layout.slurm_conf, layout.cluster_config, bin_dir=tmp_path / "bin")
    assert chrooted.env({"PATH": "/usr/bin"})["PATH"] == f"{tmp_path / 'bin'}:/usr/bin"


def test_env_of_a_cluster_that_is_not_running_is_one_clear_error(tmp_path):
    res = run_testbench("env", env={**os.environ, "HPC_SANDBOX_DIR": str(tmp_path / "absent")})
    assert res.returncode == 1 and res.stdout == ""  # nothing for `eval` to pick up
    assert "is not running" in res.stderr and "fix: start it: python -m testbench up" in res.stderr, res.stderr
