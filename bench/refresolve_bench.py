"""Reference resolution through the real services vs. the same backend pages called directly.

Run: ``.venv/bin/python -m bench.refresolve_bench [--iterations 40] [--database-url URL]``

Starts AppCenter, IssueManager and refresolve in this process (each on its own event loop
and port, on one migrated SQLite database by default), loads

* an app with 1,000 file entries in nested groups (depth 6, 39 containers), 20 % of them
  duplicating a path held by another group, listed with page size 100;
* a topic with 1,000 latest outputs (50 issues x 20),

then, alternating per iteration, measures

* ``resolver``: one ``ReferenceService.ListReferences`` call (client -> refresolve ->
  backends -> de-duplicated list), and
* ``direct``: the lower bound, the benchmark itself calling the same backend pages in
  sequence (depth-first walk of the groups / every search page) with no resolver,

and reports p50/p99, the backend calls per resolution (counted at the backend servers)
and the resolver/direct ratio of medians (target <= 1.5x). Results go to
``bench/results/refresolve.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from bench.stats import ratio_line, summarize, write_results
from grpcserver.app import RunningServer, start_server
from grpcserver.auth import TokenRegistry, token_digest
from services.appcenter.servicer import AppCenterServicer
from services.issuemanager.servicer import IssueManagerServicer
from store.migrate import upgrade

WORKSPACE = "ws-bench"
PAGE_SIZE = 100
TOKEN = "bench-admin"  # noqa: S105 - a throwaway token of an in-process registry
METADATA = (("authorization", f"Bearer {TOKEN}"),)

BACKEND_CALLS: collections.Counter[str] = collections.Counter()


def _count_calls(cls: type, method: str) -> None:
    """Count calls of one RPC at the backend server (the benchmark's only instrumentation)."""
    original = getattr(cls, method)

    @functools.wraps(original)
    async def counted(self: Any, request: Any, context: Any) -> Any:
        BACKEND_CALLS[method] += 1
        return await original(self, request, context)

    setattr(cls, method, counted)


class _Server(threading.Thread):
    """One service on its own event loop, like ``tutti serve`` in a thread."""

    def __init__(self, name: str, **settings: Any) -> None:
        super().__init__(name=f"bench-{name}", daemon=True)
        import importlib

        self.module = importlib.import_module(f"services.{name}.app")
        self.settings = self.module.Settings(
            listen_address="127.0.0.1:0", log_level="WARNING", **settings
        )
        self.started: Future[RunningServer] = Future()
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None

    def run(self) -> None:
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self.stop_event = asyncio.Event()
        registry = TokenRegistry.from_entries(
            [
                {
                    "subject": "bench",
                    "role": "admin",
                    "workspaces": ["*"],
                    "sha256": token_digest(TOKEN),
                }
            ]
        )
        running = await start_server(
            self.module.build(self.settings), self.settings, tokens=registry
        )
        self.started.set_result(running)
        await self.stop_event.wait()
        await running.stop(0)

    def address(self) -> str:
        return f"127.0.0.1:{self.started.result(timeout=30).port}"

    def stop(self) -> None:
        assert self.stop_event is not None
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.join(timeout=30)


def _app_tree() -> dict[str, Any]:
    """1,000 file entries over 39 containers, depth 6, 200 entries duplicating a path."""
    unique = [f"/bench/app/file-{index:04d}.txt" for index in range(800)]
    paths = unique + unique[:200]

    def group(group_id: str, depth: int) -> dict[str, Any]:
        node: dict[str, Any] = {"groupId": group_id, "groups": [], "artifacts": []}
        if depth < 3:
            node["groups"] = [group(f"{group_id}.{k}", depth + 1) for k in range(2)]
        elif depth < 6:
            node["groups"] = [group(f"{group_id}.c", depth + 1)]
        return node

    root: dict[str, Any] = {
        "appId": "bench-app",
        "groups": [group(f"g{k}", 1) for k in range(2)],
        "artifacts": [],
    }
    containers: list[dict[str, Any]] = []
    stack = [root]
    while stack:
        node = stack.pop(0)
        containers.append(node)
        stack.extend(node["groups"])
    leaves = [c for c in containers if not c["groups"]]
    inner = [c for c in containers if c["groups"]]
    assert len(containers) == 39
    assert len(leaves) == 8
    # 120 entries spread over the 31 inner containers, 110 in each of the 8 deepest leaves
    # (two backend pages each); duplicates land in the last leaves, far from their originals.
    slots = [c for _ in range(4) for c in inner][:120] + [
        leaf for leaf in leaves for _ in range(110)
    ]
    for index, (container, path) in enumerate(zip(slots, paths, strict=True)):
        container["artifacts"].append(
            {
                "path": path,
                "displayName": path.rsplit("/", 1)[-1],
                "sizeBytes": str(100 + index),
                "mediaType": "text/plain",
                "createdAtUnixMs": str(1_780_000_000_000 + index),
            }
        )
    return root


def _topic_tree() -> dict[str, Any]:
    issues = []
    for issue in range(50):
        outputs = [
            {
                "outputId": f"o{k}",
                "path": f"/bench/task/{issue:02d}/out-{k:02d}.md",
                "displayName": f"out-{k:02d}.md",
                "sizeBytes": "10",
                "mediaType": "text/markdown",
                "createdAtUnixMs": str(1_780_000_000_000 + issue * 20 + k),
            }
            for k in range(20)
        ]
        issues.append({"issueId": f"bench-issue-{issue:02d}", "title": "t", "outputs": outputs})
    return {"topicId": "bench-topic", "title": "Bench", "issues": issues}


def _direct_app(stub: appcenter_pb2_grpc.AppCenterServiceStub) -> int:
    """The lower bound: walk the same pages in sequence (depth-first) and de-duplicate."""
    seen: set[str] = set()
    stack: list[str | None] = [None]
    while stack:
        group = stack.pop()
        token = ""
        children: list[str] = []
        while True:
            page = stub.ListReferences(
                appcenter_pb2.ListReferencesRequest(
                    workspace_id=WORKSPACE,
                    app_id="bench-app",
                    group_id=group,
                    page_size=PAGE_SIZE,
                    page_token=token,
                ),
                metadata=METADATA,
            )
            children += [g.group_id for g in page.groups]
            seen.update(f.path for f in page.files)
            token = page.next_page_token
            if not token:
                break
        stack.extend(reversed(children))
    return len(seen)


def _direct_topic(stub: issuemanager_pb2_grpc.IssueManagerServiceStub) -> int:
    seen: set[str] = set()
    token = ""
    while True:
        page = stub.SearchIssueOutputs(
            issuemanager_pb2.SearchIssueOutputsRequest(
                workspace_id=WORKSPACE,
                topic_id="bench-topic",
                page_size=PAGE_SIZE,
                page_token=token,
            ),
            metadata=METADATA,
        )
        seen.update(hit.output.path for hit in page.outputs)
        token = page.next_page_token
        if not token:
            return len(seen)


def _timed(call: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    count = call()
    return (time.perf_counter() - started) * 1000, count


def main() -> None:
    """Run the benchmark and write ``bench/results/refresolve.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    _count_calls(AppCenterServicer, "ListReferences")
    _count_calls(IssueManagerServicer, "SearchIssueOutputs")
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        servers = [
            _Server("appcenter", database_url=url, data_dir=Path(tmp)),
            _Server("issuemanager", database_url=url, data_dir=Path(tmp)),
        ]
        for server in servers:
            server.start()
        appcenter_address, issuemanager_address = (s.address() for s in servers)
        refresolve = _Server(
            "refresolve",
            data_dir=Path(tmp),
            appcenter_address=appcenter_address,
            issuemanager_address=issuemanager_address,
            service_token=TOKEN,
            refresolve_backend_page_size=PAGE_SIZE,
        )
        refresolve.start()
        servers.append(refresolve)
        try:
            report = _measure(args, appcenter_address, issuemanager_address, refresolve.address())
        finally:
            for server in reversed(servers):
                server.stop()
    path = write_results("refresolve", report)
    print(f"wrote {path}")


def _measure(
    args: argparse.Namespace,
    appcenter_address: str,
    issuemanager_address: str,
    refresolve_address: str,
) -> dict[str, Any]:
    with (
        grpc.insecure_channel(appcenter_address) as appcenter_channel,
        grpc.insecure_channel(issuemanager_address) as issuemanager_channel,
        grpc.insecure_channel(refresolve_address) as refresolve_channel,
    ):
        appcenter = appcenter_pb2_grpc.AppCenterServiceStub(appcenter_channel)
        issuemanager = issuemanager_pb2_grpc.IssueManagerServiceStub(issuemanager_channel)
        resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve_channel)
        appcenter.LoadApps(
            json_format.ParseDict(
                {"workspaceId": WORKSPACE, "apps": [_app_tree()]}, appcenter_pb2.LoadAppsRequest()
            ),
            metadata=METADATA,
        )
        issuemanager.LoadTopics(
            json_format.ParseDict(
                {"workspaceId": WORKSPACE, "topics": [_topic_tree()]},
                issuemanager_pb2.LoadTopicsRequest(),
            ),
            metadata=METADATA,
        )

        def resolve(
            source: refresolve_pb2.ReferenceSource.ValueType, reference_id: str
        ) -> Callable[[], int]:
            request = refresolve_pb2.ListReferencesRequest(
                workspace_id=WORKSPACE, source=source, id=reference_id
            )
            return lambda: len(
                resolver.ListReferences(request, metadata=METADATA, timeout=60).items
            )

        scenarios = {
            "app": (
                resolve(refresolve_pb2.REFERENCE_SOURCE_APP, "bench-app"),
                lambda: _direct_app(appcenter),
                "ListReferences",
            ),
            "topic": (
                resolve(refresolve_pb2.REFERENCE_SOURCE_TASK, "bench-topic"),
                lambda: _direct_topic(issuemanager),
                "SearchIssueOutputs",
            ),
        }
        report: dict[str, Any] = {
            "iterations": args.iterations,
            "page_size": PAGE_SIZE,
            "database": "sqlite"
            if args.database_url is None
            else args.database_url.split(":", 1)[0],
            "target_ratio": 1.5,
        }
        for name, (ours, direct, method) in scenarios.items():
            latencies: dict[str, list[float]] = {"resolver": [], "direct": []}
            counts: dict[str, set[int]] = {"resolver": set(), "direct": set()}
            calls: dict[str, list[int]] = {"resolver": [], "direct": []}
            for iteration in range(args.warmup + args.iterations):
                # Alternate which runs first so drift affects both sides alike.
                order = [("resolver", ours), ("direct", direct)]
                if iteration % 2:
                    order.reverse()
                for label, call in order:
                    before = BACKEND_CALLS[method]
                    elapsed, count = _timed(call)
                    if iteration >= args.warmup:
                        latencies[label].append(elapsed)
                        counts[label].add(count)
                        calls[label].append(BACKEND_CALLS[method] - before)
            resolver_summary = summarize(f"{name} resolver", latencies["resolver"])
            direct_summary = summarize(f"{name} direct", latencies["direct"])
            ratio = resolver_summary.p50_ms / direct_summary.p50_ms
            print(ratio_line(resolver_summary, direct_summary))
            print(
                f"  items: resolver {sorted(counts['resolver'])} direct "
                f"{sorted(counts['direct'])}; backend calls per resolution: resolver "
                f"{max(calls['resolver'])} direct {max(calls['direct'])}"
            )
            report[name] = {
                "resolver": asdict(resolver_summary),
                "direct": asdict(direct_summary),
                "ratio_p50": round(ratio, 3),
                "ratio_p99": round(resolver_summary.p99_ms / direct_summary.p99_ms, 3),
                "items": sorted(counts["resolver"]),
                "backend_calls_per_resolution": max(calls["resolver"]),
                "direct_calls_per_walk": max(calls["direct"]),
                "meets_target": ratio <= 1.5,
            }
        return report


if __name__ == "__main__":
    main()
