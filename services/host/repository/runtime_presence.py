"""Runtime presence rows (SCALE-2, ADR 0042): which Host replica holds which runtime's link.

Synchronous statements on a direct write or read connection (``ctx.write`` / ``ctx.read``, ADR
0034): one row per runtime, a handful of point statements per link event, and one statement per
heartbeat. Only Host with the shared bus (several replicas) writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

from sqlalchemy import Table, and_, bindparam, insert, select, update

from store.direct_reads import ReadConnection, ReadQuery
from store.direct_writes import WriteConnection, WriteStatement
from store.models import RuntimePresence

__all__ = [
    "PresenceRow",
    "attach",
    "attached_anywhere",
    "claim_expired",
    "detach",
    "live_rows",
    "release_replica",
    "renew",
]

_P = cast(Table, RuntimePresence.__table__)

_ROW_LOCKED: Final = ReadQuery(
    select(_P.c.instance_id).where(_P.c.runtime_id == bindparam("runtime_id")).with_for_update()
)
_INSERT: Final = WriteStatement(
    insert(_P).values(
        runtime_id=bindparam("runtime_id"),
        instance_id=bindparam("instance_id"),
        replica_id=bindparam("replica_id"),
        link_id=bindparam("link_id"),
        identity_json=bindparam("identity_json"),
        attached_at_unix_ms=bindparam("now"),
        lease_expires_at_unix_ms=bindparam("expires"),
        detached_at_unix_ms=None,
    )
)
_TAKE_OVER: Final = WriteStatement(
    update(_P)
    .where(_P.c.runtime_id == bindparam("runtime_id"))
    .values(
        instance_id=bindparam("instance_id"),
        replica_id=bindparam("replica_id"),
        link_id=bindparam("link_id"),
        identity_json=bindparam("identity_json"),
        attached_at_unix_ms=bindparam("now"),
        lease_expires_at_unix_ms=bindparam("expires"),
        detached_at_unix_ms=None,
    )
)
# Only the link that is still recorded: a newer link of the runtime (here or on another
# replica) already replaced the row, and its presence must stay.
_DETACH: Final = WriteStatement(
    update(_P)
    .where(
        and_(
            _P.c.runtime_id == bindparam("rt"),
            _P.c.replica_id == bindparam("replica"),
            _P.c.link_id == bindparam("link"),
        )
    )
    .values(replica_id=None, link_id=None, detached_at_unix_ms=bindparam("now"))
)
_RENEW: Final = WriteStatement(
    update(_P)
    .where(_P.c.replica_id == bindparam("replica"))
    .values(lease_expires_at_unix_ms=bindparam("expires"))
)
_RELEASE: Final = WriteStatement(
    update(_P)
    .where(_P.c.replica_id == bindparam("replica"))
    .values(replica_id=None, link_id=None, detached_at_unix_ms=bindparam("now"))
)
# One statement: exactly one replica claims each expired row (the row lock of the UPDATE).
_CLAIM_EXPIRED: Final = WriteStatement(
    update(_P)
    .where(and_(_P.c.replica_id.is_not(None), _P.c.lease_expires_at_unix_ms < bindparam("now")))
    .values(replica_id=None, link_id=None, detached_at_unix_ms=bindparam("now"))
    .returning(_P.c.runtime_id, _P.c.instance_id, _P.c.identity_json)
)
_LIVE: Final = ReadQuery(
    select(_P.c.runtime_id, _P.c.instance_id, _P.c.replica_id, _P.c.identity_json)
    .where(and_(_P.c.replica_id.is_not(None), _P.c.lease_expires_at_unix_ms >= bindparam("now")))
    .order_by(_P.c.attached_at_unix_ms)
)
_LIVE_ONE: Final = ReadQuery(
    select(_P.c.replica_id).where(
        and_(
            _P.c.runtime_id == bindparam("runtime_id"),
            _P.c.replica_id.is_not(None),
            _P.c.lease_expires_at_unix_ms >= bindparam("now"),
        )
    )
)


@dataclass(frozen=True)
class PresenceRow:
    """A runtime attached somewhere (or, from :func:`claim_expired`, one that was)."""

    runtime_id: str
    instance_id: str
    replica_id: str | None
    identity_json: str


def attach(
    conn: WriteConnection,
    *,
    runtime_id: str,
    instance_id: str,
    replica_id: str,
    link_id: str,
    identity_json: str,
    now: int,
    expires: int,
) -> str | None:
    """Record the runtime's link on ``replica_id``; the instance recorded before, if any.

    The row is locked first, so two replicas attaching the same runtime at once serialize and
    the later one sees the earlier one's instance.
    """
    params = {
        "runtime_id": runtime_id,
        "instance_id": instance_id,
        "replica_id": replica_id,
        "link_id": link_id,
        "identity_json": identity_json,
        "now": now,
        "expires": expires,
    }
    found = conn.first(_ROW_LOCKED, {"runtime_id": runtime_id})
    if found is None:
        conn.execute(_INSERT, params)
        return None
    conn.execute(_TAKE_OVER, params)
    return str(found.instance_id)


def detach(
    conn: WriteConnection, *, runtime_id: str, replica_id: str, link_id: str, now: int
) -> bool:
    """Record that this link ended; ``False`` when a newer link already took the row."""
    params = {"rt": runtime_id, "replica": replica_id, "link": link_id, "now": now}
    return conn.execute(_DETACH, params) > 0


def renew(conn: WriteConnection, *, replica_id: str, expires: int) -> int:
    """Extend the lease of every row of ``replica_id`` (the heartbeat); how many."""
    return conn.execute(_RENEW, {"replica": replica_id, "expires": expires})


def release_replica(conn: WriteConnection, *, replica_id: str, now: int) -> int:
    """Mark every row of ``replica_id`` detached (the replica stops)."""
    return conn.execute(_RELEASE, {"replica": replica_id, "now": now})


def claim_expired(conn: WriteConnection, *, now: int) -> list[PresenceRow]:
    """Detach the rows whose replica stopped renewing them; the rows this call claimed."""
    return [
        PresenceRow(str(runtime_id), str(instance_id), None, str(identity_json))
        for runtime_id, instance_id, identity_json in conn.returned(_CLAIM_EXPIRED, {"now": now})
    ]


def live_rows(conn: ReadConnection, *, now: int) -> list[PresenceRow]:
    """Every runtime attached to a replica whose lease still runs, oldest attachment first."""
    return [
        PresenceRow(row.runtime_id, row.instance_id, row.replica_id, row.identity_json)
        for row in conn.all(_LIVE, {"now": now})
    ]


def attached_anywhere(conn: ReadConnection, *, runtime_id: str, now: int) -> bool:
    """Whether ``runtime_id`` is attached to a replica whose lease still runs."""
    return conn.first(_LIVE_ONE, {"runtime_id": runtime_id, "now": now}) is not None
