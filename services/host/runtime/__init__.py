"""The runtime side: the RuntimeLink rules, decoded reports, the registry of connected runtimes and
the live-settings port.
"""
