"""Wire layer of ``ReferenceService`` (REF-API-1, REF-EXP-1, REF-SKILL-1).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.refresolve.v1 import refresolve_pb2_grpc


class ReferenceServicer(refresolve_pb2_grpc.ReferenceServiceServicer):
    """Serves ``agentactivity.refresolve.v1.ReferenceService``."""
