"""A job in a container: every rank runs in it, started by NVIDIA pyxis's srun options; the batch script stays on
the host (it calls srun, and runs the job's set-up).

pyxis's option names are its own (NVIDIA/pyxis v0.24.0 args.c, spank_opts): --container-image,
--container-mounts (SRC:DST[:FLAGS] joined by ","), --container-workdir, --container-env (NAME[,NAME...]),
--container-writable / --container-readonly. What reaches a containerized task (pyxis_slurmstepd.c
spank_import_container_env): the host task's environment, then the container's, whose values win, except for the
names given with --container-env. So an image whose /etc/environment sets MASTER_ADDR, or enroot's
50-slurm-pytorch.sh hook (on an image that sets PYTORCH_VERSION it writes MASTER_ADDR, MASTER_PORT = job id %
4536 + 61000, RANK, WORLD_SIZE, LOCAL_RANK: enroot conf/hooks/extra/50-slurm-pytorch.sh), would replace the job's
rendezvous. The job passes every variable it sets with --container-env: the rendezvous and the rank contract
(toolkit.job.rank, which each rank's bash also exports again inside) and the job's own env. Path lists the job
prepends to (LD_LIBRARY_PATH) are prepended again inside, to the image's value, by each rank's prelude, which also
activates the recipe's software there.
"""

from __future__ import annotations

import dataclasses
import os

from toolkit.job.env import EnvVar
from toolkit.job.shell import activation_lines, export_line

# What the job's set-up and the rank program set (toolkit.job.rank, templates/setup.sh.j2).
CONTRACT_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
TORCHRUN_ENV = ("PET_RDZV_ENDPOINT", "PET_RDZV_ID")
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs")


@dataclasses.dataclass(frozen=True)
class ContainerEnv:
    """A recipe's software.container with its paths resolved (as the nodes see them)."""

    image: str  # an absolute squashfs path, or an image reference for enroot to import
    mounts: tuple[str, ...]  # SRC[:DST[:FLAGS]], SRC absolute
    workdir: str | None
    env: tuple[str, ...]  # host variables passed besides the job's own
    writable: bool


def resolve(container, root: str, run_dir: str) -> ContainerEnv:
    """A recipe's Container (toolkit.recipes.schema) with relative squashfs files and mount sources under ROOT (the
    dirs root, e.g. the FSx mount). pyxis takes only an image starting with "." or "/" for a file: a relative one
    would be imported from a registry by that name (pyxis_slurmstepd.c). The run dir is mounted at its own path
    unless a mount already shows it there: the ranks write their logs, results and checkpoints into it (and
    enroot puts a fresh tmpfs on /tmp: enroot conf/mounts/10-system.fstab)."""
    def under(path: str) -> str:
        return path if path.startswith("/") else os.path.normpath(os.path.join(root, path))

    image = container.image
    if image.endswith(SQUASHFS_SUFFIXES) or image.startswith("."):
        image = under(image)
    mounts = []
    for mount in container.mounts:
        src, sep, rest = mount.partition(":")
        mounts.append(under(src) + sep + rest if sep else f"{under(src)}:{under(src)}")
    same_path = [m.split(":")[0] for m in mounts if m.split(":")[0] == m.split(":")[1]]
    if not any(run_dir == src or run_dir.startswith(src.rstrip("/") + "/") for src in same_path):
        mounts.append(f"{run_dir}:{run_dir}")
    return ContainerEnv(image, tuple(mounts), container.workdir, tuple(container.env), container.writable)


def passed_env(env: tuple[EnvVar, ...], container: ContainerEnv, style: str) -> list[str]:
    """Names passed with --container-env: the job's values win over the image's and enroot's hooks'."""
    names = [*CONTRACT_ENV, *(TORCHRUN_ENV if style == "torchrun" else ()),
             *(var.name for var in env if not var.prepend), *container.env]
    return list(dict.fromkeys(names))


def pyxis_options(container: ContainerEnv | None, env: tuple[EnvVar, ...], style: str) -> list[str]:
    """srun's pyxis options for a job's steps (none without a container)."""
    if container is None:
        return []
    options = [f"--container-image={container.image}"]
    if container.mounts:
        options.append(f"--container-mounts={','.join(container.mounts)}")
    if container.workdir:
        options.append(f"--container-workdir={container.workdir}")
    options.append(f"--container-env={','.join(passed_env(env, container, style))}")
    # Explicit both ways: a cluster's pyxis may default to either (enroot's ENROOT_ROOTFS_WRITABLE).
    options.append("--container-writable" if container.writable else "--container-readonly")
    return options


def prelude(software, env: tuple[EnvVar, ...]) -> str:
    """What each rank's bash runs first inside the container: the software's activation and the path lists
    prepended to the image's values ("" when there is nothing to do)."""
    lines = activation_lines(software) + [export_line(var) for var in env if var.prepend]
    return "; ".join(lines)


def container_words(software, env: tuple[EnvVar, ...], command: tuple[str, ...]) -> list[str]:
    """`bash -c PRELUDE; exec "$0" "$@"` COMMAND: a command run in the container after the prelude."""
    first = prelude(software, env)
    return ["bash", "-c", f'{first}; exec "$0" "$@"' if first else 'exec "$0" "$@"', *command]

