"""Sessions and what they launch on: lifecycle commands and the canonical read, rail listings,
agent targets, projects, the settings catalog and the @-menu catalog.
"""
