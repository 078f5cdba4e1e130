"""Migrations and database-enforced integrity of the canonical store, on SQLite and Postgres.

STORE-1: one schema, the same migrations on both backends, SQLite in WAL mode with foreign keys.
STORE-2: referential integrity (including exact ``active_turn_id`` ownership) is enforced by the
database itself, so these tests write rows directly and expect ``IntegrityError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, delete, func, insert, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from store import migrate
from store.engine import create_async_engine_for, create_sync_engine_for
from store.models import (
    ActivityEvent,
    Base,
    Interaction,
    InteractionResponseOperation,
    Message,
    Session,
    Turn,
)
from tests.migrations.rows import (
    NOW_MS,
    WORKSPACE,
    activity_event_row,
    interaction_row,
    message_row,
    session_row,
    turn_row,
)

# --------------------------------------------------------------------------------------------
# Migrations
# --------------------------------------------------------------------------------------------


def _tables(url: str) -> set[str]:
    engine = create_sync_engine_for(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


@pytest.mark.spec("STORE-1")
def test_upgrade_empty_database_to_head(empty_db_url: str) -> None:
    assert migrate.current(empty_db_url) is None

    migrate.upgrade(empty_db_url)

    assert migrate.current(empty_db_url) == migrate.head()
    assert _tables(empty_db_url) == set(Base.metadata.tables)
    migrate.check(empty_db_url)


@pytest.mark.spec("STORE-1")
def test_migrated_database_has_no_drift(migrated_db_url: str) -> None:
    assert migrate.compare(migrated_db_url) == []
    migrate.check(migrated_db_url)


@pytest.mark.spec("STORE-1")
def test_check_reports_drift_and_unmigrated_databases(
    empty_db_url: str, migrated_db_url: str
) -> None:
    with pytest.raises(migrate.SchemaDriftError, match="expected head"):
        migrate.check(empty_db_url)

    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE sessions ADD COLUMN rogue BIGINT"))
    finally:
        engine.dispose()
    with pytest.raises(migrate.SchemaDriftError) as raised:
        migrate.check(migrated_db_url)
    assert raised.value.diffs


@pytest.mark.spec("STORE-1")
def test_downgrade_to_base_and_upgrade_again(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)

    migrate.downgrade(empty_db_url, "base")

    assert migrate.current(empty_db_url) is None
    assert _tables(empty_db_url) == set()

    migrate.upgrade(empty_db_url)

    assert migrate.current(empty_db_url) == migrate.head()
    migrate.check(empty_db_url)


@pytest.mark.spec("STORE-1")
def test_upgrade_at_head_is_a_no_op(migrated_db_url: str) -> None:
    migrate.upgrade(migrated_db_url)
    assert migrate.current(migrated_db_url) == migrate.head()


# --------------------------------------------------------------------------------------------
# STORE-1: engine configuration
# --------------------------------------------------------------------------------------------


def _pragma(connection: Connection, name: str) -> Any:
    return connection.exec_driver_sql(f"PRAGMA {name}").scalar()


@pytest.mark.spec("STORE-1")
def test_sync_engine_configures_every_connection(backend: str, sync_engine: Engine) -> None:
    if backend == "postgres":
        assert sync_engine.dialect.driver == "psycopg"
        return
    # Two pooled connections: the settings hold on every connection, not just the first.
    with sync_engine.connect() as first, sync_engine.connect() as second:
        for connection in (first, second):
            assert str(_pragma(connection, "journal_mode")).lower() == "wal"
            assert _pragma(connection, "foreign_keys") == 1
            assert _pragma(connection, "busy_timeout") > 0


@pytest.mark.spec("STORE-1")
def test_async_engine_configures_every_connection(backend: str, migrated_db_url: str) -> None:
    async def probe() -> list[tuple[Any, Any]]:
        engine = create_async_engine_for(migrated_db_url)
        try:
            if backend == "postgres":
                assert engine.dialect.driver == "psycopg"
                assert engine.dialect.is_async
                return []
            results = []
            async with engine.connect() as first, engine.connect() as second:
                for connection in (first, second):
                    mode = await connection.exec_driver_sql("PRAGMA journal_mode")
                    keys = await connection.exec_driver_sql("PRAGMA foreign_keys")
                    results.append((mode.scalar(), keys.scalar()))
            return results
        finally:
            await engine.dispose()

    for mode, keys in asyncio.run(probe()):
        assert str(mode).lower() == "wal"
        assert keys == 1


# --------------------------------------------------------------------------------------------
# STORE-2: referential integrity enforced by the database
# --------------------------------------------------------------------------------------------


def _seed_two_sessions(engine: Engine) -> None:
    """Sessions s-1 and s-2, each with Turn t-1; s-2 also has Turn t-2."""
    with engine.begin() as connection:
        connection.execute(insert(Session), [session_row("s-1"), session_row("s-2")])
        connection.execute(
            insert(Turn),
            [turn_row("s-1", "t-1"), turn_row("s-2", "t-1"), turn_row("s-2", "t-2")],
        )


def _insert(model: type[Base], row: dict[str, Any]) -> Callable[[Connection], object]:
    return lambda connection: connection.execute(insert(model).values(**row))


def _activate(session_id: str, turn_id: str | None) -> Callable[[Connection], object]:
    return lambda connection: connection.execute(
        update(Session)
        .where(Session.workspace_id == WORKSPACE, Session.session_id == session_id)
        .values(active_turn_id=turn_id)
    )


VIOLATIONS: dict[str, Callable[[Connection], object]] = {
    "turn-for-missing-session": _insert(Turn, turn_row("s-missing", "t-9")),
    "turn-in-other-workspace-session": _insert(Turn, turn_row("s-1", "t-9", workspace_id="ws-2")),
    "message-for-missing-session": _insert(Message, message_row("s-missing")),
    "message-with-turn-of-another-session": _insert(
        Message, message_row("s-1", "m-9", turn_id="t-2")
    ),
    "message-with-missing-turn": _insert(Message, message_row("s-1", "m-9", turn_id="t-404")),
    "interaction-for-missing-turn": _insert(Interaction, interaction_row("s-1", "t-404")),
    "interaction-with-turn-of-another-session": _insert(Interaction, interaction_row("s-1", "t-2")),
    "active-turn-of-another-session": _activate("s-1", "t-2"),
    "active-turn-nonexistent": _activate("s-1", "t-404"),
    "session-with-missing-parent": _insert(
        Session, session_row("s-9", parent_session_id="s-missing", root_session_id="s-missing")
    ),
    "response-operation-for-missing-interaction": _insert(
        InteractionResponseOperation,
        {
            "workspace_id": WORKSPACE,
            "operation_id": "op-1",
            "idempotency_key": "k-1",
            "session_id": "s-1",
            "turn_id": "t-1",
            "request_id": "r-404",
            "request_fingerprint": "f",
            "action": "allow",
            "state": "pending",
            "created_at_unix_ms": NOW_MS,
            "updated_at_unix_ms": NOW_MS,
        },
    ),
}


@pytest.mark.spec("STORE-2")
@pytest.mark.parametrize("violation", sorted(VIOLATIONS))
def test_database_rejects_dangling_references(sync_engine: Engine, violation: str) -> None:
    _seed_two_sessions(sync_engine)

    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        VIOLATIONS[violation](connection)

    # The failed write changed nothing: the seed is intact and usable.
    with sync_engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(Turn)) == 3
        assert connection.scalar(select(func.count()).select_from(Message)) == 0


@pytest.mark.spec("STORE-2")
def test_valid_references_are_accepted(sync_engine: Engine) -> None:
    _seed_two_sessions(sync_engine)

    with sync_engine.begin() as connection:
        _activate("s-1", "t-1")(connection)
        _activate("s-2", "t-2")(connection)
        connection.execute(
            insert(Message),
            [
                message_row("s-1", "m-0", sequence=1),  # turnless: session-scoped content
                message_row("s-1", "m-1", sequence=2, turn_id="t-1"),
                message_row("s-2", "m-1", sequence=1, turn_id="t-2"),
            ],
        )
        connection.execute(
            insert(Interaction),
            [interaction_row("s-1", "t-1", "r-1"), interaction_row("s-2", "t-1", "r-1")],
        )
        # A child Session in the same workspace.
        connection.execute(
            insert(Session).values(
                **session_row("s-3", parent_session_id="s-1", root_session_id="s-1")
            )
        )
        # Clearing the active reference is always allowed (MATCH SIMPLE on NULL).
        _activate("s-2", None)(connection)

    with sync_engine.connect() as connection:
        active = connection.execute(
            select(Session.session_id, Session.active_turn_id).order_by(Session.session_id)
        ).all()
    assert [tuple(row) for row in active] == [("s-1", "t-1"), ("s-2", None), ("s-3", None)]


@pytest.mark.spec("STORE-2")
def test_same_session_id_may_exist_in_several_workspaces(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        connection.execute(
            insert(Session), [session_row("s-1"), session_row("s-1", workspace_id="ws-2")]
        )
        connection.execute(
            insert(Turn), [turn_row("s-1", "t-1"), turn_row("s-1", "t-1", workspace_id="ws-2")]
        )
        # A Turn of the same id in another workspace is still not this Session's Turn.
        connection.execute(
            update(Session)
            .where(Session.workspace_id == "ws-2", Session.session_id == "s-1")
            .values(active_turn_id="t-1")
        )
    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(delete(Turn).where(Turn.workspace_id == "ws-2"))


def _seed_tree(connection: Connection) -> None:
    """Root r with child c; each owns a settled Turn, Messages and an Interaction."""
    connection.execute(
        insert(Session),
        [session_row("r"), session_row("c", parent_session_id="r", root_session_id="r")],
    )
    for sid in ("r", "c"):
        connection.execute(
            insert(Turn).values(**turn_row(sid, "t-1", phase="settled", outcome="completed"))
        )
        connection.execute(
            insert(Message),
            [
                message_row(sid, "m-0", sequence=1),
                message_row(sid, "m-1", sequence=2, turn_id="t-1"),
            ],
        )
        connection.execute(
            insert(Interaction).values(**interaction_row(sid, "t-1", status="answered"))
        )


def _count_all(connection: Connection) -> dict[str, int]:
    return {
        model.__tablename__: int(connection.scalar(select(func.count()).select_from(model)) or 0)
        for model in (Session, Turn, Message, Interaction)
    }


@pytest.mark.spec("STORE-2")
def test_deleting_a_whole_tree_removes_everything_it_owns(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        _seed_tree(connection)

    with sync_engine.begin() as connection:
        connection.execute(
            delete(Session).where(
                Session.workspace_id == WORKSPACE, Session.session_id.in_(["r", "c"])
            )
        )
        assert _count_all(connection) == {
            "sessions": 0,
            "turns": 0,
            "messages": 0,
            "interactions": 0,
        }


@pytest.mark.spec("STORE-2")
def test_leaf_first_delete_removes_a_tree(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        _seed_tree(connection)

    with sync_engine.begin() as connection:
        for sid in ("c", "r"):
            connection.execute(
                delete(Session).where(Session.workspace_id == WORKSPACE, Session.session_id == sid)
            )
        assert _count_all(connection)["sessions"] == 0


@pytest.mark.spec("STORE-2")
def test_deleting_a_parent_without_its_child_is_rejected(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        _seed_tree(connection)

    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(
            delete(Session).where(Session.workspace_id == WORKSPACE, Session.session_id == "r")
        )

    with sync_engine.connect() as connection:
        assert _count_all(connection) == {
            "sessions": 2,
            "turns": 2,
            "messages": 4,
            "interactions": 2,
        }


@pytest.mark.spec("STORE-2")
def test_a_turn_still_referenced_cannot_be_deleted_alone(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        _seed_tree(connection)

    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(delete(Turn).where(Turn.session_id == "r"))


# --------------------------------------------------------------------------------------------
# Schema invariants beyond foreign keys
# --------------------------------------------------------------------------------------------

BAD_SESSION_ROWS: dict[str, dict[str, Any]] = {
    "tombstone-without-generation": session_row("s-9", deleted_at_unix_ms=NOW_MS, component_size=1),
    "tombstone-without-component-size": session_row(
        "s-9", deleted_at_unix_ms=NOW_MS, deletion_generation="g"
    ),
    "generation-without-deleted-at": session_row("s-9", deletion_generation="g", component_size=1),
    "component-size-zero": session_row(
        "s-9", deleted_at_unix_ms=NOW_MS, deletion_generation="g", component_size=0
    ),
    "legacy-flag-on-live-session": session_row("s-9", tombstone_legacy=True),
    "blank-rail-section-key": session_row("s-9", rail_section_key=""),
    "own-parent": session_row("s-9", parent_session_id="s-9"),
}


@pytest.mark.parametrize("case", sorted(BAD_SESSION_ROWS))
def test_inconsistent_session_rows_are_rejected(sync_engine: Engine, case: str) -> None:
    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(insert(Session).values(**BAD_SESSION_ROWS[case]))


def test_tombstone_rows_are_accepted(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        connection.execute(
            insert(Session),
            [
                session_row(
                    "s-8", deleted_at_unix_ms=NOW_MS, deletion_generation="g", component_size=1
                ),
                session_row("s-9", deleted_at_unix_ms=NOW_MS, tombstone_legacy=True),
            ],
        )


def test_a_tombstone_cannot_keep_an_active_turn(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        connection.execute(insert(Session).values(**session_row("s-1")))
        connection.execute(insert(Turn).values(**turn_row("s-1", "t-1")))
        _activate("s-1", "t-1")(connection)

    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(
            update(Session)
            .where(Session.session_id == "s-1")
            .values(deleted_at_unix_ms=NOW_MS, deletion_generation="g", component_size=1)
        )


TURN_CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "running-without-outcome": ({"phase": "running"}, True),
    "settled-with-outcome": ({"phase": "settled", "outcome": "canceled"}, True),
    "unknown-phase": ({"phase": "paused"}, False),
    "settled-without-outcome": ({"phase": "settled"}, False),
    "running-with-outcome": ({"phase": "running", "outcome": "completed"}, False),
    "unknown-outcome": ({"phase": "settled", "outcome": "exploded"}, False),
    "result-message-and-resolved-empty": (
        {
            "phase": "settled",
            "outcome": "completed",
            "result_message_id": "m-1",
            "result_resolved_empty": True,
        },
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(TURN_CASES))
def test_turn_phase_and_outcome_stay_consistent(sync_engine: Engine, case: str) -> None:
    values, valid = TURN_CASES[case]
    with sync_engine.begin() as connection:
        connection.execute(insert(Session).values(**session_row("s-1")))

    def write() -> None:
        with sync_engine.begin() as connection:
            connection.execute(insert(Turn).values(**turn_row("s-1", "t-1", **values)))

    if valid:
        write()
    else:
        with pytest.raises(IntegrityError):
            write()


def test_client_submit_id_is_unique_per_session(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        connection.execute(insert(Session), [session_row("s-1"), session_row("s-2")])
        connection.execute(
            insert(Turn),
            [
                turn_row("s-1", "t-1", client_submit_id="submit-1"),
                turn_row("s-2", "t-1", client_submit_id="submit-1"),  # other Session: fine
                turn_row("s-1", "t-2"),  # NULLs never collide
                turn_row("s-1", "t-3"),
            ],
        )
    with pytest.raises(IntegrityError), sync_engine.begin() as connection:
        connection.execute(
            insert(Turn).values(**turn_row("s-1", "t-4", client_submit_id="submit-1"))
        )


def test_message_sequence_and_version_are_unique_per_session(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        connection.execute(insert(Session), [session_row("s-1"), session_row("s-2")])
        connection.execute(insert(Message), [message_row("s-1", "m-1"), message_row("s-2", "m-1")])
    for duplicate in (
        message_row("s-1", "m-2", sequence=1, version=2),
        message_row("s-1", "m-2", sequence=2, version=1),
    ):
        with pytest.raises(IntegrityError), sync_engine.begin() as connection:
            connection.execute(insert(Message).values(**duplicate))


def test_activity_event_ids_are_never_reused(sync_engine: Engine) -> None:
    with sync_engine.begin() as connection:
        ids = [
            connection.execute(
                insert(ActivityEvent)
                .values(**activity_event_row(workspace_seq=seq))
                .returning(ActivityEvent.id)
            ).scalar_one()
            for seq in range(1, 4)
        ]
        assert ids == sorted(ids)
        assert len(set(ids)) == 3
        connection.execute(delete(ActivityEvent))

    with sync_engine.begin() as connection:
        next_id = connection.execute(
            insert(ActivityEvent)
            .values(**activity_event_row(workspace_seq=4))
            .returning(ActivityEvent.id)
        ).scalar_one()
    assert next_id > max(ids)
