"""Competing responders to one Interaction (HOST-INT-5).

A second ``SubmitInteractionResponse`` under a new idempotency key, for an Interaction another
operation already claimed, is no error and is never dispatched: it gets its own operation,
``superseded`` when its answer differs from the claimed one, otherwise following the
claimant (``answered`` only when the claimant completes answered). An Interaction nobody
claimed that is no longer pending still refuses responses.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import func, select, update

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from store.engine import create_sync_engine_for
from store.models import Interaction, InteractionResponseOperation, RuntimeCommandOutbox
from tests.integration.host_activity import WS, HostUnderTest, error_reason, start_host
from tests.support.host_activity_calls import response_operation, submit_response
from tests.support.runtime_client import (
    ScriptedRuntime,
    interaction,
    interaction_disposition,
    turn_patch,
)
from tests.support.servers import LiveServer

COMPLETED = host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
RESOLVING = host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_RESOLVING
ANSWERED = canonical_pb2.INTERACTION_STATUS_ANSWERED
SUPERSEDED = canonical_pb2.INTERACTION_STATUS_SUPERSEDED


def _claimed(
    host: HostUnderTest,
) -> tuple[ScriptedRuntime, str, host_pb2.InteractionResponseOperation, runtime_pb2.RuntimeCommand]:
    """``_pending`` answered under key ``k1``: the claimant and its delivery command."""
    runtime, turn_id = host.pending_interaction()
    claim = submit_response(host.stub, turn_id, "k1", payload_json='{"remember":true}').operation
    command = runtime.next_command()
    assert command.deliver_interaction_response.operation_id == claim.operation_id
    runtime.ack(command.command_id)
    return runtime, turn_id, claim, command


def _commands_of(host: HostUnderTest, operation_id: str) -> int:
    """Outbox rows ever kept for ``operation_id`` (a follower must have none)."""
    engine = create_sync_engine_for(host.url)
    try:
        with engine.connect() as connection:
            count = connection.execute(
                select(func.count())
                .select_from(RuntimeCommandOutbox)
                .where(RuntimeCommandOutbox.operation_id == operation_id)
            ).scalar_one()
    finally:
        engine.dispose()
    return int(count)


def _dispose(
    runtime: ScriptedRuntime,
    turn_id: str,
    claim: host_pb2.InteractionResponseOperation,
    command: runtime_pb2.RuntimeCommand,
    disposition: int,
    report_id: str = "r-disposition",
) -> None:
    result = runtime.report(
        WS,
        "s1",
        report_id,
        interaction_disposition(
            turn_id,
            "q1",
            disposition,
            operation_id=claim.operation_id,
            command_id=command.command_id,
        ),
    )
    assert result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, result


@pytest.mark.spec("HOST-INT-5")
def test_a_competing_responder_with_the_same_answer_follows_the_claimant_to_answered(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id, claim, command = _claimed(host)
    claimed = response_operation(host.stub, claim.operation_id).interaction

    # The same answer (the payload compared as JSON, not as text) under another key.
    second = submit_response(host.stub, turn_id, "k2", payload_json='{"remember": true}')
    follower = second.operation
    assert not second.replayed
    assert follower.operation_id != claim.operation_id
    assert (follower.status, follower.disposition) == (
        RESOLVING,
        canonical_pb2.INTERACTION_STATUS_UNSPECIFIED,
    )
    # The Interaction and its claim are unchanged, and nothing was sent for the follower.
    assert follower.interaction == claimed
    assert follower.interaction.answer.payload_json == '{"remember":true}'
    assert _commands_of(host, follower.operation_id) == 0
    # Its own key replays it, like any operation.
    replay = submit_response(host.stub, turn_id, "k2", payload_json='{"remember": true}')
    assert replay.replayed
    assert replay.operation.operation_id == follower.operation_id

    _dispose(runtime, turn_id, claim, command, ANSWERED)
    done = response_operation(host.stub, follower.operation_id)
    assert (done.status, done.disposition) == (COMPLETED, ANSWERED)
    assert done.interaction.status == ANSWERED
    assert response_operation(host.stub, claim.operation_id).disposition == ANSWERED

    # After the claimant completed: the same answer is answered at once, another superseded.
    late = submit_response(host.stub, turn_id, "k3", payload_json='{"remember":true}').operation
    assert (late.status, late.disposition) == (COMPLETED, ANSWERED)
    other = submit_response(host.stub, turn_id, "k4", action="deny").operation
    assert (other.status, other.disposition) == (COMPLETED, SUPERSEDED)
    assert runtime.commands.empty()  # no follower was ever dispatched
    runtime.close()


@pytest.mark.spec("HOST-INT-5")
def test_a_competing_responder_with_another_answer_is_superseded_whatever_the_claimant_does(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id, claim, command = _claimed(host)
    variants = {
        "k-action": {"action": "deny", "payload_json": '{"remember":true}'},
        "k-option": {"option_id": "always", "payload_json": '{"remember":true}'},
        "k-payload": {"payload_json": '{"remember":false}'},
    }
    followers = {}
    for key, fields in variants.items():
        operation = submit_response(host.stub, turn_id, key, **fields).operation
        assert (operation.status, operation.disposition) == (COMPLETED, SUPERSEDED), key
        assert operation.interaction.status == canonical_pb2.INTERACTION_STATUS_RESOLVING
        assert operation.interaction.answer.action == "allow"  # the claim stays
        assert _commands_of(host, operation.operation_id) == 0
        followers[key] = operation.operation_id

    _dispose(runtime, turn_id, claim, command, ANSWERED)
    for key, operation_id in followers.items():
        assert response_operation(host.stub, operation_id).disposition == SUPERSEDED, key
    runtime.close()


def _interrupted_by_the_runtime(
    runtime: ScriptedRuntime,
    turn_id: str,
    claim: host_pb2.InteractionResponseOperation,
    command: runtime_pb2.RuntimeCommand,
) -> int:
    _dispose(runtime, turn_id, claim, command, canonical_pb2.INTERACTION_STATUS_INTERRUPTED)
    return canonical_pb2.INTERACTION_STATUS_INTERRUPTED


def _session_lost(
    runtime: ScriptedRuntime,
    turn_id: str,
    claim: host_pb2.InteractionResponseOperation,
    command: runtime_pb2.RuntimeCommand,
) -> int:
    lost = runtime_pb2.ReportItem(session_lost=runtime_pb2.RuntimeSessionLost(reason="exited"))
    assert runtime.report(WS, "s1", "r-lost", lost).outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    return SUPERSEDED


@pytest.mark.spec("HOST-INT-5")
@pytest.mark.parametrize("ending", [_interrupted_by_the_runtime, _session_lost])
def test_a_claimant_that_is_not_answered_supersedes_its_followers(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    ending: Callable[..., int],
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id, claim, command = _claimed(host)
    follower = submit_response(host.stub, turn_id, "k2", payload_json='{"remember":true}')
    assert follower.operation.status == RESOLVING

    claimant_outcome = ending(runtime, turn_id, claim, command)
    assert response_operation(host.stub, claim.operation_id).disposition == claimant_outcome
    done = response_operation(host.stub, follower.operation.operation_id)
    assert (done.status, done.disposition) == (COMPLETED, SUPERSEDED)
    # A responder arriving afterwards follows the same way.
    late = submit_response(host.stub, turn_id, "k3", payload_json='{"remember":true}').operation
    assert (late.status, late.disposition) == (COMPLETED, SUPERSEDED)
    runtime.close()


def _operations(host: HostUnderTest) -> int:
    engine = create_sync_engine_for(host.url)
    try:
        with engine.connect() as connection:
            count = connection.execute(
                select(func.count()).select_from(InteractionResponseOperation)
            ).scalar_one()
    finally:
        engine.dispose()
    return int(count)


@pytest.mark.spec("HOST-INT-5")
@pytest.mark.parametrize("how", ["superseded_by_the_runtime", "turn_settled"])
def test_an_unclaimed_interaction_that_is_no_longer_pending_is_not_actionable(
    migrated_db_url: str, live_server: Callable[..., LiveServer], how: str
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = host.pending_interaction()
    if how == "superseded_by_the_runtime":
        runtime.report(WS, "s1", "r2", interaction(turn_id, "q1", SUPERSEDED))
    else:
        runtime.report(
            WS,
            "s1",
            "r2",
            turn_patch(
                turn_id,
                canonical_pb2.TURN_PHASE_SETTLED,
                outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
            ),
        )
    for key in ("k1", "k2"):
        with pytest.raises(grpc.RpcError) as refused:
            submit_response(host.stub, turn_id, key)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(refused.value) == "INTERACTION_NOT_ACTIONABLE"
    assert _operations(host) == 0  # the refusal changed nothing
    runtime.close()


def _forget_claimant_id(host: HostUnderTest, turn_id: str) -> None:
    """Rewrite the claim as stored before the claimant's id was kept with the answer.

    Read, then written in a transaction of its own: a SQLite transaction that read before the
    Host's last write cannot write (``database is locked`` at once, whatever the busy wait).
    """
    engine = create_sync_engine_for(host.url)
    where = (Interaction.turn_id == turn_id, Interaction.request_id == "q1")
    try:
        with engine.connect() as connection:
            text = connection.execute(select(Interaction.answer_json).where(*where)).scalar_one()
        assert text is not None
        stored = json.loads(text)
        assert stored.pop("operation_id")
        with engine.begin() as connection:
            connection.execute(
                update(Interaction).where(*where).values(answer_json=json.dumps(stored))
            )
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-INT-5")
def test_a_legacy_claim_still_supersedes_its_followers(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id, claim, command = _claimed(host)
    follower = submit_response(host.stub, turn_id, "k2", payload_json='{"remember":true}')
    assert follower.operation.status == RESOLVING
    # The claimant is then the Interaction's earliest operation, for completion as for reads.
    _forget_claimant_id(host, turn_id)

    _interrupted_by_the_runtime(runtime, turn_id, claim, command)
    assert (
        response_operation(host.stub, claim.operation_id).disposition
        == canonical_pb2.INTERACTION_STATUS_INTERRUPTED
    )
    done = response_operation(host.stub, follower.operation.operation_id)
    assert (done.status, done.disposition) == (COMPLETED, SUPERSEDED)
    assert done.detail == f"follows {claim.operation_id}"
    runtime.close()
