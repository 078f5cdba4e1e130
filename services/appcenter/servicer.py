"""Wire layer of ``AppCenterService`` (REF-BACKEND-1: the store-backed AppCenter backend).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.appcenter.v1 import appcenter_pb2_grpc


class AppCenterServicer(appcenter_pb2_grpc.AppCenterServiceServicer):
    """Serves ``agentactivity.appcenter.v1.AppCenterService``."""
