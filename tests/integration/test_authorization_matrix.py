"""Every RPC x every principal x every workspace and credential case, on real servers (SEC-3).

For each served RPC of each service the expected authorization is written down here by
hand (:data:`RPCS`: roles, workspace source, deployment-wide writes), independently of
the declarations in ``services/<name>/authorization.py``; a separate test checks the two
agree, so a changed declaration needs a changed expectation. Each case sends a
valid-shaped request over a real socket (``live_server``) as one principal and checks:

- the exact status code and ``ErrorInfo`` reason of a refusal (and the field violation
  of a missing workspace);
- that a refused call changed nothing: every row of every store table (the activity
  event log included) reads back the same as before the call;
- that an admitted call was not refused by authentication or authorization (it may
  still fail on its own terms: NOT_FOUND, UNIMPLEMENTED ...), and never with INTERNAL or
  UNKNOWN.

Cases per RPC: each of five principals (device, service and admin scoped to ``ws-1``;
deployment-wide service and admin) x own workspace (``ws-1``), foreign workspace
(``ws-2``) and workspace unset — one case for an RPC on deployment-wide records — plus no
token, a malformed header, an unknown token and an expired token. Every service runs on
SQLite and Postgres; :data:`CASES_PER_BACKEND` is the total.
"""

from __future__ import annotations

import enum
import importlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from sqlalchemy import Engine, select, update

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.authorization import MethodPolicy, WorkspaceSource
from services.host.runtime.registry import PROTOCOL_REVISION
from services.livestream.link import CURRENT_REVISION
from store.models import Base, Session
from tests.contract.live_link import RawLink
from tests.integration.host_activity import start_host
from tests.integration.livestream.link_client import start_livestream
from tests.support.host_sessions import demo_target
from tests.support.rpc_errors import error_details
from tests.support.servers import TEST_PRINCIPALS, LiveServer, auth_metadata, token_for
from tests.support.session_trees import add_tree

OWN, FOREIGN = "ws-1", "ws-2"


class Ws(enum.Enum):
    """Where an RPC's workspace comes from (hand-written, mirrors WorkspaceSource)."""

    FIELD = "field"
    OPTIONAL = "optional_field"
    FIRST = "first_message"
    FRAME = "each_frame"
    DEPLOYMENT = "deployment"


ALL = frozenset({"device", "service", "admin"})
OPS = frozenset({"service", "admin"})
ADMIN = frozenset({"admin"})
DEVICE_ADMIN = frozenset({"device", "admin"})


@dataclass(frozen=True)
class Principal:
    """A test principal of principals.yaml: its role and whether it is deployment-wide."""

    name: str
    role: str
    wide: bool


PRINCIPALS = (
    Principal("ws1-device", "device", wide=False),
    Principal("ws1-service", "service", wide=False),
    Principal("ws1-admin", "admin", wide=False),
    Principal("service", "service", wide=True),
    Principal("admin", "admin", wide=True),
)

CREDENTIALS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "no token": ((), "MISSING_CREDENTIALS"),
    "malformed header": ((("authorization", "Basic dXNlcjpwdw=="),), "MALFORMED_CREDENTIALS"),
    "bad token": ((("authorization", "Bearer not-a-registered-token"),), "INVALID_CREDENTIALS"),
    "expired token": (auth_metadata("expired-admin"), "EXPIRED_CREDENTIALS"),
}

AUTH_REASONS = {
    "MISSING_CREDENTIALS",
    "MALFORMED_CREDENTIALS",
    "INVALID_CREDENTIALS",
    "EXPIRED_CREDENTIALS",
    "METHOD_NOT_DECLARED",
    "ROLE_NOT_ALLOWED",
    "WORKSPACE_SCOPE_MISMATCH",
    "DEPLOYMENT_SCOPE_REQUIRED",
}

Build = Callable[[str | None], Any]
"""Request (or list of stream frames) for a workspace; ``None`` leaves the workspace unset."""


@dataclass(frozen=True)
class Rpc:
    """One RPC with its hand-written expected authorization and a valid-shaped request."""

    server: str
    stub: Callable[[grpc.Channel], Any]
    service: str
    method: str
    roles: frozenset[str]
    workspace: Ws
    build: Build
    wide_only: bool = False
    field: str = "workspace_id"
    shape: str = "unary"  # unary | server_stream | bidi
    missing_reason: str = "INVALID_ARGUMENT"
    """The refusal's reason when the workspace is unset (a protocol may name its own)."""
    open_ended: bool = False
    """A bidi stream that outlives the client's half-close (DeviceLink): admitted once its
    first frame arrives, then cancelled."""

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"


def _ws(ws: str | None, **fields: Any) -> dict[str, Any]:
    return fields if ws is None else {"workspace_id": ws, **fields}


_counter = itertools.count()


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


def _host(method: str, roles: frozenset[str], ws: Ws, build: Build, **kw: Any) -> Rpc:
    return Rpc(
        "host",
        host_pb2_grpc.HostServiceStub,
        "agentactivity.host.v1.HostService",
        method,
        roles,
        ws,
        build,
        **kw,
    )


def _req(message: type[Message], **fixed: Any) -> Build:
    """A request of ``message`` with ``fixed`` fields and the workspace (when set)."""

    def build(ws: str | None) -> Any:
        return message(**_ws(ws, **fixed))

    return build


AGENT = canonical_pb2.COMPOSER_MODE_AGENT
HOST_RPCS = [
    _host(
        "RegisterAgentTarget",
        OPS,
        Ws.DEPLOYMENT,
        wide_only=True,
        build=lambda ws: host_pb2.RegisterAgentTargetRequest(target=demo_target("authz")),
    ),
    _host("ListAgentTargets", ALL, Ws.DEPLOYMENT, build=_req(host_pb2.ListAgentTargetsRequest)),
    _host(
        "SetAgentTargetEnabled",
        OPS,
        Ws.DEPLOYMENT,
        wide_only=True,
        build=lambda ws: host_pb2.SetAgentTargetEnabledRequest(
            agent_target_id="demo", enabled=True
        ),
    ),
    _host(
        "GetMentionCatalog",
        ALL,
        Ws.FIELD,
        _req(host_pb2.GetMentionCatalogRequest, session_id="s-1", mode=AGENT),
    ),
    _host(
        "AddProject",
        ALL,
        Ws.FIELD,
        _req(host_pb2.AddProjectRequest, section_key="authz", label="Authz", path="/w/authz"),
    ),
    _host("ListProjects", ALL, Ws.FIELD, _req(host_pb2.ListProjectsRequest)),
    _host(
        "RemoveProject",
        ALL,
        Ws.FIELD,
        _req(host_pb2.RemoveProjectRequest, section_key="no-such-project"),
    ),
    _host(
        "CreateSession",
        ALL,
        Ws.FIELD,
        lambda ws: host_pb2.CreateSessionRequest(
            **_ws(ws, agent_target_id="demo", session_id=_unique("authz"), title="t", cwd="/w/app")
        ),
    ),
    _host("GetSession", ALL, Ws.FIELD, _req(host_pb2.GetSessionRequest, session_id="s-1")),
    _host(
        "ActivateSession",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ActivateSessionRequest, session_id="s-1", activation_id="act-1"),
    ),
    _host(
        "SearchGeneratedFiles",
        ALL,
        Ws.FIELD,
        _req(host_pb2.SearchGeneratedFilesRequest, section_key="conversations", limit=10),
    ),
    _host(
        "ListSessionSections",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListSessionSectionsRequest, page_size=10),
    ),
    _host(
        "ListSessionSectionPage",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListSessionSectionPageRequest, section_key="conversations", limit=10),
    ),
    _host(
        "ListPinnedSessionsPage",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListPinnedSessionsPageRequest, limit=10),
    ),
    _host(
        "SearchSessions",
        ALL,
        Ws.FIELD,
        _req(host_pb2.SearchSessionsRequest, search_query="title", limit=10),
    ),
    _host(
        "ListSectionDeletionCandidates",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListSectionDeletionCandidatesRequest, section_key="conversations"),
    ),
    _host(
        "RenameSession",
        ALL,
        Ws.FIELD,
        _req(host_pb2.RenameSessionRequest, session_id="s-1", title="renamed"),
    ),
    _host(
        "SetSessionPinned",
        ALL,
        Ws.FIELD,
        _req(host_pb2.SetSessionPinnedRequest, session_id="s-1", pinned=True),
    ),
    _host(
        "UpdateSessionSettings",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.UpdateSessionSettingsRequest,
            session_id="s-1",
            settings=canonical_pb2.SessionSettings(model="fast"),
        ),
    ),
    _host(
        "SendInput",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.SendInputRequest,
            session_id="s-1",
            client_submit_id="c-1",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=AGENT,
            content="hi",
        ),
    ),
    _host(
        "StopTurn", ALL, Ws.FIELD, _req(host_pb2.StopTurnRequest, session_id="s-1", turn_id="t-1")
    ),
    _host(
        "ListSessionTurns",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListSessionTurnsRequest, session_id="s-1", limit=10),
    ),
    _host(
        "GetTurnResult",
        ALL,
        Ws.FIELD,
        _req(host_pb2.GetTurnResultRequest, session_id="s-1", turn_id="t-1"),
    ),
    _host(
        "ListSessionMessages",
        ALL,
        Ws.FIELD,
        _req(host_pb2.ListSessionMessagesRequest, session_id="s-1", limit=10),
    ),
    _host(
        "SubmitInteractionResponse",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.SubmitInteractionResponseRequest,
            session_id="s-1",
            turn_id="t-1",
            request_id="q-1",
            action="allow",
            idempotency_key="k-1",
        ),
    ),
    _host(
        "GetInteractionResponseOperation",
        ALL,
        Ws.FIELD,
        _req(host_pb2.GetInteractionResponseOperationRequest, operation_id="op-1"),
    ),
    _host("ListAttentionItems", ALL, Ws.FIELD, _req(host_pb2.ListAttentionItemsRequest)),
    _host(
        "DeleteSessions", ALL, Ws.FIELD, _req(host_pb2.DeleteSessionsRequest, session_ids=["s-1"])
    ),
    _host(
        "ListDeletedSessions", ALL, Ws.FIELD, _req(host_pb2.ListDeletedSessionsRequest, limit=10)
    ),
    _host(
        "RestoreDeletedSession",
        ALL,
        Ws.FIELD,
        _req(host_pb2.RestoreDeletedSessionRequest, session_id="s-del"),
    ),
    _host(
        "PurgeDeletedSessions",
        OPS,
        Ws.OPTIONAL,
        _req(host_pb2.PurgeDeletedSessionsRequest, cutoff_unix_ms=2**53 - 1, max_trees=1000),
    ),
    _host(
        "PurgeWorkspaceTombstones",
        OPS,
        Ws.FIELD,
        _req(host_pb2.PurgeWorkspaceTombstonesRequest, max_components=100),
    ),
    _host(
        "ListPendingResourceCleanups",
        OPS,
        Ws.OPTIONAL,
        _req(host_pb2.ListPendingResourceCleanupsRequest, limit=100),
    ),
    _host(
        "CompleteResourceCleanup",
        OPS,
        Ws.FIELD,
        _req(host_pb2.CompleteResourceCleanupRequest, session_id="s-gone"),
    ),
    _host(
        "CompleteResourceCleanups",
        OPS,
        Ws.OPTIONAL,
        # The rows name the call's workspace, or the own one when it is unset.
        lambda ws: host_pb2.CompleteResourceCleanupsRequest(
            **_ws(
                ws,
                cleanups=[host_pb2.ResourceCleanupKey(workspace_id=ws or OWN, session_id="s-gone")],
            )
        ),
    ),
    _host("GetActivityState", ALL, Ws.OPTIONAL, _req(host_pb2.GetActivityStateRequest)),
    _host(
        "WatchActivity", OPS, Ws.FIELD, _req(host_pb2.WatchActivityRequest), shape="server_stream"
    ),
    _host(
        "ControlGoal",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.ControlGoalRequest,
            session_id="s-1",
            client_submit_id="g-1",
            action=host_pb2.GOAL_ACTION_PAUSE,
        ),
    ),
    _host(
        "SubmitPlanDecision",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.SubmitPlanDecisionRequest,
            session_id="s-1",
            turn_id="t-1",
            request_id="q-1",
            decision=host_pb2.PLAN_DECISION_DISMISS,
            idempotency_key="k-1",
        ),
    ),
    _host(
        "ImportTranscript",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.ImportTranscriptRequest,
            agent_target_id="demo",
            source_ref="src-1",
            cwd="/w/app",
        ),
    ),
    _host(
        "ForkSession",
        ALL,
        Ws.FIELD,
        _req(
            host_pb2.ForkSessionRequest, session_id="s-1", through_turn_id="t-1", client_op_id="f-1"
        ),
    ),
    _host("GetOperation", ALL, Ws.FIELD, _req(host_pb2.GetOperationRequest, operation_id="op-1")),
]


def _runtime_frames(ws: str | None) -> list[runtime_pb2.RuntimeLinkRequest]:
    hello = runtime_pb2.RuntimeHello(
        runtime_id=_unique("rt-authz"),
        runtime_instance_id="i-1",
        protocol_revision=PROTOCOL_REVISION,
        providers=["demo-provider"],
    )
    report = runtime_pb2.RuntimeReport(
        report_id=_unique("r"), workspace_id=ws or "", session_id="s-1"
    )
    return [
        runtime_pb2.RuntimeLinkRequest(hello=hello),
        runtime_pb2.RuntimeLinkRequest(report=report),
    ]


def _device_frames(ws: str | None) -> list[livestream_pb2.DeviceLinkRequest]:
    hello = livestream_pb2.ClientHello(
        protocol_revision=CURRENT_REVISION,
        device_id="device-1",
        workspace_ids=[] if ws is None else [ws],
    )
    return [livestream_pb2.DeviceLinkRequest(hello=hello)]


def _app_tree(ws: str | None) -> Any:
    return json_format.ParseDict(
        {
            **({} if ws is None else {"workspaceId": ws}),
            "apps": [
                {
                    "appId": "app-authz",
                    "displayName": "Authz",
                    "groups": [{"groupId": "g-1", "displayName": "G"}],
                }
            ],
        },
        appcenter_pb2.LoadAppsRequest(),
    )


def _topic_tree(ws: str | None) -> Any:
    return json_format.ParseDict(
        {
            **({} if ws is None else {"workspaceId": ws}),
            "topics": [
                {
                    "topicId": "t-authz",
                    "title": "Authz",
                    "issues": [
                        {
                            "issueId": "i-1",
                            "title": "I",
                            "createdAtUnixMs": "1",
                            "updatedAtUnixMs": "1",
                        }
                    ],
                }
            ],
        },
        issuemanager_pb2.LoadTopicsRequest(),
    )


def _mention(ws: str | None) -> Any:
    uri = f"mention://workspace-reference/app-1?source=app&workspaceId={ws or OWN}"
    return refresolve_pb2.ResolveMentionRequest(**_ws(ws, uri=uri))


def _rpc(server: str, stub: Any, service: str) -> Callable[..., Rpc]:
    def make(method: str, roles: frozenset[str], ws: Ws, build: Build, **kw: Any) -> Rpc:
        return Rpc(server, stub, service, method, roles, ws, build, **kw)

    return make


_link = _rpc(
    "host", runtime_pb2_grpc.RuntimeLinkServiceStub, "agentactivity.host.v1.RuntimeLinkService"
)
_ref = _rpc(
    "refresolve",
    refresolve_pb2_grpc.ReferenceServiceStub,
    "agentactivity.refresolve.v1.ReferenceService",
)
_live = _rpc(
    "livestream",
    livestream_pb2_grpc.DeviceLinkServiceStub,
    "agentactivity.livestream.v1.DeviceLinkService",
)
_maint = _rpc(
    "maintenance",
    maintenance_pb2_grpc.MaintenanceServiceStub,
    "agentactivity.maintenance.v1.MaintenanceService",
)
_apps = _rpc(
    "appcenter",
    appcenter_pb2_grpc.AppCenterServiceStub,
    "agentactivity.appcenter.v1.AppCenterService",
)
_issues = _rpc(
    "issuemanager",
    issuemanager_pb2_grpc.IssueManagerServiceStub,
    "agentactivity.issuemanager.v1.IssueManagerService",
)

RPCS: list[Rpc] = [
    *HOST_RPCS,
    _link("RuntimeLink", OPS, Ws.FRAME, _runtime_frames, shape="bidi"),
    _ref(
        "ListReferences",
        ALL,
        Ws.FIELD,
        _req(
            refresolve_pb2.ListReferencesRequest,
            source=refresolve_pb2.REFERENCE_SOURCE_APP,
            id="app-1",
            limit=10,
        ),
    ),
    _ref("ResolveMention", ALL, Ws.FIELD, _mention),
    _ref(
        "ExpandMentions",
        ALL,
        Ws.FIELD,
        _req(refresolve_pb2.ExpandMentionsRequest, text="no mentions here", limit_per_mention=5),
    ),
    _ref("GetReferenceSkill", ALL, Ws.FIELD, _req(refresolve_pb2.GetReferenceSkillRequest)),
    _live(
        "DeviceLink",
        DEVICE_ADMIN,
        Ws.FIRST,
        _device_frames,
        field="hello.workspace_ids",
        shape="bidi",
        missing_reason="PROTOCOL_VIOLATION",
        open_ended=True,
    ),
    _live(
        "ListPublishers",
        DEVICE_ADMIN,
        Ws.OPTIONAL,
        _req(livestream_pb2.ListPublishersRequest, page_size=10),
    ),
    _maint(
        "GetRetentionPreference",
        ALL,
        Ws.DEPLOYMENT,
        _req(maintenance_pb2.GetRetentionPreferenceRequest),
    ),
    _maint(
        "SetRetentionPreference",
        ADMIN,
        Ws.DEPLOYMENT,
        wide_only=True,
        build=lambda ws: maintenance_pb2.SetRetentionPreferenceRequest(
            retention=maintenance_pb2.RETENTION_PERIOD_30_DAYS
        ),
    ),
    _maint(
        "RunManualPurge",
        OPS,
        Ws.FIELD,
        _req(maintenance_pb2.RunManualPurgeRequest, scope=maintenance_pb2.PURGE_SCOPE_WORKSPACE),
    ),
    _maint(
        "GetMaintenanceStatus",
        ALL,
        Ws.OPTIONAL,
        field="preview_workspace_id",
        build=lambda ws: maintenance_pb2.GetMaintenanceStatusRequest(
            **({} if ws is None else {"preview_workspace_id": ws})
        ),
    ),
    _apps(
        "ListReferences",
        ALL,
        Ws.FIELD,
        _req(appcenter_pb2.ListReferencesRequest, app_id="app-1", page_size=10),
    ),
    _apps("LoadApps", ADMIN, Ws.FIELD, _app_tree),
    _apps(
        "DeleteApp",
        ADMIN,
        Ws.FIELD,
        _req(appcenter_pb2.DeleteAppRequest, app_id="app-gone", allow_missing=True),
    ),
    _issues(
        "GetIssueDetail",
        ALL,
        Ws.FIELD,
        _req(issuemanager_pb2.GetIssueDetailRequest, issue_id="i-1", topic_id="t-1"),
    ),
    _issues(
        "SearchIssueOutputs",
        ALL,
        Ws.FIELD,
        _req(
            issuemanager_pb2.SearchIssueOutputsRequest, topic_id="t-1", query="notes", page_size=10
        ),
    ),
    _issues("LoadTopics", ADMIN, Ws.FIELD, _topic_tree),
    _issues(
        "DeleteTopic",
        ADMIN,
        Ws.FIELD,
        _req(issuemanager_pb2.DeleteTopicRequest, topic_id="t-gone", allow_missing=True),
    ),
]

SERVERS = ("host", "refresolve", "livestream", "maintenance", "appcenter", "issuemanager")


@dataclass(frozen=True)
class Expected:
    """The expected outcome: a refusal (code, reason, violated field) or admission."""

    code: grpc.StatusCode | None = None
    reason: str = ""
    field: str | None = None

    @property
    def refused(self) -> bool:
        return self.code is not None


ADMITTED = Expected()


def _workspace_cases(rpc: Rpc) -> tuple[str, ...]:
    return ("none",) if rpc.workspace is Ws.DEPLOYMENT else ("own", "foreign", "unset")


def expected(rpc: Rpc, principal: Principal, case: str) -> Expected:
    """The hand-written rules (docs/auth.md "Rules"), applied to one case."""
    denied = grpc.StatusCode.PERMISSION_DENIED
    if principal.role not in rpc.roles:
        return Expected(denied, "ROLE_NOT_ALLOWED")
    if rpc.workspace is Ws.DEPLOYMENT:
        if rpc.wide_only and not principal.wide:
            return Expected(denied, "DEPLOYMENT_SCOPE_REQUIRED")
        return ADMITTED
    if case == "own" or (case == "foreign" and principal.wide):
        return ADMITTED
    if case == "foreign":
        return Expected(denied, "WORKSPACE_SCOPE_MISMATCH")
    # The workspace is unset.
    if rpc.workspace is Ws.OPTIONAL:
        return ADMITTED  # scoped to the principal's own workspaces (test_authorization_scope)
    if rpc.workspace is Ws.FRAME:  # a frame naming no workspace is outside a scoped token
        return ADMITTED if principal.wide else Expected(denied, "WORKSPACE_SCOPE_MISMATCH")
    return Expected(grpc.StatusCode.INVALID_ARGUMENT, rpc.missing_reason, rpc.field)


@dataclass(frozen=True)
class Case:
    """One call of the matrix."""

    rpc: Rpc
    who: str
    workspace: str
    metadata: tuple[tuple[str, str], ...]
    expect: Expected

    @property
    def label(self) -> str:
        service = self.rpc.service.rsplit(".", 1)[1]
        return f"{service}.{self.rpc.method} as {self.who} ({self.workspace})"


def cases_for(rpc: Rpc) -> list[Case]:
    """Every case of one RPC: principals x workspace cases, then the credential cases."""
    found = [
        Case(
            rpc, principal.name, case, auth_metadata(principal.name), expected(rpc, principal, case)
        )
        for principal in PRINCIPALS
        for case in _workspace_cases(rpc)
    ]
    for name, (metadata, reason) in CREDENTIALS.items():
        found.append(
            Case(rpc, name, "own", metadata, Expected(grpc.StatusCode.UNAUTHENTICATED, reason))
        )
    return found


ALL_CASES = [case for rpc in RPCS for case in cases_for(rpc)]
CASES_PER_BACKEND = len(ALL_CASES)


def _workspace_value(case: Case) -> str | None:
    if case.rpc.workspace is Ws.DEPLOYMENT:
        return None
    return {"own": OWN, "foreign": FOREIGN, "none": None, "unset": None}[case.workspace]


def _details(error: grpc.RpcError) -> tuple[str, set[str]]:
    _, reason, fields = error_details(error)
    return reason, fields


def call(channel: grpc.Channel, case: Case) -> tuple[grpc.StatusCode, str, set[str]]:
    """Make the call; return its code, ErrorInfo reason and violated fields."""
    rpc = case.rpc
    method = getattr(rpc.stub(channel), rpc.method)
    request = rpc.build(_workspace_value(case))
    try:
        if rpc.shape == "unary":
            method(request, metadata=case.metadata, timeout=15)
        elif rpc.shape == "server_stream" or rpc.open_ended:
            stream = method(
                iter(request) if rpc.open_ended else request, metadata=case.metadata, timeout=15
            )
            try:
                next(stream)  # admitted: the first frame (the ready marker) arrived
            finally:
                stream.cancel()
        else:
            for _ in method(iter(request), metadata=case.metadata, timeout=15):
                pass
    except grpc.RpcError as error:
        reason, fields = _details(error)
        return error.code(), reason, fields
    return grpc.StatusCode.OK, "", set()


def snapshot(engine: Engine) -> dict[str, list[str]]:
    """Every row of every store table, in a stable order (the activity event log included)."""
    rows: dict[str, list[str]] = {}
    with engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            rows[table.name] = sorted(repr(tuple(r)) for r in connection.execute(select(table)))
    return rows


def check(channel: grpc.Channel, engine: Engine, case: Case) -> str | None:
    """Run one case; a description of what went wrong, or ``None``."""
    before = snapshot(engine) if case.expect.refused else None
    code, reason, fields = call(channel, case)
    want = case.expect
    if want.refused:
        got = (code, reason)
        if got != (want.code, want.reason):
            return f"{case.label}: expected {want.code} {want.reason}, got {code} {reason}"
        if want.field is not None and fields != {want.field}:
            return f"{case.label}: expected a violation of {want.field}, got {sorted(fields)}"
        after = snapshot(engine)
        assert before is not None
        changed = sorted(t for t in after if after[t] != before[t])
        if changed:
            return f"{case.label}: refused, but changed {changed}"
        return None
    if reason in AUTH_REASONS or (
        code == grpc.StatusCode.INVALID_ARGUMENT and case.rpc.field in fields
    ):
        return f"{case.label}: admitted expected, got {code} {reason} {sorted(fields)}"
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return f"{case.label}: admitted, but failed with {code}"
    return None


# ---------------------------------------------------------------------------- servers


def _seed_host(host: LiveServer, engine: Engine) -> None:
    """A target, live and tombstoned Sessions and cleanup rows in both workspaces."""
    hosts = host_pb2_grpc.HostServiceStub(host.channel)
    hosts.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(target=demo_target()),
        metadata=auth_metadata("admin"),
        timeout=15,
    )
    for ws in (OWN, FOREIGN):
        add_tree(engine, {"s-1": None, "s-del": None, "s-gone": None}, workspace_id=ws)
        hosts.DeleteSessions(
            host_pb2.DeleteSessionsRequest(workspace_id=ws, session_ids=["s-del", "s-gone"]),
            metadata=auth_metadata("admin"),
            timeout=15,
        )
    with engine.begin() as connection:  # s-gone is purged (a cleanup row), s-del stays
        connection.execute(
            update(Session).where(Session.session_id == "s-gone").values(deleted_at_unix_ms=1)
        )
    hosts.PurgeDeletedSessions(
        host_pb2.PurgeDeletedSessionsRequest(cutoff_unix_ms=1, max_trees=100),
        metadata=auth_metadata("service"),
        timeout=15,
    )


def _seed_backends(apps: LiveServer, issues: LiveServer) -> None:
    for ws in (OWN, FOREIGN):
        appcenter_pb2_grpc.AppCenterServiceStub(apps.channel).LoadApps(
            json_format.ParseDict(
                {
                    "workspaceId": ws,
                    "apps": [
                        {
                            "appId": "app-1",
                            "displayName": "One",
                            "groups": [{"groupId": "q1", "displayName": "Q1"}],
                        }
                    ],
                },
                appcenter_pb2.LoadAppsRequest(),
            ),
            metadata=auth_metadata("admin"),
            timeout=15,
        )
        issuemanager_pb2_grpc.IssueManagerServiceStub(issues.channel).LoadTopics(
            _topic_tree(ws), metadata=auth_metadata("admin"), timeout=15
        )


def start(
    server: str, url: str, engine: Engine, live_server: Callable[..., LiveServer]
) -> LiveServer:
    """Start ``server`` (and what it calls) on ``url``, seeded with data in both workspaces."""
    if server == "host":
        host = live_server("host", database_url=url)
        _seed_host(host, engine)
        return host
    if server in ("appcenter", "issuemanager", "refresolve"):
        apps = live_server("appcenter", database_url=url)
        issues = live_server("issuemanager", database_url=url)
        _seed_backends(apps, issues)
        if server == "appcenter":
            return apps
        if server == "issuemanager":
            return issues
        return live_server(
            "refresolve",
            database_url=url,
            appcenter_address=apps.address,
            issuemanager_address=issues.address,
            service_token=token_for("service"),
        )
    if server == "maintenance":
        # Maintenance reaches Host for every purge and status read (ARCH-2); without one an
        # admitted call can only fail, so it gets a seeded Host on the same store.
        host = live_server("host", database_url=url)
        _seed_host(host, engine)
        return live_server(
            "maintenance",
            database_url=url,
            host_address=host.address,
            service_token=token_for("service"),
        )
    return live_server(server, database_url=url)


# ---------------------------------------------------------------------------- tests


@pytest.mark.spec("SEC-3")
def test_the_hand_written_matrix_is_the_declared_table() -> None:
    declared: dict[str, MethodPolicy] = {}
    for server in SERVERS:
        for table in importlib.import_module(f"services.{server}.authorization").AUTHORIZATION:
            declared.update(table.by_path())
    assert sorted(rpc.path for rpc in RPCS) == sorted(declared), "an RPC is missing here"
    for rpc in RPCS:
        policy = declared[rpc.path]
        assert {role.value for role in policy.roles} == set(rpc.roles), rpc.path
        assert policy.workspace is WorkspaceSource(rpc.workspace.value), rpc.path
        assert policy.deployment_wide is rpc.wide_only, rpc.path
        if rpc.workspace in (Ws.FIELD, Ws.OPTIONAL, Ws.FIRST):
            assert policy.field == rpc.field, rpc.path
    assert len(RPCS) == 60
    assert CASES_PER_BACKEND == 1090


def _by_server(server: str) -> Iterator[Case]:
    return (case for case in ALL_CASES if case.rpc.server == server)


@pytest.mark.spec("SEC-1", "SEC-3")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("server", SERVERS)
def test_every_rpc_role_and_case_is_authorized_as_declared(
    server: str,
    migrated_db_url: str,
    sync_engine: Engine,
    live_server: Callable[..., LiveServer],
) -> None:
    running = start(server, migrated_db_url, sync_engine, live_server)
    failures: list[str] = []
    ran = 0
    for case in _by_server(server):
        problem = check(running.channel, sync_engine, case)
        ran += 1
        if problem is not None:
            failures.append(problem)
    assert ran == sum(1 for _ in _by_server(server))
    assert not failures, f"{len(failures)} of {ran} cases failed:\n" + "\n".join(failures)


# ------------------------------------------------ maintenance without a reachable Host

UNREACHABLE_HOST = "127.0.0.1:1"
"""A port nothing listens on: every Host call of maintenance fails at once."""


def _maintenance_without_host(url: str, live_server: Callable[..., LiveServer]) -> Any:
    server = live_server(
        "maintenance",
        database_url=url,
        host_address=UNREACHABLE_HOST,
        service_token=token_for("service"),
    )
    return maintenance_pb2_grpc.MaintenanceServiceStub(server.channel)


@pytest.mark.spec("SEC-3", "SEC-4", "MAINT-MAN-1")
def test_an_admitted_manual_purge_without_a_reachable_host_is_unavailable(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    stub = _maintenance_without_host(migrated_db_url, live_server)
    for principal in ("ws1-service", "admin"):
        with pytest.raises(grpc.RpcError) as caught:
            stub.RunManualPurge(
                maintenance_pb2.RunManualPurgeRequest(
                    workspace_id=OWN, scope=maintenance_pb2.PURGE_SCOPE_WORKSPACE
                ),
                metadata=auth_metadata(principal),
                timeout=15,
            )
        code, reason, _ = error_details(caught.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "HOST_UNAVAILABLE"), principal


@pytest.mark.spec("SEC-3", "SEC-4", "MAINT-STAT-1")
def test_an_admitted_status_read_without_a_reachable_host_is_not_internal(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    """Once HostUnavailable escaped the status read as INTERNAL with a traceback."""
    stub = _maintenance_without_host(migrated_db_url, live_server)
    outcomes = []
    for principal, preview in (("ws1-device", None), ("ws1-device", OWN), ("admin", None)):
        request = maintenance_pb2.GetMaintenanceStatusRequest()
        if preview is not None:
            request.preview_workspace_id = preview
        try:
            response = stub.GetMaintenanceStatus(
                request, metadata=auth_metadata(principal), timeout=15
            )
        except grpc.RpcError as error:
            outcomes.append((principal, preview, error.code()))
            continue
        # Answered: the gate fails closed and says why (MAINT-IDLE-1).
        state = response.idle_gate.state
        assert state == maintenance_pb2.IDLE_GATE_STATE_ACTIVITY_STATE_UNAVAILABLE, principal
    wrong = [o for o in outcomes if o[2] != grpc.StatusCode.UNAVAILABLE]
    assert not wrong, wrong


# ------------------------------------------- livestream x every fixture principal
#
# DeviceLink and ListPublishers against every principal of principals.yaml (read from the
# file, so a principal added there is covered here), with the expectation derived from
# its declared role, workspaces and expiry, and the credential cases. Livestream reads a
# real Host, so an admitted DeviceLink is proven admitted by its stream_ready; the
# publishers a ListPublishers shows are checked too (device: its own; admin: every one
# within its workspaces).

LIVE_CREDENTIALS = {
    "no token": CREDENTIALS["no token"],
    "malformed header": CREDENTIALS["malformed header"],
    "bad token": CREDENTIALS["bad token"],
}
LIVE_SCOPES = {"own": [OWN], "foreign": [FOREIGN], "both": [OWN, FOREIGN], "empty": []}


def _fixture_expectation(name: str, workspaces: list[str]) -> Expected:
    """What principals.yaml says ``name`` may do with DeviceLink/ListPublishers."""
    spec = TEST_PRINCIPALS[name]
    not_after = spec.get("not_after")
    if not_after is not None and datetime.fromisoformat(str(not_after)) < datetime.now(UTC):
        return Expected(grpc.StatusCode.UNAUTHENTICATED, "EXPIRED_CREDENTIALS")
    if spec["role"] not in DEVICE_ADMIN:
        return Expected(grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    held = set(spec["workspaces"])
    if "*" not in held and not set(workspaces) <= held:
        return Expected(grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")
    return ADMITTED


def _device_hello(device: str, workspaces: list[str]) -> bytes:
    return livestream_pb2.DeviceLinkRequest(
        hello=livestream_pb2.ClientHello(
            protocol_revision=CURRENT_REVISION,
            device_id=device,
            workspace_ids=workspaces,
        )
    ).SerializeToString()


def _open_link(
    live: LiveServer, metadata: tuple[tuple[str, str], ...], hello: bytes
) -> tuple[RawLink, grpc.StatusCode, str, set[str]]:
    """Open a link; it is admitted once stream_ready arrives, refused when it ends."""
    link = RawLink(live.channel, metadata, [hello])
    ready = link.wait(lambda frames: any(f.kind == "stream_ready" for f in frames), timeout=15)
    if ready:
        return link, grpc.StatusCode.OK, "", set()
    assert link.error is not None
    code, reason, fields = error_details(link.error)
    return link, code, reason, fields


@pytest.mark.spec("SEC-1", "SEC-3", "LIVE-LINK-1", "LIVE-PUB-1")
@pytest.mark.timeout(300)
def test_livestream_rpcs_against_every_fixture_principal(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    live = start_livestream(live_server, host.server)
    stub = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)
    failures: list[str] = []
    opened: list[RawLink] = []
    publishers: dict[str, set[str]] = {}  # device id -> its scope, for admitted links
    owners: dict[str, str] = {}
    cases = 0
    try:
        for name in TEST_PRINCIPALS:
            for label, workspaces in LIVE_SCOPES.items():
                device = f"{name}-{label}"
                link, code, reason, fields = _open_link(
                    live, auth_metadata(name), _device_hello(device, workspaces)
                )
                opened.append(link)
                cases += 1
                want = _fixture_expectation(name, workspaces)
                if label == "empty" and want in (
                    ADMITTED,
                    Expected(grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH"),
                ):
                    want = Expected(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "PROTOCOL_VIOLATION",
                        "hello.workspace_ids",
                    )
                got = Expected(None if code == grpc.StatusCode.OK else code, reason)
                if (got.code, got.reason) != (want.code, want.reason) or (
                    want.field is not None and fields != {want.field}
                ):
                    failures.append(
                        f"DeviceLink as {name} scope {workspaces}: expected {want.code} "
                        f"{want.reason}, got {code} {reason} {sorted(fields)}"
                    )
                if code == grpc.StatusCode.OK:
                    publishers[device] = set(workspaces)
                    owners[device] = name
                    # An attach outside the link's scope is refused, whoever asks.
                    if FOREIGN not in workspaces:
                        attach = livestream_pb2.DeviceLinkRequest(
                            attach=livestream_pb2.ClientAttach(
                                binding_id="b", revision=1, workspace_id=FOREIGN, session_id="s1"
                            )
                        )
                        probe, *_ = _open_link(
                            live, auth_metadata(name), _device_hello(f"{device}-x", workspaces)
                        )
                        opened.append(probe)
                        probe.send(attach.SerializeToString())
                        error = probe.wait_error(timeout=15)
                        cases += 1
                        if error_details(error)[:2] != (
                            grpc.StatusCode.PERMISSION_DENIED,
                            "WORKSPACE_SCOPE_MISMATCH",
                        ):
                            failures.append(
                                f"attach to {FOREIGN} as {name}: {error_details(error)}"
                            )
        for credential, (metadata, reason) in LIVE_CREDENTIALS.items():
            link, code, got_reason, _ = _open_link(live, metadata, _device_hello("c", [OWN]))
            opened.append(link)
            cases += 1
            if (code, got_reason) != (grpc.StatusCode.UNAUTHENTICATED, reason):
                failures.append(f"DeviceLink with {credential}: got {code} {got_reason}")
        # ListPublishers: every principal x workspace unset / own / foreign.
        for name, spec in TEST_PRINCIPALS.items():
            for workspace in (None, OWN, FOREIGN):
                request = livestream_pb2.ListPublishersRequest(page_size=1000)
                if workspace is not None:
                    request.workspace_id = workspace
                want = _fixture_expectation(name, [] if workspace is None else [workspace])
                cases += 1
                try:
                    response = stub.ListPublishers(
                        request, metadata=auth_metadata(name), timeout=15
                    )
                except grpc.RpcError as error:
                    code, reason, _ = error_details(error)
                    if (code, reason) != (want.code, want.reason):
                        failures.append(
                            f"ListPublishers({workspace}) as {name}: expected {want.code} "
                            f"{want.reason}, got {code} {reason}"
                        )
                    continue
                if want.refused:
                    failures.append(f"ListPublishers({workspace}) as {name}: admitted")
                    continue
                held = set(spec["workspaces"])
                visible = {
                    device
                    for device, scope in publishers.items()
                    if (spec["role"] == "admin" or owners[device] == name)
                    and ("*" in held or scope <= held)
                    and (workspace is None or workspace in scope)
                }
                shown = {p.device_id for p in response.publishers} & set(publishers)
                if shown != visible:
                    failures.append(
                        f"ListPublishers({workspace}) as {name}: shows {sorted(shown)}, "
                        f"expected {sorted(visible)}"
                    )
        for credential, (metadata, reason) in CREDENTIALS.items():
            cases += 1
            try:
                stub.ListPublishers(livestream_pb2.ListPublishersRequest(), metadata=metadata)
                failures.append(f"ListPublishers with {credential}: admitted")
            except grpc.RpcError as error:
                code, got_reason, _ = error_details(error)
                if (code, got_reason) != (grpc.StatusCode.UNAUTHENTICATED, reason):
                    failures.append(f"ListPublishers with {credential}: {code} {got_reason}")
    finally:
        for link in opened:
            link.cancel()
    assert cases >= len(TEST_PRINCIPALS) * (len(LIVE_SCOPES) + 3)
    assert not failures, f"{len(failures)} of {cases} cases failed:\n" + "\n".join(failures)


@pytest.mark.spec("SEC-3", "LIVE-PUB-1")
def test_list_publishers_by_workspace_shows_a_multi_workspace_publisher_to_admin(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    """A workspace filter selects publishers whose scope contains it; it does not narrow
    what a deployment-wide admin may see (it once listed only scopes within {W})."""
    host = start_host(live_server, migrated_db_url)
    live = start_livestream(live_server, host.server)
    link, code, reason, _ = _open_link(
        live, auth_metadata("admin"), _device_hello("two-workspaces", [OWN, FOREIGN])
    )
    try:
        assert code == grpc.StatusCode.OK, (code, reason)
        stub = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)
        for workspace in (OWN, FOREIGN):
            response = stub.ListPublishers(
                livestream_pb2.ListPublishersRequest(workspace_id=workspace),
                metadata=auth_metadata("admin"),
                timeout=15,
            )
            assert [p.device_id for p in response.publishers] == ["two-workspaces"], workspace
    finally:
        link.cancel()
