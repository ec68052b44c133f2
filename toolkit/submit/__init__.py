"""Submitting job specs (submitit: Slurm or local), the run dir each run keeps, and job status."""
