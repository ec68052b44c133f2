"""The pre-flight gate (toolkit.node.gate): the rank's wait run by a real bash, and where the batch shell starts the
pre-flight beside the ranks (and where not: spares). The whole path on the local Slurm is
tests/test_preflight_slurm.py's (a requeue through submitit, a stop through the rendered script)."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time

import pytest

from tests.jobhelpers import CPU
from toolkit.job.spec import JobSpec
from toolkit.node import gate
from toolkit.recipes.load import load_recipe
from toolkit.slurm.materialize import build_job_spec
from toolkit.slurm.render import render_script, setup_block


def _rank(script: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", script + "; echo started"], env={"PATH": "/usr/bin:/bin", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_rank_waits_at_the_gate_until_the_preflight_writes_go_in_place(tmp_path):
    path = tmp_path / "gate"
    path.write_text("")
    inode = path.stat().st_ino
    rank = _rank(gate.wait_script(), {gate.VAR: str(path)})
    time.sleep(0.5)
    assert rank.poll() is None  # still waiting: an empty gate is no verdict
    gate.open_gate(str(path))
    out, err = rank.communicate(timeout=10)
    assert (rank.returncode, out, err) == (0, "started\n", "")
    assert path.stat().st_ino == inode  # rewritten in place: NFS's close-to-open shows it at the next open


def test_a_rank_without_a_gate_starts_at_once_and_one_without_a_verdict_gives_up(tmp_path):
    started = _rank(gate.wait_script(), {})
    assert started.communicate(timeout=10)[0] == "started\n"
    # a node that lost the shared file system cannot open the gate: it waits silently (the pre-flight ends the
    # step), and past WAIT_S (bash's SECONDS, set forward here) it gives up with one line
    lost = _rank(f"SECONDS={gate.WAIT_S}; " + gate.wait_script(),
                 {gate.VAR: str(tmp_path / "gone" / "gate"), "SLURM_PROCID": "3", "SLURMD_NODENAME": "w2"})
    out, err = lost.communicate(timeout=10)
    assert lost.returncode == 1 and out == ""
    assert err == (f"hpc: rank 3 on w2: no pre-flight verdict in {gate.WAIT_S} s ({tmp_path}/gone/gate): "
                   "not starting\n")


def test_a_training_jobs_ranks_start_beside_its_preflight_and_a_spares_job_checks_first():
    spec = build_job_spec(load_recipe("resnet50"), CPU, 2)
    assert spec.preflight and spec.preflight_beside_ranks
    assert spec.program.script.startswith(gate.wait_script() + "; ")  # before anything else the rank does
    lines = setup_block(spec).splitlines()
    background = next(line for line in lines if line.startswith("  { ") and " preflight " in line)
    assert background.startswith('  { "$HPC_PYTHON" -S ') and background.endswith(
        f' --gate "${gate.VAR}" || kill -TERM -- -$$ 2>/dev/null || kill -TERM $$; }} &')
    # the gate is made empty before either step starts, in the run dir every node reads
    assert lines.index('  : > "$HPC_PREFLIGHT_GATE"') < lines.index(background)
    assert f"{spec.run_dir}/.hpc/gates/" in "\n".join(lines) and "  trap 'exit 1' TERM" in lines
    # an older srun: the pre-flight first, alone (no gate exported: the ranks' wait is skipped)
    alone = next(line for line in lines if line.endswith(" || exit 1") and " preflight " in line)
    assert lines.index(background) < lines.index("else") < lines.index(alone)

    spares = build_job_spec(load_recipe("resnet50", overrides=["resources.spares=1"]), CPU, 1)
    assert spares.slurm and spares.slurm.preflight_args and not spares.preflight_beside_ranks
    script = render_script(spares)
    assert gate.VAR not in script and " preflight " in script and "|| exit 1" in script

    off: JobSpec = dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm, preflight_args=()))
    assert gate.VAR not in render_script(off)


@pytest.mark.parametrize("version, beside", [
    ("slurm 22.05.8", "1"), ("slurm-wlm 22.05.8", "1"), ("slurm 25.11.0", "1"), ("slurm 26.05.0-0rc1", "1"),
    ("slurm-wlm 20.11.7", "0"), ("slurm 21.08.8-2", "0"), ("slurm 19.05.5", "0"),
    ("", "1"),  # no answer: assumed current (without an srun the job starts no step either way)
])
def test_the_batch_shell_runs_the_preflight_beside_the_ranks_only_where_srun_can_overlap_them(tmp_path, version,
                                                                                                beside):
    """--overlap shares memory and GRES from Slurm 22.05 (its NEWS); the batch shell reads its srun's --version
    (Debian's srun says `slurm-wlm`), with a stub srun answering as each release does."""
    spec = build_job_spec(load_recipe("resnet50"), CPU, 2)
    lines = setup_block(spec).splitlines()
    case = lines[lines.index('case "$(srun --version 2>/dev/null || true)" in'):lines.index("esac") + 1]
    stub = tmp_path / "srun"
    stub.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo {shlex.quote(version)}\n" if version else
                    "#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    res = subprocess.run(["bash", "-euc", "\n".join([*case, 'echo "$HPC_PREFLIGHT_BESIDE"'])], capture_output=True,
                         text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (0, beside + "\n", "")
