"""RPCs about agent targets (HOST-TGT-1) and the ``@`` menu catalog (HOST-MENT-1)."""

from __future__ import annotations

from typing import Any

from agentactivity.host.v1 import host_pb2
from domainerrors import InvalidArgument
from services.host.context import HostContext
from services.host.model.records import (
    AgentTargetRecord,
    Capabilities,
    LaunchRef,
    ModelOption,
    SettingsCatalog,
    Subagent,
)
from services.host.sessions import targets
from services.host.sessions.mention_catalog import read_mention_catalog
from services.host.wire.command_codec import COMPOSER_MODES
from services.host.wire.projection import capabilities_to_proto

LOCALITY_FROM_WIRE = {
    host_pb2.AGENT_TARGET_LOCALITY_UNSPECIFIED: "local",
    host_pb2.AGENT_TARGET_LOCALITY_LOCAL: "local",
    host_pb2.AGENT_TARGET_LOCALITY_SHARED: "shared",
    host_pb2.AGENT_TARGET_LOCALITY_REMOTE: "remote",
}
LOCALITY_TO_WIRE = {
    "local": host_pb2.AGENT_TARGET_LOCALITY_LOCAL,
    "shared": host_pb2.AGENT_TARGET_LOCALITY_SHARED,
    "remote": host_pb2.AGENT_TARGET_LOCALITY_REMOTE,
}


def target_from_proto(message: host_pb2.AgentTarget) -> AgentTargetRecord:
    """The registration input; timestamps are ignored, an unknown locality is kept invalid."""
    catalog = message.settings_catalog
    return AgentTargetRecord(
        agent_target_id=message.agent_target_id,
        provider=message.provider,
        display_name=message.display_name,
        enabled=message.enabled,
        launch_ref=LaunchRef(
            message.launch_ref.runtime_target_ref, message.launch_ref.options_json
        ),
        capabilities=Capabilities(
            guidance=message.capabilities.guidance,
            interrupt=message.capabilities.interrupt,
            live_settings=message.capabilities.live_settings,
            subagents=message.capabilities.subagents,
        ),
        subagents=tuple(Subagent(s.name, s.description) for s in message.subagents),
        settings_catalog=SettingsCatalog(
            models=tuple(
                ModelOption(
                    model_id=m.model_id,
                    display_name=m.display_name,
                    reasoning_efforts=tuple(m.reasoning_efforts),
                    default_reasoning_effort=(
                        m.default_reasoning_effort
                        if m.HasField("default_reasoning_effort")
                        else None
                    ),
                )
                for m in catalog.models
            ),
            default_model_id=(
                catalog.default_model_id if catalog.HasField("default_model_id") else None
            ),
            permission_modes=tuple(catalog.permission_modes),
            default_permission_mode=(
                catalog.default_permission_mode
                if catalog.HasField("default_permission_mode")
                else None
            ),
            speed_configurable=catalog.speed_configurable,
        ),
        locality=LOCALITY_FROM_WIRE.get(message.locality, f"unknown:{message.locality}"),
    )


def target_to_proto(record: AgentTargetRecord) -> host_pb2.AgentTarget:
    """The stored target as the wire shows it."""
    catalog = record.settings_catalog
    wire_catalog = host_pb2.AgentSettingsCatalog(
        models=[
            host_pb2.ModelOption(
                model_id=m.model_id,
                display_name=m.display_name,
                reasoning_efforts=list(m.reasoning_efforts),
                default_reasoning_effort=m.default_reasoning_effort,
            )
            for m in catalog.models
        ],
        default_model_id=catalog.default_model_id,
        permission_modes=list(catalog.permission_modes),
        default_permission_mode=catalog.default_permission_mode,
        speed_configurable=catalog.speed_configurable,
    )
    return host_pb2.AgentTarget(
        agent_target_id=record.agent_target_id,
        provider=record.provider,
        display_name=record.display_name,
        enabled=record.enabled,
        launch_ref=host_pb2.AgentLaunchRef(
            runtime_target_ref=record.launch_ref.runtime_target_ref,
            options_json=record.launch_ref.options_json,
        ),
        capabilities=capabilities_to_proto(record.capabilities),
        subagents=[
            host_pb2.SubagentDescriptor(name=s.name, description=s.description)
            for s in record.subagents
        ],
        settings_catalog=wire_catalog,
        locality=LOCALITY_TO_WIRE.get(record.locality, host_pb2.AGENT_TARGET_LOCALITY_UNSPECIFIED),
        created_at_unix_ms=record.created_at_unix_ms,
        updated_at_unix_ms=record.updated_at_unix_ms,
    )


class TargetRpcs:
    """Serves the agent-target RPCs."""

    ctx: HostContext

    async def RegisterAgentTarget(
        self, request: host_pb2.RegisterAgentTargetRequest, context: Any
    ) -> host_pb2.RegisterAgentTargetResponse:
        """Create or replace a deployment-wide target (HOST-TGT-1).

        ``service``/``admin`` with a deployment-wide token (``services/host/authorization.py``).
        """
        if not request.HasField("target"):
            raise InvalidArgument.for_field("target", "is required")
        stored, created = await targets.register_target(self.ctx, target_from_proto(request.target))
        return host_pb2.RegisterAgentTargetResponse(target=target_to_proto(stored), created=created)

    async def ListAgentTargets(
        self, request: host_pb2.ListAgentTargetsRequest, context: Any
    ) -> host_pb2.ListAgentTargetsResponse:
        """List targets ordered by id (HOST-TGT-1); any authenticated caller."""
        provider = request.provider if request.HasField("provider") else None
        found = await targets.list_targets(
            self.ctx, include_disabled=request.include_disabled, provider=provider
        )
        return host_pb2.ListAgentTargetsResponse(targets=[target_to_proto(t) for t in found])

    async def SetAgentTargetEnabled(
        self, request: host_pb2.SetAgentTargetEnabledRequest, context: Any
    ) -> host_pb2.SetAgentTargetEnabledResponse:
        """Enable or disable a target (HOST-TGT-1); as ``RegisterAgentTarget``."""
        stored = await targets.set_target_enabled(
            self.ctx, request.agent_target_id, request.enabled
        )
        return host_pb2.SetAgentTargetEnabledResponse(target=target_to_proto(stored))

    async def GetMentionCatalog(
        self, request: host_pb2.GetMentionCatalogRequest, context: Any
    ) -> host_pb2.GetMentionCatalogResponse:
        """The ``@`` menu's Agents group minus shadowed names (HOST-MENT-1).

        A failed catalog or file-index read empties the group and sets
        ``unavailable_reason`` instead of failing the call (HOST-MENT-4).
        """
        if request.mode not in COMPOSER_MODES:
            raise InvalidArgument.for_field("mode", "unknown composer mode")
        scope = request.WhichOneof("scope")
        menu = await read_mention_catalog(
            self.ctx,
            request.workspace_id,
            session_id=request.session_id if scope == "session_id" else None,
            agent_target_id=request.agent_target_id if scope == "agent_target_id" else None,
            cwd=request.cwd if request.HasField("cwd") else None,
            mode=COMPOSER_MODES[request.mode],
        )
        return host_pb2.GetMentionCatalogResponse(
            agents=[
                host_pb2.SubagentDescriptor(name=a.name, description=a.description)
                for a in menu.agents
            ],
            shadowed_names=list(menu.shadowed_names),
            unavailable_reason=menu.unavailable_reason,
        )
