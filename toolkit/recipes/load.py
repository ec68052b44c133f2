"""Recipe YAML -> validated Recipe: find the file, overlay a profile and `--set` overrides, validate.

Overlays (a profile, then each `--set`) are deep merges over the recipe's own YAML mapping:
  - a mapping merges key by key (new keys are appended, so a new flag goes after the recipe's flags);
  - any other value replaces the old one (lists are replaced whole);
  - `null` removes the key: a flag (`args: {--fp16: null}`), an env variable, a scaling rule, a dir.
`--set KEY.PATH=VALUE` addresses the same mapping with dots (`args.--lr=0.1`, `dirs.data.dir=/tmp/d`,
`resources.nodes=2`); VALUE is read as a YAML scalar or list (`3` is a number, `null` removes, `'[1, 2]'` a
list); text that is not valid YAML is taken as a plain string.

Every fault becomes one line naming the file, the key path, what is allowed, and where the value came from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from toolkit.errors import HpcError, UsageError
from toolkit.textfile import read_text

RECIPES_DIR_ENV = "HPC_RECIPES_DIR"
Origins = dict[tuple[str, ...], str]


def builtin_recipes() -> Path:
    """The recipes that ship with the toolkit: the repository's recipes/ folder, which is the package
    toolkit.builtin_recipes (a link in a checkout, package data in a wheel), so a checkout, an editable install
    and an installed wheel find it the same way."""
    from importlib.resources import files

    return Path(files("toolkit.builtin_recipes")).resolve()


def recipe_dirs() -> list[Path]:
    """Where recipes are looked up by name, first match wins: $HPC_RECIPES_DIR, ./recipes, the toolkit's own."""
    dirs = [Path(os.environ[RECIPES_DIR_ENV])] if os.environ.get(RECIPES_DIR_ENV) else []
    dirs += [Path.cwd() / "recipes", builtin_recipes()]
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def list_recipe_files() -> list[Path]:
    """One file per recipe name (the first directory that has it wins), sorted by name."""
    found: dict[str, Path] = {}
    for d in recipe_dirs():
        for path in sorted(d.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def find_recipe(name_or_path: str | Path) -> Path:
    """A recipe by name (recipes/NAME.yaml) or a path to a recipe file."""
    text = str(name_or_path)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file():
        if path.is_dir():
            raise HpcError(f"recipe file {path} is a directory", fix="pass a recipe .yaml file inside it, or a recipe name")
        if not path.is_file():
            raise HpcError(f"recipe file {path} does not exist", fix="pass an existing .yaml file or a recipe name")
        return path
    for d in recipe_dirs():
        if (d / f"{text}.yaml").is_file():
            return d / f"{text}.yaml"
    known = ", ".join(p.stem for p in list_recipe_files()) or "none"
    raise HpcError(f"no recipe named {text!r}", fix=f"use one of: {known} (see `hpc recipes list`), or a file path")


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    text = read_text(path, "recipe", fix="pass an existing recipe file (or a recipe name: hpc recipes list)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise HpcError(f"{path}{line}: not valid YAML: {problem}",
                       fix="fix the YAML syntax (indentation, quotes, `key: value`)") from None
    if not isinstance(data, dict):
        raise HpcError(f"{path}: a recipe is a YAML mapping (name, launcher, args, ...), got {type(data).__name__}",
                       fix="start from one of the files in recipes/")
    return data


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """`KEY.PATH=VALUE` -> (("KEY", "PATH"), value); the value is read as YAML (see the module doc)."""
    import yaml

    key, sep, text = item.partition("=")
    path = tuple(key.split("."))
    if not sep or not key or "" in path:
        raise UsageError(f"--set {item!r} is not KEY.PATH=VALUE", fix="e.g. --set args.--lr=0.1 or --set resources.nodes=2")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    if isinstance(value, dict):  # a mapping would bypass key-path provenance: ask for one key at a time
        value = text
    return path, value


def merge(base: dict[str, Any], overlay: dict[str, Any], origin: str, origins: Origins,
          prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep-merge `overlay` into a copy of `base` (null removes); record where each value came from."""
    merged = dict(base)
    for key, value in overlay.items():
        path = prefix + (str(key),)
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value, origin, origins, path)
        else:
            merged[key] = value
        origins[path] = origin
    return merged


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path[1:]):
        value = {key: value}
    return {path[0]: value}


def apply_overlays(data: dict[str, Any], profile: str | None, overrides: Sequence[str],
                   source: Path) -> tuple[dict[str, Any], Origins]:
    origins: Origins = {}
    profiles = data.get("profiles") or {}
    if profile is not None:
        if not isinstance(profiles, dict) or profile not in profiles:
            known = ", ".join(profiles) if isinstance(profiles, dict) and profiles else "none"
            raise HpcError(f"{source}: recipe has no profile {profile!r}", fix=f"use one of: {known}")
        overlay = profiles[profile]
        if not isinstance(overlay, dict) or {"name", "profiles"} & set(overlay):
            raise HpcError(f"{source}: profiles.{profile} must be a mapping of recipe keys other than name/profiles",
                           fix="write the profile like a partial recipe, e.g. `args: {--max-update: 10}`")
        data = merge(data, overlay, f"profile {profile}", origins)
    for item in overrides:
        path, value = parse_override(item)
        if path[0] in ("name", "profiles"):
            raise UsageError(f"--set {item!r}: {path[0]} cannot be overridden", fix="copy the recipe file instead")
        try:
            data = merge(data, nested(path, value), f"--set {item}", origins)
        except AttributeError:
            raise HpcError(f"--set {item!r}: {'.'.join(path[:-1])} is not a mapping", fix="check the key path") from None
    return data, origins


def load_recipe(source: str | Path, profile: str | None = None, overrides: Sequence[str] = (),
                data: Mapping[str, Any] | None = None):
    """The validated Recipe from a name or file, with `profile` and then `overrides` (KEY.PATH=VALUE) applied.
    `data`: a recipe built in memory (`hpc run`), with `source` naming it in messages.

    Raises HpcError naming the file, each faulty key path, what is allowed, and the profile or --set that
    supplied the value.
    """
    from pydantic import ValidationError

    from toolkit.recipes.schema import Recipe

    path = find_recipe(source) if data is None else Path(str(source))
    data, origins = apply_overlays(read_yaml(path) if data is None else dict(data), profile, overrides, path)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        faults = list(_faults(exc, origins))
        raise HpcError(f"{path}: invalid recipe ({len(faults)} fault{'s' if len(faults) > 1 else ''}):\n"
                       + "\n".join(f"  {f}" for f in faults),
                       fix=f"edit the named keys (or the profile / --set that supplied them), then run "
                           f"`hpc recipes validate {path}`") from None


def validate_recipe_file(path: str | Path) -> list[str]:
    """Validate a recipe and every one of its profiles; returns the profile names checked."""
    recipe = load_recipe(path)
    for profile in recipe.profiles:
        load_recipe(path, profile=profile)
    return list(recipe.profiles)


def _pattern_words() -> dict[str, str]:
    from toolkit.recipes import schema

    return {schema.TIME_PATTERN: "a Slurm time limit (MINUTES, HOURS:MINUTES:SECONDS, DAYS-HOURS:MINUTES, e.g. "
                                 "01:30:00)",
            schema.NAME_PATTERN: "a name of lowercase letters, digits, - and _ (starting with a letter or digit)",
            schema.ENV_NAME_PATTERN: "a variable name (letters, digits and _, not starting with a digit)",
            schema.FLAG_PATTERN: "a flag (--name or -n)",
            schema.FLAG_PATTERN + "|^positional$": "a flag (--name or -n) or positional"}


TYPE_WORDS = {"int_parsing": "a whole number", "float_parsing": "a number", "bool_parsing": "true or false"}


def _faults(exc, origins: Origins) -> Iterable[str]:
    from toolkit.recipes.schema import Recipe

    PATTERN_WORDS = _pattern_words()
    for err in exc.errors():
        loc = tuple(str(part) for part in err["loc"] if part != "[key]")
        key = ".".join(loc) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(Recipe, loc[:-1])
            message = f"unknown key; allowed here: {', '.join(allowed)}"
        elif err["type"] == "missing":
            message = "required key is missing"
        elif err["type"] == "string_pattern_mismatch":  # the accepted forms in words, not the pattern
            message = f"{err['input']!r} is not {PATTERN_WORDS.get(err['ctx']['pattern'], err['ctx']['pattern'])}"
        elif err["type"] in ("int_parsing", "float_parsing", "bool_parsing"):
            message = f"{err['input']!r} is not {TYPE_WORDS[err['type']]}"
        if "[key]" in [str(p) for p in err["loc"]]:
            message = f"bad key {loc[-1]!r}: {message}"
        came_from = next((origins[loc[:i]] for i in range(len(loc), 0, -1) if loc[:i] in origins), None)
        yield f"{key}: {message}" + (f" (value from {came_from})" if came_from else "")


def _allowed_keys(model, loc: tuple[str, ...]) -> list[str]:
    """The field names of the model found at `loc` (walking models, dict values and optionals)."""
    import typing

    from pydantic import BaseModel

    def unwrap(tp):
        for arg in typing.get_args(tp) or ():
            found = unwrap(arg)
            if found is not None:
                return found
        return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None

    current = model
    for part in loc:
        if current is None:
            return []
        field = current.model_fields.get(part)
        if field is None:  # a dict key (a flag name, a profile name): the value type is the dict's
            continue
        current = unwrap(field.annotation)
    return sorted(current.model_fields) if current else []
