"""The local Slurm lanes (22.05 on this machine, 24.11 and 26.05 from trixie and forky root file systems): what
keeps them apart, where the root file systems come from, and the scripts that enter them (no daemons started
here)."""

from __future__ import annotations

import itertools
import shlex
import subprocess

import pytest

from testbench import chroot, cluster, procs, rootfs
from testbench.layout import LANES, Layout, lane
from toolkit.errors import HpcError, UsageError


@pytest.mark.parametrize("one, other", list(itertools.combinations(LANES, 2)))
def test_lanes_share_nothing_that_would_let_them_collide(one, other):
    old, new = LANES[one], LANES[other]
    assert old.state_dir != new.state_dir and new.rootfs is not None and old.rootfs != new.rootfs
    ports = lambda lay: {lay.slurmctld_port, lay.slurmdbd_port, *(n.port for n in lay.nodes)}  # noqa: E731
    assert not ports(old) & ports(new)
    assert not {n.addr for n in old.nodes} & {n.addr for n in new.nodes}
    assert [n.name for n in old.cpu_nodes] == [n.name for n in new.cpu_nodes] == ["c1", "c2"]
    # Test payloads derive ports from job ids: each lane numbers its jobs apart.
    assert old.first_job_id != new.first_job_id
    # Each lane's guard against a foreign Slurm looks for its own exact names: the other's daemons differ.
    assert {old.comm(d) for d in procs.GUARDED_DAEMONS}.isdisjoint(new.comm(d) for d in procs.GUARDED_DAEMONS)
    assert {new.comm(d) for d in ("munged", "slurmctld", "slurmd")} == {
        f"munged-{other}", f"slurmctld-{other}", f"slurmd-{other}"}
    assert all(len(new.comm(d)) <= 15 for d in ("slurmctld", "slurmdbd", "mariadbd"))  # the kernel's limit


def test_the_default_lane_is_this_machines_own_slurm():
    assert LANES["22.05"].rootfs is None and LANES["22.05"].comm("slurmd") == "slurmd"


def test_an_unknown_version_is_a_usage_error_naming_the_choices():
    with pytest.raises(UsageError, match="24.11"):
        lane("23.02")


@pytest.mark.parametrize("slurm, port, addr, first_job_id", [("24.11", 7017, "127.0.2.11", 10000),
                                                              ("26.05", 7117, "127.0.3.11", 20000)])
def test_the_newer_configs_have_no_accounting_and_their_own_ports_the_22_05_one_is_unchanged(
        tmp_path, slurm, port, addr, first_job_id):
    new = cluster.render_configs(Layout(tmp_path / "new", LANES[slurm]))
    conf = new[Layout(tmp_path / "new", LANES[slurm]).slurm_conf]
    assert "AccountingStorageType=accounting_storage/none" in conf and f"SlurmctldPort={port}\n" in conf
    assert f"NodeName=c1 NodeAddr={addr} " in conf and f"FirstJobId={first_job_id}\n" in conf
    assert not any(p.name == "slurmdbd.conf" for p in new)
    old = cluster.render_configs(Layout(tmp_path / "old"))
    text = old[Layout(tmp_path / "old").slurm_conf]
    assert "AccountingStorageType=accounting_storage/slurmdbd" in text and "FirstJobId" not in text
    assert any(p.name == "slurmdbd.conf" for p in old)


def test_the_debian_mirror_is_read_from_apt_sources_in_both_formats(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n")
    (d / "other.list").write_text("deb https://vendor.example/apt stable main\n")
    assert rootfs.debian_mirror((tmp_path / "absent", d)) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://local.example/debian/ bookworm main\n"
                        "deb http://local.example/debian-security bookworm-security main\n")
    assert rootfs.debian_mirror((one_line,)) == "http://local.example/debian"


def test_a_suite_newer_than_this_debootstrap_is_built_with_its_sid_script(tmp_path):
    (tmp_path / "sid").write_text("")
    (tmp_path / "trixie").symlink_to("sid")
    known = rootfs.debootstrap_command("trixie", tmp_path / "root", "http://m/debian", scripts=tmp_path)
    assert known == ["debootstrap", "--variant=minbase", "trixie", str(tmp_path / "root"), "http://m/debian"]
    newer = rootfs.debootstrap_command("forky", tmp_path / "root", "http://m/debian", scripts=tmp_path)
    assert newer == [*known[:2], "forky", *known[3:], str(tmp_path / "sid")]


def test_no_debian_mirror_is_one_clear_error(tmp_path):
    only = tmp_path / "sources.list"
    only.write_text("deb https://vendor.example/apt stable main\n")
    with pytest.raises(HpcError, match="no Debian archive"):
        rootfs.debian_mirror((only,))


def test_the_root_file_systems_hosts_name_its_own_lanes_addresses(tmp_path):
    (tmp_path / "etc").mkdir()
    rootfs.write_hosts(tmp_path, LANES["24.11"].cpu_nodes)
    lines = (tmp_path / "etc/hosts").read_text().splitlines()
    assert lines[0] == "127.0.0.1 localhost" and [line.split()[:2] for line in lines[2:]] == [
        ["127.0.2.11", "c1"], ["127.0.2.12", "c2"]]


def test_wrappers_enter_the_root_file_system_and_run_directly_inside_it(tmp_path):
    layout = Layout(tmp_path / "state it's", LANES["24.11"])
    wrapper = chroot.wrapper_script(layout, "sbatch")
    assert "if [ -e /etc/hpc-lane ]; then exec /usr/bin/sbatch" in wrapper  # a job's srun: already inside
    assert f"exec {shlex.quote(str(layout.bin / '.enter'))} /usr/bin/sbatch \"$@\"" in wrapper  # path quoted
    enter = layout.bin / ".enter"
    layout.bin.mkdir(parents=True)
    enter.write_text(chroot.enter_script(layout))
    assert subprocess.run(["sh", "-n", str(enter)]).returncode == 0  # valid shell
    binds = chroot.binds()
    assert "/tmp" in binds and "/var/tmp" in binds and all(b not in ("/proc",) for b in binds)
    assert len(binds) == len(set(binds))
    assert chroot.argv(layout, ["sinfo"]) == [str(enter), "sinfo"]
    assert chroot.argv(Layout(tmp_path), ["sinfo"]) == ["sinfo"]  # this machine's own Slurm: unchanged


def test_a_system_python_is_bound_piece_by_piece_never_over_the_root_file_systems_usr(monkeypatch):
    import sys

    assert "/usr" not in chroot.binds()
    monkeypatch.setattr(sys, "base_prefix", "/usr")  # as for a venv made from Debian's /usr/bin/python3
    paths = chroot.python_paths()
    assert all(str(p) not in ("/usr", "/usr/local") for p in paths)
    assert paths[1] == chroot.Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    assert paths[2].name.startswith("python3")  # the standard library's dir
