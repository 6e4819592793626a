"""The agent's OpenTelemetry pipeline and how a conversation is written in the GenAI semantic
conventions: message histories in the conventions' parts format, tool definitions, and the
``gen_ai.evaluation.result`` event that carries the outcome.

Spans and events go over OTLP/HTTP to a collector (tracefix listens on :4318). Each run gets its own
providers, so the agent never touches the global ones of the process that hosts it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from examples.airline.instructions import SERVICE_NAME
from examples.airline.policies import Reply

VERSION = "0.1.0"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Counting:
    """Wraps an OTLP exporter and counts what the collector accepted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, batch: Sequence[Any]) -> Any:
        result = self.inner.export(batch)
        if getattr(result, "name", "") == "SUCCESS":
            self.exported += len(batch)
        else:
            self.failed += len(batch)
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        flush = getattr(self.inner, "force_flush", None)
        return flush(timeout_millis) if flush else True

    def shutdown(self) -> None:
        self.inner.shutdown()


def collector_base(endpoint: str) -> str:
    """The collector's root URL, whether given as the root or as a `/v1/traces` or `/v1/logs` URL."""
    base = endpoint.rstrip("/")
    for suffix in ("/v1/traces", "/v1/logs"):
        base = base.removesuffix(suffix)
    return base


class Telemetry:
    """A tracer and an event logger; with no collector, spans are made (and trace context
    propagated) but sent nowhere."""

    def __init__(self, collector: str | None, service_name: str = SERVICE_NAME, timeout_s: float = 10.0) -> None:
        resource = Resource.create({"service.name": service_name, "service.version": VERSION})
        self.tracer_provider = TracerProvider(resource=resource)
        self.logger_provider = LoggerProvider(resource=resource)
        self.spans: _Counting | None = None
        self.events: _Counting | None = None
        if collector:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            base = collector_base(collector)
            self.spans = _Counting(OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=timeout_s))
            self.events = _Counting(OTLPLogExporter(endpoint=f"{base}/v1/logs", timeout=timeout_s))
            self.tracer_provider.add_span_processor(
                BatchSpanProcessor(self.spans, max_queue_size=8192, schedule_delay_millis=500)
            )
            self.logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(self.events, max_queue_size=8192, schedule_delay_millis=500)
            )
        self.tracer = self.tracer_provider.get_tracer("examples.airline", VERSION)
        self.logger = self.logger_provider.get_logger("examples.airline", VERSION)

    @property
    def exported_spans(self) -> int:
        return self.spans.exported if self.spans else 0

    @property
    def failed_spans(self) -> int:
        return self.spans.failed if self.spans else 0

    def flush(self, timeout_s: float = 30.0) -> None:
        self.tracer_provider.force_flush(int(timeout_s * 1000))
        self.logger_provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.flush()
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()


def parsed(text: Any) -> Any:
    """JSON text as its value where it parses (arguments and results are structured in the parts format)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def genai_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message in the GenAI conventions' parts format."""
    role = message["role"]
    if role == "tool":
        response = {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": parsed(message["content"])}
        return {"role": "tool", "parts": [response]}
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"type": "text", "content": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        arguments = parsed(function["arguments"])
        parts.append({"type": "tool_call", "id": call["id"], "name": function["name"], "arguments": arguments})
    return {"role": role, "parts": parts}


def input_messages(messages: list[dict[str, Any]]) -> str:
    """`gen_ai.input.messages`: the history sent to the model, without the system prompt (it has its own attribute)."""
    return dumps([genai_message(message) for message in messages if message["role"] != "system"])


def output_messages(reply: Reply) -> str:
    """`gen_ai.output.messages`: the one new assistant message, with its finish reason."""
    # The conventions spell OpenAI's "tool_calls" finish reason in the singular.
    reason = "tool_call" if reply.finish_reason == "tool_calls" else reply.finish_reason
    return dumps([{**genai_message(reply.as_message()), "finish_reason": reason}])


def system_instructions(text: str) -> str:
    return dumps([{"type": "text", "content": text}])
