"""Runtime-side normalization of cumulative provider snapshots into live delta operations.

Only a runtime adapter produces deltas (HOST-RT-2); Host and livestream never diff snapshots.
This package is what adapters (the built-in demo runtime included) use to do it: it keeps
per-message state and turns each cumulative snapshot into ``set`` / ``append_text`` operations,
with a bounded pre-anchor buffer for tool output. It is pure: no transport, no contracts.
"""

from delta_normalizer.normalizer import DeltaNormalizer, DeltaOp, PreAnchorBudget

__all__ = ["DeltaNormalizer", "DeltaOp", "PreAnchorBudget"]
