# ruff: noqa: D102 - each property is a column; store.models documents the columns
"""Read-only views of the rows a Host transaction holds (the activity lifecycle's handles).

The repositories of a write transaction hand the domain these views of the rows in the
transaction (``HostTransaction``); every change goes through a repository method
(``tx.turns.update(turn, phase=...)`` ...), which records it for the activity outbox. A view
is always current: a command that changes the same row several times (a runtime report with
many items) reads its own writes, which frozen snapshots would not give (ADR 0022). The views
expose no setter, so mypy refuses a domain module that assigns to one, and no ORM machinery.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "CommandRow",
    "HostOperationRow",
    "InteractionRow",
    "MessageRow",
    "OperationRow",
    "SessionRow",
    "TargetRow",
    "TurnRow",
]


class SessionRow(Protocol):
    """A Session row as the activity lifecycle reads it (locks, counters, resume state)."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def parent_session_id(self) -> str | None: ...

    @property
    def root_session_id(self) -> str: ...

    @property
    def parent_turn_id(self) -> str | None: ...

    @property
    def agent_target_id(self) -> str | None: ...

    @property
    def provider(self) -> str: ...

    @property
    def provider_target_ref(self) -> str | None: ...

    @property
    def title(self) -> str: ...

    @property
    def cwd(self) -> str | None: ...

    @property
    def rail_section_key(self) -> str: ...

    @property
    def rail_project_path(self) -> str | None: ...

    @property
    def settings_json(self) -> str: ...

    @property
    def capabilities_json(self) -> str: ...

    @property
    def usage_json(self) -> str | None: ...

    @property
    def isolation_json(self) -> str | None: ...

    @property
    def import_json(self) -> str | None: ...

    @property
    def provider_resume_json(self) -> str | None: ...

    @property
    def launch_subagents_json(self) -> str | None: ...

    @property
    def message_version(self) -> int: ...

    @property
    def next_message_sequence(self) -> int: ...

    @property
    def pinned_at_unix_ms(self) -> int | None: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...

    @property
    def active_turn_id(self) -> str | None: ...

    @property
    def deleted_at_unix_ms(self) -> int | None: ...

    @property
    def deletion_generation(self) -> str | None: ...

    @property
    def component_size(self) -> int | None: ...

    @property
    def tombstone_legacy(self) -> bool: ...


class TurnRow(Protocol):
    """A Turn row."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def turn_id(self) -> str: ...

    @property
    def client_submit_id(self) -> str | None: ...

    @property
    def submit_fingerprint(self) -> str | None: ...

    @property
    def phase(self) -> str: ...

    @property
    def outcome(self) -> str | None: ...

    @property
    def origin(self) -> str: ...

    @property
    def delivery(self) -> str | None: ...

    @property
    def mode(self) -> str | None: ...

    @property
    def root_turn_id(self) -> str | None: ...

    @property
    def version(self) -> int: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...

    @property
    def started_at_unix_ms(self) -> int | None: ...

    @property
    def settled_at_unix_ms(self) -> int | None: ...

    @property
    def result_message_id(self) -> str | None: ...

    @property
    def result_resolved_empty(self) -> bool: ...

    @property
    def failure_message(self) -> str | None: ...

    @property
    def retracted_at_unix_ms(self) -> int | None: ...

    @property
    def deferred_settlement_json(self) -> str | None: ...

    @property
    def file_changes_json(self) -> str | None: ...


class MessageRow(Protocol):
    """A transcript row."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def message_id(self) -> str: ...

    @property
    def sequence(self) -> int: ...

    @property
    def version(self) -> int: ...

    @property
    def turn_id(self) -> str | None: ...

    @property
    def occurred_at_unix_ms(self) -> int: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...

    @property
    def role(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def payload_json(self) -> str: ...

    @property
    def user_visible_assistant_response(self) -> bool | None: ...

    @property
    def command(self) -> str | None: ...

    @property
    def skill_mentions_json(self) -> str | None: ...

    @property
    def agent_mentions_json(self) -> str | None: ...

    @property
    def references_json(self) -> str | None: ...


class InteractionRow(Protocol):
    """An Interaction row."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def turn_id(self) -> str: ...

    @property
    def request_id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def tool_name(self) -> str | None: ...

    @property
    def input_json(self) -> str | None: ...

    @property
    def metadata_json(self) -> str | None: ...

    @property
    def title(self) -> str | None: ...

    @property
    def summary(self) -> str | None: ...

    @property
    def options_json(self) -> str | None: ...

    @property
    def answer_json(self) -> str | None: ...

    @property
    def actionable(self) -> bool: ...

    @property
    def version(self) -> int: ...

    @property
    def occurred_at_unix_ms(self) -> int: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...


class OperationRow(Protocol):
    """A durable Interaction response operation row."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def operation_id(self) -> str: ...

    @property
    def idempotency_key(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def turn_id(self) -> str: ...

    @property
    def request_id(self) -> str: ...

    @property
    def request_fingerprint(self) -> str: ...

    @property
    def action(self) -> str: ...

    @property
    def option_id(self) -> str | None: ...

    @property
    def answer_json(self) -> str | None: ...

    @property
    def state(self) -> str: ...

    @property
    def disposition(self) -> str | None: ...

    @property
    def attempts(self) -> int: ...

    @property
    def next_attempt_at_unix_ms(self) -> int | None: ...

    @property
    def last_error(self) -> str | None: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...

    @property
    def completed_at_unix_ms(self) -> int | None: ...


class CommandRow(Protocol):
    """A runtime command outbox row."""

    @property
    def id(self) -> int: ...

    @property
    def workspace_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def command_id(self) -> str: ...

    @property
    def command_kind(self) -> str: ...

    @property
    def operation_id(self) -> str | None: ...

    @property
    def payload_json(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def attempts(self) -> int: ...

    @property
    def next_attempt_at_unix_ms(self) -> int: ...

    @property
    def last_error(self) -> str | None: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...


class TargetRow(Protocol):
    """An agent target row."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def agent_target_id(self) -> str: ...

    @property
    def provider(self) -> str: ...

    @property
    def display_name(self) -> str: ...

    @property
    def enabled(self) -> bool: ...

    @property
    def launch_ref_json(self) -> str: ...

    @property
    def capabilities_json(self) -> str: ...

    @property
    def subagent_catalog_json(self) -> str: ...

    @property
    def settings_catalog_json(self) -> str: ...

    @property
    def locality(self) -> str: ...

    @property
    def created_at_unix_ms(self) -> int: ...

    @property
    def updated_at_unix_ms(self) -> int: ...


class HostOperationRow(Protocol):
    """A durable idempotent Host operation (``host_operations``)."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def operation_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def client_op_id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def result_json(self) -> str | None: ...

    @property
    def created_at_unix_ms(self) -> int: ...
