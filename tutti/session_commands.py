"""``tutti session create | send | answer``: watch an agent Session work from the terminal.

Against ``tutti up`` (which serves the built-in demo agent, target ``demo``)::

    tutti session create                       # prints the new Session id and remembers it
    tutti session send "hello" --follow        # streams the reply live, then the settled Turn
    tutti session answer allow                 # answers the Session's pending Interaction

Token and workspace discovery are those of ``tutti reference`` (``--token`` /
``TUTTI_CLI_TOKEN`` / ``<data dir>/auth/cli-token``; ``--workspace`` / ``TUTTI_WORKSPACE`` /
``<data dir>/auth/workspace``, which ``tutti up`` seeds with :data:`LOCAL_WORKSPACE`), and
so is finding the running suite's data directory and Host address (:func:`cli_settings`). The
last created Session is remembered in ``<data dir>/run/cli-session`` so ``send`` and ``answer``
need no ``--session``. ``--follow`` opens ``WatchActivity`` before sending, so no part of the
reply can be missed.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from google.protobuf import json_format

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from grpcserver.channels import sync_channel
from tutti.reference_commands import (
    CliSettings,
    TimeoutOption,
    TokenOption,
    WorkspaceOption,
    _describe,
    _fail,
    _token,
    _workspace,
    cli_settings,
)

__all__ = [
    "LOCAL_WORKSPACE",
    "TOOL_CALL_PREVIEW_CHARS",
    "clip",
    "ensure_local_workspace",
    "session_app",
]

session_app = typer.Typer(no_args_is_help=True, help="Create agent Sessions and talk to them.")

LOCAL_WORKSPACE = "local"
"""The workspace ``tutti up`` writes to ``<data dir>/auth/workspace`` when none is set."""

SessionOption = Annotated[
    str | None, typer.Option(help="Session id; default: the last `tutti session create`.")
]
AddressOption = Annotated[
    str | None, typer.Option(help="Host address; default TUTTI_HOST_ADDRESS.")
]


def ensure_local_workspace(data_dir: Path) -> None:
    """Seed ``<data dir>/auth/workspace`` for a local suite (kept if it exists)."""
    path = data_dir / "auth" / "workspace"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(LOCAL_WORKSPACE + "\n", encoding="utf-8")


def _current_path(settings: CliSettings) -> Path:
    return settings.data_dir / "run" / "cli-session"


def _session(settings: CliSettings, option: str | None) -> str:
    if option:
        return option
    try:
        return _current_path(settings).read_text(encoding="utf-8").strip()
    except OSError:
        _fail("no Session: pass --session or run `tutti session create` first", 2)


class _Host:
    def __init__(self, settings: CliSettings, token: str | None, address: str | None) -> None:
        self.metadata = (("authorization", f"Bearer {_token(settings, token)}"),)
        self.channel = sync_channel(address or settings.host_address, settings)
        self.stub = host_pb2_grpc.HostServiceStub(self.channel)

    def call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self.stub, method)(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as error:
            _fail(_describe(error))


@session_app.command("create")
def session_create(
    target: Annotated[str, typer.Option(help="Agent target id.")] = "demo",
    title: Annotated[str | None, typer.Option(help="Title of the Session.")] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory; default: here.")] = None,
    workspace: WorkspaceOption = None,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: TimeoutOption = 30.0,
) -> None:
    """Create a Session with an agent target and remember it for `send` and `answer`."""
    settings = cli_settings()
    host = _Host(settings, token, address)
    request = host_pb2.CreateSessionRequest(
        workspace_id=_workspace(settings, workspace),
        agent_target_id=target,
        cwd=cwd or os.getcwd(),
    )
    if title:
        request.title = title
    response = host.call("CreateSession", request, timeout)
    current = _current_path(settings)
    current.parent.mkdir(parents=True, exist_ok=True)
    current.write_text(response.session.session_id + "\n", encoding="utf-8")
    typer.echo(response.session.session_id)


class _Follower:
    """A ``WatchActivity`` stream read in a thread; events arrive on a queue."""

    def __init__(self, host: _Host, workspace_id: str) -> None:
        self.events: queue.Queue[activity_pb2.ActivityEvent | BaseException] = queue.Queue()
        self._ready = threading.Event()
        self._call = host.stub.WatchActivity(
            host_pb2.WatchActivityRequest(workspace_id=workspace_id), metadata=host.metadata
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                if response.WhichOneof("item") == "ready":
                    self._ready.set()
                else:
                    self.events.put(response.event)
        except grpc.RpcError as error:
            self.events.put(error)
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            _fail("WatchActivity did not become ready")

    def close(self) -> None:
        self._call.cancel()


TOOL_CALL_PREVIEW_CHARS = 200
"""How many characters of a tool call's payload ``--follow`` prints."""


def clip(text: str, limit: int = TOOL_CALL_PREVIEW_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut.

    What is cut is counted in UTF-8 bytes (what the payload weighs on the wire), e.g.
    ``{"toolName":"Task", … (1234 more bytes)``.
    """
    if len(text) <= limit:
        return text
    rest = len(text[limit:].encode("utf-8"))
    return f"{text[:limit]} … ({rest} more bytes)"


def _print_event(event: activity_pb2.ActivityEvent, session_id: str, turn_id: str) -> bool:
    """Print one event of the followed Turn; return True once the Turn settled."""
    kind = event.WhichOneof("event")
    if kind == "message_delta":
        delta = event.message_delta.delta
        if delta.session_id != session_id or delta.turn_id != turn_id:
            return False
        if delta.target == canonical_pb2.DELTA_TARGET_TOOL_OUTPUT:
            text = (
                delta.text
                if delta.operation == canonical_pb2.DELTA_OPERATION_APPEND_TEXT
                else (f"\n[tool output]\n{delta.text}")
            )
            sys.stdout.write(text)
        elif delta.operation == canonical_pb2.DELTA_OPERATION_SET:
            sys.stdout.write(f"\n{delta.text}")
        else:
            sys.stdout.write(delta.text)
        sys.stdout.flush()
    elif kind == "interaction_update":
        found = event.interaction_update.interaction
        if (
            found.session_id == session_id
            and found.turn_id == turn_id
            and found.status == canonical_pb2.INTERACTION_STATUS_PENDING
        ):
            options = "|".join(option.option_id for option in found.options) or "allow|deny"
            typer.echo(
                f"\n[interaction] {found.title}: {found.summary}\n"
                f"  answer with: tutti session answer {options.split('|')[0]} "
                f"(options: {options})"
            )
    elif kind == "message_update" and event.message_update.session_id == session_id:
        for message in event.message_update.messages:
            if message.turn_id == turn_id and message.kind == canonical_pb2.MESSAGE_KIND_TOOL_CALL:
                typer.echo(f"\n[tool call] {clip(message.payload_json)}")
    elif kind == "turn_update":
        turn = event.turn_update.turn
        if turn.session_id == session_id and turn.turn_id == turn_id:
            return turn.phase == canonical_pb2.TURN_PHASE_SETTLED
    return False


@session_app.command("send")
def session_send(
    text: Annotated[str, typer.Argument(help="What to say to the agent.")],
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the reply live, then print the settled Turn.")
    ] = False,
    session: SessionOption = None,
    workspace: WorkspaceOption = None,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: TimeoutOption = 30.0,
    follow_timeout: Annotated[
        float, typer.Option(help="How long --follow waits for the Turn to settle, in seconds.")
    ] = 600.0,
) -> None:
    """Send input as a new Turn; with --follow, watch it until it settles."""
    settings = cli_settings()
    host = _Host(settings, token, address)
    workspace_id = _workspace(settings, workspace)
    session_id = _session(settings, session)
    follower = _Follower(host, workspace_id) if follow else None
    if follower is not None:
        follower.wait_ready(timeout)
    response = host.call(
        "SendInput",
        host_pb2.SendInputRequest(
            workspace_id=workspace_id,
            session_id=session_id,
            client_submit_id=f"cli-{uuid.uuid4()}",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=canonical_pb2.COMPOSER_MODE_AGENT,
            content=text,
        ),
        timeout,
    )
    turn_id = response.turn.turn_id
    if follower is None:
        typer.echo(turn_id)
        return
    try:
        while True:
            try:
                item = follower.events.get(timeout=follow_timeout)
            except queue.Empty:
                _fail(f"Turn {turn_id} did not settle within {follow_timeout}s")
            if isinstance(item, grpc.RpcError):
                _fail(_describe(item))
            if isinstance(item, BaseException):
                raise item
            if _print_event(item, session_id, turn_id):
                break
    finally:
        follower.close()
    turns = host.call(
        "ListSessionTurns",
        host_pb2.ListSessionTurnsRequest(workspace_id=workspace_id, session_id=session_id),
        timeout,
    ).turns
    settled = next((turn for turn in turns if turn.turn_id == turn_id), response.turn)
    typer.echo("\n--- settled turn ---")
    typer.echo(json_format.MessageToJson(settled, indent=2))


@session_app.command("answer")
def session_answer(
    action: Annotated[str, typer.Argument(help="The answer, e.g. allow or deny.")],
    option: Annotated[str | None, typer.Option(help="Option id; default: the action.")] = None,
    turn: Annotated[str | None, typer.Option(help="Turn of the Interaction.")] = None,
    request: Annotated[str | None, typer.Option(help="Request id of the Interaction.")] = None,
    session: SessionOption = None,
    workspace: WorkspaceOption = None,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: TimeoutOption = 30.0,
) -> None:
    """Answer a pending Interaction (default: the Session's oldest pending one)."""
    settings = cli_settings()
    host = _Host(settings, token, address)
    workspace_id = _workspace(settings, workspace)
    session_id = _session(settings, session)
    if turn is None or request is None:
        detail = host.call(
            "GetSession",
            host_pb2.GetSessionRequest(workspace_id=workspace_id, session_id=session_id),
            timeout,
        )
        if not detail.pending_interactions:
            _fail(f"Session {session_id} has no pending Interaction")
        pending = detail.pending_interactions[0]
        turn, request = pending.turn_id, pending.request_id
        offered = {item.option_id for item in pending.options}
        if option is None and action in offered:
            option = action
    submit = host_pb2.SubmitInteractionResponseRequest(
        workspace_id=workspace_id,
        session_id=session_id,
        turn_id=turn,
        request_id=request,
        action=action,
        idempotency_key=f"cli-{uuid.uuid4()}",
    )
    if option is not None:
        submit.option_id = option
    operation = host.call("SubmitInteractionResponse", submit, timeout).operation
    status = host_pb2.InteractionResponseOperationStatus.Name(operation.status)
    typer.echo(f"{operation.operation_id}\t{status}")
