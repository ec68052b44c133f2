"""Reading Slurm's version and judging whether it has what our rendered jobs use (no Slurm needed)."""

from __future__ import annotations

import subprocess

import pytest

from toolkit.errors import HpcError
from toolkit.slurm import version
from toolkit.slurm.version import SlurmVersion

CONFIG_OK = {"SelectType": "select/cons_tres", "GresTypes": "gpu"}
MPI_OK = {"none", "pmi2", "pmix", "pmix_v5"}


@pytest.mark.parametrize("text, expected", [
    ("slurm 22.05.8\n", SlurmVersion(22, 5, 8)),  # bookworm's scontrol version
    ("slurm-wlm 24.11.5\n", SlurmVersion(24, 11, 5)),  # trixie's
    ("slurm-wlm 26.05.5\n", SlurmVersion(26, 5, 5)),  # forky's
    ("slurm 25.11.0-0rc1", SlurmVersion(25, 11, 0)),
    ("slurm 20.11", SlurmVersion(20, 11, 0)),
])
def test_versions_are_read_from_what_scontrol_and_sinfo_print(text, expected):
    assert version.parse(text) == expected


def test_versions_order_numerically_not_as_text():
    assert SlurmVersion(24, 11) > SlurmVersion(24, 5) > SlurmVersion(23, 11) > SlurmVersion(9, 99)
    assert str(SlurmVersion(22, 5, 8)) == "22.05.8"


def test_an_unreadable_version_is_one_clear_error():
    with pytest.raises(HpcError, match="cannot read a Slurm version"):
        version.parse("command not found")


def test_a_complete_slurm_lacks_nothing_and_cpu_queues_need_no_gpu_settings():
    assert version.missing_for_rendered_jobs(SlurmVersion(24, 11, 5), CONFIG_OK, 8, MPI_OK) == []
    assert version.missing_for_rendered_jobs(SlurmVersion(22, 5, 8), {}, 0, MPI_OK) == []


def test_what_rendered_gpu_jobs_need_is_named_when_missing():
    missing = version.missing_for_rendered_jobs(SlurmVersion(20, 2), {"SelectType": "select/linear"}, 8, {"pmi2"})
    assert len(missing) == 4
    joined = "\n".join(missing)
    for needle in ("older than 20.11", "pmix", "select/cons_tres", "GresTypes lacks gpu"):
        assert needle in joined


@pytest.mark.parametrize("found,parameters,expected,asked", [
    ("slurm 25.11.0", "enable_expedited_requeue", True, 2),
    ("slurm-wlm 26.05.5", "idle_on_node_suspend,enable_expedited_requeue", True, 2),
    ("slurm 25.11.2", "", False, 2),  # 26.05 refuses --requeue=expedite without the parameter
    ("slurm 24.11.5", "enable_expedited_requeue", False, 1),  # 24.11's sbatch refuses any --requeue value
])
def test_expedited_requeue_needs_25_11_and_the_controller_parameter(monkeypatch, found, parameters, expected,
                                                                     asked):
    calls = []

    def run(args, timeout=None, **kwargs):
        calls.append(args)
        out = found if args[1] == "version" else f"SlurmctldParameters     = {parameters}\nKillWait = 5 sec\n"
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(version.commands, "run", run)
    monkeypatch.setattr(version.commands, "slurm_installed", lambda: True)
    monkeypatch.setenv("SLURM_CONF", f"/etc/slurm-{found}-{parameters}.conf")  # one answer per cluster
    assert version.expedited_requeue() is expected
    assert version.expedited_requeue() is expected and len(calls) == asked  # asked once
