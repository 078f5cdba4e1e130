"""``RuntimeLinkService.RuntimeLink``: the bidirectional runtime stream (HOST-RT-1).

The stream is served by three cooperating parts: this generator yields frames to the
runtime from one merged queue; a reader task applies the runtime's frames strictly in
the order received (reports, acknowledgements) and queues each ``ReportResult``; a pump
task moves commands from the link's outbound queue (fed by the outbox dispatcher) onto
the merged queue. The rules live in :mod:`services.host.runtime.link`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import json_format

from agentactivity.host.v1 import runtime_pb2
from domainerrors import Aborted, FailedPrecondition, Unavailable
from grpcserver.auth import current_principal
from services.host.context import HostContext
from services.host.runtime import link
from services.host.runtime.ack_batches import AckBatches
from services.host.runtime.registry import RuntimeLinkHandle
from services.host.runtime.reports import ItemResult, ReportVerdict
from services.host.wire.activity_codec import delta_from_proto
from services.host.wire.runtime_codec import (
    ack_from_proto,
    command_to_proto,
    identity_from_hello,
    report_from_proto,
    verdict_to_proto,
)

_log = logging.getLogger(__name__)


class _StreamEnd:
    """The runtime half-closed its side: finish the stream."""


Outgoing = runtime_pb2.RuntimeLinkResponse | BaseException | _StreamEnd


class RuntimeLinkRpcs:
    """Serves ``RuntimeLink``."""

    ctx: HostContext

    async def RuntimeLink(
        self, request_iterator: AsyncIterator[runtime_pb2.RuntimeLinkRequest], context: Any
    ) -> AsyncIterator[runtime_pb2.RuntimeLinkResponse]:
        """Accept a runtime's hello, then exchange commands and reports (HOST-RT-1).

        Only ``service`` (and ``admin``) principals may serve targets (declared in
        ``services/host/authorization.py``, enforced by the interceptor); reports and
        deltas are limited to the token's workspaces.
        """
        principal = current_principal()
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        if first.WhichOneof("frame") != "hello":
            raise FailedPrecondition(
                "the first RuntimeLink frame must be a hello", reason="RUNTIME_HELLO_REQUIRED"
            )
        identity = identity_from_hello(first.hello, principal.workspaces)
        handle, targets = await link.open_link(self.ctx, identity, first.hello.protocol_revision)
        out: asyncio.Queue[Outgoing] = asyncio.Queue()
        unsettled: set[tuple[str, str]] = set()
        reader = asyncio.create_task(self._read(handle, request_iterator, out, unsettled))
        pump = asyncio.create_task(_pump(handle, out))
        try:
            yield runtime_pb2.RuntimeLinkResponse(
                welcome=runtime_pb2.RuntimeWelcome(
                    link_id=handle.link_id,
                    agent_target_ids=targets,
                    max_report_bytes=link.MAX_REPORT_BYTES,
                    server_time_unix_ms=self.ctx.clock(),
                )
            )
            await link.link_ready(self.ctx, handle)
            while True:
                frame = await out.get()
                if isinstance(frame, _StreamEnd):
                    return
                if isinstance(frame, BaseException):
                    raise frame
                yield frame
        finally:
            for task in (reader, pump):
                task.cancel()
            for task in (reader, pump):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            try:
                await self._settle_closed(unsettled)
            finally:
                await link.close_link(self.ctx, handle)

    async def _read(
        self,
        handle: RuntimeLinkHandle,
        request_iterator: AsyncIterator[runtime_pb2.RuntimeLinkRequest],
        out: asyncio.Queue[Outgoing],
        unsettled: set[tuple[str, str]],
    ) -> None:
        # Acknowledgements apply in order while the next frames are read; a report or
        # deltas first wait for the acknowledgements before them (runtime.ack_batches).
        acks = AckBatches(self.ctx, handle, out.put_nowait)
        try:
            async for frame in request_iterator:
                kind = frame.WhichOneof("frame")
                if kind == "command_ack":
                    acks.add(ack_from_proto(frame.command_ack))
                    continue
                await acks.settled()
                if kind == "report":
                    unsettled.discard((frame.report.workspace_id, frame.report.session_id))
                    verdict = await self._report(handle, frame.report)
                    out.put_nowait(
                        runtime_pb2.RuntimeLinkResponse(report_result=verdict_to_proto(verdict))
                    )
                elif kind == "deltas":
                    # HOST-RT-2: checked and published to the live lane right here, before
                    # the next frame (a later report) is read, so no commit overtakes them.
                    deltas = [delta_from_proto(delta) for delta in frame.deltas.deltas]
                    if self.ctx.activity.shared is not None:
                        unsettled.update((d.workspace_id, d.session_id) for d in deltas)
                    await self.ctx.activity.deltas.accept(
                        self.ctx.database, deltas, handle.identity.may_access
                    )
                else:
                    raise FailedPrecondition(
                        "hello may be sent only once", reason="RUNTIME_HELLO_REPEATED"
                    )
            await acks.settled()
            out.put_nowait(_StreamEnd())
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - handed to the stream, mapped there
            out.put_nowait(error)
        finally:
            await acks.close()

    async def _report(
        self, handle: RuntimeLinkHandle, report: runtime_pb2.RuntimeReport
    ) -> ReportVerdict:
        if report.ByteSize() > link.MAX_REPORT_BYTES:
            return ReportVerdict(
                report.report_id,
                "rejected",
                (ItemResult(0, "rejected", message="report exceeds max_report_bytes"),),
                "REPORT_TOO_LARGE",
            )
        await self._settle_deltas(handle, report)
        return await link.apply_report(self.ctx, handle.identity, report_from_proto(report))

    async def _settle_deltas(
        self, handle: RuntimeLinkHandle, report: runtime_pb2.RuntimeReport
    ) -> None:
        """SCALE-3: the Session's deltas are in the shared live log before the report commits.

        A delta the log may not hold becomes the Session's durable
        ``session_reconcile_required``, committed before the report (ADR 0041).
        """
        shared = self.ctx.activity.shared
        if shared is None or not handle.identity.may_access(report.workspace_id):
            return
        lost = await shared.settle(report.workspace_id, report.session_id)
        if lost:
            await self.ctx.activity.deltas.reconcile(
                self.ctx.database, report.workspace_id, report.session_id
            )

    async def _settle_closed(self, unsettled: set[tuple[str, str]]) -> None:
        """Settle the Sessions whose deltas no report settled before the link closed (M2).

        The shared lane keeps a Session's pending acknowledgements and dropped count until a
        settle; a runtime that disconnects after deltas sends no report, so they are settled
        here (not merely forgotten: a newer link may already have sent deltas under the same
        key, and waiting for them keeps its next report behind them). A loss still becomes
        the Session's durable ``session_reconcile_required``.
        """
        shared = self.ctx.activity.shared
        if shared is None:
            return
        for workspace_id, session_id in sorted(unsettled):
            try:
                lost = await shared.settle(workspace_id, session_id)
                if lost:
                    await self.ctx.activity.deltas.reconcile(
                        self.ctx.database, workspace_id, session_id
                    )
            except Exception:  # noqa: BLE001 - the link closes regardless
                _log.exception("settling %s/%s at link close failed", workspace_id, session_id)


async def _pump(handle: RuntimeLinkHandle, out: asyncio.Queue[Outgoing]) -> None:
    while True:
        command = await handle.outbound.get()
        if command is None:
            if handle.replaced:
                out.put_nowait(
                    Aborted(
                        "a newer link with the same runtime_id took over",
                        reason="RUNTIME_LINK_REPLACED",
                    )
                )
            else:
                out.put_nowait(Unavailable("Host is shutting down; reconnect", reason="DRAINING"))
            return
        try:
            out.put_nowait(runtime_pb2.RuntimeLinkResponse(command=command_to_proto(command)))
        except (
            json_format.ParseError,
            AttributeError,
        ):  # a bad stored payload must not kill the link
            _log.exception("cannot encode runtime command %s", command.command_id)
