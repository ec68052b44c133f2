"""Profiles and --set overlays, and one clear error per fault in a bad recipe."""

import copy

import pytest

from tests.jobhelpers import MINIMAL_RECIPE, P3DN, write_recipe
from toolkit.errors import HpcError, UsageError
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe, parse_override

WITH_PROFILE = {**MINIMAL_RECIPE, "profiles": {"smoke": {
    "args": {"--fp16": None, "--encoder-layers": 1, "--max-sentences": 2},
    "dirs": {"data": {"dir": "/tmp/smoke-data"}},
    "scaling": {"--update-freq": None},
    "env": {"NCCL_DEBUG": "WARN"},
}}}


def test_profile_overrides_removes_adds_and_changes_dirs(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, WITH_PROFILE), profile="smoke")
    assert list(recipe.args) == ["--arch", "--max-sentences", "--encoder-layers"]  # new flags go last
    assert recipe.args["--max-sentences"] == 2 and recipe.scaling == {}
    assert recipe.dirs.data.dir == "/tmp/smoke-data" and recipe.dirs.data.arg == "positional"
    assert build_job_spec(recipe, P3DN, 1, profile="smoke").job_name == "mini-smoke"


def test_set_comes_after_the_profile_and_reads_yaml_scalars(tmp_path):
    path = write_recipe(tmp_path, WITH_PROFILE)
    recipe = load_recipe(path, profile="smoke", overrides=["args.--max-sentences=8", "resources.nodes=2",
                                                           "args.--arch=null", "args.--betas=[0.9, 0.98]"])
    assert recipe.args["--max-sentences"] == 8 and recipe.resources.nodes == 2
    assert "--arch" not in recipe.args and recipe.args["--betas"] == [0.9, 0.98]


@pytest.mark.parametrize("text,value", [("k=3", 3), ("k=0.5", 0.5), ("k=null", None), ("k=a=b", "a=b"),
                                        ("k=", ""), ("k=[oops", "[oops"), ("k={a: 1}", "{a: 1}"), ("k=true", True)])
def test_override_values(text, value):
    assert parse_override(text) == (("k",), value)


@pytest.mark.parametrize("text,value", [
    ("args.--seed=010", "010"), ("args.--seed=0x10", "0x10"), ("args.--n=1_000", "1_000"),  # not 8, 16, 1000
    ("resources.time=1:30", "1:30"), ("args.--flag=yes", "yes"), ("args.--version=1.10", "1.10"),  # not 90, 1.1
    ("env.RUN_NOTE=trial #3", "trial #3"), ("env.MASK=0777", "0777"), ("env.ON=yes", "yes"), ("env.V=1.10", "1.10"),
    ("args.--lr=0.1", 0.1), ("args.--steps=12", 12), ("args.--amp=true", True), ("scaling.--lr.base=0.10", 0.1),
    ("args.--note='a #b'", "a #b"), ("env.GONE=null", None),
    ("scaling.--lr.base=1e-3", 0.001), ("args.--lr=1e-3", "1e-3")])  # YAML 1.1 read 1e-3 as a string
def test_a_plain_value_is_kept_as_written_where_yaml_1_1_would_change_it(text, value):
    """`--set args.--seed=010` ran `--seed 8` (YAML 1.1's octal), `env.RUN_NOTE=trial #3` set `trial`, `env.X=yes`
    was refused; a plain number or true/false is still one, and quotes still give YAML's reading."""
    assert parse_override(text)[1] == value and type(parse_override(text)[1]) is type(value)


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1"])
def test_malformed_set_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        parse_override(bad)


def test_unknown_profile_lists_the_known_ones(tmp_path):
    with pytest.raises(HpcError) as err:
        load_recipe(write_recipe(tmp_path, WITH_PROFILE), profile="tiny")
    assert "no profile 'tiny'" in err.value.message and err.value.fix == "use one of: smoke"
    assert err.value.exit_code == 2  # like an unknown --queue or recipe name: a usage error


def test_an_error_names_the_set_that_supplied_the_value(tmp_path):
    with pytest.raises(HpcError) as err:
        load_recipe(write_recipe(tmp_path, MINIMAL_RECIPE), overrides=["resources.nodes=0"])
    assert "resources.nodes: must be above 0, got 0 (value from --set resources.nodes=0)" in err.value.message


def mutate(path, value):
    data = copy.deepcopy(MINIMAL_RECIPE)
    *parents, last = path
    target = data
    for key in parents:
        target = target.setdefault(key, {})
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return data


BAD = [
    (("nodes",), 4,
     "nodes: unknown key; did you mean resources.nodes? (allowed here: args, deepspeed, description, dirs, env,"),
    (("launcher", "kind"), "torchrun",
     "launcher.kind: 'torchrun' is not one of 'fairseq', 'python-module', 'python-script', 'binary', 'deepspeed', "
     "'accelerate'"),
    (("launcher",), {"kind": "python-module"}, "launcher: launcher kind python-module needs `module`"),
    (("args", "--lr; rm -rf /"), 1, "args.--lr; rm -rf /: bad key '--lr; rm -rf /'"),
    (("args", "--fp16"), False, "args.--fp16: `false` is not a flag value: use null"),
    (("args", "--lr"), {"a": 1}, "args.--lr: must be a string, a number, true"),
    (("resources", "nodes"), 0, "resources.nodes: must be above 0, got 0"),
    (("resources", "time"), "forever", "resources.time: 'forever' is not a Slurm time limit"),
    (("resources", "runs_on"), ["tpu"], "resources.runs_on.0: 'tpu' is not one of 'gpu', 'hpu', 'cpu'"),
    (("env", "1BAD"), "x", "env.1BAD: bad key '1BAD'"),
    (("dirs", "data", "arg"), "data", "dirs.data.arg: 'data' is not a flag"),
    (("dirs", "data", "bogus"), 1, "dirs.data.bogus: unknown key (allowed here: arg, dir, under)"),
    (("scaling", "--update-freq", "per_rank_arg"), "--batch-size",
     "scaling.--update-freq.per_rank_arg --batch-size is not in args"),
    (("scaling", "--update-freq", "rule"), "cubic",
     "scaling.--update-freq.rule: 'cubic' is not one of 'accumulate', 'linear'"),
    (("name",), KeyError, "name: required key is missing"),
    (("name",), "Bad Name", "name: 'Bad Name' is not a name of lowercase letters"),
]


@pytest.mark.parametrize("path,value,expected", BAD, ids=[".".join(b[0]) for b in BAD])
def test_each_bad_recipe_gives_one_clear_error(tmp_path, path, value, expected):
    with pytest.raises(HpcError) as err:
        load_recipe(write_recipe(tmp_path, mutate(path, value)))
    message = err.value.message
    assert "(1 fault)" in message, message
    assert expected in message, message
    assert "recipe.yaml" in message and "hpc recipes validate" in err.value.fix


@pytest.mark.parametrize("dependency,ok", [
    # sbatch(1)'s own examples and forms (--dependency), then what a typo gives
    ("afterok:20:21,afterany:23", True), ("afterok:20:21?afterany:23", True), ("singleton", True), ("123", True),
    ("after:12+5:13", True), ("afterok:123_4", True), ("afternotok:7", True), ("afterburstbuffer:7", True),
    ("afterok", False), ("bogus:12", False), ("afterok:12+5", False), ("afterok:", False),
    ("afterok:1,afterany:2?afterok:3", False)])
def test_dependency_is_checked_in_sbatchs_form(dependency, ok):
    from toolkit.cli.options import check_dependency

    if ok:
        check_dependency(dependency)
    else:
        with pytest.raises(UsageError):
            check_dependency(dependency)
