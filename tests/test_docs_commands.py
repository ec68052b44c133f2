"""Issue 31: every `hpc` command in the code blocks of README.md and docs/*.md runs as printed, or, where it is a
synopsis that cannot run, names a command the CLI has and only options that command takes.

A command line: in a code block (indented 4 spaces, or fenced), a line whose first word is `hpc` (or a path to it:
`.venv/bin/hpc`), lines ending in `\\` joined to the next, a trailing `# comment` not part of it; in a block with
`$ ` prompts only the prompted lines are commands (the rest is their output); a command's next line indented
under it without that `\\` fails (its options would escape the checks). README's two quickstarts are
tests/test_readme_quickstarts.py's and left out here. Each page's lines are one test (ids: the page's name).

- A synopsis (`[optional]` parts, `A|B`, `...`, placeholders such as FILE, RUN_DIR, Q, NAME=VALUE, SCRIPT.py): its
  command must exist in the CLI (toolkit.cli.main's click group) and every option it names before a bare `--` must
  be one of that command's. `hpc jobs list | status ID | cancel ID` is three commands, each classified alone.
- Runnable (none of that): it runs in-process (tests.conftest.run_hpc), the page's lines in order in one temp dir,
  so what one writes (cluster.yaml, recipes/mytrain.yaml) is there for the next, with no Slurm or cluster config
  from the environment and HPC_RUNS_DIR in that dir. It must exit 0, or the code its comment states
  (`# exit 1: ...`), with no traceback; and no line may leave a run dir (nothing was sent). Except:
  - DRY_RUN: sending the job needs a live Slurm: it runs with `--dry-run` added (the same plan, nothing sent);
  - NEED_A_LIVE_SLURM: the command reads a job a live Slurm ran, or runs one (the doctor, the bad-node search):
    its `--help` must exit 0 and the line must parse (click's parser, every option and argument);
  - NEED_KUBECTL: kubectl and a Kubernetes cluster: the line must parse.
- The lines around them: `cp A B` copies (A from the temp dir, else from the checkout);
  `eval "$(python -m testbench env [--slurm V])"` sets HPC_CLUSTER_CONFIG to the local test cluster's config as
  testbench renders it (into the temp dir: no Slurm is started or asked). Other shell lines are not run.
- GIVEN: a file a page uses and says comes from elsewhere is made first, as the page says: researchers.md's
  cluster.yaml by admins.md's own `hpc cluster config` line, train.py as a copy of the example script.

Commands quoted inline in the prose (`hpc jobs status`) are checked too, as synopses (_check_prose).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.conftest import REPO, SUMMARY, run_hpc
from tests.test_readme_quickstarts import QUICKSTARTS

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NO_COMMANDS = {"README.md", "architecture.md", "gaudi.md", "node-contract.md"}  # README: the quickstarts aside
DRY_RUN = {("recipes", "submit"), ("run",)}
NEED_A_LIVE_SLURM = {("jobs", "status"), ("jobs", "logs"), ("jobs", "cancel"), ("report", "run"),
                     ("report", "nccl"), ("report", "scaling"), ("cluster", "doctor"), ("cluster", "find-bad-nodes"),
                     ("plan", "calibrate")}
NEED_KUBECTL = {("k8s", "apply")}
EXAMPLE_SCRIPT = "recipes/examples/ddp_train.py"
# page -> {file: the page's own words saying where it comes from}
GIVEN = {
    "researchers.md": {"cluster.yaml": "cluster.yaml: the admin's (admins.md)",
                       "train.py": f"copy `{EXAMPLE_SCRIPT}` from the checkout"},
    "kubernetes.md": {"train.py": f"a copy of `{EXAMPLE_SCRIPT}` from the checkout"},
}
TESTBENCH_ENV = 'eval "$(python -m testbench env'
# FILE, FILE.png, Q, NAME=VALUE (an upper-case value such as SCRATCH_2 would make its line a synopsis: checked, not run)
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?(=[A-Z][A-Z0-9_]*)?")


@dataclasses.dataclass(frozen=True)
class Line:
    where: str  # page:line of its first physical line
    text: str  # the command (prompt, continuations and comment resolved)
    comment: str


def _code_lines(page: Path) -> tuple[list[Line], list[str]]:
    """The page's code block lines (joined, prompts and comments taken off), and the lines that continue a command
    without a `\\` before them (a doc slip that would hide options from the checks)."""
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    fenced, heading = False, ""
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        heading = raw if raw.startswith("## ") else heading
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            if not fenced:
                blocks, current = [*blocks, current], []
        elif page.name == "README.md" and heading.startswith(QUICKSTARTS):
            continue
        elif fenced or raw.startswith("    "):
            current.append((number, raw if fenced else raw[4:]))
        elif raw.strip() and current:
            blocks, current = [*blocks, current], []
    blocks.append(current)
    lines, orphans = [], []
    for block in blocks:
        prompted = any(text.startswith("$ ") for _, text in block)
        joined: list[tuple[int, str]] = []
        for number, text in block:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1].rstrip() + " " + text.strip())
            else:
                if joined and text[:1].isspace() and text.strip() and _is_command(joined[-1][1], prompted):
                    orphans.append(f"{page.name}:{number}: {text.strip()}")
                joined.append((number, text))
        for number, text in joined:
            if prompted and not text.startswith("$ "):
                continue
            code, *comment = re.split(r"\s+#(?:\s|$)", text.removeprefix("$ "), maxsplit=1)
            lines.append(Line(f"{page.name}:{number}", code.strip(), " ".join(comment).strip()))
    return [line for line in lines if line.text], orphans


def _is_command(text: str, prompted: bool) -> bool:
    if prompted and not text.startswith("$ "):
        return False
    words = text.removeprefix("$ ").split()
    return bool(words) and (words[0] == "hpc" or words[0].endswith("/hpc"))


def _resolve(words: list[str]) -> tuple[tuple[str, ...], Any, list[str]]:
    """The command `hpc WORDS` names in the CLI (Typer's click command; a group has `commands`), its path and the
    words after it (LookupError: no such command)."""
    from toolkit.cli.main import command

    node, path, rest = command, tuple[str, ...](), list(words)
    while (subs := getattr(node, "commands", None)) is not None:
        default = getattr(node, "default_command", None)  # `hpc plan RECIPE` is `hpc plan predict RECIPE`
        if rest and rest[0] not in subs and default is not None:
            rest.insert(0, default)
        if not rest or rest[0] not in subs:
            raise LookupError(f"`hpc {' '.join(path)}` has no command {rest[0] if rest else ''!r} "
                              f"(it has: {', '.join(sorted(subs))})")
        node, path = subs[rest[0]], (*path, rest.pop(0))
    return path, node, rest


def _alternatives(text: str) -> list[str]:
    """`hpc jobs list | status ID | cancel ID` -> each command whole; a `|` inside [...] or a word stays."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "|" and depth == 0 and text[i - 1:i + 2] == " | ":
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    words = parts[0].split()
    path, _, _ = _resolve(words[1:])
    prefix = " ".join([words[0], *path[:-1]])  # the group the first one is in
    return [parts[0], *(f"{prefix} {part}" for part in parts[1:])]


def _is_synopsis(text: str) -> bool:
    return bool(re.search(r"[\[\]|]|\.\.\.", text)) or any(
        PLACEHOLDER.fullmatch(word) for word in text.split() if not word.startswith("-"))


def _check_synopsis(text: str) -> str | None:
    """Why the synopsis names no command of the CLI or an option its command does not take; None if it is sound."""
    words = re.sub(r"[\[\]|]", " ", text).split()
    try:
        path, cmd, rest = _resolve(words[1:])
    except LookupError as exc:
        return str(exc)
    options = {name for p in cmd.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
    own = rest[:rest.index("--")] if "--" in rest else rest  # after a bare `--`: the script's arguments
    flags = [w.split("=", 1)[0] for w in own if w.startswith("-") and w != "-"]  # `-o -`: stdout, a value
    unknown = [f for f in flags if f not in options | {"--help"}]
    return f"`hpc {' '.join(path)}` takes no {', '.join(unknown)}" if unknown else None


def _parse(path: tuple[str, ...], cmd: Any, rest: list[str]) -> str | None:
    """Why click's parser refuses the line's words for the command (None: they parse)."""
    try:
        cmd.make_context(" ".join(("hpc", *path)), list(rest), resilient_parsing=False)
    except typer.TyperException as exc:  # click's usage errors, as Typer vendors click
        return exc.format_message()
    return None


def _testbench_env(line: str, tmp_path: Path) -> dict[str, str]:
    """What `eval "$(python -m testbench env [--slurm V])"` exports for hpc: the lane's cluster config, rendered."""
    from testbench.cluster import render_configs
    from testbench.layout import Layout, lane

    version = re.search(r"--slurm (\S+?)\)", line)
    layout = Layout(tmp_path / "testbench", lane(version.group(1) if version else None))
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.cluster_config.write_text(render_configs(layout)[layout.cluster_config])
    return {"HPC_CLUSTER_CONFIG": str(layout.cluster_config)}


def _given(page: Path, tmp_path: Path, env: dict[str, str]) -> None:
    text = page.read_text()
    for name, said in GIVEN.get(page.name, {}).items():
        assert said in " ".join(text.split()), f"{page.name} no longer says where {name} comes from: {said!r}"
        if name == "train.py":
            shutil.copyfile(REPO / EXAMPLE_SCRIPT, tmp_path / name)
            continue
        admins, _ = _code_lines(REPO / "docs" / "admins.md")
        config = next(line for line in admins if line.text.startswith("hpc cluster config ")
                      and line.text.endswith(f"-o {name}"))
        res = run_hpc(*shlex.split(config.text)[1:], env=env, cwd=tmp_path)
        assert res.returncode == 0 and (tmp_path / name).is_file(), (config.where, res.stdout, res.stderr)


def _run(line: Line, tmp_path: Path, env: dict[str, str], counts: dict[str, int]) -> str | None:
    """Run one runnable line as its kind says; why it failed, or None."""
    words = shlex.split(line.text)
    try:
        path, cmd, rest = _resolve(words[1:])
    except LookupError as exc:
        return str(exc)
    if path in NEED_KUBECTL:
        counts["parsed"] += 1
        return _parse(path, cmd, rest)
    if path in NEED_A_LIVE_SLURM:
        counts["help"] += 1
        res = run_hpc(*path, "--help", env=env, cwd=tmp_path)
        return _parse(path, cmd, rest) or (None if res.returncode == 0 else f"--help exited {res.returncode}")
    args = words[1:]
    if path in DRY_RUN and "--dry-run" not in args:
        args.insert(args.index("--") if "--" in args else len(args), "--dry-run")
        counts["dry run"] += 1
    else:
        counts["ran"] += 1
    said = re.match(r"exit (\d+):", line.comment)
    expected = int(said.group(1)) if said else 0
    res = run_hpc(*args, env=env, cwd=tmp_path)
    if res.returncode != expected or "Traceback" in res.stderr or "internal error" in res.stderr:
        tail = (res.stdout[-1500:] + res.stderr[-1500:]).rstrip()
        return f"`hpc {shlex.join(args)}` exited {res.returncode}, not {expected}:\n{tail}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_in_the_docs_runs_or_names_what_the_cli_has(page, tmp_path):
    lines, orphans = _code_lines(page)
    assert not orphans, f"a command's next line continues it without a `\\` before it: {orphans}"
    commands = [line for line in lines if _is_command(line.text, False)]
    assert bool(commands) == (page.name not in NO_COMMANDS), (page.name, [c.text for c in commands])
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "HPC_CLUSTER_CONFIG")}
    env["HPC_RUNS_DIR"] = str(tmp_path / "runs")
    _given(page, tmp_path, env)
    counts = dict.fromkeys(("ran", "dry run", "help", "parsed", "synopsis"), 0)
    failures = []
    for line in lines:
        words = line.text.split()
        if words[0] == "cp":
            source, target = shlex.split(line.text)[1:]
            shutil.copyfile(tmp_path / source if (tmp_path / source).exists() else REPO / source, tmp_path / target)
            continue
        if line.text.startswith(TESTBENCH_ENV):
            env.update(_testbench_env(line.text, tmp_path))
            continue
        if not _is_command(line.text, False):
            continue  # another program's line (srun, scontrol, enroot, ...): not hpc's to test
        try:
            parts = _alternatives(line.text)
        except LookupError as exc:
            failures.append(f"{line.where}: {line.text}\n  {exc}")
            continue
        for part in parts:
            if _is_synopsis(part):
                counts["synopsis"] += 1
                why = _check_synopsis(part)
            else:
                why = _run(dataclasses.replace(line, text=part), tmp_path, env, counts)
            if why:
                failures.append(f"{line.where}: {part}\n  {why}")
    SUMMARY.append(f"docs commands: {page.name}: {len(commands)} lines: " +
                   ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "runs").exists()  # dry runs, renders and help write no run dir


def _prose_commands(page: Path) -> list[Line]:
    """`hpc ...` in inline code spans of the page's prose (outside code blocks): each names a command and options
    a reader would type."""
    found, fenced = [], False
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or raw.startswith("    "):
            continue
        for span in re.findall(r"`([^`]+)`", raw):
            if re.match(r"(\S*/)?hpc\s", span):
                found.append(Line(f"{page.name}:{number}", span.strip(), ""))
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_in_the_docs_prose_names_what_the_cli_has(page):
    """Commands quoted inline in prose are checked as synopses: the command exists and takes every option named
    (a value after an option is not checked: prose often leaves it out)."""
    failures = []
    for line in _prose_commands(page):
        try:
            parts = _alternatives(line.text) if " | " in line.text else [line.text]
        except LookupError as exc:
            failures.append(f"{line.where}: `{line.text}`\n  {exc}")
            continue
        failures += [f"{line.where}: `{part}`\n  {why}" for part in parts if (why := _check_prose(part))]
    assert not failures, "\n".join(failures)


def _check_prose(text: str) -> str | None:
    """A synopsis check that also takes a group's own options (`hpc --version`) and a group named with what
    follows left out (`hpc cluster ...`, `hpc COMMAND --help`)."""
    from toolkit.cli.main import command

    words = re.sub(r"[\[\]|]", " ", text).split()[1:]
    node, path = command, []
    while (subs := getattr(node, "commands", None)) is not None and words and words[0] in subs:
        node = subs[words[0]]
        path.append(words.pop(0))
    if getattr(node, "commands", None) is not None and words and not (
            words[0] == "..." or PLACEHOLDER.fullmatch(words[0]) or words[0].startswith("-")):
        return f"`hpc {' '.join(path)}` has no command {words[0]!r} (it has: {', '.join(sorted(node.commands))})"
    options = {name for p in node.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
    own = words[:words.index("--")] if "--" in words else words
    flags = [w.split("=", 1)[0] for w in own if w.startswith("-") and w not in ("-", "--")]
    if getattr(node, "commands", None) is not None and words and not words[0].startswith("-"):
        return None  # `hpc cluster ... --flag`: the flag is a subcommand's, which the text leaves open
    unknown = [f for f in flags if f not in options | {"--help"}]
    return f"`hpc {' '.join(path)}` takes no {', '.join(unknown)}" if unknown else None


@pytest.mark.parametrize("text, why", [
    ("hpc recipes submit RECIPE --nodez 2", "`hpc recipes submit` takes no --nodez"),
    ("hpc jobs stat ID", "`hpc jobs` has no command 'stat'"),
    ("hpc --verbose", "`hpc ` takes no --verbose"),
])
def test_a_prose_command_the_cli_lacks_is_named(text, why):
    assert (_check_prose(text) or "").startswith(why)


def test_prose_commands_are_found_in_spans_outside_code_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `hpc jobs status` then `ls`.\n\n    hpc jobs logs 1\n\n```\n`hpc jobs list`\n```\n")
    assert [line.text for line in _prose_commands(page)] == ["hpc jobs status"]
