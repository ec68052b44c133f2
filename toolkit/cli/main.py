"""`hpc` entry point: the command groups, the --debug flag, and the one place a command's outcome becomes its
exit code and, with --json, its one JSON envelope (toolkit.cli.output has the contract).

Exit codes: 0 success (a no-op included), 1 a problem found in a file or a failed job, 2 a bad flag or value
(Typer/Click's usage errors, and toolkit.errors.UsageError from our own checks of a flag's value).
"""

from __future__ import annotations

import difflib
import shlex
import sys

import typer

from toolkit import __version__
from toolkit.cli import output

# The command groups and the one top-level command, by module: main() imports only the one argv names (each group
# module imports its own heavy parts: pydantic, jinja2, submitit), so `hpc recipes submit` pays neither for the
# cluster commands' imports nor for building their 30-odd commands (Typer reads every function's signature;
# measured: docs/start-up.md). `hpc --help`, completion and anything unknown get the whole tree.
GROUPS = {"cluster": "toolkit.cli.cluster", "recipes": "toolkit.cli.recipes", "jobs": "toolkit.cli.jobs",
          "report": "toolkit.cli.report", "k8s": "toolkit.cli.k8s", "plan": "toolkit.cli.plan"}
COMMANDS = {"run": ("toolkit.cli.run", "run")}
ROOT_HELP = "Distributed deep-learning training on Slurm clusters built with AWS ParallelCluster."


def build(only: str | None = None):
    """The Click command for `hpc`: every group and command, or (`only`) the root with that one alone."""
    # rich_markup_mode=None keeps help rendering plain and cheap: `hpc --help` must stay instant. Completion
    # (--install-completion / --show-completion, Typer's own) costs nothing until a shell asks for it.
    app = typer.Typer(name="hpc", help=ROOT_HELP, no_args_is_help=True, rich_markup_mode=None,
                      pretty_exceptions_enable=False, add_completion=True)
    app.callback()(_root)  # first: a command added before the root callback has no --debug and no --version
    # __import__, not importlib.import_module: the latter's imports escape `python -X importtime`
    for name, module in GROUPS.items():
        if only in (None, name):
            app.add_typer(__import__(module, fromlist=["app"]).app, name=name)
    for name, (module, function) in COMMANDS.items():
        if only in (None, name):
            app.command(name)(getattr(__import__(module, fromlist=[function]), function))
    return _named_values(typer.main.get_command(app))


def named_in(argv: list[str]) -> str | None:
    """The group or command argv names (its first word that is no option: the root's options take no value),
    or None when it names none hpc has (help, completion, a typo: the whole tree answers those)."""
    word = next((w for w in _own_words(argv) if not w.startswith("-")), None)
    return word if word in GROUPS or word in COMMANDS else None


def _named_values(command):
    """Every option and argument shows a name for its value (FILE, N, QUEUE), not the Python type Typer would
    print (`<str>`, `<int range>`) nor a parameter's Python name; declared metavars and choices stay."""
    for param in command.params:
        desc = param.type_descriptor
        if param.param_type_name == "argument" and not desc.is_choice:  # Typer adds `<str>` after its name
            param.display_type_rich = lambda ctx: None
        if param.metavar is not None or getattr(param, "is_flag", False) or desc.is_choice:
            continue
        base = desc.annotation
        param.metavar = "N" if base is int else "SECONDS" if base is float else param.name.upper()
    for sub in getattr(command, "commands", {}).values():
        _named_values(sub)
    return command


_debug = False
_argv: list[str] = []  # the running command's argv (main sets it): --version reads its --json there


def _version(value: bool) -> None:
    """`hpc --version [--json]`: eager, so it answers before Click asks for a command."""
    if value:
        output.emit({"version": __version__}, "--json" in _own_words(_argv), f"hpc {__version__}")
        raise typer.Exit()


def _root(
    debug: bool = typer.Option(False, "--debug", help="Show a traceback on errors: hpc --debug COMMAND ..."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    as_json: bool = typer.Option(False, "--json", help="With --version: print it as one JSON envelope."),
) -> None:
    from toolkit.errors import UsageError

    global _debug
    _debug = debug
    if as_json:  # a command's own --json follows it; here it is only --version's
        raise UsageError("--json goes after the command (e.g. hpc recipes list --json), or with --version",
                         fix="move --json after the command's name")


_command = None  # the tree main() built for the running command (the error helpers walk it)


def _tree(argv: list[str]):
    """The tree the running command was parsed with (main() builds it first)."""
    return _command or build(named_in(argv))


def __getattr__(name: str):
    """`command`: the whole tree, built on first use (tests and the docs' check walk every command)."""
    if name == "command":
        globals()["command"] = tree = build()
        return tree
    raise AttributeError(name)


def _own_words(argv: list[str]) -> list[str]:
    """argv up to `--`: what follows belongs to the user's script (`hpc run train.py -- --json`)."""
    return argv[:argv.index("--")] if "--" in argv else argv


def _refuse_repeated_options(argv: list[str]) -> None:
    """An option that takes one value, given twice with different values (`--profile smoke --profile gpu-data`):
    Click keeps the last without a word. Repeatable options (--set, --env, ...) and flags are not counted."""
    from toolkit.errors import UsageError

    node, _ = _command_named(argv)
    own = _own_words(argv)
    single = {name: param for param in getattr(node, "params", [])
              if param.param_type_name == "option" and not param.multiple and not param.is_flag and not param.count
              for name in param.opts}
    given: dict[str, list[str]] = {}
    for i, word in enumerate(own):
        name, sep, value = word.partition("=")
        param = single.get(name)
        if param is not None and (sep or i + 1 < len(own)):
            long = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            given.setdefault(long, []).append(value if sep else own[i + 1])
    for name, values in given.items():
        if len(set(values)) > 1:
            raise UsageError(f"{name} given {len(values)} times ({', '.join(values)}): it takes one value, and only "
                             "the last would be used", fix=f"give {name} once")


def _command_named(argv: list[str]):
    """The command argv names and the words that name it (`recipes submit`), hpc's own options skipped."""
    node, words = _tree(argv), list[str]()
    for word in _own_words(argv):
        if word.startswith("-"):
            continue
        sub = getattr(node, "commands", {}).get(word)
        if sub is None:
            break
        node, words = sub, [*words, word]
    return node, words


def _command_name(argv: list[str]) -> str:
    """The command argv names, as the envelope's "command": "recipes submit", "cluster queue add"."""
    return " ".join(_command_named(argv)[1])


def _missing_options(exc, argv: list[str]) -> tuple[str, str] | None:
    """Every required option argv lacks, in one message (Click stops at the first), with what to add."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None or type(exc).__name__ != "MissingParameter":
        return None
    given = _own_words(argv)

    def present(param) -> bool:
        return any(w == o or w.startswith(o + "=") for o in param.opts for w in given)

    missing = [p for p in ctx.command.params if p.param_type_name == "option" and p.required and not present(p)]
    if exc.param is not None and exc.param.param_type_name == "argument":
        return (f"missing argument {exc.param.metavar or exc.param.name.upper()}" + (
            f" and option{'s' if len(missing) > 1 else ''} {', '.join(p.opts[0] for p in missing)}" if missing else ""),
            f"see `{ctx.command_path} --help`")
    if not missing:
        return None
    names = ", ".join(p.opts[0] for p in missing)
    example = " ".join(f"{p.opts[0]} {p.metavar or p.name.upper()}" for p in missing)
    plural = "s" if len(missing) > 1 else ""
    return f"missing option{plural} {names}", f"add {example} (see `{ctx.command_path} --help`)"


def _bad_value(exc, argv: list[str]) -> tuple[str, str] | None:
    """A flag's value Typer refused, said in words with the flag as typed, the value and what works: not one of
    the choices, not a whole number, out of range (Typer's own message carries pydantic's wording)."""
    param = getattr(exc, "param", None)
    if param is None or param.param_type_name != "option" or type(exc).__name__ != "BadParameter":
        return None
    words, desc = _own_words(argv), param.type_descriptor
    given = next((w.split("=", 1)[1] for w in words for o in param.opts if w.startswith(o + "=")), None)
    given = given if given is not None else next((words[i + 1] for i, w in enumerate(words[:-1]) if w in param.opts),
                                                 "")
    flag = next((w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in param.opts), param.opts[0])
    if desc.is_choice:
        choices = ", ".join(c.value for c in desc.choices)
        return f"{flag} {given!r} is not one of {choices}", f"use one of: {choices}"
    info, kind = desc.parameter_info, desc.annotation
    if kind in (int, float):
        low, high = info.min, info.max
        example = f"e.g. {flag} {low if low is not None else 1}"
        try:
            number = kind(given)
        except ValueError:
            return f"{flag} {given!r} is not a {'whole number' if kind is int else 'number'}", example
        if low is not None and number < low:
            return f"{flag} {given}: the least it takes is {low}", example
        if high is not None and number > high:
            return f"{flag} {given}: the most it takes is {high}", f"e.g. {flag} {high}"
    return None


def _script_args_habit(exc, argv: list[str]) -> tuple[str, str] | None:
    """An unknown option given to a command that passes arguments on to the user's script (`hpc run`, `hpc
    recipes new`): torchrun's habit, `hpc run train.py --nodes 2 --epochs 5`. The fix is the command with the
    unknown options, and the words after them that are not hpc's, moved after `--`."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None or type(exc).__name__ != "NoSuchOption":
        return None
    if not any(p.param_type_name == "argument" and p.nargs == -1 for p in ctx.command.params):
        return None
    own = _own_words(argv)
    if ctx.command.name == "render" and not any(w.endswith(".py") or w in ("-m", "--module") for w in own):
        return None  # `hpc k8s render RECIPE`: no script here to give the option to (toolkit.k8s.usercode)
    node, end = _tree(argv), 0
    for i, word in enumerate(own):  # the command's path (hpc's own options before it stay where they are)
        if word.startswith("-"):
            continue
        sub = getattr(node, "commands", {}).get(word)
        if sub is None:
            break
        node, end = sub, i + 1
    options = {name: p for p in ctx.command.params if p.param_type_name == "option"
               for name in (*p.opts, *p.secondary_opts)}
    kept, moved, rest, i = list[str](), list[str](), own[end:], 0
    while i < len(rest):
        word = rest[i]
        attached = "=" in word or (not word.startswith("--") and len(word) > 2)  # --nodes=2, -N2: one word
        param = options.get(word.split("=", 1)[0]) or (options.get(word[:2]) if attached else None)
        if word.startswith("-") and param is not None:
            take = 1 if param.is_flag or param.count or attached else 1 + param.nargs
            kept += rest[i:i + take]
            i += take
            continue
        (moved if moved or word.startswith("-") else kept).append(word)
        i += 1
    fixed = shlex.join([output.hpc_program(), *own[:end], *kept, "--", *moved, *argv[len(own) + 1:]])
    # hpc's own option it may be a typo of: Click's guesses compare the dashes too (--epochs -> --qos)
    meant = [f"--{m}" for m in difflib.get_close_matches(exc.option_name.lstrip("-"),
                                                         [n.lstrip("-") for n in options if n.startswith("--")],
                                                         cutoff=0.75)]
    if meant:  # a typo of hpc's own is the likelier reading, and the safer command: moving `--dryrun` after `--`
        # would have dropped the dry run (and a real job would be submitted by the command as printed)
        at = argv.index(next(w for w in own if w.split("=", 1)[0] == exc.option_name))
        typo, sep, value = argv[at].partition("=")
        corrected = shlex.join([output.hpc_program(), *argv[:at], meant[0] + sep + value, *argv[at + 1:]])
        return (f"{exc.option_name} is not an option of `{ctx.command_path}`: did you mean {meant[0]}?",
                f"{corrected} (or, if {exc.option_name} is your script's: {fixed})")
    return (f"{exc.option_name} is not an option of `{ctx.command_path}`: arguments for your script go after `--`",
            fixed)


def _end(argv: list[str], code: int, message: str | None = None, fix: str | None = None) -> None:
    """Say the error (stderr), write the envelope (--json), exit with `code`."""
    if message is not None:
        sys.stderr.write(f"error: {message}\n")
        if fix:
            sys.stderr.write(f"  fix: {fix}\n")
    if "--json" in _own_words(argv):
        error = {"message": message, "fix": fix, "exit_code": code} if message is not None else None
        sys.stdout.write(output.envelope_json(_command_name(argv), code, error))
    output.envelope.active = False
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run `hpc ARGV` (default: this process's command line) and exit with its code (tests call it in-process)."""
    from toolkit.errors import HpcError

    global _debug, _argv, _command
    _debug = False  # the root callback sets it; a usage error can come before it runs
    argv = sys.argv[1:] if argv is None else list(argv)
    _argv = argv
    output.begin()
    _command = build(named_in(argv))
    try:
        _refuse_repeated_options(argv)
        code = _command.main(args=argv, prog_name="hpc", standalone_mode=False)
    except typer.TyperException as exc:  # bad command-line usage (Typer's click): our error/fix form, exit 2
        ctx = getattr(exc, "ctx", None)
        # a bare command group: its help is the answer (click's NoArgsIsHelpError, which typer vendors privately)
        if type(exc).__name__ == "NoArgsIsHelpError" and callable(show := getattr(exc, "show", None)):
            show()
            _end(argv, exc.exit_code)
        message, fix = _missing_options(exc, argv) or _bad_value(exc, argv) or _script_args_habit(exc, argv) or (
            exc.format_message(), f"see `{ctx.command_path if ctx else 'hpc'} --help`")
        _end(argv, exc.exit_code, message, fix)
    except typer.Abort:
        _end(argv, 1, "aborted")
    except HpcError as exc:
        if _debug:  # the traceback, and still the error's own exit code (a usage error is 2 with --debug too)
            import traceback

            traceback.print_exc()
        _end(argv, exc.exit_code, exc.message, exc.fix)
    except KeyboardInterrupt:
        _end(argv, 130, "interrupted")
    except Exception as exc:  # an unexpected fault: one line, the traceback only with --debug
        if _debug:
            raise
        again = shlex.join([output.hpc_program(), "--debug", *argv])  # a root option: before the command
        _end(argv, 1, f"internal error: {type(exc).__name__}: {exc}",
             f"re-run as `{again}` and report the traceback")
    _end(argv, code if isinstance(code, int) else 0)
