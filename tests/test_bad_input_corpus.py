"""A corpus of bad input, each case run through the real CLI (in-process); the cases whose answer comes from
Slurm (a stopped slurmctld, sbatch refusing a job, an unknown job id) run against the real local Slurm.

Every case states its exit code and a pattern its message must match. For every case the test checks: that
exit code; stderr has `error:` naming what is wrong (the pattern) and `fix:` saying what to do; no traceback;
no file under the recipes, cluster configs and runs root changed (content, mtime, or a file/dir appearing or
vanishing); and no job of ours reached Slurm: the cases without Slurm run with every Slurm command on PATH
replaced by a stand-in that records the call and fails, and none that submits (sbatch, srun, salloc) may be
called (a query such as `scontrol show config` may: it fails as with no Slurm there); the Slurm cases check
squeue and sacct, filtered to jobs submitted from this corpus's directory, so other users' jobs do not matter.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SUMMARY, run_hpc, slurm_env, tally
from tests.jobhelpers import PROBE, write_recipe

GOOD = {
    "name": "probe", "description": "records argv", "source": "tests",
    "launcher": {"kind": "binary", "program": str(PROBE)},
    "args": {"--count": 1}, "resources": {"nodes": 1, "time": "00:05:00", "exclusive": False},
    "env": {"PROBE_OUT": "/nonexistent-probe-out"},
}
# The local Slurm's cpu queue (2 nodes): the sbatch cases submit to its partition.
CPU_QUEUE = {
    "Name": "cpu", "CapacityType": "ONDEMAND", "Networking": {"SubnetIds": ["subnet-00000000000000000"]},
    "ComputeResources": [{"Name": "m5-xl", "Instances": [{"InstanceType": "m5.xlarge"}], "MinCount": 2,
                          "MaxCount": 2}],
    "Tags": [{"Key": "hpc:ranks-per-node", "Value": "2"}, {"Key": "hpc:cpus-per-task", "Value": "1"},
             {"Key": "hpc:efa-stack", "Value": "none"}],
}
CLUSTER = {"Region": "us-east-1", "Image": {"Os": "ubuntu2204"},
           "HeadNode": {"InstanceType": "m5.xlarge", "Networking": {"SubnetId": "subnet-00000000000000000"},
                        "Ssh": {"KeyName": "k"}},
           "Scheduling": {"Scheduler": "slurm", "SlurmQueues": [CPU_QUEUE]}}
SUBMITTING = ("sbatch", "srun", "salloc")
SLURM_COMMANDS = (*SUBMITTING, "squeue", "sacct", "scancel", "scontrol", "sinfo")
FAIRSEQ = {"name": "fs", "description": "d", "source": "s", "launcher": {"kind": "fairseq"},
           "args": {"--arch": "transformer", "--distributed-world-size": 8}, "resources": {"nodes": 1}}


def bad(**changes) -> dict:
    data = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


@dataclasses.dataclass(frozen=True)
class Case:
    category: str
    name: str
    args: tuple[str, ...]
    code: int
    pattern: str  # a regex the error message must match (case-insensitive)
    env: tuple[tuple[str, str], ...] = ()
    report: bool = False  # a report command (hpc cluster validate): its findings, with fixes, are on stdout
    slurm: bool = False  # the answer comes from the real Slurm
    training: bool = False  # the answer comes from fairseq's or DeepSpeed's own parser (the training environment)

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


def case(category, name, args, code, pattern, report=False, slurm=False, training=False, **env) -> Case:
    return Case(category, name, tuple(args), code, pattern, tuple(env.items()), report,
                slurm or category in ("slurmctld", "sbatch"), training)


SUBMIT = ("recipes", "submit", "probe", "--cluster", "{ws}/cluster.yaml", "--queue", "cpu")
CONFIG = ("cluster", "config", "--name", "c1", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
          "--key-name", "k")

CASES = [
    # issue 20: training arguments, sweeps, --set
    case("set", "fairseq-unknown-flag", ["recipes", "submit", "roberta", "--set", "args.--lrr=0.1"], 1,
         r"unknown argument --lrr \(from --set args\.--lrr=0\.1\): fairseq-train .*did you mean --lr\?\n"
         r"  fix: --set args\.--lr=0\.1 ", training=True),
    case("set", "fairseq-bad-value", ["recipes", "submit", "roberta", "--set", "args.--lr=abc"], 1,
         r"--lr abc \(from --set args\.--lr=abc\) is not a value fairseq-train .* accepts: it wants values like 1 "
         r".*\n  fix: --set args\.--lr=0\.25", training=True),
    case("set", "trainer-unknown-flag", ["recipes", "submit", "resnet50", "--set", "args.--batch-sizee=128"], 1,
         r"unknown argument --batch-sizee .*did you mean --batch-size\?\n  fix: --set args\.--batch-size=128 "),
    case("set", "trainer-switch-with-value", ["recipes", "submit", "resnet50", "--set", "args.--amp=1"], 1,
         r"--amp is a switch and takes no value, got '1'.*\n  fix: .*--set args\.--amp=true"),
    case("set", "derived-key", ["recipes", "submit", "resnet50", "--set", "args.--lr=0.2"], 1,
         r"--set args\.--lr=0\.2: --lr is derived by the recipe's scaling rule scaling\.--lr.*\n"
         r"  fix: .*--set scaling\.--lr\.base=0\.2"),
    # a dir's flag: the job passes dirs.data itself, and `--set args.--data=...` was replaced without a word
    case("set", "dir-flag", ["recipes", "submit", "resnet50", "--set", "args.--data=/x/mydata"], 1,
         r"--set args\.--data=/x/mydata: --data is the job's dirs\.data \(its arg: --data\).*\n"
         r"  fix: --set dirs\.data\.dir=/x/mydata"),
    case("recipes", "dir-flag-in-args", ["recipes", "submit", "{ws}/recipes/dirflag.yaml"], 1,
         r"args\.--data is the job's dirs\.data \(its arg: --data\), which the job passes: set dirs\.data\.dir"),
    case("set", "deepspeed-config-key", ["recipes", "submit", "bert-5b",
                                         "--cluster", str(REPO / "jobs" / "dl1-cluster.yaml"),
                                         "--set", "deepspeed.config.bf16.enabld=true"], 1,
         r"deepspeed\.config\.bf16\.enabld: DeepSpeed \S+ has no such key .*did you mean enabled\?", training=True),
    case("set", "unknown-key-did-you-mean", [*SUBMIT, "--set", "resources.nodez=2"], 1,
         r"resources\.nodez: unknown key; did you mean resources\.nodes\?.*\n  fix: --set resources\.nodes=2"),
    # one value from two options: the later was taken without a word (as --nodes with --set resources.nodes)
    case("set", "time-twice", [*SUBMIT, "--time", "01:00:00", "--set", "resources.time=02:00:00"], 2,
         r"--time 01:00:00 and --set resources\.time=02:00:00 both set resources\.time"),
    case("set", "env-twice", [*SUBMIT, "--env", "FOO=1", "--set", "env.FOO=2"], 2,
         r"--env FOO=1 and --set env\.FOO=2 both set env\.FOO"),
    # options that cannot go together are usage errors (exit 2): they exited 1
    case("sweeps", "sweep-with-executor-sbatch", [*SUBMIT, "--sweep", "args.--count=1,2", "--executor", "sbatch",
                                                  "--dry-run"], 2, r"a sweep is a submitit job array"),
    case("cli", "spares-with-executor-slurm", [*SUBMIT, "--spares", "1", "--executor", "slurm", "--dry-run"], 2,
         r"--spares 1: spare nodes are a Slurm allocation's"),
    case("sweeps", "set-of-a-swept-key", [*SUBMIT, "--sweep", "args.--count=1,2", "--set", "args.--count=5"], 2,
         r"--sweep args\.--count=1,2 and --set args\.--count=5 both set args\.--count"),
    case("set", "nodes-twice", [*SUBMIT, "--nodes", "1", "--set", "resources.nodes=2"], 2,
         r"--nodes 1 and --set resources\.nodes=2 both set the node count"),
    case("recipes", "name-did-you-mean", ["recipes", "submit", "robera"], 2,
         r"no recipe named 'robera'; did you mean roberta\?"),
    case("recipes", "profile-did-you-mean", [*SUBMIT[:3], "--profile", "smok", *SUBMIT[3:]], 2,
         r"has no profile 'smok'"),
    case("sweeps", "nodes-and-node-sweep", [*SUBMIT, "--nodes", "2", "--sweep", "resources.nodes=1,2"], 2,
         r"--nodes 2 and --sweep resources\.nodes=1,2 both set the node count"),
    case("sweeps", "range-without-step", [*SUBMIT, "--sweep", "args.--lr=0.1..0.4"], 2,
         r"the range 0\.1\.\.0\.4 has no step.*\n  fix: give the step: 0\.1\.\.0\.4:STEP \(e\.g\. 0\.1\.\.0\.4:0\.1\)"),
    case("sweeps", "point-args-checked", ["recipes", "submit", "resnet50", "--sweep", "args.--batch-sizee=1,2"], 1,
         r"sweep point 0 \(args\.--batch-sizee=1\): unknown argument --batch-sizee .*did you mean --batch-size\?\n"
         # the fix keeps the sweep's values (it named the point's one: --sweep args.--batch-size=1)
         r"  fix: --sweep args\.--batch-size=\.\.\. with the values of your --sweep args\.--batch-sizee=\.\.\."),
    case("set", "top-level-key-a-letter-off", [*SUBMIT, "--set", "arg.--count=5"], 1,
         r"arg: unknown key; did you mean args\?.*\n  fix: --set args\.--count=5"),  # was dirs.data.arg=5
    case("set", "dashes-only", [*SUBMIT, "--set", "args.--=5"], 2, r"'--' is not a flag"),
    # recipes
    case("recipes", "invalid-yaml", ["recipes", "submit", "{ws}/recipes/broken.yaml"], 1, r"line \d+.*not valid YAML"),
    # YAML lets the later of two equal keys win without a word: the recipe ran the value the reader did not see
    case("recipes", "duplicate-key", ["recipes", "validate", "{ws}/recipes/dup.yaml"], 1,
         r"dup\.yaml \(line \d+, column \d+\): duplicate key '--count' \(first on line \d+\)\n"
         r"  fix: keep one of the two"),
    case("recipes", "not-a-mapping", ["recipes", "submit", "{ws}/recipes/list.yaml"], 1, r"a recipe is a YAML mapping"),
    case("recipes", "empty-file", ["recipes", "submit", "{ws}/recipes/empty.yaml"], 1, r"the file is empty"),
    case("recipes", "unknown-key", ["recipes", "submit", "{ws}/recipes/colour.yaml"], 1, r"colour: unknown key"),
    case("recipes", "missing-launcher", ["recipes", "submit", "{ws}/recipes/nolauncher.yaml"], 1,
         r"launcher: required key is missing"),
    case("recipes", "bad-name", ["recipes", "submit", "{ws}/recipes/badname.yaml"], 1, r"name: 'Bad Name!'"),
    case("recipes", "bad-time", ["recipes", "submit", "{ws}/recipes/badtime.yaml"], 1, r"resources\.time"),
    case("recipes", "flag-without-dashes", ["recipes", "submit", "{ws}/recipes/badflag.yaml"], 1, r"bad key 'lr'"),
    case("recipes", "bad-env-name", ["recipes", "submit", "{ws}/recipes/badenv.yaml"], 1, r"bad key '1BAD'"),
    case("recipes", "zero-nodes", ["recipes", "submit", "{ws}/recipes/zeronodes.yaml"], 1, r"resources\.nodes"),
    case("recipes", "toolkit-controlled-flag", ["recipes", "submit", "{ws}/recipes/fs.yaml", "--cluster",
                                               "{ws}/cluster.yaml"], 1,
         r"--distributed-world-size is set by the toolkit"),
    case("recipes", "unknown-name", ["recipes", "submit", "no-such-recipe"], 2, r"no recipe named 'no-such-recipe'"),
    case("recipes", "unknown-profile", [*SUBMIT, "--profile", "nope"], 2, r"has no profile 'nope'"),
    # --set overrides
    case("set", "no-equals", [*SUBMIT, "--set", "args.--lr"], 2, r"not KEY\.PATH=VALUE"),
    case("set", "empty-key-part", [*SUBMIT, "--set", "args..x=1"], 2, r"not KEY\.PATH=VALUE"),
    case("set", "name", [*SUBMIT, "--set", "name=other"], 2, r"name cannot be overridden"),
    case("set", "into-a-scalar", [*SUBMIT, "--set", "args.--count.x=1"], 1,
         r"args\.--count: must be a string.*value from --set args\.--count\.x=1"),
    case("set", "unknown-key", [*SUBMIT, "--set", "colour=red"], 1, r"colour: unknown key.*--set colour=red"),
    case("set", "nodes-not-a-number", [*SUBMIT, "--set", "resources.nodes=many"], 1, r"resources\.nodes.*--set"),
    case("set", "bad-time", [*SUBMIT, "--set", "resources.time=25h"], 1, r"resources\.time"),
    case("set", "bad-env-value-type", [*SUBMIT, "--set", "env=[1, 2]"], 1, r"env"),
    # sweeps
    case("sweeps", "no-values", [*SUBMIT, "--sweep", "args.--lr"], 2, r"not KEY\.PATH=V1,V2"),
    case("sweeps", "empty-value", [*SUBMIT, "--sweep", "args.--lr=0.1,,0.2"], 2, r"value 2 is empty"),
    case("sweeps", "reversed-range", [*SUBMIT, "--sweep", "args.--seed=9..1"], 2, r"range 9\.\.1 is empty"),
    case("sweeps", "key-twice", [*SUBMIT, "--sweep", "args.--a=1", "--sweep", "args.--a=2"], 2, r"given twice"),
    case("sweeps", "value-twice", [*SUBMIT, "--sweep", "args.--a=1,2,1"], 2, r"1 given more than once"),
    case("sweeps", "bad-point-57", [*SUBMIT, "--sweep", "resources.time=00:05:00,later", "--sweep",
                                    "args.--count=1..57"], 1,
         r"sweep point 57 \(resources\.time=later, args\.--count=1\)"),
    case("sweeps", "changes-resources", [*SUBMIT, "--sweep", "resources.nodes=1,2"], 1,
         r"sweep point 1 .* changes the job's nodes"),
    case("sweeps", "changes-environment", [*SUBMIT, "--sweep", "env.X=1,2"], 1, r"changes the job's setup"),
    case("sweeps", "bad-max-array-size", [*SUBMIT, "--sweep", "args.--count=1..3"], 1,
         r"HPC_MAX_ARRAY_SIZE='0' is not a positive whole number", HPC_MAX_ARRAY_SIZE="0"),
    case("sweeps", "parallelism-without-sweep", [*SUBMIT, "--array-parallelism", "2"], 2, r"limits a sweep"),
    case("sweeps", "parallelism-zero", [*SUBMIT, "--sweep", "args.--a=1,2", "--array-parallelism", "0"], 2,
         r"--array-parallelism"),
    case("sweeps", "local-executor", [*SUBMIT, "--executor", "local", "--sweep", "args.--a=1,2"], 2,
         r"Slurm job array"),
    # cluster configs
    case("cluster", "missing-file", ["recipes", "submit", "probe", "--cluster", "{ws}/nope.yaml"], 1,
         r"cluster config .*nope\.yaml does not exist"),
    case("cluster", "invalid-yaml", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-broken.yaml"], 1,
         r"cluster-broken\.yaml"),
    case("cluster", "unknown-queue", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster.yaml", "--queue",
                                      "gpu"], 2, r"has no queue 'gpu'"),
    case("cluster", "no-queues", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-noqueues.yaml"], 1,
         r"defines no Slurm queues"),
    case("cluster", "env-config-missing", ["recipes", "submit", "probe"], 1, r"HPC_CLUSTER_CONFIG names",
         HPC_CLUSTER_CONFIG="{ws}/nope.yaml"),
    case("cluster", "validate-min-over-max", ["cluster", "validate", "{ws}/cluster-minmax.yaml"], 1,
         r"MaxCount\s+Max count must be greater than or equal to min count", report=True),
    case("cluster", "config-bad-queue-name", [*CONFIG, "--queue-spec", "Bad_Q=m5.xlarge:2", "-o", "{ws}/new.yaml"], 2,
         r"queue name 'Bad_Q'"),
    case("cluster", "config-unknown-instance", [*CONFIG, "--queue-spec", "q=x9.huge:2", "-o", "{ws}/new.yaml"], 2,
         r"--queue-spec 'q=x9\.huge:2': instance type 'x9\.huge' is not in the toolkit's catalog.*instances\.yaml"),
    case("cluster", "config-over-existing-file", [*CONFIG, "--queue-spec", "q=m5.xlarge:2", "-o", "{ws}/cluster.yaml"],
         1, r"already exists"),
    case("cluster", "config-bad-region", [*CONFIG[:4], "--region", "mars", *CONFIG[6:], "--queue-spec", "q=m5.xlarge:2",
                                          "-o", "{ws}/new.yaml"], 2, r"region 'mars'"),
    # CLI arguments
    case("cli", "unknown-option", [*SUBMIT, "--bogus"], 2, r"No such option: --bogus"),
    case("cli", "missing-argument", ["recipes", "submit"], 2, r"Missing argument"),
    case("cli", "nodes-not-an-int", [*SUBMIT, "--nodes", "two"], 2, r"--nodes 'two' is not a whole number"),
    case("cli", "nodes-zero", [*SUBMIT, "--nodes", "0"], 2, r"--nodes"),
    case("cli", "more-nodes-than-the-queue", [*SUBMIT, "--nodes", "3"], 1,
         r"3 nodes requested; queue cpu has at most 2"),
    case("cli", "unknown-executor", [*SUBMIT, "--executor", "cloud"], 2, r"--executor 'cloud'"),
    case("cli", "unknown-command", ["recipes", "sumbit", "probe"], 2, r"No such command"),
    # a name or typo as a job id: Slurm was asked (cancel: scancel said only "Invalid job id") and the answer was 1
    case("cli", "job-id-a-word", ["jobs", "status", "abc"], 2, r"'abc' is not a job id: Slurm's are numbers"),
    case("cli", "cancel-job-id-a-typo", ["jobs", "cancel", "12a4"], 2, r"'12a4' is not a job id.*hpc jobs list"),
    # issue 20: vocabulary and output contract
    case("cli", "queue-is-not-queue-spec", [*CONFIG, "--queue", "q=m5.xlarge:2", "-o", "{ws}/new.yaml"], 2,
         r"No such option: --queue.*--queue-spec"),
    case("cli", "every-missing-option", ["cluster", "config", "--name", "c1"], 2,
         r"missing options --region, --key-name, --queue-spec, --output"),
    case("cli", "bad-time", [*SUBMIT, "--time", "90min"], 2, r"--time '90min' is not a Slurm time limit"),
    # the stop signal 120 s before the limit came at the start, and the job requeued itself again and again
    case("cli", "time-inside-the-stop-signal", [*SUBMIT, "--time", "1", "--dry-run"], 1,
         r"time limit 1 \(60 s\) is too short for the stop signal 120 s before it.*--time 4 or more"),
    # went into #SBATCH --dependency and a dry run showed it; sbatch refused the job at submit
    case("cli", "dependency-without-job", [*SUBMIT, "--dependency", "afterok", "--dry-run"], 2,
         r"--dependency 'afterok' is not a Slurm dependency .*\n  fix: e\.g\. --dependency afterok:123"),
    case("cli", "dependency-unknown-type", [*SUBMIT, "--dependency", "bogus:12", "--dry-run"], 2,
         r"--dependency 'bogus:12' is not a Slurm dependency"),
    case("cli", "env-without-value", [*SUBMIT, "--env", "NOEQUALS"], 2, r"--env 'NOEQUALS' is not NAME=VALUE"),
    case("cli", "venv-not-a-venv", [*SUBMIT, "--venv", "{ws}"], 2, r"--venv .* has no bin/activate"),
    case("cli", "not-a-choice", ["cluster", "diff", "{ws}/cluster.yaml", "{ws}/cluster.yaml", "--head-node-state",
                                 "paused"], 2, r"--head-node-state 'paused' is not one of running, stopped"),
    case("cli", "new-cannot-sweep", ["recipes", "new", "x", "--script", "{ws}/x.py", "--sweep", "args.--a=1,2"], 2,
         r"recipes new does not take --sweep"),
    case("cli", "run-has-no-profiles", ["run", "{ws}/x.py", "--profile", "smoke"], 2, r"run does not take --profile"),
    case("cli", "status-of-unknown-job", ["jobs", "status", "987654321"], 1, r"job 987654321 is unknown", slurm=True),
    case("cli", "logs-of-unknown-job", ["jobs", "logs", "987654321"], 1, r"no run dir records job 987654321"),
    case("cli", "directive-unsafe-account", [*SUBMIT, "--account", "a b"], 1, r"account 'a b' cannot go into"),
    # missing or unreadable files and dirs
    case("files", "recipe-file-missing", ["recipes", "submit", "{ws}/nope/recipe.yaml"], 1, r"does not exist"),
    case("files", "recipe-is-a-directory", ["recipes", "submit", "{ws}/dir.yaml"], 1, r"dir\.yaml is a directory"),
    case("files", "recipe-not-utf8", ["recipes", "submit", "{ws}/recipes/latin1.yaml"], 1, r"not UTF-8"),
    case("files", "recipe-dangling-symlink", ["recipes", "submit", "{ws}/recipes/dangling.yaml"], 1, r"does not exist"),
    case("files", "cluster-is-a-directory", ["recipes", "submit", "probe", "--cluster", "{ws}/dir.yaml"], 1,
         r"dir\.yaml is a directory"),
    case("files", "cluster-not-utf8", ["recipes", "submit", "probe", "--cluster", "{ws}/recipes/latin1.yaml"], 1,
         r"not UTF-8"),
    # the run dir is made once Slurm has said it takes the job
    case("files", "runs-root-is-a-file", [*SUBMIT], 1, r"cannot create run dir", slurm=True,
         HPC_RUNS_DIR="{ws}/cluster.yaml"),
    case("files", "runs-root-not-creatable", [*SUBMIT], 1, r"cannot create run dir", slurm=True,
         HPC_RUNS_DIR="/proc/hpc-runs"),
    case("files", "runs-root-with-a-space", [*SUBMIT], 1, r"run dir .* cannot go into an #SBATCH line",
         HPC_RUNS_DIR="{ws}/runs/with space"),
    case("files", "render-into-missing-dir", ["recipes", "render", "probe", "--cluster", "{ws}/cluster.yaml",
                                              "-o", "{ws}/nope/job.sbatch"], 1, r"cannot write .*nope/job\.sbatch"),
    case("files", "validate-missing-file", ["cluster", "validate", "{ws}/nope.yaml"], 1, r"nope\.yaml"),
    # a stopped slurmctld (a copy of the sandbox's slurm.conf with a port nobody listens on)
    case("slurmctld", "submit", [*SUBMIT], 1, r"controller \(slurmctld\) is not answering: nothing was submitted",
         SLURM_CONF="{ws}/dead/slurm.conf"),
    case("slurmctld", "sweep", [*SUBMIT, "--sweep", "args.--count=1,2"], 1, r"slurmctld\) is not answering",
         SLURM_CONF="{ws}/dead/slurm.conf"),
    case("slurmctld", "status", ["jobs", "status", "987654321"], 1, r"slurmctld\) is not answering",
         SLURM_CONF="{ws}/dead/slurm.conf"),
    case("slurmctld", "cancel", ["jobs", "cancel", "987654321"], 1, r"slurmctld\) is not answering",
         SLURM_CONF="{ws}/dead/slurm.conf"),
    # sbatch refusing a job
    case("sbatch", "unknown-partition", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-nopart.yaml"], 1,
         r"Slurm refused the job: .*invalid partition"),
    case("sbatch", "too-many-nodes", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-big.yaml", "--nodes",
                                      "5"], 1, r"Slurm refused the job: .*node configuration is not available"),
    case("sbatch", "sweep-unknown-partition", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-nopart.yaml",
                                               "--sweep", "args.--count=1,2"], 1, r"Slurm refused the job"),
    case("sbatch", "sweep-too-many-nodes", ["recipes", "submit", "probe", "--cluster", "{ws}/cluster-big.yaml",
                                            "--nodes", "3", "--sweep", "args.--count=1,2"], 1,
         r"Slurm refused the job: .*node configuration is not available"),
    # issue 20: instance checks and queue edits
    case("cluster", "queue-set-instance-typo", ["cluster", "queue", "set", "{ws}/cluster.yaml", "cpu", "--instance",
                                                "m5.xlarg"], 2,
         r"--instance 'm5\.xlarg': instance type .* not in the toolkit's catalog"
         r".*did you mean --instance m5\.xlarge\?"),
    case("cluster", "queue-add-instance-typo", ["cluster", "queue", "add", "{ws}/cluster.yaml", "--queue-spec",
                                                "x=p4d.24xlarg:2"], 2,
         r"--queue-spec 'x=p4d\.24xlarg:2'.*did you mean --queue-spec x=p4d\.24xlarge:2\?"),
    case("cluster", "config-instance-typo", [*CONFIG, "--queue-spec", "q=p4d.24xlarg:2", "-o", "{ws}/new.yaml"], 2,
         r"--queue-spec 'q=p4d\.24xlarg:2'.*did you mean --queue-spec q=p4d\.24xlarge:2\?"),
    case("cluster", "queue-add-capital-name", ["cluster", "queue", "add", "{ws}/cluster.yaml", "--queue-spec",
                                               "Gpu=m5.xlarge:2"], 2,
         r"queue name 'Gpu'.*fix: e\.g\. --queue-spec gpu=m5\.xlarge:2"),
    case("cluster", "queue-add-bad-subnet", ["cluster", "queue", "add", "{ws}/cluster.yaml", "--queue-spec",
                                             "x=m5.xlarge:2", "--subnet", "subnet-1"], 2,
         r"--subnet 'subnet-1' is not a subnet id.*--subnet subnet-0123456789abcdef0"),
    case("cluster", "config-bad-subnet", [*CONFIG[:6], "--subnet", "sn-1", *CONFIG[8:], "--queue-spec", "q=m5.xlarge:2",
                                          "-o", "{ws}/new.yaml"], 2, r"--subnet 'sn-1' is not a subnet id"),
    case("cluster", "instance-facts-missing", ["cluster", "queue", "add", "{ws}/cluster.yaml", "--queue-spec",
                                               "x=m5.xlarge:2"], 1, r"HPC_INSTANCE_FACTS names .*nope\.yaml",
         HPC_INSTANCE_FACTS="{ws}/nope.yaml"),
    case("cluster", "instance-facts-not-a-catalog", ["cluster", "queue", "add", "{ws}/cluster.yaml", "--queue-spec",
                                                     "x=m5.xlarge:2"], 1,
         r"list\.yaml: an instance facts file is a mapping with an `instances:` mapping",
         HPC_INSTANCE_FACTS="{ws}/recipes/list.yaml"),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("corpus")
    recipes = ws / "recipes"
    recipes.mkdir()
    write_recipe(recipes, GOOD, "probe.yaml")
    (recipes / "broken.yaml").write_text("name: probe\nargs: {--count: [1, 2\n")
    (recipes / "list.yaml").write_text("- name\n- probe\n")
    (recipes / "empty.yaml").write_text("")
    good = yaml.safe_dump(GOOD, sort_keys=False)
    (recipes / "dup.yaml").write_text(good.replace("args:\n", "args:\n  --count: 9\n", 1))  # then --count: 1
    (recipes / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (recipes / "dangling.yaml").symlink_to(ws / "gone.yaml")
    for name, data in {"colour": {**GOOD, "colour": "red"}, "nolauncher": bad(launcher=None),
                       "badname": bad(name="Bad Name!"), "badtime": bad(resources={"time": "soon"}),
                       "badflag": bad(args={"lr": 1}), "badenv": bad(env={"1BAD": "x"}),
                       "zeronodes": bad(resources={"nodes": 0}), "fs": FAIRSEQ,
                       "dirflag": bad(args={"--data": "/x"}, dirs={"data": {"dir": "d", "arg": "--data"}})}.items():
        write_recipe(recipes, data, f"{name}.yaml")
    (ws / "dir.yaml").mkdir()

    def with_queue(queue: dict | None) -> str:
        scheduling = {"Scheduler": "slurm", **({"SlurmQueues": [queue]} if queue else {})}
        return yaml.safe_dump({**CLUSTER, "Scheduling": scheduling}, sort_keys=False)

    compute = CPU_QUEUE["ComputeResources"][0]
    (ws / "cluster.yaml").write_text(with_queue(CPU_QUEUE))
    (ws / "cluster-nopart.yaml").write_text(with_queue({**CPU_QUEUE, "Name": "nosuchpartition"}))
    (ws / "cluster-big.yaml").write_text(with_queue(
        {**CPU_QUEUE, "ComputeResources": [{**compute, "MinCount": 0, "MaxCount": 10}]}))
    (ws / "cluster-minmax.yaml").write_text(with_queue(
        {**CPU_QUEUE, "ComputeResources": [{**compute, "MinCount": 3, "MaxCount": 2}]}))
    (ws / "cluster-noqueues.yaml").write_text(with_queue(None))
    (ws / "cluster-broken.yaml").write_text("Region: us-east-1\nScheduling: [\n")

    old_run = ws / "runs" / "probe-20200101-000000-abcdef"  # a run from before: must stay as it is
    old_run.mkdir(parents=True)
    (old_run / "metadata.json").write_text('{"recipe": "probe", "job_ids": ["1"], "executor": "slurm"}\n')
    return ws


@pytest.fixture(scope="module")
def slurm_trap(tmp_path_factory) -> tuple[Path, Path]:
    """A dir of stand-ins for every Slurm command, each recording its call in a log and failing."""
    bin_dir = tmp_path_factory.mktemp("slurm-trap")
    log = bin_dir.parent / f"{bin_dir.name}.log"
    for name in SLURM_COMMANDS:
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


@pytest.fixture(scope="module")
def dead_slurm_conf(slurm_sandbox, workspace) -> None:
    """A copy of the local Slurm's slurm.conf with a port nobody listens on: a stopped slurmctld."""
    dead = workspace / "dead"
    dead.mkdir()
    conf = Path(slurm_sandbox.slurm_conf).read_text()
    conf = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", conf)
    # Slurm retries a dead controller for up to MessageTimeout: 1 s is enough to see it is down
    (dead / "slurm.conf").write_text(re.sub(r"(?m)^MessageTimeout=.*$", "MessageTimeout=1", conf))


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every file and dir under the roots: (kind, sha256, mtime_ns)."""
    state: dict[str, tuple] = {}
    for root in roots:
        paths = [root] if root.is_file() else [root, *root.rglob("*")]
        for path in paths:
            st = path.lstat()
            if path.is_symlink():
                state[str(path)] = ("link", os.readlink(path), st.st_mtime_ns)
            elif path.is_dir():
                state[str(path)] = ("dir", None, st.st_mtime_ns)
            else:
                state[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)
    return state


def our_jobs(ws: Path, since: dt.datetime, env: dict) -> list[str]:
    """Jobs submitted from the corpus dir (their WorkDir), in squeue (any state) and in accounting."""
    import subprocess

    found = []
    squeue = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%Z"], capture_output=True, text=True, env=env,
                            timeout=30)
    assert squeue.returncode == 0, squeue.stderr
    found += [line for line in squeue.stdout.splitlines() if str(ws) in line]
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-S", since.strftime("%Y-%m-%dT%H:%M:%S"), "-o",
                            "JobID,WorkDir"], capture_output=True, text=True, env=env, timeout=30)
    assert sacct.returncode == 0, sacct.stderr
    found += [line for line in sacct.stdout.splitlines() if str(ws) in line]
    return found


@pytest.fixture(scope="module")
def counts():
    # the cases passed, by category, summed over the workers (its Slurm cases run on the default lane's worker)
    SUMMARY.append(f"bad-input corpus: {len(CASES)} cases in {len({c.category for c in CASES})} categories")
    return tally("bad-input corpus, cases passed")


def test_the_corpus_is_big_enough():
    categories = collections.Counter(c.category for c in CASES)
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)
    assert set(categories) == {"recipes", "set", "sweeps", "cluster", "cli", "files", "slurmctld", "sbatch"}


def check(case: Case, ws: Path, env: dict) -> None:
    """Run the case's command; its exit code, one error with a fix, no traceback, no file changed."""
    roots = [ws, REPO / "recipes"]
    before = snapshot(*roots)
    res = run_hpc(*(a.format(ws=ws) for a in case.args), env=env, cwd=ws)

    out = res.stdout + res.stderr
    assert res.returncode == case.code, f"exit {res.returncode}, expected {case.code}:\n{res.stderr}"
    assert "Traceback" not in out and "internal error" not in out, out
    if case.report:
        assert re.search(r"(?m)^error\s", res.stdout) and "fix: " in res.stdout, res.stdout
        message = res.stdout
    else:
        assert "error: " in res.stderr and "  fix: " in res.stderr, res.stderr
        message = res.stderr.split("error: ", 1)[1]
    assert re.search(case.pattern, message, re.IGNORECASE | re.DOTALL), f"{case.pattern!r} not in:\n{message}"
    fix = message.split("fix: ", 1)[1].strip()
    assert len(fix) > 10, fix
    after = snapshot(*roots)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert changed == [], f"files changed: {changed}"


def case_env(case: Case, ws: Path, base: dict) -> dict:
    return {**base, "HPC_RUNS_DIR": str(ws / "runs"), **{k: v.format(ws=ws) for k, v in case.env}}


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.training] if c.training else [], id=c.id)
                                  for c in CASES if not c.slurm])
def test_bad_input(case: Case, workspace: Path, slurm_trap, counts):
    bin_dir, log = slurm_trap
    base = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    base["PATH"] = f"{bin_dir}{os.pathsep}{base.get('PATH', '')}"
    check(case, workspace, case_env(case, workspace, base))
    calls = log.read_text().splitlines() if log.exists() else []
    assert not [call for call in calls if call.split()[0] in SUBMITTING], f"a job was submitted: {calls}"
    counts[case.category] += 1


@pytest.mark.slurm
@pytest.mark.parametrize("case", [c for c in CASES if c.slurm], ids=[c.id for c in CASES if c.slurm])
def test_bad_input_answered_by_slurm(case: Case, workspace: Path, slurm_sandbox, dead_slurm_conf, counts):
    since = dt.datetime.now() - dt.timedelta(seconds=1)
    check(case, workspace, case_env(case, workspace, slurm_env(slurm_sandbox)))
    assert our_jobs(workspace, since, slurm_env(slurm_sandbox)) == [], "a job reached Slurm"
    counts[case.category] += 1
