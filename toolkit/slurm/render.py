"""JobSpec -> sbatch script text (Jinja2). All quoting happens here, in Python; the template holds text only.

Every value that reaches the script is either shlex-quoted, an element of a quoted bash array, or (in
`#SBATCH` lines, which sbatch parses) restricted to a safe character set by toolkit.slurm.materialize.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys

from toolkit.job.container import container_words, pyxis_options
from toolkit.job.env import COMMUNICATION_PREFIXES, submit_env_allowlist
from toolkit.job.rank import MASTER_PORT_BASE, MASTER_PORT_SPAN
from toolkit.job.shell import activation_lines, export_line
from toolkit.job.spec import JobSpec
from toolkit.job.staging import node_command, unpack_lines
from toolkit.node.ledger import FLEET_DIR_ENV
from toolkit.slurm.hostfile import hostfile_lines, ordered_srun
from toolkit.slurm.part import SlurmPart


def slurm_part(spec: JobSpec) -> SlurmPart:
    """The job's Slurm part: a spec planned for a Slurm queue (toolkit.slurm.materialize) has one."""
    if spec.slurm is None:
        raise ValueError(f"job {spec.job_name} was not planned for a Slurm queue (toolkit.slurm.materialize)")
    return spec.slurm


def job_options(spec: JobSpec) -> dict[str, str | int | bool]:
    """The job's sbatch options (name -> value; True is a bare flag): the one source of both the rendered
    script's #SBATCH lines and submitit's parameters (toolkit.slurm.executors.slurm_parameters).

    No --mem: ParallelCluster schedules without memory unless EnableMemoryBasedScheduling is on.
    """
    part = slurm_part(spec)
    options: dict[str, str | int | bool] = {
        "job-name": spec.job_name, "partition": spec.partition, "nodes": spec.nodes + spec.spares,
        "ntasks-per-node": part.tasks_per_node,
    }
    if spec.gpus_per_node:
        options["gpus-per-node"] = spec.gpus_per_node
    options.update({"cpus-per-task": part.cpus_per_task, "time": spec.time_limit})
    if spec.exclusive:
        options["exclusive"] = True
    if part.wait_all_nodes:
        options["wait-all-nodes"] = 1
    options[spec.stop.requeue_option] = "expedite" if part.expedited_requeue else True  # toolkit.node.stop
    if spec.spares:  # keep the allocation when a node fails: the spares supervisor restarts on the others
        options["no-kill"] = True
    options.update(part.options)  # account, qos, reservation, dependency: passed through
    return options


def sbatch_directives(spec: JobSpec) -> list[str]:
    """The #SBATCH options of the rendered script, without the prefix: job_options() plus what only a script
    sent by hand needs (its log file, the allow-listed environment, the stop signal to the batch shell)."""
    directives = [f"--{name}" if value is True else f"--{name}={value}" for name, value in job_options(spec).items()]
    directives += [f"--output={slurm_part(spec).output}", "--open-mode=append",
                   f"--export={','.join(submit_env_allowlist())}"]
    if spec.stop.batch_signal:  # the stop signal to the batch shell before the time limit: the template's trap
        directives.append(f"--signal={spec.stop.batch_signal}")
    return directives


def srun_options(spec: JobSpec) -> list[str]:
    """srun's options: the step's shape is spelled out (Slurm >= 22.05 srun does not inherit --cpus-per-task)."""
    part = slurm_part(spec)
    options = ["--export=ALL", f"--nodes={spec.nodes}", f"--ntasks-per-node={part.tasks_per_node}",
               f"--cpus-per-task={part.cpus_per_task}", "--kill-on-bad-exit=1"]
    if spec.spares:  # the job's SLURM_NTASKS counts the spares' tasks too
        options.insert(2, f"--ntasks={spec.nodes * part.tasks_per_node}")
    if spec.mpi:
        options.append(f"--mpi={spec.mpi}")
    return options + list(part.srun_binding) + pyxis_options(spec.software.container, spec.env, spec.style)


def environment_lines(spec: JobSpec) -> list[str]:
    """Shell lines that activate the nodes' software, then export the job's variables: the job's environment
    (also what `hpc cluster doctor --recipe` runs its loader check in)."""
    # In a container the software is activated inside it, by each rank (toolkit.job.container.prelude).
    lines = [] if spec.software.container else activation_lines(spec.software)
    for var in spec.env:
        lines += [f"# {var.doc}", export_line(var)]
    return lines


def setup_lines(spec: JobSpec) -> list[str]:
    """The job's environment, then the files its set-up writes (also submitit's setup)."""
    lines = environment_lines(spec)
    fleet = spec.slurm.fleet_dir if spec.slurm else None
    if fleet and FLEET_DIR_ENV not in spec.environ:  # one the recipe or --env set is in the lines above already
        lines += ["# the cluster's node ledger (toolkit.node.ledger): pre-flight verdicts, lost nodes, hangs",
                  f"export {FLEET_DIR_ENV}={shlex.quote(fleet)}"]
    for file in spec.files:
        lines += [f"# {file.doc}", f"mkdir -p {shlex.quote(os.path.dirname(file.path))}",
                  f"printf '%s\\n' {shlex.quote(file.text)} > {shlex.quote(file.path)}"]
    return lines


def array_lines(words: tuple[str, ...]) -> list[str]:
    """The array's quoted words, one flag and its values per line (layout only: bash sees the same words)."""
    lines: list[list[str]] = []
    for word in words:
        if not lines or word.startswith("-"):
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return [" ".join(line) for line in lines]


@functools.cache
def _template(name: str):
    import jinja2

    from toolkit.cache import template_cache

    # Compiled once per template version into the user's cache (toolkit.cache): ~0.05 s of every submission.
    env = jinja2.Environment(loader=jinja2.PackageLoader("toolkit.slurm", "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False, bytecode_cache=template_cache())
    return env.get_template(name)


def prepare_line(spec: JobSpec) -> str:
    """The data-making command: in the batch shell, or with a container one task inside it (its software is
    there), on this first node."""
    if not spec.prepare or not spec.software.container:
        return shlex.join(spec.prepare)
    step = ["srun", "--export=ALL", "--nodes=1", "--ntasks=1", f"--cpus-per-task={slurm_part(spec).cpus_per_task}",
            *pyxis_options(spec.software.container, spec.env, spec.style)]
    return shlex.join([*step, *container_words(spec.software, spec.env, spec.prepare)])


def preflight_line(spec: JobSpec) -> str:
    """The pre-flight's command (toolkit.node.preflight, from the staged bundle) in the batch shell, else nothing."""
    args = slurm_part(spec).preflight_args
    if not args:
        return ""
    from toolkit.job.staging import JOB_PYTHON3_VAR
    from toolkit.node.records import batch_dir

    return (node_command(spec.run_dir, "preflight", "--run-dir", str(batch_dir(spec.run_dir)), *args) +
            f' --job-python3 "${JOB_PYTHON3_VAR}"')


def gate_lines(spec: JobSpec) -> list[str]:
    """Where the ranks start beside the pre-flight (toolkit.node.gate): the empty gate, made before either step
    starts, and the pre-flight in the background. A failed pre-flight that did not requeue the job ends every
    process of the batch script's (its process group: srun and its step too) and the trap exits 1, at once if the
    ranks' srun has not started yet. An srun older than 22.05 runs the pre-flight first, alone, as before: its
    --overlap shares only CPUs, so the pre-flight's step would wait for the memory the ranks' step holds
    (SchedMD/slurm NEWS, 22.05.0rc1: "srun --overlap now allows the step to share all resources (CPUs, memory, and
    GRES)"); a node's own older srun (the bench's Debian bullseye lane has 20.11) is told by its --version."""
    if not spec.preflight_beside_ranks:
        return []
    from toolkit.job.staging import STAGE_DIR
    from toolkit.node.gate import VAR
    from toolkit.node.records import batch_dir

    gates = batch_dir(spec.run_dir) / STAGE_DIR / "gates"
    preflight = preflight_line(spec)
    return ['case "$(srun --version 2>/dev/null || true)" in',
            "  *' '1[0-9].*|*' '2[01].*) HPC_PREFLIGHT_BESIDE=0 ;;  # srun < 22.05",
            "  *) HPC_PREFLIGHT_BESIDE=1 ;;",
            "esac",
            'if [ "$HPC_PREFLIGHT_BESIDE" = 1 ]; then',
            f"  mkdir -p {shlex.quote(str(gates))}",
            f'  export {VAR}={shlex.quote(str(gates))}/"$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"',
            f'  : > "${VAR}"',
            "  trap 'exit 1' TERM",
            f'  {{ {preflight} --gate "${VAR}" || kill -TERM -- -$$ 2>/dev/null || kill -TERM $$; }} &',
            "else",
            f"  {preflight} || exit 1",
            "fi"]


def staging_lines(spec: JobSpec) -> list[str]:
    """The node-side bundle's unpacking (toolkit.job.staging), where the job runs node-side code of ours: the
    pre-flight, the spares supervisor, or ranks that import the heartbeat from it
    (every job toolkit.slurm.materialize planned)."""
    part = slurm_part(spec)
    commands = bool(part.preflight_args or spec.spares)  # these run "$HPC_PYTHON" BUNDLE ...: a python3 >= 3.9
    return unpack_lines(spec.run_dir, choose_python=commands) if part.node_bundle or commands else []


def seed_line(spec: JobSpec) -> str:
    """--resume-from: the other run's checkpoints copied into this run's empty checkpoints dir, once (a requeue
    finds its own there and resumes them). A copy, not hard links: torch.save rewrites checkpoint files
    in place (open "wb"), which through a link would change the other run's."""
    if not spec.resume_from:
        return ""
    source, own = spec.resume_from, spec.dirs["checkpoints"]
    q_own = shlex.quote(own)
    return (f'if [ -z "$(ls -A {q_own} 2>/dev/null)" ]; then mkdir -p {q_own} && cp -a {shlex.quote(source + "/.")} '
            f'{q_own}/ && echo {shlex.quote(f"hpc: checkpoints of {source} copied to {own} (--resume-from)")}; fi')


def _setup_context(spec: JobSpec) -> dict:
    return dict(
        spec=spec,
        seed=seed_line(spec),
        preflight=preflight_line(spec),
        gate=gate_lines(spec),
        staging=staging_lines(spec),
        setup=setup_lines(spec),
        prepare=prepare_line(spec),
        port_base=MASTER_PORT_BASE,
        port_span=MASTER_PORT_SPAN,
        printed_pattern=shlex.quote("^(" + "|".join(COMMUNICATION_PREFIXES) + ")"),
    )


def setup_block(spec: JobSpec) -> str:
    """The batch shell's set-up (software, exports, rendezvous): part of the script, and submitit's setup."""
    return _template("setup.sh.j2").render(**_setup_context(spec))


# Every rank of the rendered script writes to the job's one log (#SBATCH --output): srun --label starts each line
# with its task's number, which `hpc jobs logs --rank N` selects (toolkit.rundir.task_lines). submitit's ranks
# each have their own log files: its srun gets no label.
SHARED_LOG_SRUN_OPTIONS = ("--label",)


def spares_supervisor(spec: JobSpec) -> str:
    """The command that runs a job with spares' srun line round after round (toolkit.node.spares, from the staged
    bundle with the node's python3), up to its `--`; else nothing."""
    if not spec.spares:
        return ""
    from toolkit.node.heartbeat import DIR_VAR

    words = ["--nodes", str(spec.nodes), "--spares", str(spec.spares), "--run-dir", spec.run_dir,
             "--heartbeat-dir", spec.environ.get(DIR_VAR, f"{spec.run_dir}/heartbeats")]
    if spec.hang_timeout_s:
        words += ["--hang-timeout", str(spec.hang_timeout_s)]
    words += ["--stop", spec.stop.to_json()]  # which signals it passes on to srun, which exit is a stop
    return node_command(spec.run_dir, "spares", *words, "--") + " "


def node_python(spec: JobSpec) -> str:
    """The Python that runs the toolkit's own code on the nodes (submitit's per-rank code):
    the recipe's environment's, else the one running hpc."""
    if spec.software.venv:
        return f"{spec.software.venv}/bin/python"  # in a container: mounted there (software.container.mounts)
    if spec.software.conda_root or spec.software.modules or spec.software.container:
        return "python"  # whatever the set-up lines (or the container's image) put first on PATH
    return sys.executable


def end_record_line(spec: JobSpec) -> str:
    """The batch shell's last word in the run dir: result.json (toolkit.rundir.RESULT) with the ranks' step's exit
    status, ok or not, written aside and moved. Slurm forgets a finished job (MinJobAge; ParallelCluster has no
    accounting by default): then `hpc jobs status` reads how it ended from here, as it reads submitit's rank 0's
    record. Not written when the job is requeued or stopped by its pre-flight (its shell exits before this line).
    A record that cannot be written (the run dir gone from this node) does not change the job's status."""
    from toolkit.rundir import RESULT

    result = shlex.quote(os.path.join(str(spec.run_dir), RESULT))
    record = ('{"rank": null, "host": "%s", "exit_code": %d, "finished_at": "%s", "ok": %s}\\n')
    return (f"printf '{record}' \"${{SLURMD_NODENAME:-$(hostname)}}\" \"$STATUS\" "
            f"\"$(date -u +%Y-%m-%dT%H:%M:%S+00:00)\" \"$([ \"$STATUS\" = 0 ] && echo true || echo false)\" "
            f"2>/dev/null > {result}.$$ && mv -f {result}.$$ {result} 2>/dev/null || true")


def render_script(spec: JobSpec) -> str:
    """The sbatch script of a job: srun starts the job's rank program (toolkit.job.rank) on every task."""
    program = spec.program
    return _template("job.sbatch.j2").render(
        end_record=end_record_line(spec),
        **_setup_context(spec),
        stop=spec.stop,
        directives=sbatch_directives(spec),
        array_lines=array_lines(program.words),
        hostfile=hostfile_lines(spec),
        launch=spares_supervisor(spec) + ordered_srun(spec, ["srun", *SHARED_LOG_SRUN_OPTIONS, *srun_options(spec)]),
        rank_script=shlex.quote(program.script),
    )
