"""Shared value types and rules of Host: read records, cursor bounds and listing cursors, per-
Session mutation lanes.
"""
