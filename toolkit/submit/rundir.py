"""Moved to toolkit.rundir. Kept only for toolkit/cli/recipes.py, which reads a sweep's metadata.json through
these two names; drop this file once it uses toolkit.rundir.RunDir."""

from toolkit.rundir import METADATA, read_json

__all__ = ["METADATA", "read_json"]
