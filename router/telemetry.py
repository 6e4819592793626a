"""The router's own spans: one per request, in the GenAI semantic conventions, sent over OTLP/HTTP
to the collector, so served traffic (and which adapter served it) flows back into analysis.

A request that carries a W3C ``traceparent`` gets its span inside the caller's trace: the agent's
run and the router's answers join one trajectory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tracefix.daemon.core.settings import RouterSettings, Settings

log = logging.getLogger(__name__)

SERVICE_NAME = "tracefix-router"
TRACES_PATH = "/v1/traces"


def spans_endpoint(settings: Settings) -> str:
    """[router] otlp_endpoint, or the collector this same configuration runs."""
    if settings.router.otlp_endpoint:
        return settings.router.otlp_endpoint
    collector = settings.collector
    host = "127.0.0.1" if collector.host in ("0.0.0.0", "::", "") else collector.host
    return f"http://{host}:{collector.http_port}"


def traces_url(endpoint: str) -> str:
    """OTLP/HTTP's traces URL for a collector endpoint given as its root (as OTEL_EXPORTER_OTLP_ENDPOINT is)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class Telemetry:
    """Records request spans through a batch processor; does nothing when export is off."""

    def __init__(self, settings: RouterSettings, endpoint: str) -> None:
        self._provider: Any = None
        if not settings.export_spans:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            log.warning(
                "[router] export_spans is on but the OpenTelemetry SDK is missing; no spans are sent "
                "(pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)"
            )
            return
        self._provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("tracefix.router")

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def record(
        self,
        headers: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        error: str | None = None,
    ) -> None:
        """One finished request as a span named ``chat <request model>``; `error` is its error.type."""
        if self._provider is None:
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(carrier=dict(headers))
        name = f"chat {attributes.get('gen_ai.request.model', '')}".strip()
        present = {key: value for key, value in attributes.items() if value is not None}
        if error is not None:
            present["error.type"] = error
        span = self._tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=present, start_time=start_ns
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    def flush(self, timeout_ms: int = 5000) -> None:
        if self._provider is not None:
            self._provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
