"""The house rules that code review alone would let slip: no import cycle in toolkit/ (lazy imports inside
functions count too: they are cycles all the same, only deferred), no toolkit module imports the test bench
(testbench/, the local Slurm set-up: dev and test only, not shipped), submitting and reporting meet only in the
run dir (toolkit.rundir), no arrow points up a layer (UPWARD), and `hpc --help` imports nothing heavy."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Set as AbstractSet
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "toolkit"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every toolkit module `path` imports, at any depth (`from toolkit.a import b` is toolkit.a.b if that is a
    module, else toolkit.a)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("toolkit"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("toolkit"))
    return {m for m in found if m in modules} - {module_name(path)}


def bench_imports_of(path: Path) -> set[str]:
    """The testbench modules `path` imports, at any depth (a lazy import inside a function counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "testbench" or m.startswith("testbench.")}


def find_cycle(graph: Mapping[str, AbstractSet[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


@functools.lru_cache(maxsize=1)
def package_graph() -> dict[str, frozenset[str]]:
    """Each toolkit module -> the toolkit modules it imports (lazy imports included). Parsed once per test process
    (every file's AST, some 200: read again by each of the ~30 layer checks, it was 100 s of the suite's time)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: frozenset(imports_of(path, set(files))) for name, path in files.items()}


def crossings(graph: Mapping[str, AbstractSet[str]], importer: str, imported: str) -> list[str]:
    """Imports from a module of package `importer` of a module of package `imported`."""
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(f"{package}.")

    return sorted(f"{m} -> {n}" for m, targets in graph.items() if inside(m, importer)
                  for n in targets if inside(n, imported))


def test_no_import_cycle_in_the_package():
    graph = package_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the checker finds one when there is one
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_toolkit_module_imports_the_test_bench(tmp_path):
    offenders = {module_name(p): sorted(found) for p in PACKAGE.rglob("*.py") if (found := bench_imports_of(p))}
    assert offenders == {}, f"the product imports the test bench: {offenders}"
    # the checker finds them when they are there, lazy ones included
    probe = tmp_path / "probe.py"
    probe.write_text("import testbenchmark\n\ndef f():\n    import testbench\n    from testbench.cluster import up\n")
    assert bench_imports_of(probe) == {"testbench", "testbench.cluster"}


def test_submit_and_reports_never_import_each_other():
    """Jobs and reports read a run the same way through toolkit.rundir, never through each other."""
    graph = package_graph()
    assert crossings(graph, "toolkit.submit", "toolkit.reports") == []
    assert crossings(graph, "toolkit.reports", "toolkit.submit") == []
    # the check finds one when there is one (a package's __init__ counts)
    assert crossings({"toolkit.submit.runs": {"toolkit.reports", "toolkit.rundir"}, "toolkit.submitter": {
        "toolkit.reports.nccl"}}, "toolkit.submit", "toolkit.reports") == ["toolkit.submit.runs -> toolkit.reports"]


# Arrows that point up a layer: the lower package is what the higher one is built on (the run dir is what jobs and
# reports read; Slurm's commands and the node checks are what submitting uses), never the other way round.
UPWARD = [("toolkit.health", "toolkit.submit"), ("toolkit.health", "toolkit.cli"),
          ("toolkit.rundir", "toolkit.reports"), ("toolkit.rundir", "toolkit.submit"),
          ("toolkit.rundir", "toolkit.health"), ("toolkit.rundir", "toolkit.job"),
          ("toolkit.slurm", "toolkit.submit"), ("toolkit.slurm", "toolkit.health"),
          ("toolkit.slurm", "toolkit.reports"), ("toolkit.slurm", "toolkit.cli"),
          ("toolkit.reports", "toolkit.cli"), ("toolkit.submit", "toolkit.cli"), ("toolkit.job", "toolkit.cli"),
          # the planner (hpc plan) reads run dirs through the reports and submits through submit: above both
          *((lower, "toolkit.planner") for lower in ("toolkit.submit", "toolkit.reports", "toolkit.rundir",
                                                      "toolkit.job", "toolkit.slurm", "toolkit.cluster")),
          ("toolkit.planner", "toolkit.cli"),
          # the accelerator families answer from the catalog's facts alone: every planner asks them
          *(("toolkit.accelerators", higher) for higher in ("toolkit.job", "toolkit.slurm", "toolkit.k8s",
                                                            "toolkit.cluster", "toolkit.health", "toolkit.submit",
                                                            "toolkit.reports", "toolkit.cli"))]


@pytest.mark.parametrize("lower,higher", UPWARD)
def test_no_arrow_points_up_a_layer(lower, higher):
    assert crossings(package_graph(), lower, higher) == []


def test_the_node_side_imports_nothing_of_the_rest_of_the_package():
    """toolkit.node runs on compute nodes as the staged bundle (docs/node-contract.md): no arrow leaves it."""
    graph = package_graph()
    leaving = sorted(f"{m} -> {n}" for m, targets in graph.items() if m.startswith("toolkit.node")
                     for n in targets if not n.startswith("toolkit.node"))
    assert leaving == []


def test_the_suite_collects_and_deselects_cleanly_without_the_training_environment(tmp_path):
    """A venv without `make train-env` collects every test module (torch imported lazily), so that
    `-m 'not training'` runs there. Stand-ins that refuse to import play the missing packages."""
    for name in ("torch", "torchvision", "fairseq", "fairseq_cli", "deepspeed", "sklearn"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ModuleNotFoundError('no {name} here', name={name!r})\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                          "not training and not slurm and not canary", "tests"], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    summary = res.stdout.strip().splitlines()[-1]  # "N/M tests collected (K deselected) in ...", errors counted
    assert res.returncode == 0 and "error" not in summary, res.stdout[-3000:] + res.stderr[-2000:]


def test_help_loads_no_heavy_library():
    code = ("import sys; from toolkit.cli.main import main; sys.argv = ['hpc', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('pcluster', 'boto3', 'submitit', 'torch', 'kubernetes', 'pydantic', 'jinja2', "
            "'matplotlib', 'deepspeed') if m in sys.modules]\nprint(heavy, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr


def test_a_command_loads_only_its_own_group():
    """main() builds the tree for the group argv names: `hpc recipes list` imports no other group's module (nor
    builds its commands), while `hpc --help` and the module's `command` still have every group."""
    code = ("import sys; from toolkit.cli.main import main; sys.argv = ['hpc', '--debug', 'recipes', 'list']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('toolkit.cli.') and m not in "
            "('toolkit.cli.main', 'toolkit.cli.output', 'toolkit.cli.options')), file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.stderr.strip().splitlines()[-1] == "['toolkit.cli.recipes']", res.stderr
    from toolkit.cli.main import GROUPS, command

    assert set(GROUPS) | {"run"} == set(command.commands)
