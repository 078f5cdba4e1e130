"""Seed Host rows directly in the store for activity tests (targets and Sessions).

Used until tests can create Sessions through ``CreateSession``; it writes exactly the
columns that RPC persists for an ordinary root Session.
"""

from __future__ import annotations

import json

from sqlalchemy import insert

from store.engine import create_sync_engine_for
from store.models import DEPLOYMENT_WORKSPACE_KEY, AgentTarget, Session

TARGET_ID = "demo-target"
PROVIDER = "demo"


def seed_target(
    url: str,
    *,
    target_id: str = TARGET_ID,
    provider: str = PROVIDER,
    guidance: bool = True,
    interrupt: bool = True,
    enabled: bool = True,
) -> None:
    """Register a deployment-wide agent target."""
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(AgentTarget).values(
                    workspace_id=DEPLOYMENT_WORKSPACE_KEY,
                    agent_target_id=target_id,
                    provider=provider,
                    display_name=target_id,
                    enabled=enabled,
                    launch_ref_json=json.dumps({"runtime_target_ref": f"{provider}:default"}),
                    capabilities_json=json.dumps(
                        {"guidance": guidance, "interrupt": interrupt, "live_settings": True}
                    ),
                    subagent_catalog_json=json.dumps([{"name": "explorer"}]),
                    created_at_unix_ms=1,
                    updated_at_unix_ms=1,
                )
            )
    finally:
        engine.dispose()


def seed_session(
    url: str,
    session_id: str,
    *,
    workspace_id: str = "ws-1",
    target_id: str = TARGET_ID,
    provider: str = PROVIDER,
    subagents: tuple[str, ...] = ("explorer",),
) -> None:
    """Insert a live root Session launched on ``target_id``."""
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(Session).values(
                    workspace_id=workspace_id,
                    session_id=session_id,
                    root_session_id=session_id,
                    agent_target_id=target_id,
                    provider=provider,
                    title=f"title of {session_id}",
                    cwd="/nonexistent/workspace",
                    rail_section_key="conversations",
                    capabilities_json=json.dumps({"guidance": True, "interrupt": True}),
                    launch_subagents_json=json.dumps([{"name": name} for name in subagents]),
                    created_at_unix_ms=1,
                    updated_at_unix_ms=1,
                )
            )
    finally:
        engine.dispose()
