"""Recipe YAML -> validated Recipe: find the file, overlay a profile and `--set` overrides, validate.

Overlays (a profile, then each `--set`) are deep merges over the recipe's own YAML mapping:
  - a mapping merges key by key (new keys are appended, so a new flag goes after the recipe's flags);
  - any other value replaces the old one (lists are replaced whole);
  - `null` removes the key: a flag (`args: {--fp16: null}`), an env variable, a scaling rule, a dir.
`--set KEY.PATH=VALUE` addresses the same mapping with dots (`args.--lr=0.1`, `dirs.data.dir=/tmp/d`,
`resources.nodes=2`); VALUE is read as a YAML scalar or list (`3` is a number, `null` removes, `'[1, 2]'` a
list); text that is not valid YAML is taken as a plain string. A plain value is kept as written wherever YAML 1.1
would change it (`010` is not 8, `1:30` not 90, `yes` not true, `1.10` not 1.1 in args, `a #3` keeps its `#3`),
and an env value is always its text: quote it ('...') for YAML's reading.

Every fault becomes one line naming the file, the key path, what is allowed, and where the value came from.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from toolkit.errors import HpcError, UsageError
from toolkit.textfile import read_text

RECIPES_DIR_ENV = "HPC_RECIPES_DIR"
Origins = dict[tuple[str, ...], str]
# pydantic's error types in plain words (the rest keep pydantic's message, without its "Input should" phrasing)
PLAIN = {"int_parsing": "must be a whole number", "int_from_float": "must be a whole number",
         "float_parsing": "must be a number", "bool_parsing": "must be true or false",
         "string_type": "must be a string", "dict_type": "must be a mapping (key: value)",
         "list_type": "must be a list",
         "int_type": "must be a whole number", "float_type": "must be a number", "bool_type": "must be true or false"}


class Override(str):
    """A KEY.PATH=VALUE override, and the option the user gave it with (--set, or --sweep for a sweep point's):
    messages name that option."""

    option = "--set"

    def __new__(cls, item: str, option: str = "--set") -> Override:
        self = super().__new__(cls, item)
        self.option = option
        return self


def option_of(item: str) -> str:
    """The option an override came with: --set unless it is a sweep point's."""
    return getattr(item, "option", "--set")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"; did you mean X?" for the closest choice (difflib), or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def builtin_recipes() -> Path:
    """The recipes that ship with the toolkit: the repository's recipes/ folder, which is the package
    toolkit.builtin_recipes (a link in a checkout, package data in a wheel), so a checkout, an editable install
    and an installed wheel find it the same way."""
    from importlib.resources import files

    return Path(str(files("toolkit.builtin_recipes"))).resolve()


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
    if path.suffix == ".py":  # `hpc recipes submit train.py`: the script's own command is `hpc run`
        raise UsageError(f"{text} is a Python script, not a recipe", fix=f"run it with `hpc run {text} ...`, or write "
                         f"a recipe for it: hpc recipes new NAME --script {text}")
    directory = HpcError(f"recipe file {path} is a directory",
                         fix="pass a recipe .yaml file inside it, or a recipe name")
    if path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file():
        if path.is_dir():
            raise directory
        if not path.exists():
            raise HpcError(f"recipe file {path} does not exist", fix="pass an existing .yaml file or a recipe name")
        if not path.is_file():  # /dev/null, a pipe from `<(...)`: a recipe is read once per profile it is checked with
            raise HpcError(f"recipe file {path} is not a regular file",
                           fix="save the recipe to a .yaml file and pass that")
        return path
    for d in recipe_dirs():
        if (d / f"{text}.yaml").is_file():
            return d / f"{text}.yaml"
    if path.is_dir():  # no recipe of that name, and a directory here that has it (a recipe's own name wins)
        raise directory
    names = [p.stem for p in list_recipe_files()]
    raise UsageError(f"no recipe named {text!r}{did_you_mean(text, names)}",
                   fix=f"use one of: {', '.join(names) or 'none'} (see `hpc recipes list`), or a file path")


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    from toolkit.cluster.yamlsource import StrictLoader  # refuses a key given twice, which YAML lets the later win

    text = read_text(path, "recipe", fix="pass an existing recipe file (or a recipe name: hpc recipes list)")
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc)
        twice = str(problem).startswith("duplicate key")
        raise HpcError(f"{path}{line}: {'' if twice else 'not valid YAML: '}{problem}",
                       fix="keep one of the two: YAML would take the later one without a word" if twice else
                           "fix the YAML syntax (indentation, quotes, `key: value`)") from None
    if data is None:
        raise HpcError(f"{path}: the file is empty (or only comments)",
                       fix="write a recipe: start from one of the files in recipes/, or `hpc recipes new NAME`")
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
        raise UsageError(f"--set {item!r} is not KEY.PATH=VALUE",
                         fix="e.g. --set args.--lr=0.1 or --set resources.nodes=2")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    if isinstance(value, dict):  # a mapping would bypass key-path provenance: ask for one key at a time
        value = text
    return path, _as_written(value, text, path)


_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_EXPONENT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def _as_written(value: Any, text: str, path: tuple[str, ...]) -> Any:
    """A plain (unquoted, not a list) value as the user wrote it where YAML 1.1's reading would change it: octal
    010 and hex 0x10, 1_000, sexagesimal 1:30, yes/on/off as booleans, a ` #` read as a comment; in args 1.10 kept
    (a version, not 1.1); an env value is text. A number or true/false written plainly stays one."""
    plain = text.strip()
    if value is None or plain[:1] in ("'", '"', "[", "{") or isinstance(value, list):
        return value
    if path[0] == "env":
        return plain
    if isinstance(value, bool):
        return value if plain.lower() in ("true", "false") else plain
    if isinstance(value, int):
        return value if _DECIMAL_INT.fullmatch(plain) else plain
    if isinstance(value, float):
        exact = _DECIMAL_FLOAT.fullmatch(plain) and (path[0] != "args" or repr(value) == plain.lstrip("+"))
        return value if exact else plain
    if isinstance(value, str) and path[0] in ("scaling", "deepspeed", "resources") and _EXPONENT.fullmatch(plain):
        return float(plain)  # 1e-3: YAML 1.1's floats need a dot, so it read a string where a number is meant
    return plain if isinstance(value, str) and value != plain else value


def merge(base: dict[str, Any], overlay: dict[str, Any], origin: str, origins: Origins,
          prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep-merge `overlay` into a copy of `base` (null removes); record where each value came from."""
    merged = dict(base)
    for key, value in overlay.items():
        path = prefix + (str(key),)
        if isinstance(value, dict) and isinstance(merged.get(key), dict):  # the keys below record their origin
            merged[key] = merge(merged[key], value, origin, origins, path)
            continue
        if value is None:
            merged.pop(key, None)
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
            # --profile names a choice the way --queue and the recipe's name do: an unknown one is a usage error (2)
            raise UsageError(f"{source}: recipe has no profile {profile!r}"
                             f"{did_you_mean(profile, profiles if isinstance(profiles, dict) else [])}",
                             fix=f"use one of: {known}")
        overlay = profiles[profile]
        if not isinstance(overlay, dict) or {"name", "profiles"} & set(overlay):
            raise HpcError(f"{source}: profiles.{profile} must be a mapping of recipe keys other than name/profiles",
                           fix="write the profile like a partial recipe, e.g. `args: {--max-update: 10}`")
        data = merge(data, overlay, f"profile {profile}", origins)
    for item in overrides:
        path, value = parse_override(item)
        option = option_of(item)
        if path[0] in ("name", "profiles"):
            raise UsageError(f"{option} {item!r}: {path[0]} cannot be overridden", fix="copy the recipe file instead")
        _refuse_bare_flag(data, path, item, option)
        try:
            data = merge(data, nested(path, value), f"{option} {item}", origins)
        except AttributeError:
            raise HpcError(f"{option} {item!r}: {'.'.join(path[:-1])} is not a mapping",
                           fix="check the key path") from None
    for item in overrides:  # once all are applied: `--set scaling.--lr=null --set args.--lr=0.2` in any order
        _refuse_derived(data, parse_override(item)[0], f"{option_of(item)} {item}")
    return data, origins


def _refuse_bare_flag(data: dict[str, Any], path: tuple[str, ...], item: str, option: str) -> None:
    """`--set args.lr=0.1`: the keys of args are the flags as the program takes them (args.--lr). Say the key to
    write, the recipe's own flag where it has one (--lr, or --max-update for max_update)."""
    from toolkit.recipes.schema import FLAG_PATTERN

    if len(path) != 2 or path[0] != "args" or re.match(FLAG_PATTERN, path[1]):
        return
    args = data.get("args")
    args = args if isinstance(args, dict) else {}
    word = path[1].lstrip("-")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", word):  # no flag name in it to suggest (`args.--=5`)
        raise UsageError(f"{option} {item}: {path[1]!r} is not a flag (--name or -n)",
                         fix=f"{option} args.--NAME=VALUE, e.g. {option} args.--lr=0.1")
    flag = next((f for f in args if isinstance(f, str) and f.lstrip("-") in (word, word.replace("_", "-"))), None)
    value = item.split("=", 1)[1]
    if flag is not None:
        why = f"the recipe's flag is {flag}"
    else:
        flag, why = ("--" if len(word) > 1 else "-") + word.replace("_", "-"), "a flag the recipe does not set yet"
    # a sweep point holds one of the sweep's values: its fix names the key, with the values as given
    fixed = shlex.quote(f"args.{flag}={value}") if option == "--set" else f"args.{flag}=V1,V2,... (the same values)"
    raise UsageError(f"{option} {item}: the keys of args are the program's flags with their dashes ({why})",
                     fix=f"{option} {fixed}")


def _refuse_derived(data: dict[str, Any], path: tuple[str, ...], given: str) -> None:
    """An override of a value the recipe derives (a dir's flag, a scaling rule's flag, DeepSpeed's batch keys): name
    the key that sets it instead."""
    dirs = data.get("dirs")
    dirs = dirs if isinstance(dirs, dict) else {}
    owner = next((name for name, spec in dirs.items() if len(path) == 2 and path[0] == "args"
                  and isinstance(spec, dict) and spec.get("arg") == path[1]), None)
    if owner is not None:
        text, option = given.split("=", 1)[1], given.split(" ", 1)[0]
        raise HpcError(f"{given}: {path[1]} is the job's dirs.{owner} (its arg: {path[1]}), which the job passes "
                       "itself: a value in args would not reach the program",
                       fix=f"{option} dirs.{owner}.dir={text}")
    scaling, args = data.get("scaling"), data.get("args")
    if len(path) == 2 and path[0] == "args" and isinstance(scaling, dict) and isinstance(args, dict) \
            and path[1] in args:
        flag, rule = path[1], scaling.get(path[1])
        if not isinstance(rule, dict) or rule.get("rule") in (None, "gpu-memory-cap"):
            return
        text, option = given.split("=", 1)[1], given.split(" ", 1)[0]  # option: --set, or --sweep for a point
        instead = {"accumulate": f"{option} scaling.{flag}.global_batch=N (the {rule.get('unit', 'samples')} per "
                                 f"update it keeps) or {option} args.{rule.get('per_rank_arg')}=N",
                   "linear": f"{option} scaling.{flag}.base={text} (the value per {rule.get('per')} "
                             f"{rule.get('unit', 'samples')} of global batch, scaled with the world size)",
                   "cpus-per-rank": f"{option} scaling.{flag}.reserve=N (CPUs kept for the rank itself)"}[rule["rule"]]
        raise HpcError(f"{given}: {flag} is derived by the recipe's scaling rule scaling.{flag} ({rule['rule']}): "
                       f"{' '.join(str(rule.get('why', '')).split())}",
                       fix=f"set the rule's input instead: {instead}; or drop the rule and set {flag} yourself: "
                           f"--set scaling.{flag}=null {option} args.{flag}={text}")
    derived_batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if path[:2] == ("deepspeed", "config") and len(path) == 3 and path[2] in derived_batch:
        raise HpcError(f"{given}: {path[2]} is derived for each job from deepspeed.global_batch and "
                       "deepspeed.micro_batch (accumulation = global / (micro x world size))",
                       fix="--set deepspeed.global_batch=N or --set deepspeed.micro_batch=N")


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
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        faults = list(_faults(exc, origins))
        renames = [f.rename for f in faults if f.rename]
        check = f"`hpc recipes validate {path}`"
        typed = all((f.came_from or "").startswith(("--set ", "--sweep ")) for f in faults)
        fix = (f"{renames[0]}" + ("" if renames[0].startswith("--") else f", then run {check}")
               if len(faults) == 1 and renames else
               "change the --set / --sweep values named above (the recipe file itself is not at fault)" if typed else
               f"edit the named keys (or the profile / --set that supplied them), then run {check}")
        raise HpcError(f"{path}: invalid recipe ({len(faults)} fault{'s' if len(faults) > 1 else ''}):\n"
                       + "\n".join(f"  {f}" for f in faults), fix=fix) from None
    recipe._origins = origins
    return recipe


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
            schema.MOUNT_PATTERN: "a mount as pyxis takes it, SRC[:DST[:FLAGS]] without spaces or commas (e.g. "
                                  "/fsx or /fsx/data:/data:ro)",
            schema.IMAGE_PATTERN: schema.IMAGE_WORDS,
            schema.FLAG_PATTERN + "|^positional$": "a flag (--name or -n) or positional"}


class Fault(str):
    """One line of a validation error; `rename`: the fix when the fault is a misspelt key."""

    rename: str | None = None
    came_from: str | None = None  # the profile or --set/--sweep that gave the value; None: the recipe file


def _faults(exc, origins: Origins) -> Iterable[Fault]:
    from toolkit.recipes.schema import Recipe

    for err in exc.errors():
        loc = tuple(str(part) for part in err["loc"] if part != "[key]")
        key = ".".join(loc) or "(top level)"
        message = plain_error(err)
        came_from = next((origins[loc[:i]] for i in range(len(loc), 0, -1) if loc[:i] in origins), None)
        rename = None
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(Recipe, loc[:-1])
            right = _suggest(Recipe, loc, allowed)
            message = f"unknown key{f'; did you mean {right}?' if right else ''} (allowed here: {', '.join(allowed)})"
            given = came_from or ""
            if right and given.startswith(("--set ", "--sweep ")) and "=" in given:
                option, item = given.split(" ", 1)
                keys, value = item.split("=", 1)
                rest = keys.split(".")[len(loc):]  # `--set arg.--epochs=5`: the fault is `arg`, --epochs stays
                rename = f"{option} {'.'.join([right, *rest])}={value}"
            elif right:
                rename = f"write {key} as {right}" + (f" (in {came_from})" if came_from else "")
        if "[key]" in [str(p) for p in err["loc"]]:
            message = f"bad key {loc[-1]!r}: {message}"
        fault = Fault(f"{key}: {message}" + (f" (value from {came_from})" if came_from else ""))
        fault.rename, fault.came_from = rename, came_from
        yield fault


def plain_error(err: Mapping[str, Any]) -> str:
    """pydantic's error as a sentence about the value, without pydantic's phrasing."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        return "required key is missing"
    if kind == "string_pattern_mismatch":  # the accepted forms in words, not the pattern
        return f"{err['input']!r} is not {_pattern_words().get(ctx['pattern'], ctx['pattern'])}"
    if kind == "literal_error":
        return f"{err['input']!r} is not one of {ctx.get('expected', '').replace(' or ', ', ')}"
    if kind in PLAIN:
        return f"{PLAIN[kind]}, got {err['input']!r}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = next(iter(ctx.values()))
        words = {"greater_than": "above", "greater_than_equal": "at least", "less_than": "below",
                 "less_than_equal": "at most"}[kind]
        return f"must be {words} {bound}, got {err['input']!r}"
    return err["msg"].removeprefix("Value error, ")


def _model_of(tp):
    """The pydantic model inside an annotation (Optional[M], dict[str, M], M), or None."""
    import typing

    from pydantic import BaseModel

    for arg in typing.get_args(tp) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _allowed_keys(model, loc: tuple[str, ...]) -> list[str]:
    """The field names of the model found at `loc` (walking models, dict values and optionals)."""
    current = model
    for part in loc:
        if current is None:
            return []
        field = current.model_fields.get(part)
        if field is None:  # a dict key (a flag name, a profile name): the value type is the dict's
            continue
        current = _model_of(field.annotation)
    return sorted(current.model_fields) if current else []


def _key_elsewhere(model, key: str, prefix: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The path of a field named `key` deeper in the schema (`nodes` at the top is resources.nodes)."""
    for name, field in model.model_fields.items():
        if name == key and prefix:
            return (*prefix, name)
        inner = _model_of(field.annotation)
        if inner is not None and inner is not model and (found := _key_elsewhere(inner, key, (*prefix, name))):
            return found
    return None


def _suggest(model, loc: tuple[str, ...], allowed: list[str]) -> str | None:
    """The key a misplaced or misspelt `loc` most likely meant: the same name one level down from where it was
    written (`nodes` -> resources.nodes), else the closest name allowed there (difflib)."""
    close = difflib.get_close_matches(loc[-1], allowed, n=1)
    if close and difflib.SequenceMatcher(None, loc[-1], close[0]).ratio() >= 0.85:  # a letter off: arg -> args
        return ".".join((*loc[:-1], close[0]))
    inner = {name: _model_of(_field_at(model, (*loc[:-1], name))) for name in allowed}
    below = next((found for name, m in inner.items() if m is not None
                  and (found := _key_elsewhere(m, loc[-1], (name,)))), None)
    if below is not None:
        return ".".join((*loc[:-1], *below))
    return ".".join((*loc[:-1], close[0])) if close else None


def _field_at(model, loc: tuple[str, ...]):
    """The annotation of the field at `loc` (None where loc leaves the models)."""
    current, annotation = model, None
    for part in loc:
        if current is None or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        current = _model_of(annotation)
    return annotation
