"""OpenTelemetry traces and metrics for one service process (ARCH-4).

Traces use the stock gRPC aio server instrumentation and go to the configured exporter
(none by default). Metrics (RPC count and latency by method and code) are recorded by
the service interceptor and exposed for Prometheus when ``metrics_port`` is set.
Providers are per server, never global, so several servers can share a test process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from opentelemetry.metrics import Counter, Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from grpcserver.settings import ServerSettings


@dataclass
class Telemetry:
    """The telemetry handles of one server."""

    meter_provider: MeterProvider
    rpc_count: Counter
    rpc_duration: Histogram
    tracer_provider: TracerProvider | None = None
    server_interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)

    def shutdown(self) -> None:
        """Flush and stop exporters."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def _span_exporter(settings: ServerSettings) -> SpanExporter | None:
    if settings.otel_exporter == "console":
        return ConsoleSpanExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.otel_endpoint)
    return None


def setup_telemetry(service: str, settings: ServerSettings) -> Telemetry:
    """Create the providers, instruments and tracing interceptor for ``service``."""
    resource = Resource.create({"service.name": f"tutti-{service}"})
    readers: list[MetricReader] = []
    if settings.metrics_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port)
        readers.append(PrometheusMetricReader())
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    meter = meter_provider.get_meter("tutti.grpcserver")
    telemetry = Telemetry(
        meter_provider=meter_provider,
        rpc_count=meter.create_counter("rpc.server.calls", description="RPCs by method and code"),
        rpc_duration=meter.create_histogram(
            "rpc.server.duration", unit="ms", description="RPC latency by method and code"
        ),
    )
    exporter = _span_exporter(settings)
    if exporter is not None:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        telemetry.tracer_provider = tracer_provider
        telemetry.server_interceptors.append(
            aio_server_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
        )
    return telemetry
