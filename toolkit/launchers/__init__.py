"""Launcher kinds, one module each: what a rank runs and everything that depends on it (its argv, its device
flags, its own parser's argument check, its resume rule, its advice, its Kubernetes form). Callers ask the launcher
(launcher_for) instead of branching on the kind's name. toolkit.launchers.base holds what every launcher answers,
the defaults and the registry, which finds the kinds' modules here; adding a kind is one module here (its name also
goes in the recipe schema's launcher.kind) and its tests (tests/test_launchers.py).

Modules are imported when a kind is first asked for, and a launcher imports its program (to build the program's
own parser) only when a job's arguments are checked: `hpc --help` imports none of them
(tests/test_architecture.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolkit.launchers.base import all_launchers, kubernetes_forms, launcher_for, launcher_of, parsers, registry

if TYPE_CHECKING:
    from toolkit.recipes.schema import Recipe

__all__ = ["all_launchers", "check_arguments", "kubernetes_forms", "launcher_for", "launcher_of", "parsers", "registry"]


def check_arguments(recipe: Recipe, spec: Any) -> list[str]:
    """Refuse the job's arguments where its launcher's own parser refuses them (toolkit.job.argcheck's messages);
    the notes (said once) name what could not be checked here."""
    from toolkit.job.rank import preview_argv
    from toolkit.progress import step

    launcher = launcher_of(recipe.launcher)
    # loading a program's own parser can take seconds (the biggest: ~5 s of imports)
    with step(f"checking the arguments with {launcher.what(recipe.launcher)}'s own parser"):
        return launcher.check_arguments(recipe, spec, preview_argv(spec.command))
