"""hpc: distributed deep-learning training on Slurm clusters built with AWS ParallelCluster."""

__version__ = "0.1.0"
