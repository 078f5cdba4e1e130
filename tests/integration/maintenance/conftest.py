"""Fixtures of the maintenance integration tests."""

from tests.integration.maintenance.stack import stack

__all__ = ["stack"]
