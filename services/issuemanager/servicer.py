"""Wire layer of ``IssueManagerService`` (REF-BACKEND-1: the store-backed IssueManager backend).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.issuemanager.v1 import issuemanager_pb2_grpc


class IssueManagerServicer(issuemanager_pb2_grpc.IssueManagerServiceServicer):
    """Serves ``agentactivity.issuemanager.v1.IssueManagerService``."""
