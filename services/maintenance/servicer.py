"""Wire layer of ``MaintenanceService`` (MAINT-PREF-1, MAINT-MAN-1, MAINT-STAT-1).

It only translates: request checks, proto -> domain call -> proto. The rules live in
:mod:`services.maintenance.worker` (runs), :mod:`services.maintenance.status` (the status
read) and :mod:`services.maintenance.retention` (the preference).
"""

from __future__ import annotations

from typing import Any

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from domainerrors import FieldViolation, InvalidArgument
from grpcserver.auth import current_principal
from grpcserver.errors import clip
from services.maintenance.compaction import DatabaseMeasurement
from services.maintenance.idle_gate import GateObservation
from services.maintenance.records import CleanupAttempt
from services.maintenance.retention import RetentionPreference, RetentionPreferences
from services.maintenance.status import MaintenanceStatus, PurgePreview, StatusReader
from services.maintenance.worker import MaintenanceWorker, RunRecord

_PERIOD_BY_DAYS = {
    15: maintenance_pb2.RETENTION_PERIOD_15_DAYS,
    30: maintenance_pb2.RETENTION_PERIOD_30_DAYS,
}
_DAYS_BY_PERIOD = {period: days for days, period in _PERIOD_BY_DAYS.items()}
_BACKENDS = {
    "sqlite": maintenance_pb2.STORE_BACKEND_SQLITE,
    "postgres": maintenance_pb2.STORE_BACKEND_POSTGRES,
}


def _preference(value: RetentionPreference) -> maintenance_pb2.RetentionPreference:
    message = maintenance_pb2.RetentionPreference(
        retention=_PERIOD_BY_DAYS[value.days],
        retention_days=value.days,
        is_default=value.is_default,
    )
    if value.updated_at_unix_ms is not None:
        message.updated_at_unix_ms = value.updated_at_unix_ms
    return message


def _run(run: RunRecord) -> maintenance_pb2.MaintenanceRun:
    message = maintenance_pb2.MaintenanceRun(
        run_id=run.run_id,
        trigger=maintenance_pb2.RunTrigger.Value(f"RUN_TRIGGER_{run.trigger.value}"),
        state=maintenance_pb2.MaintenanceRunState.Value(f"MAINTENANCE_RUN_STATE_{run.state.value}"),
        started_at_unix_ms=run.started_at_unix_ms,
        progress=maintenance_pb2.PurgeProgress(
            batches_completed=run.batches_completed,
            components_purged=run.components_purged,
            sessions_purged=run.sessions_purged,
            components_blocked=run.components_blocked,
            more_remaining=run.more_remaining,
        ),
        cleanup=maintenance_pb2.CleanupSummary(
            attempted=run.cleanup.attempted,
            completed=run.cleanup.completed,
            failed=run.cleanup.failed,
        ),
        detail=clip(run.detail, 500),
        compaction=maintenance_pb2.CompactionReport(
            outcome=maintenance_pb2.CompactionOutcome.Value(f"COMPACTION_OUTCOME_{run.compaction}")
        ),
    )
    if run.workspace_id is not None:
        message.workspace_id = run.workspace_id
    if run.purge_cutoff_unix_ms is not None:
        message.purge_cutoff_unix_ms = run.purge_cutoff_unix_ms
    if run.finished_at_unix_ms is not None:
        message.finished_at_unix_ms = run.finished_at_unix_ms
    result = run.compaction_result
    if result is not None:
        if result.size_before_bytes is not None:
            message.compaction.size_before_bytes = result.size_before_bytes
        if result.size_after_bytes is not None:
            message.compaction.size_after_bytes = result.size_after_bytes
        if result.reclaimable_fraction_before is not None:
            message.compaction.reclaimable_fraction_before = result.reclaimable_fraction_before
    return message


def _gate(gate: GateObservation, scope: frozenset[str] | None) -> maintenance_pb2.IdleGate:
    return maintenance_pb2.IdleGate(
        state=maintenance_pb2.IdleGateState.Value(f"IDLE_GATE_STATE_{gate.state.value}"),
        active_workspace_count=len(gate.active_workspaces),
        active_workspace_ids=sorted(
            w for w in gate.active_workspaces if scope is None or w in scope
        ),
        observed_at_unix_ms=gate.observed_at_unix_ms,
    )


def _failure(attempt: CleanupAttempt) -> maintenance_pb2.CleanupFailure:
    return maintenance_pb2.CleanupFailure(
        workspace_id=attempt.workspace_id,
        session_id=attempt.session_id,
        attempts=attempt.attempts,
        last_attempt_at_unix_ms=attempt.updated_at_unix_ms,
        next_attempt_at_unix_ms=attempt.next_attempt_at_unix_ms,
        last_error=attempt.last_error,
    )


def _database(status: MaintenanceStatus) -> maintenance_pb2.DatabaseStatus:
    measurement: DatabaseMeasurement = status.database
    message = maintenance_pb2.DatabaseStatus(
        backend=_BACKENDS[measurement.backend],
        size_bytes=measurement.size_bytes,
        compaction_max_size_bytes=status.compaction_max_size_bytes,
        compaction_min_reclaimable_fraction=status.compaction_min_reclaimable_fraction,
        compaction_eligible=status.compaction_eligible,
    )
    if measurement.reclaimable_fraction is not None:
        message.reclaimable_fraction = measurement.reclaimable_fraction
    return message


def _preview(preview: PurgePreview) -> maintenance_pb2.ManualPurgePreview:
    return maintenance_pb2.ManualPurgePreview(
        workspace_id=preview.workspace_id,
        topmost_components=preview.topmost_components,
        sessions=preview.sessions,
        restorable_components=preview.restorable_components,
        non_restorable_components=preview.non_restorable_components,
        past_cutoff_components=preview.past_cutoff_components,
    )


def _status(
    status: MaintenanceStatus, scope: frozenset[str] | None
) -> maintenance_pb2.GetMaintenanceStatusResponse:
    response = maintenance_pb2.GetMaintenanceStatusResponse(
        retention=_preference(status.retention),
        purge_cutoff_unix_ms=status.purge_cutoff_unix_ms,
        next_check_unix_ms=status.next_check_unix_ms,
        paused_by_idle_gate=status.paused_by_idle_gate,
        idle_gate=_gate(status.idle_gate, scope),
        cleanup=maintenance_pb2.CleanupStatus(
            pending_rows=status.cleanup.pending_rows,
            pending_rows_capped=status.cleanup.pending_rows_capped,
            failing_rows=status.cleanup.failing_rows,
            failing=[_failure(a) for a in status.cleanup.failing],
        ),
        database=_database(status),
        generated_at_unix_ms=status.generated_at_unix_ms,
    )
    if status.last_completed_run_unix_ms is not None:
        response.last_completed_run_unix_ms = status.last_completed_run_unix_ms
    if status.next_run_eligible_at_unix_ms is not None:
        response.next_run_eligible_at_unix_ms = status.next_run_eligible_at_unix_ms
    if status.current_run is not None:
        response.current_run.CopyFrom(_run(status.current_run))
    if status.last_run is not None:
        response.last_run.CopyFrom(_run(status.last_run))
    if status.preview is not None:
        response.manual_purge_preview.CopyFrom(_preview(status.preview))
    return response


def _manual_target(request: maintenance_pb2.RunManualPurgeRequest) -> str | None:
    """The Session id a manual purge targets (``None``: the whole workspace)."""
    scope = request.scope
    if scope == maintenance_pb2.PURGE_SCOPE_COMPONENT:
        if not request.HasField("session_id") or not request.session_id:
            raise InvalidArgument(
                "session_id is required with PURGE_SCOPE_COMPONENT",
                field_violations=[
                    FieldViolation("session_id", "required with PURGE_SCOPE_COMPONENT")
                ],
            )
        return request.session_id
    if scope == maintenance_pb2.PURGE_SCOPE_WORKSPACE:
        if request.HasField("session_id"):
            raise InvalidArgument(
                "session_id must be unset with PURGE_SCOPE_WORKSPACE",
                field_violations=[
                    FieldViolation("session_id", "must be unset with PURGE_SCOPE_WORKSPACE")
                ],
            )
        return None
    raise InvalidArgument.for_field(
        "scope", "must be PURGE_SCOPE_COMPONENT or PURGE_SCOPE_WORKSPACE"
    )


class MaintenanceServicer(maintenance_pb2_grpc.MaintenanceServiceServicer):
    """Serves ``agentactivity.maintenance.v1.MaintenanceService``."""

    def __init__(
        self, retention: RetentionPreferences, worker: MaintenanceWorker, status: StatusReader
    ) -> None:
        self._retention = retention
        self._worker = worker
        self._status = status

    async def GetRetentionPreference(
        self, request: maintenance_pb2.GetRetentionPreferenceRequest, context: Any
    ) -> maintenance_pb2.GetRetentionPreferenceResponse:
        """Return the effective retention preference (MAINT-PREF-1)."""
        return maintenance_pb2.GetRetentionPreferenceResponse(
            preference=_preference(await self._retention.get())
        )

    async def SetRetentionPreference(
        self, request: maintenance_pb2.SetRetentionPreferenceRequest, context: Any
    ) -> maintenance_pb2.SetRetentionPreferenceResponse:
        """Persist 15 or 30 days (MAINT-PREF-1); a deployment-wide admin only (SEC-3)."""
        days = _DAYS_BY_PERIOD.get(request.retention)
        if days is None:
            raise InvalidArgument.for_field(
                "retention", "must be RETENTION_PERIOD_15_DAYS or RETENTION_PERIOD_30_DAYS"
            )
        return maintenance_pb2.SetRetentionPreferenceResponse(
            preference=_preference(await self._retention.set(days))
        )

    async def RunManualPurge(
        self, request: maintenance_pb2.RunManualPurgeRequest, context: Any
    ) -> maintenance_pb2.RunManualPurgeResponse:
        """Purge one component or every topmost tombstone of a workspace (MAINT-MAN-1).

        Optionally compacts afterwards (MAINT-VAC-1); ``service``/``admin`` only.
        """
        session_id = _manual_target(request)
        run = await self._worker.run_manual(request.workspace_id, session_id, request.compact)
        return maintenance_pb2.RunManualPurgeResponse(
            run=_run(run), purged_session_ids=run.purged_session_ids
        )

    async def GetMaintenanceStatus(
        self, request: maintenance_pb2.GetMaintenanceStatusRequest, context: Any
    ) -> maintenance_pb2.GetMaintenanceStatusResponse:
        """Report the maintenance status (MAINT-STAT-1); changes nothing.

        Retention, schedule, idle gate, runs, cleanup, database and an optional manual-purge
        preview.
        """
        scope = current_principal().scope
        preview = request.preview_workspace_id if request.HasField("preview_workspace_id") else None
        return _status(await self._status.read(scope, preview), scope)
