"""`hpc cluster`: Generate, validate and inspect AWS ParallelCluster v3 configs."""

from __future__ import annotations

import typer

app = typer.Typer(help="Generate, validate and inspect AWS ParallelCluster v3 configs.", no_args_is_help=True, rich_markup_mode=None)
