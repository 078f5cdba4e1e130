"""Shared value types and rules of Host, below the domain packages and the repositories.

It owns the read records, cursor bounds and listing cursors, the per-Session mutation lanes and
the Session id rules.
"""
