"""A ``SendInput`` submission as a request: its values, validation, identity, replay rule.

What a submit is, independent of how it is written (``turns.submit_write``) and served
(``turns.submission``): the user message id ``client-submit:user:<client_submit_id>`` is the
idempotency record of every delivery (HOST-TURN-1), and an identical replay is told from a
conflicting one by the submission's fingerprint (a Turn) or its typed text (guidance).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from domainerrors import AlreadyExists, FieldViolation, InvalidArgument
from services.host.model.records import json_object
from services.host.repository.row_records import MessageRecord
from services.host.repository.row_views import MessageRow, TurnRow
from services.host.turns.reference_metadata import (
    ReferenceMeta,
    encode_references,
    validate_references,
)

DELIVERIES = ("new_turn", "guidance", "interrupt")
MAX_CONTENT_CHARS = 1_048_576
MAX_SUBMIT_ID_CHARS = 256


def user_message_id(client_submit_id: str) -> str:
    """The stable id of a submission's user row (HOST-TURN-1)."""
    return f"client-submit:user:{client_submit_id}"


@dataclass(frozen=True)
class Submission:
    """A validated ``SendInput`` request in domain terms."""

    workspace_id: str
    session_id: str
    client_submit_id: str
    delivery: str
    target_turn_id: str | None
    mode: str
    content: str
    references: tuple[ReferenceMeta, ...] = ()

    def fingerprint(self) -> str:
        """Digest of everything that makes two submissions the same one."""
        body = {
            "delivery": self.delivery,
            "target_turn_id": self.target_turn_id,
            "mode": self.mode,
            "content": self.content,
            "references": encode_references(self.references),
        }
        encoded = json.dumps(body, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(encoded).hexdigest()


def validate(submission: Submission, *, field_prefix: str = "", rpc: str = "SendInput") -> None:
    """Reject malformed input before anything is read (SEC-2, HOST-TURN-3).

    Args:
        submission: the request in domain terms.
        field_prefix: request path of the submission fields (``initial_input.`` when
            ``CreateSession`` carries the first input).
        rpc: the RPC named in the error message.

    Raises:
        InvalidArgument: reason ``INVALID_REFERENCES`` for malformed references (checked
            first), else with one violation per bad field.
    """
    validate_references(submission.references, field=f"{field_prefix}references")
    violations: list[FieldViolation] = []

    def bad(name: str, description: str) -> None:
        violations.append(FieldViolation(f"{field_prefix}{name}", description))

    if not submission.session_id:
        bad("session_id", "must name a Session")
    if not submission.client_submit_id:
        bad("client_submit_id", "is required")
    elif len(submission.client_submit_id) > MAX_SUBMIT_ID_CHARS:
        bad("client_submit_id", f"must be at most {MAX_SUBMIT_ID_CHARS} characters")
    if submission.delivery not in DELIVERIES:
        bad("delivery", "must be new_turn, guidance or interrupt")
    if submission.delivery == "guidance" and not submission.target_turn_id:
        bad("target_turn_id", "is required for guidance")
    if submission.delivery != "guidance" and submission.target_turn_id is not None:
        bad("target_turn_id", "is only allowed for guidance")
    if not submission.content.strip() and not submission.references:
        bad("content", "must not be empty")
    if len(submission.content) > MAX_CONTENT_CHARS:
        bad("content", "is larger than 1 MiB")
    if violations:
        raise InvalidArgument(
            f"invalid {rpc}: {violations[0].field} {violations[0].description}",
            field_violations=violations,
        )


def check_replay(
    submission: Submission, message: MessageRow | MessageRecord, turn: TurnRow | None
) -> None:
    """Accept an identical earlier submission as a replay; refuse anything else.

    ``message`` is the row the earlier submission wrote and ``turn`` the Turn found by its
    ``client_submit_id`` (none for guidance).

    Raises:
        AlreadyExists: ``CLIENT_SUBMIT_CONFLICT``.
    """
    if turn is not None:
        same = turn.submit_fingerprint == submission.fingerprint()
    else:
        # A guidance row: its identity is the guided Turn, the typed text and references.
        typed = message.command if message.command is not None else _text(message)
        same = (
            submission.delivery == "guidance"
            and message.turn_id == submission.target_turn_id
            and typed == submission.content
            and message.references_json == encode_references(submission.references)
        )
    if not same:
        raise AlreadyExists(
            f"client_submit_id {submission.client_submit_id!r} was used for another submission",
            reason="CLIENT_SUBMIT_CONFLICT",
            metadata={"client_submit_id": submission.client_submit_id},
        )


def _text(message: MessageRow | MessageRecord) -> str:
    text = json_object(message.payload_json).get("text")
    return text if isinstance(text, str) else ""


def restored_input(message: MessageRow | MessageRecord | None) -> str | None:
    """The text a composer restores after a stop: ``command`` when rewritten, else content."""
    if message is None:
        return None
    return message.command if message.command is not None else _text(message)


__all__: Sequence[str] = (
    "DELIVERIES",
    "Submission",
    "check_replay",
    "restored_input",
    "user_message_id",
    "validate",
)
