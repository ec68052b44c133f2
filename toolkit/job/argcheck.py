"""A job's training arguments checked against the launcher's own parser when the job is planned, so a typo or a
wrongly typed value is refused before a 64-GPU job starts, in the user's terms (the flag, the value, the form the
parser accepts, a command that works).

- fairseq: fairseq-train's argparse, built as fairseq_cli/train.py builds it (facebookresearch/fairseq v0.12,
  fairseq/options.py: get_training_parser(), then parse_args_and_arch(), which parses twice and adds the options
  of the chosen --task, --arch, --optimizer, --lr-scheduler, --criterion... in between, and post-checks a few
  combinations). Importing fairseq costs seconds: it happens only here, once per process.
- our trainers and benchmarks (toolkit.workloads.*): the module's parser() (and check_values(), where it has one).
- DeepSpeed: the generated config through DeepSpeed's own DeepSpeedConfig (microsoft/DeepSpeed
  deepspeed/runtime/config.py and its pydantic section models), where DeepSpeed loads; the training script's own
  flags (e.g. HabanaAI/Model-References) have no parser here.
- anything else (a binary, a researcher's script): not checked, and the plan says so once.

check_arguments() refuses with toolkit.errors.HpcError and returns the notes the plan prints once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import io
import json
import logging
import re
import warnings
from typing import Any, Callable

from toolkit.errors import HpcError

FAIRSEQ_PROGRAM = "fairseq-train"
OWN_MODULES = "toolkit.workloads."
# Values tried on a parser's type function to show the form it accepts (when it is neither int, float nor choices)
SAMPLE_VALUES = ("1", "0.5", "0.1,0.2", "true")
# fairseq's registry flags: the options they add depend on the value, so the help that lists them needs them too
FAIRSEQ_CHOICE_FLAGS = ("--task", "--arch", "--criterion", "--optimizer", "--lr-scheduler")


class _ParserError(Exception):
    """argparse's parser.error(), raised instead of printing usage and exiting 2."""


def check_arguments(recipe, spec) -> list[str]:
    """Refuse the job's arguments where the launcher's own parser refuses them; the notes (said once) name what
    could not be checked here."""
    from toolkit.job.rank import preview_argv

    argv = preview_argv(spec.command)
    launcher = recipe.launcher
    if launcher.kind == "fairseq":
        return _check_fairseq(recipe, argv[argv.index(FAIRSEQ_PROGRAM) + 1:])
    if launcher.kind == "python-module" and (launcher.module or "").startswith(OWN_MODULES):
        return _check_own_module(recipe, launcher.module, _after_module(argv, launcher.module))
    if launcher.kind == "deepspeed":
        return _check_deepspeed(recipe, spec, argv)
    what = {"binary": f"the binary {launcher.program}", "python-script": f"the script {launcher.script}",
            "python-module": f"the module {launcher.module}"}[launcher.kind]
    return [f"arguments: not checked: hpc has no parser for {what} (only fairseq-train's and its own trainers')"]


def _after_module(argv: list[str], module: str) -> list[str]:
    """The words after `-m MODULE` (our trainers run as `python -m MODULE`, directly or under user_main)."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == module:
            return argv[i + 2:]
    raise HpcError(f"no `-m {module}` in the job's command", fix="report this as a bug in hpc")


@contextlib.contextmanager
def _quiet():
    """Heavy imports print (fairseq's logging set-up, DeepSpeed's accelerator probe, torch's warnings): keep them
    off our stdout (--json) and stderr, and leave the root logger as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)


@functools.lru_cache(maxsize=None)
def _fairseq() -> tuple[Any, str]:
    """(fairseq.options, fairseq's version), imported once; ImportError (or fairseq's own import failure) when
    fairseq cannot load here."""
    with _quiet():
        import fairseq
        from fairseq import options
    return options, getattr(fairseq, "__version__", "?")


def _check_fairseq(recipe, argv: list[str]) -> list[str]:
    try:
        options, version = _fairseq()
    except Exception as exc:  # not installed here, or fairseq 0.12.2's import failure on Python 3.11
        reason = "fairseq is not installed" if isinstance(exc, ImportError) else f"fairseq does not load ({exc})"
        return [f"arguments: not checked: {reason} where hpc runs, so fairseq-train's parser is not available "
                "(the nodes' fairseq will check them when the job starts)"]
    if "--user-dir" in argv:  # a researcher's tasks and models, in a dir on the cluster
        return ["arguments: not checked: --user-dir adds the researcher's own fairseq tasks and models, which hpc "
                "does not load"]

    def parse(parser: argparse.ArgumentParser, words: list[str]):
        return options.parse_args_and_arch(parser, input_args=words, parse_known=True)

    with _quiet():
        parser = options.get_training_parser()
    program = Program(FAIRSEQ_PROGRAM, _fairseq_help(argv), f"fairseq {version}")
    _check_argparse(recipe, program, parser, argv, parse)
    return []


def _fairseq_help(argv: list[str]) -> str:
    """fairseq-train's help with the registry choices the job makes: the options it lists depend on them."""
    import shlex

    chosen: list[str] = []
    for flag in FAIRSEQ_CHOICE_FLAGS:
        if flag in argv and argv.index(flag) + 1 < len(argv):
            chosen += [flag, argv[argv.index(flag) + 1]]
    return shlex.join([FAIRSEQ_PROGRAM, *chosen, "--help"])


def _check_own_module(recipe, module: str, argv: list[str]) -> list[str]:
    import importlib

    try:
        workload = importlib.import_module(module)
    except ImportError as exc:  # the nodes' toolkit may have it; this one does not
        return [f"arguments: not checked: {module} does not import where hpc runs ({exc})"]
    if not hasattr(workload, "parser"):
        return [f"arguments: not checked: {module} exposes no parser() for hpc to check them against"]
    program = Program(f"python -m {module}", f"python -m {module} --help", None)
    post = getattr(workload, "check_values", None)

    def parse(parser: argparse.ArgumentParser, words: list[str]):
        args, extra = parser.parse_known_args(words)
        if post is not None and not extra:
            post(parser, args)
        return args, extra

    _check_argparse(recipe, program, workload.parser(), argv, parse)
    return []


@dataclasses.dataclass(frozen=True)
class Program:
    """The program whose parser answers: its name, the command that lists its flags, its version."""

    name: str
    help_command: str
    version: str | None

    def __str__(self) -> str:
        return self.name + (f" ({self.version})" if self.version else "")


def _check_argparse(recipe, program: Program, parser: argparse.ArgumentParser, argv: list[str],
                    parse: Callable[[argparse.ArgumentParser, list[str]], tuple[Any, list[str]]]) -> None:
    def error(message: str):
        raise _ParserError(message)

    parser.error = error  # type: ignore[method-assign]  # argparse would print usage and exit 2
    try:
        with _quiet():
            _, extra = parse(parser, argv)
    except _ParserError as exc:
        raise _refusal(recipe, program, parser, argv, str(exc)) from None
    except (ValueError, RuntimeError) as exc:  # fairseq's post-checks (e.g. "Cannot combine --fp16 and --tpu")
        given = [origin for flag in recipe.args if (origin := recipe.origin(("args", flag)))]
        raise HpcError(f"{program} refuses the job's arguments: {exc}"
                       + (f" (with {', '.join(dict.fromkeys(given))})" if given else ""),
                       fix=f"change or remove the flags it names (see `{program.help_command}`)") from None
    if extra:
        raise _extra_word(recipe, program, parser, argv, extra)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)  # every option string the parser knows, after fairseq's additions


def _extra_word(recipe, program: Program, parser, argv: list[str], extra: list[str]) -> HpcError:
    """A flag the parser does not know (did you mean...?), or a value given to a switch that takes none."""
    known = _options(parser)
    flag = next((w.split("=", 1)[0] for w in extra if w.startswith("-") and not _is_number(w)), None)
    if flag is None:  # a value after a switch: `--fp16 1`
        word = extra[0]
        before = argv[argv.index(word) - 1] if word in argv and argv.index(word) > 0 else None
        action = known.get(before or "")
        if action is not None and action.nargs == 0:
            key, origin = _key(recipe, before)
            return HpcError(f"{before} is a switch and takes no value, got {word!r}{origin}",
                            fix=f"write the switch as `{key}: true` (--set {key}=true), or remove it "
                                f"(--set {key}=null)")
        return HpcError(f"{program} takes no argument {word!r} here",
                        fix=f"remove it (see `{program.help_command}`)")
    key, origin = _key(recipe, flag)
    close = difflib.get_close_matches(flag, [o for o in known if o.startswith("--") == flag.startswith("--")], n=1)
    if not close:
        return HpcError(f"unknown argument {flag}{origin}: {program} has no such option",
                        fix=f"remove it (--set {key}=null); `{program.help_command}` lists the options")
    return HpcError(f"unknown argument {flag}{origin}: {program} has no such option; did you mean {close[0]}?",
                    fix=_rename_fix(recipe, key, flag, close[0]))


def _rename_fix(recipe, key: str, flag: str, new: str) -> str:
    """A command that works: the user's own override with the flag renamed, else a rename in the recipe."""
    origin = recipe.origin(("args", flag))
    option, _, item = (origin or "").partition(" ")
    if option in ("--set", "--sweep") and item.startswith(f"{key}="):
        return f"{option} args.{new}={item.split('=', 1)[1]} (in place of {origin})"
    value = recipe.args.get(flag)
    text = "true" if value is True else _yaml_text(value)
    where = f"profiles.{option_profile}.args" if (option_profile := _profile(origin)) else "args"
    return f"rename {flag} to {new} in the recipe's {where}, or override it: --set {key}=null --set args.{new}={text}"


def _profile(origin: str | None) -> str | None:
    return origin.removeprefix("profile ") if origin and origin.startswith("profile ") else None


def _yaml_text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    from toolkit.recipes.schema import format_value

    return format_value(value) if value is not None else "VALUE"


def _option(recipe, flag: str | None) -> str:
    """The option the user set the flag with (--sweep for a sweep point's), for fixes; --set otherwise."""
    origin = recipe.origin(("args", flag)) if flag else None
    return "--sweep" if origin and origin.startswith("--sweep ") else "--set"


def _key(recipe, flag: str | None) -> tuple[str, str]:
    """(args.FLAG, " (from ...)") for messages: the recipe key and where its value came from."""
    key = f"args.{flag}"
    if flag not in recipe.args:
        return key, " (in the arguments hpc adds, or the ones after --)" if flag else ""
    origin = recipe.origin(("args", flag))
    return key, f" (from {origin})" if origin else f" ({key} of recipe {recipe.name})"


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


ARGUMENT_ERROR = re.compile(r"^argument (?P<names>[^:]+): (?P<problem>.*)$", re.DOTALL)


def _refusal(recipe, program: Program, parser, argv: list[str], message: str) -> HpcError:
    """argparse's message in the user's terms: the flag, the value given, the form the parser accepts."""
    match = ARGUMENT_ERROR.match(message)
    if message.startswith("unrecognized arguments: "):
        return _extra_word(recipe, program, parser, argv, message.split(": ", 1)[1].split())
    if match is None:  # "the following arguments are required: ...", a post-check's own sentence
        return HpcError(f"{program}: {message}", fix=f"see `{program.help_command}`")
    action = _options(parser).get(match["names"].split("/")[0])
    flag = next((o for o in (action.option_strings if action else []) if o in argv), match["names"].split("/")[0])
    value = argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None
    key, origin = _key(recipe, flag)
    option = _option(recipe, flag)
    problem = match["problem"]
    if action is None:
        return HpcError(f"{flag}{origin}: {program}: {problem}", fix=f"see `{program.help_command}`")
    if problem.startswith("expected"):  # a switch-style `true` for a flag that takes a value
        return HpcError(f"{flag}{origin} needs a value: {program} wants {_form(action)}",
                        fix=f"give it one: {option} {key}={_example(action, value)}")
    if action.choices is not None:
        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1)
        listed = ", ".join(choices) if len(choices) <= 12 else f"{len(choices)} names (`{program.name} --help`)"
        return HpcError(f"{flag} {value!s}{origin}: {program} accepts one of {listed}"
                        + (f"; did you mean {close[0]}?" if close else ""),
                        fix=f"{option} {key}={close[0] if close else choices[0]}")
    return HpcError(f"{flag} {value!s}{origin} is not a value {program} accepts: it wants {_form(action)}",
                    fix=f"{option} {key}={_example(action, value)}")


def _form(action: argparse.Action) -> str:
    """The values an option takes, in words, from its own type function."""
    if action.choices is not None:
        return "one of " + ", ".join(str(c) for c in action.choices)
    if action.type is int:
        return "a whole number"
    if action.type is float:
        return "a number"
    if action.type is None or action.type is str:
        return "a value"
    accepted = [s for s in SAMPLE_VALUES if _accepts(action, s)]
    return f"values like {' or '.join(accepted)}" if accepted else f"a value its type ({action.type!r}) accepts"


def _accepts(action: argparse.Action, text: str) -> bool:
    if not callable(action.type):  # no type (a plain string) or argparse's registry name of one
        return False
    try:
        action.type(text)
    except Exception:
        return False
    return True


def _example(action: argparse.Action, given: str | None = None) -> str:
    """A value the option accepts: the given number made whole for a whole-number option, the option's default
    where it has one, else a sample its type takes."""
    if action.type is int and given is not None and _is_number(given):
        return str(int(float(given)))
    default = action.default
    if default not in (None, argparse.SUPPRESS) and not isinstance(default, bool):
        return ",".join(str(d) for d in default) if isinstance(default, (list, tuple)) else str(default)
    if action.choices is not None:
        return str(next(iter(action.choices)))
    return next((s for s in SAMPLE_VALUES if action.type is None or _accepts(action, s)), "VALUE")


@functools.lru_cache(maxsize=None)
def _deepspeed() -> tuple[Any, str]:
    with _quiet():
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig
    return DeepSpeedConfig, getattr(deepspeed, "__version__", "?")


def _check_deepspeed(recipe, spec, argv: list[str]) -> list[str]:
    """The generated config through DeepSpeed's own parser; the script's flags are not checked (no parser here)."""
    script = f"the script's own flags ({recipe.launcher.script}) were not checked: hpc has no parser for them"
    config_arg = recipe.deepspeed.config_arg
    path = argv[argv.index(config_arg) + 1]
    config = json.loads(next(f.text for f in spec.files if f.path == path))
    try:
        parse, version = _deepspeed()
    except Exception as exc:
        reason = "DeepSpeed is not installed" if isinstance(exc, ImportError) else f"DeepSpeed does not load ({exc})"
        return [f"arguments: not checked: {reason} where hpc runs, so neither the DeepSpeed config nor {script}"]
    # torch.distributed is not initialised here, so DeepSpeedConfig sees one rank (world size 1, whatever mpu
    # says): give it the batch keys of one rank; the job's own arithmetic for its world size is
    # toolkit.job.deepspeed's, which follows the same assertion.
    one_rank = {**config, "train_batch_size": config["train_micro_batch_size_per_gpu"]
                * config["gradient_accumulation_steps"]}
    unknown = _deepspeed_parse(parse, one_rank, version)
    notes = [f"arguments: {script}"]
    if unknown:
        notes.append(f"arguments: DeepSpeed {version} here does not know {', '.join(unknown)} (a key of another "
                     "DeepSpeed, e.g. Habana's fork): those were not checked")
    return notes


def _deepspeed_parse(parse, config: dict[str, Any], version: str) -> list[str]:
    """Parse, setting aside keys this DeepSpeed does not know (another DeepSpeed's, e.g. Habana's fork's); returns
    their key paths. Any other refusal is an error naming DeepSpeed's own complaint."""
    from pydantic import ValidationError

    config = json.loads(json.dumps(config))
    unknown: list[str] = []
    for _ in range(32):
        try:
            with _quiet():
                parse(config)
            return unknown
        except ValidationError as exc:
            extra = [e for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not extra or len(extra) != len(exc.errors()):
                from toolkit.recipes.load import plain_error

                bad = next(e for e in exc.errors() if e["type"] != "extra_forbidden")
                where = _path_of(config, str(bad["loc"][-1])) or ".".join(str(p) for p in bad["loc"])
                raise HpcError(f"deepspeed.config.{where}: {plain_error(bad)} (DeepSpeed {version}'s own config "
                               f"parser, {exc.title})",
                               fix=f"--set deepspeed.config.{where}=VALUE with a value DeepSpeed accepts") from None
            for error in extra:  # a misspelt key of a section this DeepSpeed knows: did you mean...?
                key = str(error["loc"][-1])
                close = difflib.get_close_matches(key, _deepspeed_fields(exc.title), n=1, cutoff=0.8)
                if close:
                    where = _path_of(config, key) or key
                    raise HpcError(f"deepspeed.config.{where}: DeepSpeed {version} has no such key ({exc.title}); "
                                   f"did you mean {close[0]}?",
                                   fix=f"rename it in the recipe's deepspeed.config, or --set deepspeed.config.{where}"
                                       f"=null --set deepspeed.config.{where.rsplit(key, 1)[0]}{close[0]}=VALUE"
                                   ) from None
            popped = [path for error in extra for path in _pop_key(config, str(error["loc"][-1]))]
            if not popped:
                raise HpcError(f"the generated DeepSpeed config: DeepSpeed {version} refuses it: {exc.title} has "
                               f"no {', '.join(str(e['loc'][-1]) for e in extra)}",
                               fix="change the recipe's deepspeed: section") from None
            unknown += popped
        except (AssertionError, ValueError, KeyError, TypeError) as exc:
            raise HpcError(f"the generated DeepSpeed config: DeepSpeed {version} refuses it: {exc}",
                           fix="change the recipe's deepspeed: section") from None
    return unknown


def _deepspeed_fields(model_name: str) -> list[str]:
    """The keys (field names and aliases) of DeepSpeed's config model named `model_name`."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    stack = [DeepSpeedConfigModel]
    while stack:
        model = stack.pop()
        if model.__name__ == model_name:
            return [key for name, field in model.model_fields.items() for key in (name, field.alias) if key]
        stack += model.__subclasses__()
    return []


def _path_of(config: dict[str, Any], key: str, prefix: str = "") -> str | None:
    """The dotted path of the first `key` in the nested config."""
    for name, value in config.items():
        if name == key:
            return f"{prefix}{name}"
        if isinstance(value, dict) and (found := _path_of(value, key, f"{prefix}{name}.")):
            return found
    return None


def _pop_key(config: dict[str, Any], key: str, prefix: str = "") -> list[str]:
    """Remove `key` wherever it sits in the nested config; its dotted paths."""
    found = []
    for name, value in list(config.items()):
        path = f"{prefix}{name}"
        if name == key:
            found.append(path)
            del config[name]
        elif isinstance(value, dict):
            found += _pop_key(value, key, f"{path}.")
    return found
