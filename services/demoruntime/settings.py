"""Settings of the demo runtime process (environment variables ``TUTTI_*``, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import ServerSettings


class Settings(ServerSettings):
    """Settings of ``tutti serve demoruntime``; see :class:`~grpcserver.settings.ServerSettings`.

    The process serves only health (so ``tutti up`` supervises it like every service) and
    connects *to* Host over ``RuntimeLink`` with ``TUTTI_SERVICE_TOKEN``.
    """

    listen_address: str = "127.0.0.1:0"
    """``host:port`` of the health endpoint (``TUTTI_LISTEN_ADDRESS``; default a free port)."""

    demo_target_id: str = "demo"
    """Agent target the runtime registers (deployment-wide) and serves
    (``TUTTI_DEMO_TARGET_ID``)."""

    demo_provider: str = "demo"
    """Provider name of the target (``TUTTI_DEMO_PROVIDER``)."""

    demo_runtime_id: str = "demo-runtime"
    """Stable ``runtime_id`` of the link (``TUTTI_DEMO_RUNTIME_ID``)."""

    demo_step_delay_seconds: float = 0.05
    """Pause between streamed chunks, so a watcher sees the reply grow
    (``TUTTI_DEMO_STEP_DELAY_SECONDS``)."""

    demo_register_target: bool = True
    """Register the demo target through ``RegisterAgentTarget`` at start (idempotent)
    (``TUTTI_DEMO_REGISTER_TARGET``)."""

    demo_connect_timeout_seconds: float = 30.0
    """How long start-up waits for Host's welcome before failing
    (``TUTTI_DEMO_CONNECT_TIMEOUT_SECONDS``)."""
