"""The suite's services, one package each.

They share the contracts, the store and the server bootstrap, and never import each other (the
import contracts in ``pyproject.toml``).
"""
