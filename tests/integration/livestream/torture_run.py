"""One seeded iteration of the livestream torture test (see ``test_live_torture.py``).

An iteration creates fresh Sessions, starts a few :class:`TortureApp` devices (each with
its own Subscriber, store, bindings and chaos; some start late, some attach nothing and
only watch the workspace) on an asyncio loop of their own thread, runs the producer plan in
the test thread while the chaos is on (and, for the model Host, injects upstream drops and
expiries between producer steps), then stops the chaos and settles *sentinel* Turns until
every app has seen one settle: everything produced before it has then either reached the
app or been announced as lost. Finally it reads Host's canonical state and checks every app.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.livestream.subscriber import Delivered, Reconcile, Reconnecting, ResumeRejected
from tests.integration.livestream.torture_app import AppConfig, TortureApp
from tests.integration.livestream.torture_check import check_app, describe
from tests.integration.livestream.torture_worlds import Plan, SentLog, World, produce

__all__ = ["IterationReport", "run_iteration"]

READY_SECONDS = 15.0
SENTINEL_SECONDS = 3.0
SENTINEL_ATTEMPTS = 5


@dataclass
class IterationReport:
    seed: int
    violations: list[str]
    summary: str
    traces: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _all_saw(apps: list[TortureApp], turn_id: str) -> bool:
    return all(app.saw_sentinel(turn_id) for app in apps)


def _wait(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def run_iteration(
    world: World,
    seed: int,
    *,
    prefix: str,
    max_sessions: int = 3,
    max_turns: int = 2,
    max_apps: int = 3,
    upstream: Callable[[random.Random], None] | None = None,
) -> IterationReport:
    """Run iteration ``seed`` on ``world``; ``upstream(rng)`` runs between producer steps."""
    started = time.monotonic()
    rng = random.Random(seed)
    world.begin_iteration()
    plan = Plan.random(rng, prefix, sessions=rng.randint(1, max_sessions), turns=max_turns)
    sentinel = f"{prefix}-sentinel"
    sessions = (*plan.sessions, sentinel)
    for session_id in sessions:
        world.create_session(session_id)
    chaos, stop = threading.Event(), threading.Event()
    apps: list[TortureApp] = []
    for k in range(rng.randint(1, max_apps)):
        if k == 0:
            bindings = {f"b{j}": s for j, s in enumerate(plan.sessions)}
            delay = 0.0
        else:
            chosen = [s for s in plan.sessions if rng.random() < 0.5]
            bindings = {f"b{j}": s for j, s in enumerate(chosen)}
            delay = rng.choice([0.0, rng.uniform(0, 0.4)])
        app_rng = random.Random(rng.random())
        apps.append(
            TortureApp(
                name=f"app{k}",
                device_id=f"{prefix}-device{k}",
                world=world,
                sessions=sessions,
                sentinel_session=sentinel,
                bindings=bindings,
                attachable=plan.sessions,
                rng=app_rng,
                config=AppConfig.random(app_rng, delay),
                chaos=chaos,
                stop=stop,
            )
        )

    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        await asyncio.gather(*(app.run() for app in apps))

    thread = threading.Thread(target=asyncio.run, args=(main(),), name=f"torture-{seed}")
    chaos.set()
    thread.start()
    problems: list[str] = []
    sent = SentLog()
    sentinels: list[str] = []
    try:
        early = [a for a in apps if a.config.start_delay == 0]
        if not _wait(lambda: all(a.first_ready_at is not None for a in early), READY_SECONDS):
            problems.append("an app never became ready")
        fault_rng = random.Random(rng.random())
        produce(
            world,
            plan,
            rng,
            sent,
            on_step=(lambda: upstream(fault_rng)) if upstream is not None else None,
        )
        chaos.clear()
        # A sentinel committed while an app is away may legitimately reach it only by a
        # read (an ended epoch's deliveries are dropped): let every app connect first.
        if not _wait(lambda: all(a.connected for a in apps), READY_SECONDS):
            problems.append(f"apps not connected: {[a.name for a in apps if not a.connected]}")
        for _ in range(SENTINEL_ATTEMPTS):
            turn_id = world.start_turn(sentinel)
            world.settle(sentinel, turn_id)
            sentinels.append(turn_id)
            if _wait(functools.partial(_all_saw, apps, turn_id), SENTINEL_SECONDS):
                break
        else:
            missing = [a.name for a in apps if not a.saw_sentinel(sentinels[-1])]
            problems.append(f"{missing} never saw a sentinel Turn settle (stuck or lost)")
            if loops:
                problems.append("app tasks:\n" + _task_stacks(loops[0]))
        if not _wait(lambda: all(a.caught_up for a in apps), READY_SECONDS):
            problems.append(f"bindings not caught up: {[a.name for a in apps if not a.caught_up]}")
    finally:
        chaos.clear()
        stop.set()
        thread.join(60)
    if thread.is_alive():
        problems.append("the apps did not stop")
    host = {s: world.read_session(s) for s in sessions}
    history = world.turn_history(set(sent.turns) | set(sentinels))
    world.end_iteration()
    violations = [f"iteration {seed}: {p}" for p in problems]
    traces: list[str] = []
    for app in apps:
        found = check_app(app, sent, host, history)
        violations += [f"iteration {seed}: {v}" for v in found]
        if found or problems:
            traces.append(f"--- {app.name} (seed {seed}) ---\n{describe(app)}")
    return IterationReport(
        seed, violations, _summary(seed, plan, apps, sent), traces, time.monotonic() - started
    )


def _task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Where every task of the apps' loop is suspended (for a hang)."""
    done = threading.Event()
    lines: list[str] = []

    def dump() -> None:
        for task in asyncio.all_tasks(loop):
            where: list[str] = []
            awaited: Any = task.get_coro()
            while awaited is not None and len(where) < 12:
                frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
                if frame is not None:
                    where.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
            lines.append(f"  {task.get_name()}: {' -> '.join(where)}")
        done.set()

    if loop.is_closed():
        return "  (the apps' loop has ended: every app stopped)"
    loop.call_soon_threadsafe(dump)
    done.wait(5)
    return "\n".join(sorted(lines))


def _summary(seed: int, plan: Plan, apps: list[TortureApp], sent: SentLog) -> str:
    deltas = sum(len(m.sent_at) for m in sent.messages.values())
    parts = [
        f"seed {seed}: {len(plan.sessions)} sessions, {len(sent.turns)} turns, "
        f"{len(sent.messages)} messages, {deltas} deltas"
    ]
    for app in apps:
        kinds: Counter[str] = Counter()
        for entry in app.log:
            event = entry.event
            if isinstance(event, Delivered):
                kinds[event.kind] += 1
            elif isinstance(event, Reconcile):
                kinds[f"reconcile:{event.reason}"] += 1
            elif isinstance(event, ResumeRejected):
                kinds[f"rejected:{event.reason}"] += 1
            elif isinstance(event, Reconnecting):
                kinds[f"end:{event.reason or event.code}"] += 1
            else:
                kinds[type(event).__name__] += 1
        parts.append(
            f"  {app.name} bindings={len(app.bindings)} delay={app.config.start_delay:.2f} "
            f"queue={app.config.queue_limit} actions={dict(sorted(app.actions.items()))} "
            f"events={dict(sorted(kinds.items()))}"
        )
    return "\n".join(parts)
