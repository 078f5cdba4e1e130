"""Wire layer of ``HostService`` (HOST-*: the canonical lifecycle).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.host.v1 import host_pb2_grpc


class HostServicer(host_pb2_grpc.HostServiceServicer):
    """Serves ``agentactivity.host.v1.HostService``."""
