"""Tests of the deployment assets under ``deploy/`` (DEPLOY-1)."""
