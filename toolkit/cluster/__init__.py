"""ParallelCluster configs: build (queues -> YAML), validate (offline), and read back into queues."""
