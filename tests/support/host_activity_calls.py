"""HostService calls that the Host activity tests repeat.

A response to an Interaction and its operation, the attention items, and a Session's Turns
and messages, each as one call on the test's ``HostServiceStub``. They call as the
``ws1-device`` principal in workspace ``ws-1``. The Session defaults to ``s1`` and the
Interaction to request ``q1``: the Session that ``tests.integration.host_activity.start_host``
creates and the request id the tests report with ``interaction(turn_id, "q1")``
(``tests.support.runtime_client``).
"""

from __future__ import annotations

from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from tests.support.host_sessions import WS1

__all__ = [
    "REQUEST_ID",
    "SESSION_ID",
    "WORKSPACE_ID",
    "attention_items",
    "response_operation",
    "session_messages",
    "session_turn",
    "submit_response",
]

WORKSPACE_ID = "ws-1"
"""The workspace the calls are made in (``ws1-device`` belongs to it)."""
SESSION_ID = "s1"
"""The Session the calls default to."""
REQUEST_ID = "q1"
"""The Interaction request id the calls default to."""


def submit_response(
    stub: host_pb2_grpc.HostServiceStub,
    turn_id: str,
    idempotency_key: str,
    action: str = "allow",
    *,
    session_id: str = SESSION_ID,
    request_id: str = REQUEST_ID,
    **fields: Any,
) -> host_pb2.SubmitInteractionResponseResponse:
    """``SubmitInteractionResponse`` to the Interaction ``request_id`` of ``turn_id``.

    ``fields`` are further request fields (``payload_json``, ``wait_timeout_ms``).
    """
    response: host_pb2.SubmitInteractionResponseResponse = stub.SubmitInteractionResponse(
        host_pb2.SubmitInteractionResponseRequest(
            workspace_id=WORKSPACE_ID,
            session_id=session_id,
            turn_id=turn_id,
            request_id=request_id,
            action=action,
            idempotency_key=idempotency_key,
            **fields,
        ),
        metadata=WS1,
    )
    return response


def response_operation(
    stub: host_pb2_grpc.HostServiceStub, operation_id: str
) -> host_pb2.InteractionResponseOperation:
    """The Interaction response operation ``operation_id`` (``GetInteractionResponseOperation``)."""
    operation: host_pb2.InteractionResponseOperation = stub.GetInteractionResponseOperation(
        host_pb2.GetInteractionResponseOperationRequest(
            workspace_id=WORKSPACE_ID, operation_id=operation_id
        ),
        metadata=WS1,
    ).operation
    return operation


def attention_items(stub: host_pb2_grpc.HostServiceStub) -> list[host_pb2.AttentionItem]:
    """The workspace's attention items (``ListAttentionItems``)."""
    response: host_pb2.ListAttentionItemsResponse = stub.ListAttentionItems(
        host_pb2.ListAttentionItemsRequest(workspace_id=WORKSPACE_ID), metadata=WS1
    )
    return list(response.items)


def session_messages(
    stub: host_pb2_grpc.HostServiceStub, **fields: Any
) -> host_pb2.ListSessionMessagesResponse:
    """One page of a Session's messages (``ListSessionMessages``).

    ``fields`` are request fields: the paging ones (``limit``, ``order``, ``after_version``,
    ``before_version``) and ``session_id``, ``s1`` unless given. They are not keyword
    parameters, so a test can pass any ``dict`` of them, invalid values included.
    """
    fields.setdefault("session_id", SESSION_ID)
    response: host_pb2.ListSessionMessagesResponse = stub.ListSessionMessages(
        host_pb2.ListSessionMessagesRequest(workspace_id=WORKSPACE_ID, **fields),
        metadata=WS1,
    )
    return response


def session_turn(
    stub: host_pb2_grpc.HostServiceStub, turn_id: str, *, session_id: str = SESSION_ID
) -> canonical_pb2.Turn:
    """The Turn ``turn_id`` as ``ListSessionTurns`` of its Session returns it (first page)."""
    turns = stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WORKSPACE_ID, session_id=session_id),
        metadata=WS1,
    ).turns
    found: canonical_pb2.Turn = next(t for t in turns if t.turn_id == turn_id)
    return found
