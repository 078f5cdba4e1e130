"""Where a Session's runtime resources live on disk, and how they are released (MAINT-OUT-1).

This package owns the on-disk layout of the per-Session resources a runtime creates under one
resource root (``TUTTI_RESOURCES_DIR``, default ``<data dir>/resources``) and the one function
that releases them after Host has purged a Session:

* Session-id-keyed resources (the runtime sidecar state directory and the copied-attachments
  directory), keyed by Session id only;
* workspace-keyed resources (the runtime's per-workspace per-Session scratch directory);
* the global releaser's resource (a per-Session agent lease under a global directory).

The demo runtime creates them; the maintenance service releases them. It imports nothing of
``services`` and no gRPC or protobuf types. It never reaches managed worktrees: every path it
touches is one of the four layout paths under the root, ids are single safe path components,
and symlinks are never followed.
"""

from session_resources.layout import ResourceLayout
from session_resources.release import (
    CleanupFacts,
    ReleaseOutcome,
    ResourceReleaseError,
    release_resources,
)

__all__ = [
    "CleanupFacts",
    "ReleaseOutcome",
    "ResourceLayout",
    "ResourceReleaseError",
    "release_resources",
]
