"""Shell lines for a job's software and variables, written once: the batch shell's set-up (toolkit.slurm.render)
and, for a job in a container, each rank's prelude inside it (toolkit.job.container) both use them."""

from __future__ import annotations

import shlex

from toolkit.job.env import EnvVar


def activation_lines(software) -> list[str]:
    """Lines that activate a SoftwareEnv (toolkit.job.spec): modules, then the venv or the conda env."""
    lines = [f"module load {shlex.quote(m)}" for m in software.modules]
    if software.venv:
        lines.append(f"set +u; source {shlex.quote(software.venv + '/bin/activate')}; set -u")
    if software.conda_root:
        lines.append(f"set +u; source {shlex.quote(software.conda_root + '/etc/profile.d/conda.sh')}; "
                     f"conda activate {shlex.quote(software.conda_env or '')}; set -u")
    return lines


def export_line(var: EnvVar) -> str:
    """`export NAME=VALUE`; a path list to prepend goes before the value the node already has, if any."""
    if var.prepend:
        return f'export {var.name}={shlex.quote(var.value)}"${{{var.name}:+:${var.name}}}"'
    return f"export {var.name}={shlex.quote(var.value)}"
