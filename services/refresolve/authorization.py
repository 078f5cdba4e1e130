"""Who may call each ReferenceService RPC, and where its workspace comes from (SEC-3).

The one authorization table of refresolve; the server interceptor enforces it before
any handler runs (see :mod:`grpcserver.authorization`). Every RPC resolves references of
one workspace (a mention URI must name the same workspace, checked by the handler).
"""

from __future__ import annotations

from agentactivity.refresolve.v1 import refresolve_pb2
from grpcserver.authorization import ANY_ROLE, ServiceAuthorization, workspace_field

REFERENCE_SERVICE = ServiceAuthorization(
    refresolve_pb2.DESCRIPTOR.services_by_name["ReferenceService"],
    {
        "ListReferences": workspace_field(*ANY_ROLE),
        "ResolveMention": workspace_field(*ANY_ROLE),
        "ExpandMentions": workspace_field(*ANY_ROLE),
        "GetReferenceSkill": workspace_field(*ANY_ROLE),
    },
)

AUTHORIZATION = (REFERENCE_SERVICE,)
"""The tables of every service the refresolve server serves."""
