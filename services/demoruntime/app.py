"""Process wiring of the demo runtime: ``tutti serve demoruntime`` (ARCH-3, HOST-RT-1).

It serves only ``grpc.health.v1`` (so ``tutti up`` starts and drains it like any service)
and, once started, is connected to Host over ``RuntimeLink`` serving the demo target.
"""

from __future__ import annotations

from grpcserver.app import ServiceDefinition, definition_for
from services.demoruntime.link import DemoRuntime
from services.demoruntime.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the demo runtime for :func:`grpcserver.app.serve`."""
    runtime = DemoRuntime(settings)
    return definition_for("demoruntime", [], on_start=[runtime.start], on_stop=[runtime.stop])
