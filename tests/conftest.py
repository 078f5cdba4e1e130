"""Shared pytest configuration: spec markers, backend fixtures and live servers.

Fixtures live in ``tests/support/`` modules named for what they provide.
"""

pytest_plugins = [
    "tests.support.spec",
    "tests.support.database",
    "tests.support.servers",
    "tests.support.references",
    "tests.support.hypothesis_profiles",
    "tests.support.nats_server",
]
