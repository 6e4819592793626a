"""Synthetic agent runs as OTLP, in the GenAI semantic conventions: the one place that writes them.

An :class:`Agent` is what every model call of an agent repeats (its name, model, system
instructions and tool definitions). An :class:`AgentRun` writes one run through an SDK tracer with
explicit timestamps: the ``invoke_agent`` root span, a ``chat`` span per model call carrying the
conversation so far and the new message (parts format), an ``execute_tool`` span per tool call.
:func:`evaluation_attributes` is the outcome, for a ``gen_ai.evaluation.result`` log record or
span event. :class:`Recorder` keeps finished spans in memory, :func:`exporter` sends spans or log
records over OTLP/HTTP or gRPC, and :func:`any_value` / :func:`key_values` write attributes as
OTLP/JSON.

Three generators build on it and keep only what is their own:

- ``examples/traffic.py``: airline-support traffic with planted capability gaps; the plans, trace
  ids taken from the plan, and exporters that count what the receiver accepted.
- ``bench/ingest.py``: coding-agent runs recorded once per client as templates; cloning them with
  fresh ids per request, re-serializing encoded bodies and posting them are local, for raw speed,
  as is its OTLP/JSON exporter of SDK spans (the SDK has none).
- ``tests/otlp_builders.py``: the same conversation in the other dialects tracefix reads, and
  OTLP/JSON written by hand, malformed on purpose where a test needs it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode


def dumps(value: Any) -> str:
    """JSON as the conventions' string attributes carry it: compact, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _present(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value is not None}


# --- the conventions' attributes -------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """What an agent's spans repeat on every run; None leaves an optional attribute out."""

    name: str
    model: str
    system_instructions: str
    tools: Sequence[Mapping[str, Any]]  # tool definitions, each with "type": "function"
    id: str | None = None
    provider: str = "openai"
    response_model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    server: tuple[str, int] | None = None  # the model API's address and port

    @cached_property
    def instructions_json(self) -> str:
        return dumps([{"type": "text", "content": self.system_instructions}])

    @cached_property
    def tools_json(self) -> str:
        return dumps(list(self.tools))


def agent_attributes(agent: Agent, conversation_id: str | None = None) -> dict[str, Any]:
    """The attributes of an `invoke_agent` root span."""
    return _present({
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent.name,
        "gen_ai.agent.id": agent.id,
        "gen_ai.conversation.id": conversation_id,
        "gen_ai.provider.name": agent.provider,
        "gen_ai.request.model": agent.model,
    })  # fmt: skip


def chat_attributes(
    agent: Agent,
    inputs: Sequence[Mapping[str, Any]],
    output: Mapping[str, Any],
    *,
    conversation_id: str | None = None,
    response_id: str | None = None,
    usage: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The attributes of a `chat` span: `inputs` (the conversation before the call) in, `output` (the
    assistant message, with its finish_reason) out. Input messages carry no finish reason. Without
    `usage` (input, output tokens) the counts are estimated at four characters a token."""
    input_json = dumps([{key: value for key, value in message.items() if key != "finish_reason"} for message in inputs])
    output_json = dumps([output])
    if usage is None:
        prompt = len(agent.instructions_json) + len(agent.tools_json) + len(input_json)
        usage = prompt // 4, max(1, len(output_json) // 4)
    address, port = agent.server or (None, None)
    return _present({
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": agent.provider,
        "gen_ai.request.model": agent.model,
        "gen_ai.response.model": agent.response_model,
        "gen_ai.response.id": response_id,
        "gen_ai.conversation.id": conversation_id,
        "gen_ai.request.temperature": agent.temperature,
        "gen_ai.request.max_tokens": agent.max_tokens,
        "gen_ai.system_instructions": agent.instructions_json,
        "gen_ai.tool.definitions": agent.tools_json,
        "gen_ai.input.messages": input_json,
        "gen_ai.output.messages": output_json,
        "gen_ai.response.finish_reasons": [output.get("finish_reason", "stop")],
        "gen_ai.usage.input_tokens": usage[0],
        "gen_ai.usage.output_tokens": usage[1],
        "server.address": address,
        "server.port": port,
    })  # fmt: skip


def tool_attributes(
    name: str,
    call_id: str,
    arguments: Any,
    *,
    result: str | None = None,
    error_type: str | None = None,
    description: str | None = None,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    """The attributes of an `execute_tool` span: the result of a call that worked, the error type of
    one that failed."""
    return _present({
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": dumps(arguments),
        "gen_ai.conversation.id": conversation_id,
        "gen_ai.tool.description": description,
        "error.type": error_type,
        "gen_ai.tool.call.result": result if error_type is None else None,
    })  # fmt: skip


def evaluation_attributes(name: str, passed: bool, explanation: str | None = None) -> dict[str, Any]:
    """The attributes of a `gen_ai.evaluation.result` log record or span event."""
    return _present({
        "gen_ai.evaluation.name": name,
        "gen_ai.evaluation.score.label": "pass" if passed else "fail",
        "gen_ai.evaluation.score.value": 1.0 if passed else 0.0,
        "gen_ai.evaluation.explanation": explanation,
    })  # fmt: skip


# --- spans through the SDK -----------------------------------------------------------------------


class AgentRun:
    """One run of `agent` written through `tracer`: the root span opened at `start_ns` (with any
    extra `attributes`), and the chat and tool spans under it, each given its start and end."""

    def __init__(
        self,
        tracer: trace.Tracer,
        agent: Agent,
        conversation_id: str | None,
        start_ns: int,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self.tracer, self.agent, self.conversation_id = tracer, agent, conversation_id
        self.span = tracer.start_span(
            f"invoke_agent {agent.name}", context=Context(), kind=SpanKind.INTERNAL,
            attributes={**agent_attributes(agent, conversation_id), **(attributes or {})}, start_time=start_ns,
        )  # fmt: skip
        self.context = trace.set_span_in_context(self.span)  # the run's spans and log records belong here

    def chat(
        self,
        inputs: Sequence[Mapping[str, Any]],
        output: Mapping[str, Any],
        start_ns: int,
        end_ns: int,
        *,
        response_id: str | None = None,
        usage: tuple[int, int] | None = None,
    ) -> None:
        """A model call: see :func:`chat_attributes`."""
        attributes = chat_attributes(
            self.agent, inputs, output, conversation_id=self.conversation_id, response_id=response_id, usage=usage
        )
        span = self.tracer.start_span(
            f"chat {self.agent.model}", context=self.context, kind=SpanKind.CLIENT, start_time=start_ns,
            attributes=attributes,
        )  # fmt: skip
        span.end(end_time=end_ns)

    def tool(
        self,
        name: str,
        call_id: str,
        arguments: Any,
        start_ns: int,
        end_ns: int,
        *,
        result: str | None = None,
        error: tuple[str, str] | None = None,
        description: str | None = None,
    ) -> None:
        """A tool call, with the result it returned or the (type, message) of its `error`."""
        attributes = tool_attributes(
            name, call_id, arguments, result=result, error_type=error[0] if error else None,
            description=description, conversation_id=self.conversation_id,
        )  # fmt: skip
        span = self.tracer.start_span(
            f"execute_tool {name}", context=self.context, kind=SpanKind.INTERNAL, attributes=attributes,
            start_time=start_ns,
        )  # fmt: skip
        if error:
            span.set_status(Status(StatusCode.ERROR, f"{error[0]}: {error[1]}"))
        span.end(end_time=end_ns)

    def end(self, end_ns: int) -> None:
        self.span.end(end_time=end_ns)


class Recorder:
    """A TracerProvider of one resource that keeps the spans it finishes in memory."""

    def __init__(self, resource: Mapping[str, Any], scope: str, version: str) -> None:
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create(dict(resource)))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer(scope, version)

    def finished(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())

    def take(self) -> list[ReadableSpan]:
        """The finished spans, forgotten here so the next take holds only new ones."""
        spans = self.finished()
        self.memory.clear()
        return spans


def exporter(
    signal: str, endpoint: str, protocol: str = "http/protobuf", timeout_s: float = 10.0, **options: Any
) -> Any:
    """The SDK's OTLP exporter of `signal` ("traces" or "logs") over `protocol` ("http/protobuf" or
    "grpc"); `endpoint` is the collector's root URL (a /v1/traces or /v1/logs URL also does) or its
    gRPC address, plaintext unless it starts with https://. `options` go to the exporter."""
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http import _log_exporter, trace_exporter

        root = endpoint.rstrip("/").removesuffix("/v1/traces").removesuffix("/v1/logs")
        kind = trace_exporter.OTLPSpanExporter if signal == "traces" else _log_exporter.OTLPLogExporter
        return kind(endpoint=f"{root}/v1/{signal}", timeout=timeout_s, **options)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import _log_exporter, trace_exporter

        target = endpoint.split("://", 1)[-1].rstrip("/")
        kind = trace_exporter.OTLPSpanExporter if signal == "traces" else _log_exporter.OTLPLogExporter
        return kind(endpoint=target, insecure=not endpoint.startswith("https://"), timeout=timeout_s, **options)
    raise ValueError(f"unknown protocol {protocol!r}; use http/protobuf or grpc")


# --- OTLP/JSON ---------------------------------------------------------------------------------


def any_value(value: Any) -> dict[str, Any]:
    """An AnyValue in OTLP/JSON: int64 as a decimal string, bytes as base64."""
    if isinstance(value, str):  # first: nearly every attribute value is one
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": key_values(value)}}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    raise TypeError(f"no OTLP AnyValue for {value!r}")


def key_values(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Attributes as OTLP/JSON KeyValues, in their order."""
    return [{"key": key, "value": any_value(value)} for key, value in (attributes or {}).items()]
