"""Contract conformance: replay data fixtures against a live implementation (CON-3).

Fixtures are YAML files of proto3-JSON requests and expected responses or typed
errors (``tests/contract/fixtures/``). They are data, not Python, so any other
implementation of the contracts can be checked with them:
``tutti conformance run FIXTURE... --address host=HOST:PORT --token admin=TOKEN``.
"""
