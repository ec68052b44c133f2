"""Issue 31: recipe YAML as editors read it. The JSON Schema of recipe files is made from the recipe model itself
(toolkit.recipes.schema.recipe_json_schema), shipped as toolkit/recipes/recipe.schema.json and printed by
`hpc recipes schema`; the built-in recipes and `hpc recipes new` point yaml-language-server at it by a modeline.

The schema is held to the loader (toolkit.recipes.load): every built-in recipe and profile passes it, and every
fault it shows in an editor is one the loader refuses too. The loader may be stricter (its model validators,
e.g. the fields that go with a launcher kind, are not JSON Schema); never the schema.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from tests.conftest import cli_json, run_hpc
from toolkit.errors import HpcError
from toolkit.recipes.load import apply_overlays, builtin_recipes, load_recipe, validate_recipe_file
from toolkit.recipes.schema import REGENERATE, SCHEMA_FILE, recipe_json_schema, recipe_json_schema_text

MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
BUILTIN = sorted(builtin_recipes().glob("*.yaml"))


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    # pydantic writes JSON Schema draft 2020-12 (pydantic docs, "JSON Schema"): check in that dialect
    return jsonschema.Draft202012Validator(recipe_json_schema())


def schema_errors(data: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(data)]


def loader_refuses(data: dict[str, Any]) -> bool:
    try:
        load_recipe("planted.yaml", data=data)
    except HpcError:
        return True
    return False


def test_the_shipped_schema_file_is_the_models_own():
    assert SCHEMA_FILE.read_text() == recipe_json_schema_text(), \
        f"{SCHEMA_FILE} is out of date with toolkit/recipes/schema.py: regenerate it with {REGENERATE}"
    jsonschema.Draft202012Validator.check_schema(recipe_json_schema())


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.stem)
def test_every_builtin_recipe_and_profile_passes_the_schema(path: Path):
    data = yaml.safe_load(path.read_text())
    assert schema_errors(data) == []
    for profile in data.get("profiles") or {}:
        applied, _ = apply_overlays(data, profile, (), path)
        assert schema_errors(applied) == [], profile


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.stem)
def test_builtin_recipes_point_editors_at_the_shipped_schema(path: Path):
    # yaml-language-server (redhat-developer/yaml-language-server README, "Using inlined schema"): a relative
    # $schema is resolved from the YAML file's directory. recipes/recipe.schema.json links to the shipped file,
    # and the wheel copies it into toolkit/builtin_recipes/, so the same line works in a checkout and installed.
    found = MODELINE.match(path.read_text().splitlines()[0])
    assert found, f"{path}: the first line is not a yaml-language-server modeline"
    target = path.parent / found.group(1)
    assert target.is_file() and target.read_text() == SCHEMA_FILE.read_text()


def test_recipes_schema_prints_writes_and_reports_the_schema(tmp_path):
    res = run_hpc("recipes", "schema")
    assert res.returncode == 0, res.stderr
    assert res.stdout == recipe_json_schema_text()
    res = run_hpc("recipes", "schema", "-o", str(tmp_path) + "/", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    data = cli_json(res)
    assert data["output"] == str(tmp_path / "recipe.schema.json")
    assert data["schema"] == json.loads((tmp_path / "recipe.schema.json").read_text()) == recipe_json_schema()
    res = run_hpc("recipes", "schema", "-o", str(tmp_path / "recipe.schema.json"))
    assert res.returncode != 0 and "--force" in res.stdout + res.stderr


def test_recipes_new_writes_a_recipe_whose_modeline_names_the_installed_schema(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    res = run_hpc("recipes", "new", "mytrain", "--script", "train.py", "--nodes", "2", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "recipes" / "mytrain.yaml").read_text()
    found = MODELINE.match(text.splitlines()[0])
    assert found and Path(found.group(1)).is_absolute() and Path(found.group(1)).samefile(SCHEMA_FILE)
    assert schema_errors(yaml.safe_load(text)) == []


def _nccl() -> dict[str, Any]:
    return yaml.safe_load((builtin_recipes() / "nccl-tests.yaml").read_text())


def _planted(path: tuple[str, ...], value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    data = copy.deepcopy(base if base is not None else _nccl())
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


PLANTED = {
    "unknown key": (("resources", "nodez"), 2),
    "misplaced key": (("nodes",), 2),
    "wrong type": (("resources", "nodes"), "two"),
    "a number as text": (("resources", "nodes"), "2"),
    "a boolean as text": (("resources", "requeue"), "no"),
    "bad launcher kind": (("launcher", "kind"), "horovod"),
    "negative node count": (("resources", "nodes"), -1),
    "zero nodes": (("resources", "nodes"), 0),
    "flag without dashes": (("args", "lr"), 0.1),
    "bad time": (("resources", "time"), "2 hours"),
    "unknown profile key": (("profiles", "smoke", "resource"), {"nodes": 1}),
    "an image enroot cannot import": (("software", "container"), {"image": "nvcr.io/nvidia/PyTorch:24.01"}),
}


@pytest.mark.parametrize("fault", PLANTED)
def test_planted_faults_are_caught_by_the_schema_and_the_loader(fault: str, tmp_path):
    path, value = PLANTED[fault]
    data = _planted(path, value)
    assert schema_errors(data), f"the schema accepts {fault}"
    recipe = tmp_path / "planted.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(HpcError):
        validate_recipe_file(recipe)  # `hpc recipes validate`: the recipe and each profile applied


BAD_VALUES: tuple[Any, ...] = ("2", "yes", "", 2, -1, 0, 2.5, True, None, [], ["x"], {}, {"x": 1})


def _leaf_paths(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaf_paths(value, (*path, str(key)))
    elif path:
        yield path


def _model_paths() -> Iterator[tuple[str, ...]]:
    """Every field of the recipe's sections, also those no built-in recipe writes."""
    from toolkit.recipes.schema import Launcher, Recipe, Resources, Software

    yield from ((name,) for name in Recipe.model_fields if name != "profiles")
    for section, model in (("launcher", Launcher), ("resources", Resources), ("software", Software)):
        yield from ((section, name) for name in model.model_fields)


def test_every_fault_the_schema_shows_the_loader_refuses():
    """Planted values of every JSON type at every key of every built-in recipe (and every section field): where
    the schema refuses one, the loader must too, or an editor would flag a recipe `hpc` accepts."""
    checked, schema_only = 0, []
    for path in BUILTIN:
        base = yaml.safe_load(path.read_text())
        base.pop("profiles", None)
        for where in sorted({*_leaf_paths(base), *_model_paths()}):
            for value in BAD_VALUES:
                data = _planted(where, value, base)
                if schema_errors(data):
                    checked += 1
                    if not loader_refuses(data):
                        schema_only.append(f"{path.stem}: {'.'.join(where)}={value!r}")
    assert checked > 1000, checked
    assert not schema_only, f"the schema refuses, the loader accepts: {schema_only[:20]}"
