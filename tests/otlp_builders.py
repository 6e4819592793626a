"""Realistic OTLP traffic for the tests.

Spans and log records are made with the real OpenTelemetry SDK and sent by its real OTLP exporters;
OTLP/JSON requests are written by hand the way the specification shows them (hex ids, camelCase,
64-bit integers as strings), so a test can also make them wrong. One agent conversation is rendered
in each attribute dialect tracefix reads; the GenAI conventions' attributes, the in-memory recorder,
the exporters and the OTLP/JSON values come from `examples.otlp`, which the demo traffic and the
ingest benchmark write with too. Run as a script, this module is the writer process of the
durability tests.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracefix.collectors.otlp import Limits, decode_spans, parse_traces_json
from tracefix.daemon.store.writer import BatchedWriter

from examples.otlp import Agent, Recorder, any_value, chat_attributes, exporter, key_values, tool_attributes

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
EXPORT_TIMEOUT_S = 5

__all__ = ["Compression", "SpanExportResult", "SpanKind"]


# --- ids --------------------------------------------------------------------------------------


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


def hex_trace_id(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def hex_span_id(span: ReadableSpan) -> str:
    return format(span.context.span_id, "016x")


# --- spans and log records from the real SDK ---------------------------------------------------


class AgentRecorder(Recorder):
    """A TracerProvider of one service whose finished spans are kept, to be exported as one request.

    Timestamps come from a clock that advances 1 ms per event, so the order of spans is exact.
    """

    def __init__(self, service_name: str, scope: str = "agent-under-test", **resource: Any) -> None:
        super().__init__({"service.name": service_name, **resource}, scope, "1.2.3")
        self.clock = time.time_ns()

    def tick(self) -> int:
        self.clock += 1_000_000
        return self.clock

    def start(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        parent: trace.Span | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> trace.Span:
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=self.tick())

    def end(self, span: trace.Span, error: str | None = None, error_type: str | None = None) -> None:
        if error is not None:
            if error_type:
                span.set_attribute("error.type", error_type)
            span.record_exception(RuntimeError(error), timestamp=self.tick())
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=self.tick())

    def one(self, name: str, attributes: dict[str, Any] | None = None, parent: trace.Span | None = None) -> trace.Span:
        """A finished span with no children."""
        span = self.start(name, attributes, parent)
        self.end(span)
        return span


def record_logs(service_name: str, records: Sequence[dict[str, Any]]) -> list[ReadableLogRecord]:
    """Log records emitted through the SDK's Logger; a record's `trace_id`/`span_id` (hex) set its context."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("agent-evaluator", "0.1")
    for record in records:
        context = None
        if record.get("trace_id"):
            span_context = SpanContext(
                int(record["trace_id"], 16),
                int(record.get("span_id") or new_span_id(), 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            context = trace.set_span_in_context(NonRecordingSpan(span_context), Context())
        logger.emit(
            timestamp=record.get("timestamp", time.time_ns()),
            context=context or Context(),
            severity_text=record.get("severity_text", "INFO"),
            body=record.get("body"),
            attributes=record.get("attributes"),
            event_name=record.get("event_name"),
        )
    return list(memory.get_finished_logs())


# --- the SDK exporters ------------------------------------------------------------------------


def _exported(sender: Any, batch: Sequence[Any]) -> Any:
    try:
        return sender.export(batch)
    finally:
        sender.shutdown()


def export_http(daemon: Any, spans: Sequence[ReadableSpan], **options: Any) -> SpanExportResult:
    return _exported(exporter("traces", daemon.http_url, "http/protobuf", EXPORT_TIMEOUT_S, **options), spans)


def export_grpc(daemon: Any, spans: Sequence[ReadableSpan], **options: Any) -> SpanExportResult:
    return _exported(exporter("traces", daemon.grpc_endpoint, "grpc", EXPORT_TIMEOUT_S, **options), spans)


def export_logs_http(daemon: Any, records: Sequence[ReadableLogRecord], **options: Any) -> Any:
    return _exported(exporter("logs", daemon.http_url, "http/protobuf", EXPORT_TIMEOUT_S, **options), records)


def export_logs_grpc(daemon: Any, records: Sequence[ReadableLogRecord], **options: Any) -> Any:
    return _exported(exporter("logs", daemon.grpc_endpoint, "grpc", EXPORT_TIMEOUT_S, **options), records)


def protobuf_request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The ExportTraceServiceRequest the SDK exporters send for these spans."""
    return encode_spans(spans)


def protobuf_logs_request(records: Sequence[ReadableLogRecord]) -> Any:
    return encode_logs(records)


def post(url: str, body: bytes, headers: dict[str, str], **extra_headers: str) -> httpx.Response:
    return httpx.post(url, content=body, headers={**headers, **extra_headers}, timeout=10)


# --- OTLP/JSON by hand --------------------------------------------------------------------------


def json_span(
    trace_id: str,
    span_id: str,
    name: str,
    *,
    parent_span_id: str | None = None,
    attributes: dict[str, Any] | None = None,
    start: int | None = None,
    duration_ns: int = 2_000_000,
    kind: int = 1,
    events: Sequence[dict[str, Any]] = (),
    status: tuple[int, str] | None = None,
) -> dict[str, Any]:
    start = start if start is not None else time.time_ns()
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + duration_ns),
        "attributes": key_values(attributes or {}),
    }
    if parent_span_id:
        span["parentSpanId"] = parent_span_id
    if events:
        span["events"] = [
            {
                "timeUnixNano": str(event.get("time", start + 1_000_000)),
                "name": event["name"],
                "attributes": key_values(event.get("attributes", {})),
            }
            for event in events
        ]
    if status:
        span["status"] = {"code": status[0], "message": status[1]}
    return span


def json_traces(spans: Sequence[dict[str, Any]], service_name: str = "json-agent", scope: str = "hand-made") -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values({"service.name": service_name})},
                "scopeSpans": [{"scope": {"name": scope, "version": "0.0.1"}, "spans": list(spans)}],
            }
        ]
    }


def commit_json_spans(writer: BatchedWriter, spans: Sequence[dict[str, Any]]) -> None:
    """Hand-made JSON spans decoded as the receiver decodes them and committed by the real writer."""
    writer.submit(spans=decode_spans(parse_traces_json(json_traces(spans)), Limits()).columns).result(timeout=10)


def json_log(
    *,
    event_name: str | None = None,
    attributes: dict[str, Any] | None = None,
    body: Any = None,
    trace_id: str | None = None,
    span_id: str | None = None,
    time_ns: int | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "timeUnixNano": str(time_ns or time.time_ns()),
        "observedTimeUnixNano": str(time_ns or time.time_ns()),
        "severityNumber": 9,
        "severityText": "INFO",
        "attributes": key_values(attributes or {}),
    }
    if event_name:
        record["eventName"] = event_name
    if body is not None:
        record["body"] = any_value(body)
    if trace_id:
        record["traceId"] = trace_id
    if span_id:
        record["spanId"] = span_id
    return record


def json_logs(records: Sequence[dict[str, Any]], service_name: str = "json-agent") -> dict:
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": key_values({"service.name": service_name})},
                "scopeLogs": [{"scope": {"name": "hand-made"}, "logRecords": list(records)}],
            }
        ]
    }


def json_bytes(document: dict) -> bytes:
    return json.dumps(document).encode()


def gzipped(body: bytes) -> bytes:
    return gzip.compress(body)


def simple_json_trace(n_spans: int = 3, service_name: str = "json-agent") -> tuple[str, list[str], dict]:
    """A root with children, as OTLP/JSON; returns (trace id, span ids, request)."""
    trace_id = new_trace_id()
    span_ids = [new_span_id() for _ in range(n_spans)]
    start = time.time_ns()
    spans = [json_span(trace_id, span_ids[0], "root", start=start, duration_ns=10_000_000)]
    spans += [
        json_span(trace_id, span_id, f"step {index}", parent_span_id=span_ids[0], start=start + index * 1000)
        for index, span_id in enumerate(span_ids[1:], start=1)
    ]
    return trace_id, span_ids, json_traces(spans, service_name)


# --- one agent conversation, in every dialect ---------------------------------------------------

MODEL = "gpt-4o-mini"
SYSTEM_PROMPT = "You are the support agent of an online shop. Look orders up before changing them."
TOOLS = [
    {
        "name": "get_order",
        "description": "Look up an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]-[0-9]{4}$"}},
            "required": ["order_id"],
        },
    },
    {
        "name": "cancel_order",
        "description": "Cancel an order that has not shipped yet.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "reason": {"type": "string", "enum": ["customer request", "fraud"]},
            },
            "required": ["order_id", "reason"],
        },
    },
]
GET_ARGUMENTS = {"order_id": "A-1001"}
CANCEL_ARGUMENTS = {"order_id": "A-1001", "reason": "customer request"}
ORDER_RECORD = '{"order_id": "A-1001", "status": "shipped", "total": 42.5}'
CANCEL_ERROR = "order A-1001 has already shipped and cannot be cancelled"
FINAL_ANSWER = "Order A-1001 has already shipped, so I could not cancel it. You can return it once it arrives."
USER_REQUEST = "Please cancel my order A-1001."


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Msg:
    role: str
    content: str = ""
    calls: tuple[Call, ...] = ()
    tool_call_id: str | None = None


@dataclass
class Conversation:
    """A transcript (without the system prompt) and the tool runs that fail."""

    messages: list[Msg]
    system: str = SYSTEM_PROMPT
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    failures: dict[str, str] = field(default_factory=dict)


SUPPORT_CONVERSATION = Conversation(
    messages=[
        Msg("user", USER_REQUEST),
        Msg("assistant", calls=(Call("call_1", "get_order", GET_ARGUMENTS),)),
        Msg("tool", ORDER_RECORD, tool_call_id="call_1"),
        Msg("assistant", calls=(Call("call_2", "cancel_order", CANCEL_ARGUMENTS),)),
        Msg("tool", CANCEL_ERROR, tool_call_id="call_2"),
        Msg("assistant", FINAL_ANSWER),
    ],
    failures={"call_2": CANCEL_ERROR},
)


def _genai_message(message: Msg) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}]}
    parts: list[dict[str, Any]] = [{"type": "text", "content": message.content}] if message.content else []
    parts += [{"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments} for call in message.calls]
    return {"role": message.role, "parts": parts}


def _genai_chat(conversation: Conversation, inputs: list[Msg], output: Msg) -> dict[str, Any]:
    tools = [{"type": "function", **tool} for tool in conversation.tools]
    agent = Agent("support_agent", MODEL, conversation.system, tools)
    finished = {**_genai_message(output), "finish_reason": "tool_call" if output.calls else "stop"}
    history = [_genai_message(message) for message in inputs]
    return chat_attributes(agent, history, finished, usage=(120 + 40 * len(inputs), 25))


def _indexed_message(prefix: str, message: Msg) -> dict[str, Any]:
    attributes: dict[str, Any] = {f"{prefix}.role": message.role}
    if message.content:
        attributes[f"{prefix}.content"] = message.content
    if message.tool_call_id:
        attributes[f"{prefix}.tool_call_id"] = message.tool_call_id
    for index, call in enumerate(message.calls):
        attributes[f"{prefix}.tool_calls.{index}.id"] = call.id
        attributes[f"{prefix}.tool_calls.{index}.name"] = call.name
        attributes[f"{prefix}.tool_calls.{index}.arguments"] = json.dumps(call.arguments)
    return attributes


def _indexed_chat(conversation: Conversation, inputs: list[Msg], output: Msg) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.system": "openai",
        "gen_ai.request.model": MODEL,
        "llm.request.type": "chat",
    }
    prompt = [Msg("system", conversation.system), *inputs]
    for index, message in enumerate(prompt):
        attributes.update(_indexed_message(f"gen_ai.prompt.{index}", message))
    attributes.update(_indexed_message("gen_ai.completion.0", output))
    attributes["gen_ai.completion.0.finish_reason"] = "tool_calls" if output.calls else "stop"
    for index, tool in enumerate(conversation.tools):
        attributes[f"llm.request.functions.{index}.name"] = tool["name"]
        attributes[f"llm.request.functions.{index}.description"] = tool["description"]
        attributes[f"llm.request.functions.{index}.parameters"] = json.dumps(tool["parameters"])
    return attributes


def _openinference_message(prefix: str, message: Msg) -> dict[str, Any]:
    attributes: dict[str, Any] = {f"{prefix}.message.role": message.role}
    if message.content:
        attributes[f"{prefix}.message.content"] = message.content
    if message.tool_call_id:
        attributes[f"{prefix}.message.tool_call_id"] = message.tool_call_id
    for index, call in enumerate(message.calls):
        call_prefix = f"{prefix}.message.tool_calls.{index}.tool_call"
        attributes[f"{call_prefix}.id"] = call.id
        attributes[f"{call_prefix}.function.name"] = call.name
        attributes[f"{call_prefix}.function.arguments"] = json.dumps(call.arguments)
    return attributes


def _openinference_chat(conversation: Conversation, inputs: list[Msg], output: Msg) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "openinference.span.kind": "LLM",
        "llm.model_name": MODEL,
        "llm.provider": "openai",
        "llm.system": "openai",
        "input.mime_type": "application/json",
        "input.value": json.dumps({"model": MODEL, "messages": len(inputs) + 1}),
    }
    prompt = [Msg("system", conversation.system), *inputs]
    for index, message in enumerate(prompt):
        attributes.update(_openinference_message(f"llm.input_messages.{index}", message))
    attributes.update(_openinference_message("llm.output_messages.0", output))
    for index, tool in enumerate(conversation.tools):
        schema = {"type": "function", "function": tool}
        attributes[f"llm.tools.{index}.tool.json_schema"] = json.dumps(schema)
    return attributes


def record_conversation(
    recorder: AgentRecorder,
    dialect: str,
    conversation: Conversation = SUPPORT_CONVERSATION,
    conversation_id: str | None = None,
    root_attributes: dict[str, Any] | None = None,
    start_at: int = 0,
    session_on_root: bool = True,
) -> trace.Span:
    """Record one agent run as `dialect` ("genai", "genai_indexed", "openinference", "openllmetry").

    Each assistant message is one model call whose input is everything before it; each tool call
    an assistant asks for runs as a tool span (not in "genai_indexed", whose agent traces only its
    model calls). Messages before `start_at` are history from an earlier trace: sent as input, not
    recorded again. `session_on_root=False` leaves the conversation id off the root span (some SDKs
    set it on model calls only). Returns the root span.
    """
    root_attributes = dict(root_attributes or {})
    if dialect == "genai":
        root_name = "invoke_agent support_agent"
        root_attributes.update({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support_agent"})
        session_key = "gen_ai.conversation.id"
    elif dialect == "genai_indexed":
        root_name = "handle support ticket"
        session_key = "gen_ai.conversation.id"
    elif dialect == "openinference":
        root_name = "support_agent"
        root_attributes.update({"openinference.span.kind": "AGENT", "agent.name": "support_agent"})
        session_key = "session.id"
    elif dialect == "openllmetry":
        root_name = "support_flow.workflow"
        root_attributes.update(
            {
                "traceloop.span.kind": "workflow",
                "traceloop.entity.name": "support_flow",
                "traceloop.workflow.name": "support_flow",
            }
        )
        session_key = "traceloop.association.properties.session_id"
    else:
        raise ValueError(dialect)
    session = {session_key: conversation_id} if conversation_id else {}
    root = recorder.start(root_name, {**root_attributes, **(session if session_on_root else {})}, kind=SpanKind.SERVER)
    results = {message.tool_call_id: message.content for message in conversation.messages if message.role == "tool"}
    for position, message in enumerate(conversation.messages):
        if message.role != "assistant" or position < start_at:
            continue
        inputs = conversation.messages[:position]
        if dialect == "genai":
            name, attributes = f"chat {MODEL}", _genai_chat(conversation, inputs, message)
        elif dialect == "openinference":
            name, attributes = "ChatCompletion", _openinference_chat(conversation, inputs, message)
        else:
            name, attributes = "openai.chat", _indexed_chat(conversation, inputs, message)
            if dialect == "openllmetry":
                attributes["traceloop.workflow.name"] = "support_flow"
        chat = recorder.start(name, {**attributes, **session}, parent=root, kind=SpanKind.CLIENT)
        recorder.end(chat)
        if dialect == "genai_indexed":
            continue
        for call in message.calls:
            error = conversation.failures.get(call.id)
            tool = recorder.start(*_tool_span(dialect, call, results.get(call.id), error, session), parent=root)
            recorder.end(tool, error=error, error_type="OrderAlreadyShipped" if error else None)
    recorder.end(root)
    return root


def _tool_span(
    dialect: str, call: Call, result: str | None, error: str | None, session: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    description = next(tool["description"] for tool in TOOLS if tool["name"] == call.name)
    if dialect == "genai":
        result = result if error is None else None
        attributes = tool_attributes(call.name, call.id, call.arguments, result=result, description=description)
        return f"execute_tool {call.name}", {**attributes, **session}
    if dialect == "openinference":
        # The instrumented function's arguments, formatted by another serializer than the model's.
        attributes = {
            "openinference.span.kind": "TOOL",
            "tool.name": call.name,
            "tool.description": description,
            "input.mime_type": "application/json",
            "input.value": json.dumps(call.arguments, indent=1, sort_keys=True),
        }
        if error is None and result is not None:
            attributes.update({"output.value": result, "output.mime_type": "application/json"})
        return call.name, {**attributes, **session}
    attributes = {
        "traceloop.span.kind": "tool",
        "traceloop.entity.name": call.name,
        "traceloop.workflow.name": "support_flow",
        "traceloop.entity.input": json.dumps({"args": [], "kwargs": call.arguments}),
    }
    if error is None and result is not None:
        attributes["traceloop.entity.output"] = result
    return f"{call.name}.tool", {**attributes, **session}


# --- talking to the daemon -----------------------------------------------------------------------


def span_count(daemon: Any) -> int:
    return daemon.status()["counts"]["spans"]


def log_count(daemon: Any) -> int:
    return daemon.status()["counts"]["logs"]


def metric(daemon: Any, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in the daemon's /metrics whose labels include `labels`."""
    return metric_at(daemon.api_url, name, **labels)


def metric_at(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in `url`/metrics (the daemon's or the router's) whose labels
    include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items()):
                total += sample.value
    return total


def metric_names(daemon: Any) -> dict[str, list[dict[str, str]]]:
    """Every sample name in /metrics with the label sets it appears with."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{daemon.api_url}/metrics", timeout=10).text
    names: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, []).append(dict(sample.labels))
    return names


def send_sentinel_and_wait(daemon: Any) -> dict[str, Any]:
    """Commit one more span, then wait for assembly.

    /api/status compares the assembler's span position with the last committed batch, which stays
    behind after a commit holding only logs; a span committed last lets `wait_assembled` see the end.
    """
    _, _, document = simple_json_trace(1, service_name="sentinel")
    response = post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON)
    assert response.status_code == 200, response.text
    return daemon.wait_assembled()


@contextmanager
def offline(daemon: Any) -> Iterator[Any]:
    """Stop the daemon (SIGTERM), yield its `query`, start it again on the same file and ports."""
    daemon.stop()
    try:
        yield daemon.query
    finally:
        daemon.start()


# --- the writer process of the durability tests -----------------------------------------------------


def stream_batches(transport: str, target: str, ack_path: str, stop_path: str, spans_per_batch: int = 50) -> None:
    """Send one new trace per request until `stop_path` exists; append each acknowledged trace id to `ack_path`.

    A line is written only after the receiver answered 200 (HTTP) or OK (gRPC), and flushed at once.
    Refused connections (the daemon is down) are retried until stopped.
    """
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    stub = None
    http = None
    if transport == "grpc":
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(target))
    else:
        http = httpx.Client(timeout=10)
    with open(ack_path, "a", buffering=1) as acks:
        while not os.path.exists(stop_path):
            trace_id = secrets.token_bytes(16)
            request = ExportTraceServiceRequest()
            resource_spans = request.resource_spans.add()
            service = resource_spans.resource.attributes.add()
            service.key, service.value.string_value = "service.name", f"stream-{transport}"
            spans = resource_spans.scope_spans.add().spans
            now = time.time_ns()
            root_id = secrets.token_bytes(8)
            for index in range(spans_per_batch):
                span = spans.add()
                span.trace_id = trace_id
                span.span_id = root_id if index == 0 else secrets.token_bytes(8)
                if index:
                    span.parent_span_id = root_id
                span.name = f"step {index}"
                span.start_time_unix_nano = now + index
                span.end_time_unix_nano = now + index + 1000
                attribute = span.attributes.add()
                attribute.key, attribute.value.int_value = "step", index
            try:
                if stub is not None:
                    stub.Export(request, timeout=10)
                else:
                    response = http.post(target, content=request.SerializeToString(), headers=PROTOBUF)
                    if response.status_code != 200:
                        continue
            except (grpc.RpcError, httpx.HTTPError):
                time.sleep(0.02)
                continue
            acks.write(f"{trace_id.hex()} {spans_per_batch}\n")


if __name__ == "__main__":
    stream_batches(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 50)
    Path(sys.argv[3] + ".done").touch()
