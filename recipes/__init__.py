"""The built-in recipes. This folder ships inside the package as `toolkit.builtin_recipes` (a link to it), so
that an installed hpc finds them through importlib.resources (toolkit/recipes/load.py)."""
