"""Training workloads launched per rank on the nodes (our ResNet trainer) and the data they can run on."""
