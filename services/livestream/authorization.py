"""Who may call each DeviceLinkService RPC, and where its workspace comes from (SEC-3).

The one authorization table of livestream; the server interceptor enforces it before
any handler runs (see :mod:`grpcserver.authorization`). A DeviceLink names its workspace
scope in its first message (the hello), which the interceptor checks before the handler
sees the stream; the link's attaches stay inside that scope (LIVE-LINK-1).
"""

from __future__ import annotations

from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.auth import Role
from grpcserver.authorization import ServiceAuthorization, first_message, optional_workspace

DEVICE_LINK_SERVICE = ServiceAuthorization(
    livestream_pb2.DESCRIPTOR.services_by_name["DeviceLinkService"],
    {
        # A first message that is not a hello (or names no workspace) breaks the live
        # protocol: PROTOCOL_VIOLATION, as the contract says (LIVE-LINK-1).
        "DeviceLink": first_message(
            Role.DEVICE,
            Role.ADMIN,
            path="hello.workspace_ids",
            missing_reason="PROTOCOL_VIOLATION",
        ),
        "ListPublishers": optional_workspace(Role.DEVICE, Role.ADMIN),
    },
)

AUTHORIZATION = (DEVICE_LINK_SERVICE,)
"""The tables of every service the livestream server serves."""
