"""The device-side Subscriber client against an in-process fake DeviceLink server (LIVE-SUB-1)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from agentactivity.livestream.v1 import livestream_pb2 as pb
from agentactivity.livestream.v1 import livestream_pb2_grpc as pbg
from services.livestream.subscriber import (
    PROTOCOL_REVISION,
    Attachment,
    AttachmentCaughtUp,
    Backoff,
    Cursor,
    Delivered,
    DesiredAttachment,
    DeviceState,
    MemoryStateStore,
    Ready,
    Reconnecting,
    Subscriber,
    Terminated,
)

Handler = Callable[["Call"], Coroutine[Any, Any, None]]


class Call:
    def __init__(self, requests: AsyncIterator[pb.DeviceLinkRequest], context: Any) -> None:
        self.context = context
        self.out: asyncio.Queue[pb.DeviceLinkResponse | None] = asyncio.Queue()
        self.requests: asyncio.Queue[pb.DeviceLinkRequest] = asyncio.Queue()
        self.hello: pb.ClientHello | None = None
        self.metadata = dict(context.invocation_metadata())
        self._requests = requests

    async def pump(self) -> None:
        async for r in self._requests:
            await self.requests.put(r)

    def send(self, frame: pb.DeviceLinkResponse) -> None:
        self.out.put_nowait(frame)

    async def next_request(
        self, kind: str | None = None, wait_s: float = 5
    ) -> pb.DeviceLinkRequest:
        async with asyncio.timeout(wait_s):
            while True:
                r = await self.requests.get()
                if kind is None or r.WhichOneof("kind") == kind:
                    return r

    async def abort(self, code: grpc.StatusCode, reason: str, retry_s: float | None = None) -> None:
        details: list[any_pb2.Any] = []
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="x"))
        details.append(info)
        if retry_s is not None:
            r = any_pb2.Any()
            r.Pack(
                error_details_pb2.RetryInfo(
                    retry_delay=duration_pb2.Duration(
                        seconds=int(retry_s), nanos=int((retry_s % 1) * 1e9)
                    )
                )
            )
            details.append(r)
        status = status_pb2.Status(code=code.value[0], message=reason.lower(), details=details)
        await self.context.abort_with_status(rpc_status.to_status(status))


class Fake(pbg.DeviceLinkServiceServicer):
    def __init__(self) -> None:
        self.handlers: list[Handler] = []
        self.calls: list[Call] = []

    async def DeviceLink(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.DeviceLinkRequest], context: Any
    ) -> AsyncIterator[pb.DeviceLinkResponse]:
        call = Call(request_iterator, context)
        self.calls.append(call)
        pump = asyncio.create_task(call.pump())
        first = await call.next_request()
        call.hello = first.hello
        handler = self.handlers.pop(0) if self.handlers else None
        task: asyncio.Task[None] | None = asyncio.create_task(handler(call)) if handler else None
        try:
            while True:
                get = asyncio.create_task(call.out.get())
                waits = {get} | ({task} if task else set())
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if get in done:
                    frame = get.result()
                    if frame is None:
                        return
                    yield frame
                else:
                    assert task is not None
                    get.cancel()
                    task.result()  # re-raise abort
                    task = None
        finally:
            pump.cancel()
            if task:
                task.cancel()

    async def ListPublishers(  # noqa: N802
        self, request: pb.ListPublishersRequest, context: Any
    ) -> pb.ListPublishersResponse:
        raise NotImplementedError


def ready(epoch: str, latest: int, resumed: bool, hb: int = 200) -> pb.DeviceLinkResponse:
    return pb.DeviceLinkResponse(
        stream_ready=pb.StreamReady(
            protocol_revision=PROTOCOL_REVISION,
            epoch=epoch,
            resumed=resumed,
            latest_sequence=latest,
            limits=pb.LinkLimits(heartbeat_interval_ms=hb),
        )
    )


def batch(epoch: str, *ds: pb.Delivery) -> pb.DeviceLinkResponse:
    return pb.DeviceLinkResponse(deliveries=pb.DeliveryBatch(epoch=epoch, deliveries=ds))


def delta(seq: int, text: str = "x") -> pb.Delivery:
    from agentactivity.canonical.v1 import canonical_pb2

    return pb.Delivery(
        sequence=seq,
        message_delta=canonical_pb2.MessageDelta(
            workspace_id="ws", session_id="s", turn_id="t", message_id="m", text=text
        ),
    )


def baseline(seq: int, attach: pb.ClientAttach) -> list[pb.Delivery]:
    a = attach
    return [
        pb.Delivery(
            sequence=seq,
            attachment_changed=pb.AttachmentChanged(
                binding_id=a.binding_id,
                revision=a.revision,
                workspace_id=a.workspace_id,
                session_id=a.session_id,
                caller_turn_id=a.caller_turn_id if a.HasField("caller_turn_id") else None,
            ),
        ),
        pb.Delivery(
            sequence=seq + 1,
            interaction_snapshot=pb.InteractionSnapshot(
                binding_id=a.binding_id,
                revision=a.revision,
                workspace_id=a.workspace_id,
                session_id=a.session_id,
            ),
        ),
        pb.Delivery(
            sequence=seq + 2,
            attachment_caught_up=pb.AttachmentCaughtUp(
                binding_id=a.binding_id,
                revision=a.revision,
                workspace_id=a.workspace_id,
                session_id=a.session_id,
                canonical_turn_ids=["t"],
                caller_turn_id=a.caller_turn_id if a.HasField("caller_turn_id") else None,
            ),
        ),
    ]


async def start_fake() -> tuple[grpc.aio.Server, Fake, str]:
    fake = Fake()
    server = grpc.aio.server()
    pbg.add_DeviceLinkServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, fake, f"127.0.0.1:{port}"


async def collect(sub: Subscriber, until: Callable[[Any], bool], within_s: float = 5) -> list[Any]:
    got: list[Any] = []
    async with asyncio.timeout(within_s):
        async for e in sub.events():
            got.append(e)
            if until(e):
                return got
    return got


def fast() -> Backoff:
    return Backoff(initial_s=0.01, max_s=0.05)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@pytest.mark.spec("LIVE-SUB-1")
@pytest.mark.spec("LIVE-RESUME-1")
def test_fresh_attach_drop_resume_heartbeat() -> None:
    """Fresh attach, heartbeat, then a dropped link resumes from the cursor without re-attach."""

    async def main() -> None:
        server, fake, addr = await start_fake()
        store = MemoryStateStore()

        async def first(call: Call) -> None:
            call.send(ready("e1", 0, False))
            att = (await call.next_request("attach")).attach
            assert (att.binding_id, att.revision, att.session_id) == ("scr", 1, "s")
            for f in [batch("e1", *baseline(1, att)), batch("e1", delta(4, "hello"))]:
                call.send(f)
            hb = (await call.next_request("heartbeat")).heartbeat
            assert (hb.epoch, hb.last_sequence) == ("e1", 4)
            await asyncio.sleep(10)

        async def second(call: Call) -> None:
            assert call.hello is not None
            assert call.hello.resume_cursor.epoch == "e1"
            assert call.hello.resume_cursor.last_sequence == 4
            call.send(batch("e1", delta(5, "again")))
            call.send(ready("e1", 5, True))
            await asyncio.sleep(10)

        fake.handlers += [first, second]
        async with Subscriber(
            target=addr,
            token="tok",
            device_id="dev",
            workspace_ids=["ws"],
            store=store,
            backoff=fast(),
        ) as sub:
            await sub.attach("scr", "ws", "s")
            evs = await collect(sub, lambda e: isinstance(e, Delivered) and e.sequence == 4)
            kinds = [type(e).__name__ for e in evs]
            assert kinds == [
                "Connecting",
                "Ready",
                "AttachmentStarted",
                "Delivered",
                "AttachmentCaughtUp",
                "Delivered",
            ], kinds
            assert fake.calls[0].metadata["authorization"] == "Bearer tok"
            hello = fake.calls[0].hello
            assert hello is not None
            assert hello.protocol_revision == PROTOCOL_REVISION
            assert not hello.HasField("resume_cursor")
            await asyncio.sleep(0.5)  # a heartbeat goes out
            saved = store.load()
            assert saved is not None
            assert saved.cursor == Cursor("e1", 4)
            assert saved.attachments["scr"].caught_up
            await sub.drop_link()
            evs = await collect(sub, lambda e: isinstance(e, Ready))
            kinds = [type(e).__name__ for e in evs]
            assert kinds == ["Reconnecting", "Connecting", "Delivered", "Ready"], kinds
            assert evs[0].reason == "LINK_DROPPED"
            assert evs[-1].resumed
            # No re-attach on a resumed call whose attachment was confirmed.
            await asyncio.sleep(0.3)
            reqs = [
                fake.calls[1].requests.get_nowait().WhichOneof("kind")
                for _ in range(fake.calls[1].requests.qsize())
            ]
            assert "attach" not in reqs, reqs
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
@pytest.mark.spec("LIVE-RESUME-1")
def test_draining_honours_retry_info_and_superseded_terminates() -> None:
    """DRAINING honours RetryInfo and resumes; LINK_SUPERSEDED terminates the event stream."""

    async def main() -> None:
        server, fake, addr = await start_fake()

        async def drain(call: Call) -> None:
            call.send(ready("e1", 0, False))
            call.send(batch("e1", delta(1)))
            await asyncio.sleep(0.05)
            await call.abort(grpc.StatusCode.UNAVAILABLE, "DRAINING", retry_s=0.4)

        async def supersede(call: Call) -> None:
            assert call.hello is not None
            assert call.hello.resume_cursor.last_sequence == 1
            call.send(ready("e1", 1, True))
            await asyncio.sleep(0.05)
            await call.abort(grpc.StatusCode.ABORTED, "LINK_SUPERSEDED")

        fake.handlers += [drain, supersede]
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], backoff=fast()
        ) as sub:
            evs = await collect(sub, lambda e: isinstance(e, Terminated))
            names = [type(e).__name__ for e in evs]
            assert names == [
                "Connecting",
                "Ready",
                "Delivered",
                "Reconnecting",
                "Connecting",
                "Ready",
                "Terminated",
            ], names
            rec = evs[3]
            assert (rec.code, rec.reason) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
            assert rec.delay_s >= 0.4
            term = evs[-1]
            assert (term.code, term.reason) == (grpc.StatusCode.ABORTED, "LINK_SUPERSEDED")
            assert [e async for e in sub.events()] == []  # iterator has ended
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
@pytest.mark.spec("LIVE-RESUME-1")
def test_resume_rejected_reattaches_with_new_revision_and_gap_reconnects_fresh() -> None:
    """Rejected resume re-attaches at a new revision; a gap drops the cursor, reconnects fresh."""

    async def main() -> None:
        server, fake, addr = await start_fake()
        st = DeviceState(
            device_id="dev",
            workspace_ids=("ws",),
            cursor=Cursor("old", 9),
            revisions={"scr": 4},
            desired={"scr": DesiredAttachment("ws", "s", "t1")},
        )
        store = MemoryStateStore(st.to_json())

        async def rejected(call: Call) -> None:
            assert call.hello is not None
            assert call.hello.resume_cursor.epoch == "old"
            call.send(
                batch(
                    "e2",
                    pb.Delivery(
                        sequence=1,
                        resume_rejected=pb.ResumeRejected(
                            reason=pb.RESUME_REJECTED_REASON_EPOCH_UNKNOWN,
                            rejected_cursor=pb.ResumeCursor(epoch="old", last_sequence=9),
                        ),
                    ),
                )
            )
            call.send(ready("e2", 1, False))
            att = (await call.next_request("attach")).attach
            assert (att.revision, att.caller_turn_id) == (5, "t1"), att
            call.send(batch("e2", *baseline(2, att)))
            call.send(batch("e2", delta(7)))  # gap: 5 expected
            await asyncio.sleep(10)

        async def fresh(call: Call) -> None:
            assert call.hello is not None
            assert not call.hello.HasField("resume_cursor")
            call.send(ready("e3", 0, False))
            att = (await call.next_request("attach")).attach
            assert att.revision == 6
            call.send(batch("e3", *baseline(1, att)))
            await asyncio.sleep(10)

        fake.handlers += [rejected, fresh]
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], store=store, backoff=fast()
        ) as sub:
            evs = await collect(
                sub, lambda e: isinstance(e, AttachmentCaughtUp) and e.revision == 6
            )
            names = [type(e).__name__ for e in evs]
            assert names == [
                "Connecting",
                "ResumeRejected",
                "Reconcile",
                "Ready",
                "AttachmentStarted",
                "Delivered",
                "AttachmentCaughtUp",
                "Reconcile",
                "Reconnecting",
                "Connecting",
                "Ready",
                "AttachmentStarted",
                "Delivered",
                "AttachmentCaughtUp",
            ], names
            assert evs[7].reason == "gap"
            assert evs[7].cursor_dropped
            assert evs[8].reason == "CONTINUITY_LOST"
            assert sub.state.revisions == {"scr": 6}
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
def test_generation_drops_queued_events() -> None:
    """A new generation drops events queued under the old one; later events carry the new one."""

    async def main() -> None:
        server, fake, addr = await start_fake()

        async def h(call: Call) -> None:
            call.send(ready("e1", 0, False))
            call.send(batch("e1", delta(1), delta(2)))
            await asyncio.sleep(0.3)
            call.send(batch("e1", delta(3)))
            await asyncio.sleep(10)

        fake.handlers.append(h)
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], backoff=fast()
        ) as sub:
            await asyncio.sleep(0.15)  # events 1-2 queued, unread
            g = sub.open_generation()
            evs = await collect(sub, lambda e: isinstance(e, Delivered))
            assert [(type(e).__name__, e.generation) for e in evs] == [("Delivered", g)]
            assert evs[0].sequence == 3
            assert sub.dropped_events == 4  # Connecting, Ready, 2 deliveries
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
def test_terminal_codes_and_unreachable_server() -> None:
    """Terminal refusal ends the stream; an unreachable server is retried with capped backoff."""

    async def main() -> None:
        server, fake, addr = await start_fake()

        async def h(call: Call) -> None:
            await call.abort(grpc.StatusCode.FAILED_PRECONDITION, "PROTOCOL_REVISION_MISMATCH")

        fake.handlers.append(h)
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], backoff=fast()
        ) as sub:
            evs = await collect(sub, lambda e: isinstance(e, Terminated))
            assert evs[-1].reason == "PROTOCOL_REVISION_MISMATCH"
            with pytest.raises(RuntimeError):
                await sub.wait_ready()
        await server.stop(None)
        # Nothing listens: UNAVAILABLE, reconnect with growing backoff.
        async with Subscriber(
            target=addr,
            device_id="dev",
            workspace_ids=["ws"],
            backoff=Backoff(initial_s=0.01, max_s=0.08),
            rng=random.Random(1),
        ) as sub:
            evs = await collect(sub, lambda e: isinstance(e, Reconnecting) and e.attempt >= 4)
            recs = [e for e in evs if isinstance(e, Reconnecting)]
            assert all(e.code == grpc.StatusCode.UNAVAILABLE for e in recs)
            assert recs
            assert all(round(e.delay_s, 3) <= 0.08 for e in recs), [e.delay_s for e in recs]

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
def test_heartbeat_silence_cuts_the_link() -> None:
    """A server silent past the heartbeat allowance is cut with HEARTBEAT_TIMEOUT."""

    async def main() -> None:
        server, fake, addr = await start_fake()

        async def silent(call: Call) -> None:
            call.send(ready("e1", 0, False, hb=100))
            await asyncio.sleep(10)

        fake.handlers += [silent, silent]
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], backoff=fast()
        ) as sub:
            evs = await collect(sub, lambda e: isinstance(e, Reconnecting))
            assert evs[-1].reason == "HEARTBEAT_TIMEOUT"
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
@pytest.mark.spec("LIVE-FLOW-1")
def test_slow_application_is_backpressure_not_silence() -> None:
    """A slow application is backpressure: the heartbeat watchdog does not cut the link."""

    async def main() -> None:
        server, fake, addr = await start_fake()

        async def many(call: Call) -> None:
            call.send(ready("e1", 0, False, hb=50))
            for i in range(1, 21):
                call.send(batch("e1", delta(i)))
            await asyncio.sleep(10)

        fake.handlers.append(many)
        async with Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], backoff=fast(), queue_limit=2
        ) as sub:
            got: list[Any] = []
            async with asyncio.timeout(8):
                async for e in sub.events():
                    got.append(e)
                    await asyncio.sleep(0.05)  # slower than 3 heartbeat intervals overall
                    if isinstance(e, Delivered) and e.sequence == 20:
                        break
            assert not [e for e in got if isinstance(e, Reconnecting)], got
            assert sub.calls == 1
        await server.stop(None)

    run(main())


@pytest.mark.spec("LIVE-SUB-1")
@pytest.mark.spec("LIVE-RESUME-1")
def test_changes_made_while_disconnected_are_sent_on_resume() -> None:
    """Attach/detach recorded while disconnected are sent with fresh revisions on resume."""

    async def main() -> None:
        server, fake, addr = await start_fake()
        st = DeviceState(
            device_id="dev",
            workspace_ids=("ws",),
            cursor=Cursor("e1", 3),
            revisions={"a": 2, "b": 5},
            desired={"a": DesiredAttachment("ws", "s1")},
            attachments={
                "a": Attachment(revision=2, workspace_id="ws", session_id="s1", caught_up=True),
                "b": Attachment(revision=5, workspace_id="ws", session_id="s2", caught_up=True),
            },
        )
        store = MemoryStateStore(st.to_json())
        seen: list[pb.DeviceLinkRequest] = []

        async def resumed(call: Call) -> None:
            call.send(ready("e1", 3, True))
            for _ in range(2):
                seen.append(await call.next_request("attach" if not seen else None))
            await asyncio.sleep(10)

        fake.handlers.append(resumed)
        sub = Subscriber(
            target=addr, device_id="dev", workspace_ids=["ws"], store=store, backoff=fast()
        )
        await sub.start()
        assert await sub.attach("a", "ws", "s9") is None  # not ready yet: recorded
        await sub.wait_ready()
        await asyncio.sleep(0.3)
        kinds: list[tuple[str, str, int]] = []
        for r in seen:
            kind = r.WhichOneof("kind")
            assert kind is not None
            kinds.append((kind, getattr(r, kind).binding_id, getattr(r, kind).revision))
        assert kinds == [("attach", "a", 3), ("detach", "b", 6)], kinds
        assert seen[0].attach.session_id == "s9"
        await sub.close()
        await server.stop(None)

    run(main())
