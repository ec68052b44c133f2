"""The `hpc` command line: thin Typer commands over the library (no logic beyond parsing and printing)."""
