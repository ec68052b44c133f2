"""Talking to Slurm: every call with a timeout and a clear error when Slurm is absent or dead."""
