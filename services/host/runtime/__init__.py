"""The runtime side of Host: what connected runtimes report and what they are told.

It owns the RuntimeLink rules, decoded reports, the registry of connected runtimes and the
live-settings port.
"""
