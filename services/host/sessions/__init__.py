"""Sessions and what they launch on.

It owns the lifecycle commands and the canonical read, rail listings, agent targets, projects,
the settings catalog and the @-menu catalog.
"""
