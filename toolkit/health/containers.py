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

# pyxis_loaded/require_pyxis: Slurm's own question (`srun --help`), asked by the Slurm targets before a submit
from toolkit.slurm.pyxis import ENABLE_FIX, pyxis_loaded, require_pyxis  # noqa: F401 (doctor's and tests' names)


def config_enables_pyxis(config: dict) -> bool:
    """Whether a ParallelCluster config turns pyxis on: a custom action (head node or queue) whose script or
    arguments name pyxis, as AWS's enable-pyxis scripts do (ParallelCluster >= 3.11 ships pyxis off)."""
    def actions(section) -> list:
        return list((section or {}).get("CustomActions", {}).values()) if isinstance(section, dict) else []

    queues = (config.get("Scheduling") or {}).get("SlurmQueues") or []
    found = actions(config.get("HeadNode")) + [a for q in queues for a in actions(q)]
    return any("pyxis" in str(a.get("Script", "")) + " ".join(map(str, a.get("Args") or []))
               for a in found if isinstance(a, dict))


def config_warning(path) -> str | None:
    """A plan's warning when the cluster config it was planned on does not enable pyxis (the submission itself
    asks srun, which decides)."""
    import yaml

    from toolkit.textfile import read_text

    try:
        config = yaml.safe_load(read_text(path, "cluster config", fix="")) or {}
    except (HpcError, yaml.YAMLError):
        return None
    if isinstance(config, dict) and not config_enables_pyxis(config):
        return (f"the job runs in a container, but {path} does not enable pyxis (no custom action names it): "
                f"it will be refused where srun has no --container-image; {ENABLE_FIX}")
    return None


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
