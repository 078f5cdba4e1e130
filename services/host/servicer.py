"""Wire layer of ``HostService`` and ``RuntimeLinkService`` (HOST-*).

``HostServicer`` composes one mixin per group of RPCs (``services/host/wire/``). Methods
no mixin overrides fall through to the generated base class, which the server
interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an RPC of the
contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.host.v1 import host_pb2_grpc, runtime_pb2_grpc
from services.host.context import HostContext
from services.host.wire.activity import ActivityRpcs
from services.host.wire.deletion import DeletionRpcs
from services.host.wire.interactions import InteractionRpcs
from services.host.wire.messages import MessageRpcs
from services.host.wire.projects import ProjectRpcs
from services.host.wire.runtime import RuntimeLinkRpcs
from services.host.wire.sessions import SessionRpcs
from services.host.wire.targets import TargetRpcs
from services.host.wire.turns import TurnRpcs
from services.host.wire.watch import WatchRpcs


class HostServicer(
    ActivityRpcs,
    WatchRpcs,
    TargetRpcs,
    ProjectRpcs,
    SessionRpcs,
    TurnRpcs,
    MessageRpcs,
    InteractionRpcs,
    DeletionRpcs,
    host_pb2_grpc.HostServiceServicer,
):
    """Serves ``agentactivity.host.v1.HostService``."""

    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx


class RuntimeLinkServicer(RuntimeLinkRpcs, runtime_pb2_grpc.RuntimeLinkServiceServicer):
    """Serves ``agentactivity.host.v1.RuntimeLinkService`` (HOST-RT-1)."""

    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx
