"""`hpc recipes show`, `hpc recipes render` and `hpc recipes submit --dry-run` are views of one plan
(toolkit.submit.plan.plan_job): for the same recipe, nodes, queue and --set they agree on every value, the run
dir included (each names a new one under the runs root, as submit does; only its time stamp and nonce differ)."""

from __future__ import annotations

import json
import os
import re

from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import write_cluster
from toolkit.cluster.queues import CLUSTER_CONFIG_ENV

RUN_DIR_MARK = "<run dir>"


def views(tmp_path, *run_dir: str) -> dict[str, dict]:
    """The three views' --json of one request; `run_dir` (--run-dir DIR) goes to show and render only."""
    env = {**os.environ, CLUSTER_CONFIG_ENV: "", "HPC_RUNS_DIR": str(tmp_path / "runs")}
    same = ("resnet50", "--nodes", "2", "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu",
            "--set", "args.--epochs=3", "--set", "dirs.logs.under=run", "--json")
    found = {}
    for view, command in (("show", ("recipes", "show", *run_dir)), ("render", ("recipes", "render", *run_dir)),
                          ("dry_run", ("recipes", "submit", "--dry-run", "--executor", "sbatch"))):
        res = run_hpc(*command, *same, env=env)
        assert res.returncode == 0, res.stderr
        found[view] = cli_json(res)
    return found


def masked(value, run_dir: str):
    """`value` with the run dir written as RUN_DIR_MARK (JSON round trip: every string of it)."""
    return json.loads(json.dumps(value).replace(run_dir, RUN_DIR_MARK))


def test_show_render_and_dry_run_agree_on_every_value_and_the_run_dir(tmp_path):
    found = views(tmp_path)
    show, render, dry_run = found["show"], found["render"], found["dry_run"]
    run_dirs = [show["job"]["run_dir"], render["run_dir"], dry_run["run_dir"]]
    for run_dir in run_dirs:  # submit's own naming: <runs root>/<recipe>-<UTC time>-<nonce>
        assert re.fullmatch(re.escape(str(tmp_path / "runs")) + r"/resnet50-\d{8}-\d{6}-[0-9a-f]{6}", run_dir)
    show, render, dry_run = (masked(view, run_dir)
                             for view, run_dir in zip((show, render, dry_run), run_dirs, strict=True))

    assert show["derived"] == dry_run["derived"]
    assert {"key": "logs dir", "value": f"{RUN_DIR_MARK}/logs/resnet50", "rule": "dirs.logs.dir under the run dir"} in \
        show["derived"]
    assert show["rank0_argv"] == dry_run["rank0_argv"] and "--epochs" in show["rank0_argv"]
    assert render["script"] == dry_run["script"] and f"--output={RUN_DIR_MARK}/" in render["script"]
    assert show["warnings"] == render["warnings"] == dry_run["warnings"]
    assert (show["job"]["nodes"], show["job"]["world_size"], show["job"]["partition"]) == \
        (dry_run["nodes"], dry_run["ranks"], dry_run["queue"])


def test_a_fixed_run_dir_is_the_same_in_show_and_render(tmp_path):
    fixed = str(tmp_path / "fixed-run")
    found = views(tmp_path, "--run-dir", fixed)
    assert found["show"]["job"]["run_dir"] == found["render"]["run_dir"] == fixed
    assert f"--output={fixed}/resnet50-%j.out" in found["render"]["script"]
    assert found["dry_run"]["run_dir"] != fixed  # submit always makes a new run dir
