"""Who may call each Host RPC, and where its workspace comes from (SEC-1, SEC-3).

The one authorization table of ``HostService`` and ``RuntimeLinkService``; the server
interceptor enforces it before any handler runs (see :mod:`grpcserver.authorization`)
and ``docs/auth.md`` shows it (``python scripts/auth_table.py``). Permanent purge and
resource cleanup are maintenance's job: ``service``/``admin`` only. Agent targets are
deployment-wide records: writing one needs a deployment-wide principal.
"""

from __future__ import annotations

from agentactivity.host.v1 import host_pb2, runtime_pb2
from grpcserver.authorization import (
    ANY_ROLE,
    OPERATORS,
    ServiceAuthorization,
    deployment_read,
    deployment_write,
    each_frame,
    optional_workspace,
    workspace_field,
)

HOST_SERVICE = ServiceAuthorization(
    host_pb2.DESCRIPTOR.services_by_name["HostService"],
    {
        # Agent targets: deployment-wide records (ADR 0009).
        "RegisterAgentTarget": deployment_write(*OPERATORS),
        "ListAgentTargets": deployment_read(*ANY_ROLE),
        "SetAgentTargetEnabled": deployment_write(*OPERATORS),
        "GetMentionCatalog": workspace_field(*ANY_ROLE),
        # Projects and Sessions.
        "AddProject": workspace_field(*ANY_ROLE),
        "ListProjects": workspace_field(*ANY_ROLE),
        "RemoveProject": workspace_field(*ANY_ROLE),
        "CreateSession": workspace_field(*ANY_ROLE),
        "GetSession": workspace_field(*ANY_ROLE),
        "ActivateSession": workspace_field(*ANY_ROLE),
        "SearchGeneratedFiles": workspace_field(*ANY_ROLE),
        "ListSessionSections": workspace_field(*ANY_ROLE),
        "ListSessionSectionPage": workspace_field(*ANY_ROLE),
        "ListPinnedSessionsPage": workspace_field(*ANY_ROLE),
        "SearchSessions": workspace_field(*ANY_ROLE),
        "ListSectionDeletionCandidates": workspace_field(*ANY_ROLE),
        "RenameSession": workspace_field(*ANY_ROLE),
        "SetSessionPinned": workspace_field(*ANY_ROLE),
        "UpdateSessionSettings": workspace_field(*ANY_ROLE),
        # Turns, messages, Interactions.
        "SendInput": workspace_field(*ANY_ROLE),
        "StopTurn": workspace_field(*ANY_ROLE),
        "ListSessionTurns": workspace_field(*ANY_ROLE),
        "GetTurnResult": workspace_field(*ANY_ROLE),
        "ListSessionMessages": workspace_field(*ANY_ROLE),
        "SubmitInteractionResponse": workspace_field(*ANY_ROLE),
        "GetInteractionResponseOperation": workspace_field(*ANY_ROLE),
        "ListAttentionItems": workspace_field(*ANY_ROLE),
        # Delete and restore are user actions; permanent purge and cleanup are not.
        "DeleteSessions": workspace_field(*ANY_ROLE),
        "ListDeletedSessions": workspace_field(*ANY_ROLE),
        "RestoreDeletedSession": workspace_field(*ANY_ROLE),
        "PurgeDeletedSessions": optional_workspace(*OPERATORS),
        "PurgeWorkspaceTombstones": workspace_field(*OPERATORS),
        "ListPendingResourceCleanups": optional_workspace(*OPERATORS),
        "CompleteResourceCleanup": workspace_field(*OPERATORS),
        "CompleteResourceCleanups": optional_workspace(*OPERATORS),
        # Activity: the idle gate reads every workspace of its (deployment-wide) token.
        "GetActivityState": optional_workspace(*ANY_ROLE),
        "WatchActivity": workspace_field(*OPERATORS),
        # Second phase (UNIMPLEMENTED for now), declared as they will be served.
        "ControlGoal": workspace_field(*ANY_ROLE),
        "SubmitPlanDecision": workspace_field(*ANY_ROLE),
        "ImportTranscript": workspace_field(*ANY_ROLE),
        "ForkSession": workspace_field(*ANY_ROLE),
        "GetOperation": workspace_field(*ANY_ROLE),
    },
)

RUNTIME_LINK_SERVICE = ServiceAuthorization(
    runtime_pb2.DESCRIPTOR.services_by_name["RuntimeLinkService"],
    # Runtimes serve targets across the workspaces of their token; every report and
    # delta names its workspace and the link refuses one outside the token's.
    {"RuntimeLink": each_frame(*OPERATORS)},
)

AUTHORIZATION = (HOST_SERVICE, RUNTIME_LINK_SERVICE)
"""The tables of every service the host server serves."""
