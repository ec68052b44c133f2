"""A job's training arguments checked against a launcher's own parser when the job is planned, so a typo or a
wrongly typed value is refused before a 64-GPU job starts, in the user's terms (the flag, the value, the form the
parser accepts, a command that works).

Each launcher (toolkit.launchers) builds its program's own parser and hands it to check_argparse(); which programs
have one, and what the plan says for the others, is the launcher's (toolkit.launchers.check_arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import logging
import re
import warnings
from typing import Any, Callable

from toolkit.errors import HpcError

# Values tried on a parser's type function to show the form it accepts (when it is neither int, float nor choices)
SAMPLE_VALUES = ("1", "0.5", "0.1,0.2", "true")


class _ParserError(Exception):
    """argparse's parser.error(), raised instead of printing usage and exiting 2."""


@contextlib.contextmanager
def quiet():
    """Heavy imports print (a program's logging set-up, DeepSpeed's accelerator probe, torch's warnings): keep them
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


@dataclasses.dataclass(frozen=True)
class Program:
    """The program whose parser answers: its name, the command that lists its flags, its version."""

    name: str
    help_command: str
    version: str | None

    def __str__(self) -> str:
        return self.name + (f" ({self.version})" if self.version else "")


def check_argparse(recipe, program: Program, parser: argparse.ArgumentParser, argv: list[str],
                    parse: Callable[[argparse.ArgumentParser, list[str]], tuple[Any, list[str]]]) -> None:
    def error(message: str):
        raise _ParserError(message)

    parser.error = error  # type: ignore[method-assign]  # argparse would print usage and exit 2
    try:
        with quiet():
            _, extra = parse(parser, argv)
    except _ParserError as exc:
        raise _refusal(recipe, program, parser, argv, str(exc)) from None
    except (ValueError, RuntimeError) as exc:  # a parser's post-checks (e.g. "Cannot combine --fp16 and --tpu")
        given = [origin for flag in recipe.args if (origin := recipe.origin(("args", flag)))]
        raise HpcError(f"{program} refuses the job's arguments: {exc}"
                       + (f" (with {', '.join(dict.fromkeys(given))})" if given else ""),
                       fix=f"change or remove the flags it names (see `{program.help_command}`)") from None
    if extra:
        raise _extra_word(recipe, program, parser, argv, extra)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)  # every option string the parser knows, after a program's additions


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
    if option == "--sweep" and item.startswith(f"{key}="):  # a point holds one value of the sweep: keep them all
        return f"--sweep args.{new}=... with the values of your --sweep {key}=..."
    if option == "--set" and item.startswith(f"{key}="):
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
