"""Kubernetes (Amazon EKS) forms of the recipes: manifests rendered from the JobSpec, validated offline."""
