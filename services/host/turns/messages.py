"""Transcript messages: version-cursor paging and snapshot writes (HOST-MSG-1, HOST-MSG-2).

Every write takes the next Session ``message_version`` as the message's ``version``; a new
message also takes the next ``sequence``, which never changes afterwards. A snapshot's
``user_visible_assistant_response`` is its producer's classification, stored verbatim: Host
never derives it from role or kind (HOST-MSG-1); it classifies only the rows it writes itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import InvalidArgument
from services.host.context import HostContext
from services.host.model.cursor_bounds import parse_cursor_argument
from services.host.model.session_rules import session_not_found
from services.host.repository import hot_reads
from services.host.repository.row_records import MessageRecord
from services.host.repository.row_views import MessageRow, SessionRow
from services.host.repository.unit_of_work import HostTransaction

DEFAULT_MESSAGE_PAGE = 200
MAX_MESSAGE_PAGE = 1000


@dataclass(frozen=True)
class MessagePage:
    """A page of messages and the Session's high-water version."""

    messages: list[MessageRecord]
    latest_version: int
    has_more: bool


async def list_messages(
    ctx: HostContext,
    workspace_id: str,
    session_id: str,
    *,
    after_version: int | None,
    before_version: int | None,
    limit: int,
    descending: bool,
) -> MessagePage:
    """Page messages strictly between the version bounds (HOST-MSG-2).

    Raises:
        InvalidArgument: a cursor outside ``[0, 2^53-1]`` or a negative limit.
        NotFound: ``SESSION_NOT_FOUND``.
    """
    if after_version is not None:
        parse_cursor_argument(after_version, field="after_version")
    if before_version is not None:
        parse_cursor_argument(before_version, field="before_version")
    if limit < 0:
        raise InvalidArgument.for_field("limit", "must not be negative")
    size = min(limit or DEFAULT_MESSAGE_PAGE, MAX_MESSAGE_PAGE)

    found = await ctx.read(
        lambda conn: hot_reads.message_page(
            conn,
            workspace_id,
            session_id,
            after_version=after_version,
            before_version=before_version,
            limit=size + 1,
            descending=descending,
        ),
        one_statement=True,
    )
    if found is None:
        raise session_not_found(workspace_id, session_id)
    latest_version, rows = found
    return MessagePage(rows[:size], latest_version, len(rows) > size)


@dataclass(frozen=True)
class SnapshotWrite:
    """What writing a snapshot did: ``changed`` false for an exact replay."""

    changed: bool
    message: MessageRow


async def write_snapshot(
    repos: HostTransaction,
    session: SessionRow,
    *,
    message_id: str,
    turn_id: str | None,
    role: str,
    kind: str,
    payload_json: str,
    user_visible_assistant_response: bool,
    occurred_at_unix_ms: int,
    now: int,
) -> SnapshotWrite:
    """Insert or update one message; an identical snapshot changes nothing.

    ``user_visible_assistant_response`` is the producer's classification, stored as given
    (HOST-MSG-1); a changed classification is a change like any other.
    """
    existing = await repos.messages.get(session.workspace_id, session.session_id, message_id)
    if existing is not None:
        if (
            existing.payload_json == payload_json
            and existing.kind == kind
            and existing.role == role
            and existing.user_visible_assistant_response == user_visible_assistant_response
        ):
            return SnapshotWrite(False, existing)
        repos.messages.update(
            existing,
            payload_json=payload_json,
            kind=kind,
            role=role,
            user_visible_assistant_response=user_visible_assistant_response,
            version=repos.session_rows.next_message_version(session),
            occurred_at_unix_ms=occurred_at_unix_ms,
            updated_at_unix_ms=now,
        )
        repos.session_rows.update(session, updated_at_unix_ms=max(session.updated_at_unix_ms, now))
        return SnapshotWrite(True, existing)
    sequence, version = repos.session_rows.next_message_cursor(session)
    message = repos.messages.add(
        workspace_id=session.workspace_id,
        session_id=session.session_id,
        message_id=message_id,
        sequence=sequence,
        version=version,
        turn_id=turn_id,
        occurred_at_unix_ms=occurred_at_unix_ms,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
        role=role,
        kind=kind,
        payload_json=payload_json,
        user_visible_assistant_response=user_visible_assistant_response,
    )
    repos.session_rows.update(session, updated_at_unix_ms=max(session.updated_at_unix_ms, now))
    return SnapshotWrite(True, message)
