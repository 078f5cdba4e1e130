"""The built-in demo runtime: a deterministic, no-network agent provider (HOST-RT-1, ARCH-3)."""
