"""Wire layer of ``DeviceLinkService`` (LIVE-LINK-1 and the live device protocol).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.livestream.v1 import livestream_pb2_grpc


class DeviceLinkServicer(livestream_pb2_grpc.DeviceLinkServiceServicer):
    """Serves ``agentactivity.livestream.v1.DeviceLinkService``."""
