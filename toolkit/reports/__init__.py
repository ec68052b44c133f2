"""Reports from logs and run dirs: nccl-tests, training throughput, scaling; tables, JSON and PNG plots."""
