"""Issue 20: one vocabulary and one output contract for the whole CLI (toolkit/cli/options.py, output.py, main.py).

The job options are one set with sbatch's letters; a flag a command cannot honour is refused; choices are listed;
completion answers; every command's --json is one envelope; exit codes follow one rule; -o DIR and -o - work.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO, cli_envelope, cli_json, run_hpc, run_hpc_process
from tests.jobhelpers import write_cluster

JOB_COMMANDS = (("run",), ("recipes", "submit"), ("recipes", "new"))
SHARED = ("--set", "--sweep", "--profile", "--time", "--hang-timeout", "--env", "--venv", "--account", "--qos",
          "--reservation", "--dependency")


def _commands():
    from toolkit.cli.main import command

    def walk(node, path):
        subs = getattr(node, "commands", None)
        if subs is None:
            yield path, node
        else:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, (*path, name))
    return dict(walk(command, ()))


def _options(cmd) -> dict[str, tuple[str, ...]]:
    """Each option's long name -> all its names (short letters included)."""
    return {p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0]: tuple(sorted(p.opts))
            for p in cmd.params if p.param_type_name == "option"}


def test_the_job_options_are_one_set_with_sbatchs_letters():
    commands = _commands()
    declared = [_options(commands[path]) for path in JOB_COMMANDS]
    for flag in SHARED:
        assert len({opts.get(flag) for opts in declared}) == 1 and declared[0].get(flag), flag
    every = {}
    for cmd in commands.values():
        for long, names in _options(cmd).items():
            for short in (n for n in names if not n.startswith("--")):
                every.setdefault(short, set()).add(long)
    # sbatch(1): -p partition, -q qos, -N nodes, -t time, -A account, -d dependency; each letter one meaning
    assert {k: v for k, v in every.items() if k in ("-p", "-q", "-N", "-t", "-A", "-d")} == {
        "-p": {"--queue"}, "-q": {"--qos"}, "-N": {"--nodes"}, "-t": {"--time"},
        "-A": {"--account"}, "-d": {"--dependency"}}
    assert all(len(longs) == 1 for longs in every.values()), every
    assert declared[0]["--profile"] == ("--profile",)


def test_a_flag_means_one_thing_across_commands():
    commands = _commands()
    spec = {path for path, cmd in commands.items() if "--queue-spec" in _options(cmd)}
    assert spec == {("cluster", "config"), ("cluster", "queue", "add")}
    assert not any("--queue" in _options(commands[path]) for path in spec)
    assert "--head-node-state" in _options(commands["cluster", "diff"])
    assert "--head-node" not in _options(commands["cluster", "diff"])


def test_choices_mirror_the_library_and_show_in_help():
    from toolkit.cli import options as o
    from toolkit.cluster.build import FSX_DEPLOYMENTS, OSES
    from toolkit.cluster.diff import STATES
    from toolkit.k8s.manifests import APIS
    from toolkit.k8s.usercode import SOURCES
    from toolkit.recipes.user import STYLES
    from toolkit.slurm.executors import Executor

    for enum, library in ((o.Os, OSES), (o.FsxDeployment, FSX_DEPLOYMENTS), (o.State, STATES),
                          (o.KubeflowApi, APIS), (o.ScriptFrom, SOURCES),
                          (o.Executor, tuple(e.value for e in Executor)), (o.Launcher, STYLES)):
        assert tuple(e.value for e in enum) == tuple(library), enum
    assert "<script|torchrun|accelerate>" in run_hpc("run", "--help").stdout
    assert "<trainer-v2|v1>" in run_hpc("k8s", "render", "--help").stdout
    assert "<image|configmap>" in run_hpc("k8s", "render", "--help").stdout


def test_help_names_values_not_python_types():
    for path in _commands():
        text = run_hpc(*path, "--help").stdout
        for internal in ("<str>", "<int", "<float", "<path>", "<Path>", "{file}", "json_", "as_json"):
            assert internal not in text, (path, internal)


def test_shell_completion_answers_for_a_command(tmp_path):
    assert "--install-completion" in run_hpc("--help").stdout
    env = {**os.environ, "_HPC_COMPLETE": "complete_bash", "COMP_WORDS": "hpc recipes submit --pro",
           "COMP_CWORD": "3"}
    assert run_hpc_process(env=env).stdout.split() == ["--profile"]
    env.update(COMP_WORDS="hpc run x.py --launcher ", COMP_CWORD="4")
    assert run_hpc_process(env=env).stdout.split() == ["script", "torchrun", "accelerate"]


@pytest.mark.parametrize("args,flag", [
    (["recipes", "new", "x", "--script", "s.py", "--qos", "high"], "--qos"),
    (["recipes", "new", "x", "--script", "s.py", "--sweep", "args.--lr=1,2"], "--sweep"),
    (["recipes", "new", "x", "--script", "s.py", "--profile", "smoke"], "--profile"),
    (["run", "s.py", "--profile", "smoke", "--dry-run"], "--profile"),
])
def test_an_option_a_command_cannot_honour_is_refused(tmp_path, args, flag):
    (tmp_path / "s.py").write_text("print('hi')\n")
    res = run_hpc(*args, "--json", cwd=tmp_path)
    assert res.returncode == 2 and f"does not take {flag}" in cli_envelope(res)["error"]["message"]
    assert not (tmp_path / "recipes").exists()


def test_run_and_submit_honour_the_shared_options(tmp_path):
    (tmp_path / "s.py").write_text("print('hi')\n")
    cluster = write_cluster(tmp_path)
    common = ["--cluster", str(cluster), "-p", "cpu", "--executor", "slurm", "--dry-run", "--json",
              "-t", "00:10:00", "--env", "HPC_PROBE=on", "-A", "acct", "-q", "high", "--set", "env.OTHER=2"]
    run = cli_json(run_hpc("run", "s.py", *common, cwd=tmp_path))
    (tmp_path / "r.yaml").write_text(
        "name: r\ndescription: d\nsource: s\nlauncher: {kind: python-script, script: %s}\n" % (tmp_path / "s.py"))
    submit = cli_json(run_hpc("recipes", "submit", str(tmp_path / "r.yaml"), *common, cwd=tmp_path))
    for plan in (run, submit):
        script = plan["script"] + plan["batch_script"]
        for wanted in ("--time=00:10:00", "--account=acct", "--qos=high", "HPC_PROBE", "OTHER"):
            assert wanted in script, (wanted, script)
    sweep = cli_json(run_hpc("run", "s.py", *common, "--sweep", "args.--lr=0.1,0.2", cwd=tmp_path))
    assert sweep["tasks"] == 2


def test_one_envelope_for_success_failure_and_usage(tmp_path):
    listed = cli_envelope(run_hpc("recipes", "list", "--json"))
    assert (listed["ok"], listed["command"], listed["warnings"]) == (True, "recipes list", [])
    assert "resnet50" in {r["name"] for r in listed["data"]}
    bad = tmp_path / "bad.yaml"
    bad.write_text("Region: us-east-1\n")
    res = run_hpc("cluster", "validate", str(bad), "--json")
    invalid = cli_envelope(res)
    assert res.returncode == 1 and invalid["data"]["valid"] is False  # the findings, and why it failed
    assert invalid["error"]["message"] == f"{bad} is not a valid cluster config"
    logs = cli_envelope(run_hpc("jobs", "logs", "987654321", "--json", env={**os.environ,
                                                                            "HPC_RUNS_DIR": str(tmp_path)}))
    assert logs["command"] == "jobs logs" and logs["error"]["exit_code"] == 1  # `jobs logs` has --json now
    script_args = cli_envelope(run_hpc("run", "s.py", "--bogus", "--json", "--", "--json"))
    assert script_args["error"]["exit_code"] == 2 and "--bogus" in script_args["error"]["message"]


def test_every_missing_required_option_is_reported_at_once():
    res = run_hpc("cluster", "config", "--region", "us-east-1", "--json")
    error = cli_envelope(res)["error"]
    assert res.returncode == 2
    assert error["message"] == "missing options --name, --key-name, --queue-spec, --output"
    assert "--queue-spec NAME=INSTANCE_TYPE:MAX_NODES" in error["fix"]


@pytest.mark.parametrize("args,code,says", [
    (["recipes", "render", "resnet50", "-N", "1", "--time", "ninety"], 2, "--time 'ninety' is not a Slurm time"),
    (["recipes", "render", "resnet50", "-N", "1", "--env", "1X=2"], 2, "--env '1X=2' is not NAME=VALUE"),
    (["recipes", "render", "resnet50", "-N", "1", "--venv", "/nonexistent"], 2, "--venv /nonexistent has no"),
    (["k8s", "render", "resnet50", "-N", "1", "--instance", "p4d.24xlarge", "--api", "v3"], 2,
     "--api 'v3' is not one of trainer-v2, v1"),
    (["recipes", "render", "resnet50", "-N", "two"], 2, "-N 'two' is not a whole number"),
    (["run", "s.py", "--rendezvous-timeout=0"], 2, "--rendezvous-timeout 0: the least it takes is 1"),
    (["recipes", "new", "Bad Name", "--script", "s.py"], 2, "recipe name 'Bad Name' is not lowercase letters"),
    (["cluster", "diff", "a.yaml", "b.yaml", "--head-node-state", "paused"], 2,
     "--head-node-state 'paused' is not one of running, stopped"),
])
def test_a_bad_flag_value_exits_2_in_the_users_terms(args, code, says):
    res = run_hpc(*args)
    assert res.returncode == code and f"error: {says}" in res.stderr and "fix:" in res.stderr, res.stderr
    assert "Value error" not in res.stderr and "Traceback" not in res.stderr


def test_output_into_a_directory_or_stdout(tmp_path):
    rendered = run_hpc("recipes", "render", "resnet50", "-N", "1", "-o", str(tmp_path))
    written = list(tmp_path.glob("*.sbatch"))
    assert rendered.returncode == 0 and len(written) == 1 and written[0].read_text().startswith("#!")
    assert run_hpc("recipes", "render", "resnet50", "-N", "1", "-o", "-").stdout.startswith("#!")
    (tmp_path / "s.py").write_text("print('hi')\n")
    new = run_hpc("recipes", "new", "mine", "--script", "s.py", "-o", "-", cwd=tmp_path)
    assert new.returncode == 0 and "name: mine" in new.stdout and not (tmp_path / "recipes").exists()
    into = tmp_path / "out"
    into.mkdir()
    assert run_hpc("recipes", "new", "mine", "--script", "s.py", "-o", str(into), cwd=tmp_path).returncode == 0
    assert (into / "mine.yaml").is_file()
    k8s = run_hpc("k8s", "render", "resnet50", "-N", "1", "--instance", "p4d.24xlarge", "-o", str(into))
    assert k8s.returncode == 0 and (into / "resnet50.yaml").is_file()
    config = ["cluster", "config", "--name", "demo", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
              "--key-name", "k", "--queue-spec", "cpu=c5.2xlarge:2"]
    assert run_hpc(*config, "-o", str(into)).returncode == 0 and (into / "demo.yaml").is_file()
    shown = run_hpc(*config, "-o", "-")
    assert shown.returncode == 0 and "SlurmQueues" in shown.stdout


def test_the_readme_cli_reference_lists_every_command_and_option():
    import re

    text = (REPO / "README.md").read_text().split("## CLI reference", 1)[1]
    rows = {}
    for line in text.splitlines():
        found = re.match(r"\| `hpc ([a-z0-9 -]+?)(?: [A-Z\[].*?)?` \| (.*) \|$", line)
        if found:
            rows[tuple(found.group(1).split())] = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", found.group(2)))
    live = {path: {name for p in cmd.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
            for path, cmd in _commands().items()}
    differ = {" ".join(path): {"missing": sorted(live.get(path, set()) - rows.get(path, set())),
                               "extra": sorted(rows.get(path, set()) - live.get(path, set()))}
              for path in {*rows, *live} if rows.get(path) != live.get(path)}
    assert not differ, f"README.md's CLI reference table differs from the CLI (add a row/flag): {differ}"
