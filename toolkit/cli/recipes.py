"""`hpc recipes`: Training recipes: list, show, validate, render and submit."""

from __future__ import annotations

import typer

app = typer.Typer(help="Training recipes: list, show, validate, render and submit.", no_args_is_help=True, rich_markup_mode=None)
