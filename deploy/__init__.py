"""Deployment assets: the container image, the kustomize tree and its renderer (DEPLOY-1)."""
