"""Can this cluster run containers? pyxis (NVIDIA's SPANK plugin) adds --container-image to srun when Slurm loads
it through plugstack.conf, so `srun --help` is the check pyxis's own guide gives (NVIDIA/pyxis wiki, Installation:
`srun --help | grep container-image`); enroot, which pyxis runs on each node, is proven by starting a container
there. A job that asks for a container is refused before it is submitted where pyxis is not loaded: without it
srun would reject the unknown option only when the job runs, or worse, a script edited by hand would run on the host.
"""

from __future__ import annotations

import dataclasses
import shlex

from toolkit.errors import HpcError

PYXIS_OPTION = "--container-image"
ENABLE_FIX = ("enable pyxis: on ParallelCluster >= 3.11 write the config with `hpc cluster config ... --pyxis` (AWS's "
              "enable-pyxis custom actions; pyxis is installed but off by default), or load spank_pyxis.so in Slurm's "
              "plugstack.conf (NVIDIA/pyxis README); or drop software.container / --container to run on the host")


def pyxis_loaded() -> bool:
    """Whether this machine's srun lists pyxis's options (pyxis loaded through the cluster's plugstack.conf)."""
    from toolkit.slurm.commands import run

    res = run(["srun", "--help"], check=False)
    return PYXIS_OPTION in res.stdout


def require_pyxis() -> None:
    """Refuse a containerized job on a cluster whose srun has no pyxis."""
    if not pyxis_loaded():
        raise HpcError("this job runs in a container (software.container / --container), but this cluster's srun "
                       "has no --container-image: pyxis is not loaded, and the job would fail or run on the host",
                       fix=ENABLE_FIX)


@dataclasses.dataclass(frozen=True)
class ContainerCheck:
    pyxis: bool  # srun --help lists --container-image
    image: str | None = None  # the image started on the nodes, if one was given
    started: tuple[str, ...] = ()  # nodes where a container of it started (enroot there works)
    error: str | None = None  # why it did not start (pyxis's or enroot's own message)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


MARK = "hpc-container-ok"


def start_argv(partition: str, nodes: int, nodelist: list[str] | None, image: str) -> list[str]:
    """One task per node that starts IMAGE through pyxis and says on which node it ran."""
    argv = ["srun", f"--partition={partition}", f"--nodes={nodes}", "--ntasks-per-node=1", "--time=5",
            "--job-name=hpc-doctor", f"--container-image={image}", "--container-readonly"]
    if nodelist:
        argv.append(f"--nodelist={','.join(nodelist)}")
    return [*argv, "sh", "-c", f'echo {shlex.quote(MARK)} "$SLURMD_NODENAME"']


def started_check(image: str, nodes: int, res) -> ContainerCheck:
    """The verdict from srun's result RES of start_argv(..., IMAGE) on NODES nodes (pyxis is loaded)."""
    started = tuple(sorted(line.split()[1] for line in res.stdout.splitlines()
                           if line.startswith(MARK) and len(line.split()) == 2))
    error = None
    if res.returncode != 0 or len(started) < nodes:
        lines = [ln.strip() for ln in res.stderr.splitlines() if "pyxis" in ln or "enroot" in ln or "error" in ln]
        error = lines[-1] if lines else f"srun exited {res.returncode}"
    return ContainerCheck(True, image, started, error)
