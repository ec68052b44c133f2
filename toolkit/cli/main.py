"""`hpc` entry point: the command groups, the --debug flag, and the one place errors become exit codes.

Exit codes: 0 success, 1 a failure or invalid input found, 2 a usage error (Typer/Click's own).
"""

from __future__ import annotations

import json
import sys

import typer

from toolkit import __version__
from toolkit.cli import cluster, jobs, k8s, recipes, report, run

# rich_markup_mode=None keeps help rendering plain and cheap: `hpc --help` must stay instant.
app = typer.Typer(
    name="hpc",
    help="Distributed deep-learning training on Slurm clusters built with AWS ParallelCluster.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(cluster.app, name="cluster")
app.add_typer(recipes.app, name="recipes")
app.add_typer(jobs.app, name="jobs")
app.add_typer(report.app, name="report")
app.add_typer(k8s.app, name="k8s")
app.command("run")(run.run)

_debug = False


def _version(value: bool) -> None:
    if value:
        print(f"hpc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show a traceback on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    global _debug
    _debug = debug


def _report(message: str, fix: str | None, argv: list[str]) -> None:
    sys.stderr.write(f"error: {message}\n")
    if fix:
        sys.stderr.write(f"  fix: {fix}\n")
    if "--json" in argv:
        sys.stdout.write(json.dumps({"ok": False, "error": message, "fix": fix}) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Run `hpc ARGV` (default: this process's command line) and exit with its code (tests call it in-process)."""
    from toolkit.errors import HpcError

    global _debug
    _debug = False  # the root callback sets it; a usage error can come before it runs
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        code = app(args=argv, prog_name="hpc", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.TyperException as exc:  # bad command-line usage (Typer's click): our error/fix form, exit 2
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare command group: its help is the answer
            exc.show()
        else:
            if ctx is not None:
                sys.stderr.write(ctx.get_usage() + "\n")
            _report(exc.format_message(), f"see `{ctx.command_path if ctx else 'hpc'} --help`", argv)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except HpcError as exc:
        if _debug:
            raise
        _report(exc.message, exc.fix, argv)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # an unexpected fault: one line, the traceback only with --debug
        if _debug:
            raise
        _report(f"internal error: {type(exc).__name__}: {exc}", "re-run with --debug and report the traceback", argv)
        sys.exit(1)
