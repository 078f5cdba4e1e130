"""``tutti refdata load`` and ``tutti reference list`` (REF-BACKEND-1, REF-CLI-1, OPS-2).

Both talk to the running services over gRPC with a bearer token and a workspace taken
from the CLI's authenticated context:

* token: ``--token``, else ``TUTTI_CLI_TOKEN``, else ``<data dir>/auth/cli-token`` (the
  local admin token ``tutti up`` writes);
* workspace: ``--workspace``, else ``TUTTI_WORKSPACE``, else the first line of
  ``<data dir>/auth/workspace``; with none of them the command fails (a token may span
  several workspaces, so the CLI never guesses one).

The data directory and the addresses are those of the running ``tutti up`` (its record,
:mod:`tutti.suite_record`) unless ``TUTTI_DATA_DIR`` names another one or ``TUTTI_*_ADDRESS``
/ ``--address`` says otherwise; with no suite running they are the settings' defaults.

Failures print one line to stderr (``error: NOT_FOUND (APP_NOT_FOUND): ...``) and exit 1
(2 for bad usage).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import grpc
import typer
import yaml
from google.protobuf import json_format
from pydantic import SecretStr

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.call_errors import call_error
from grpcserver.channels import sync_channel
from grpcserver.settings import DEFAULT_PORTS, ServerSettings
from tutti.suite_record import find_running_suite

__all__ = ["CliSettings", "cli_settings", "refdata_app", "reference_app"]

reference_app = typer.Typer(no_args_is_help=True, help="Resolve workspace references.")
refdata_app = typer.Typer(no_args_is_help=True, help="Load reference data (apps, topics).")

_SOURCES = {
    "app": refresolve_pb2.REFERENCE_SOURCE_APP,
    "task": refresolve_pb2.REFERENCE_SOURCE_TASK,
}


class CliSettings(ServerSettings):
    """What the reference commands read from ``TUTTI_*`` (OPS-1)."""

    refresolve_address: str = f"127.0.0.1:{DEFAULT_PORTS['refresolve']}"
    """Where the refresolve service listens (``TUTTI_REFRESOLVE_ADDRESS``)."""

    cli_token: SecretStr | None = None
    """Bearer token of the CLI (``TUTTI_CLI_TOKEN``); default ``<data dir>/auth/cli-token``."""

    workspace: str | None = None
    """Workspace the CLI acts in (``TUTTI_WORKSPACE``); default ``<data dir>/auth/workspace``."""


_RECORDED_ADDRESSES = ("host", "refresolve", "appcenter", "issuemanager")
"""Servers whose ``<name>_address`` setting the running suite's record may supply."""


def cli_settings() -> CliSettings:
    """The CLI's settings, pointed at the running ``tutti up`` where nothing says otherwise.

    With no ``TUTTI_DATA_DIR``, or one naming the recorded suite's data directory, the data
    directory and every address not set explicitly (``TUTTI_HOST_ADDRESS`` ...) come from
    the record of the running suite (:mod:`tutti.suite_record`). An explicit setting always
    wins, and so does a ``--address`` option (applied by each command).
    """
    settings = CliSettings()
    record = find_running_suite()
    if record is None:
        return settings
    explicit = settings.model_fields_set
    if "data_dir" in explicit and settings.data_dir.resolve() != record.data_dir.resolve():
        return settings  # another data directory: the record describes another suite
    update: dict[str, object] = {"data_dir": record.data_dir}
    for name in _RECORDED_ADDRESSES:
        field = f"{name}_address"
        if field not in explicit and name in record.addresses:
            update[field] = record.addresses[name]
    return settings.model_copy(update=update)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def _token(settings: CliSettings, option: str | None) -> str:
    if option:
        return option
    if settings.cli_token is not None:
        return settings.cli_token.get_secret_value()
    path = settings.data_dir / "auth" / "cli-token"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        _fail(
            f"no CLI token at {path}: pass --token, set TUTTI_CLI_TOKEN, set TUTTI_DATA_DIR "
            "to the suite's data directory, or start the suite with `tutti up`",
            2,
        )


def _workspace(settings: CliSettings, option: str | None) -> str:
    if option:
        return option
    if settings.workspace:
        return settings.workspace
    path = settings.data_dir / "auth" / "workspace"
    try:
        lines = path.read_text(encoding="utf-8").split()
    except OSError:
        lines = []
    if lines:
        return lines[0]
    _fail(f"no workspace: pass --workspace, set TUTTI_WORKSPACE or write {path}", 2)


def _describe(error: grpc.RpcError) -> str:
    said = call_error(error)
    reason = f" ({said.reason})" if said.reason else ""
    return f"{said.code.name}{reason}: {said.message}"


WorkspaceOption = Annotated[
    str | None,
    typer.Option(help="Workspace; default TUTTI_WORKSPACE or <data dir>/auth/workspace."),
]
TokenOption = Annotated[
    str | None, typer.Option(help="Bearer token; default TUTTI_CLI_TOKEN or the local CLI token.")
]
TimeoutOption = Annotated[float, typer.Option(help="Deadline of each call, in seconds.")]


def _item_json(item: refresolve_pb2.ReferenceItem) -> dict[str, Any]:
    # Exactly the REF-CLI-1 shape: every key present, numbers as JSON numbers.
    return {
        "path": item.path,
        "displayName": item.display_name,
        "sizeBytes": item.size_bytes,
        "mediaType": item.media_type,
        "createdAtUnixMs": item.created_at_unix_ms,
    }


@reference_app.command("list")
def reference_list(
    source: Annotated[str, typer.Option(help="app or task.")],
    id_: Annotated[str, typer.Option("--id", help="App id (app) or topic id (task).")],
    group_id: Annotated[
        str | None, typer.Option(help="App-owned group (app) or issue id (task).")
    ] = None,
    query: Annotated[
        str | None, typer.Option(help="Keep files whose name contains this (any case).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many items (max 1000).")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help='Print {"items":[...]} as JSON.')
    ] = False,
    workspace: WorkspaceOption = None,
    token: TokenOption = None,
    address: Annotated[
        str | None, typer.Option(help="refresolve address; default TUTTI_REFRESOLVE_ADDRESS.")
    ] = None,
    timeout: TimeoutOption = 30.0,
) -> None:
    """Resolve one reference handle into its current files (REF-CLI-1)."""
    if source not in _SOURCES:
        _fail(f"--source must be app or task, got {source!r}", 2)
    settings = cli_settings()
    request = refresolve_pb2.ListReferencesRequest(
        workspace_id=_workspace(settings, workspace),
        source=_SOURCES[source],
        id=id_,
        group_id=group_id,
        query=query,
        limit=limit,
    )
    metadata = (("authorization", f"Bearer {_token(settings, token)}"),)
    with sync_channel(address or settings.refresolve_address, settings) as channel:
        stub = refresolve_pb2_grpc.ReferenceServiceStub(channel)
        try:
            response = stub.ListReferences(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            _fail(_describe(error))
    if json_output:
        document = {"items": [_item_json(item) for item in response.items]}
        typer.echo(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
        return
    for item in response.items:
        typer.echo(f"{item.path}\t{item.size_bytes}\t{item.media_type}")
    if response.truncated:
        typer.echo(f"(truncated at {len(response.items)} items)", err=True)


def _sections(document: Any, default_workspace: str | None) -> list[tuple[str, dict[str, Any]]]:
    """Split a refdata document into ``(workspace, {apps, topics})`` sections."""
    if not isinstance(document, dict):
        _fail("the data file must hold a mapping with 'apps', 'topics' or 'workspaces'")
    parts = document.get("workspaces", [document])
    if not isinstance(parts, list):
        _fail("'workspaces' must be a list")
    sections = []
    for index, part in enumerate(parts):
        if not isinstance(part, dict):
            _fail(f"workspaces[{index}] must be a mapping")
        workspace = part.get("workspaceId") or part.get("workspace_id") or default_workspace
        if not workspace:
            _fail("the data file names no workspaceId; pass --workspace or set TUTTI_WORKSPACE", 2)
        sections.append((str(workspace), part))
    return sections


@refdata_app.command("load")
def refdata_load(
    file: Annotated[Path, typer.Argument(help="JSON or YAML file describing apps and topics.")],
    workspace: WorkspaceOption = None,
    token: TokenOption = None,
    timeout: TimeoutOption = 60.0,
) -> None:
    """Create or replace the apps and topics a file describes (REF-BACKEND-1).

    The file holds ``apps`` (AppCenter ``AppTree`` objects) and ``topics`` (IssueManager
    ``TopicTree`` objects) in proto3 JSON, optionally under ``workspaces: [{workspaceId,
    apps, topics}]``. Each named app or topic is replaced whole; loading twice is a no-op.
    """
    settings = cli_settings()
    try:
        text = file.read_text(encoding="utf-8")
        document = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:
        _fail(f"cannot read {file}: {error}")
    default_workspace = workspace or settings.workspace
    requests = []
    for ws, part in _sections(document, default_workspace):
        try:
            apps = json_format.ParseDict(
                {"workspaceId": ws, "apps": part.get("apps") or []}, appcenter_pb2.LoadAppsRequest()
            )
            topics = json_format.ParseDict(
                {"workspaceId": ws, "topics": part.get("topics") or []},
                issuemanager_pb2.LoadTopicsRequest(),
            )
        except json_format.ParseError as error:
            _fail(f"{file}: {error}")
        requests.append((ws, apps, topics))
    metadata = (("authorization", f"Bearer {_token(settings, token)}"),)
    with (
        sync_channel(settings.appcenter_address, settings) as appcenter_channel,
        sync_channel(settings.issuemanager_address, settings) as issuemanager_channel,
    ):
        appcenter = appcenter_pb2_grpc.AppCenterServiceStub(appcenter_channel)
        issuemanager = issuemanager_pb2_grpc.IssueManagerServiceStub(issuemanager_channel)
        for ws, apps, topics in requests:
            try:
                loaded_apps = appcenter.LoadApps(apps, metadata=metadata, timeout=timeout)
                loaded_topics = issuemanager.LoadTopics(topics, metadata=metadata, timeout=timeout)
            except grpc.RpcError as error:
                _fail(_describe(error))
            typer.echo(
                f"{ws}: {loaded_apps.apps_loaded} apps ({loaded_apps.groups_loaded} groups, "
                f"{loaded_apps.artifacts_loaded} artifacts), {loaded_topics.topics_loaded} topics "
                f"({loaded_topics.issues_loaded} issues, {loaded_topics.outputs_loaded} outputs)"
            )
