"""Write agent conversations as real OpenTelemetry GenAI spans and export them over OTLP.

A conversation is a list of steps — ``User(text)``, ``Say(text)``, ``Call(tool, args, result,
error)`` — rendered the way an instrumented agent emits them: an ``invoke_agent`` root span, one
``chat`` span per model call carrying the whole history so far, and one ``execute_tool`` span per
tool call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

TOOLS = [
    {
        "type": "function",
        "name": "get_reservation",
        "description": "Read a reservation by id.",
        "parameters": {
            "type": "object",
            "properties": {"reservation_id": {"type": "string"}},
            "required": ["reservation_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "cancel_reservation",
        "description": "Cancel a reservation.",
        "parameters": {
            "type": "object",
            "properties": {"reservation_id": {"type": "string"}, "reason": {"type": "string"}},
            "required": ["reservation_id"],
        },
    },
    {
        "type": "function",
        "name": "list_items",
        "description": "List the items of an order with their prices.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
]
SYSTEM = "You are the support agent of SkyWays. Confirm with the user before changing a booking."


@dataclass
class User:
    text: str


@dataclass
class Say:
    text: str


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any] | str
    result: Any = None
    error: str | None = None


@dataclass
class Conversation:
    steps: list[User | Say | Call]
    outcome: str | None = None  # success / failure, as the root-span attribute tracefix.outcome
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    conversation_id: str | None = None
    system: str | None = SYSTEM  # the agent's instructions (gen_ai.system_instructions); None: none sent


def _text(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


class ConversationSender:
    """Exports conversations to an OTLP/HTTP endpoint with the real SDK; returns their trace ids."""

    def __init__(self, endpoint: str, service: str = "support-agent") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
        self.tracer = self.provider.get_tracer("tests.conversations")

    def send(self, conversation: Conversation) -> str:
        history: list[dict[str, Any]] = []
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}
        if conversation.outcome:
            attributes["tracefix.outcome"] = conversation.outcome
        if conversation.conversation_id:
            attributes["gen_ai.conversation.id"] = conversation.conversation_id
        clock = time.time_ns() - 60_000_000_000
        with self.tracer.start_as_current_span("invoke_agent support", attributes=attributes, start_time=clock) as root:
            for index, step in enumerate(conversation.steps):
                clock += 1_000_000
                if isinstance(step, User):
                    history.append(_text("user", step.text))
                    continue
                if isinstance(step, Say):
                    output = _text("assistant", step.text)
                else:
                    arguments = step.arguments if isinstance(step.arguments, str) else step.arguments
                    output = {
                        "role": "assistant",
                        "parts": [{"type": "tool_call", "id": f"call_{index}", "name": step.tool, "arguments": arguments}],
                    }
                chat = {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "support-model",
                    "gen_ai.tool.definitions": json.dumps(conversation.tools),
                    "gen_ai.input.messages": json.dumps(history),
                    "gen_ai.output.messages": json.dumps([output]),
                }
                if conversation.system is not None:
                    chat["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": conversation.system}])
                with self.tracer.start_as_current_span("chat support-model", attributes=chat, start_time=clock):
                    pass
                history.append(output)
                if isinstance(step, Call):
                    clock += 1_000_000
                    arguments_text = step.arguments if isinstance(step.arguments, str) else json.dumps(step.arguments)
                    result_text = step.result if isinstance(step.result, str) or step.result is None else json.dumps(step.result)
                    tool_attributes = {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": step.tool,
                        "gen_ai.tool.call.id": f"call_{index}",
                        "gen_ai.tool.call.arguments": arguments_text,
                    }
                    if result_text is not None:
                        tool_attributes["gen_ai.tool.call.result"] = result_text
                    with self.tracer.start_as_current_span(
                        f"execute_tool {step.tool}", attributes=tool_attributes, start_time=clock
                    ) as tool_span:
                        if step.error:
                            tool_span.set_status(Status(StatusCode.ERROR, step.error))
                            tool_span.set_attribute("error.type", "ToolError")
                    history.append(
                        {
                            "role": "tool",
                            "parts": [
                                {
                                    "type": "tool_call_response",
                                    "id": f"call_{index}",
                                    "response": step.error if step.error else (result_text or ""),
                                }
                            ],
                        }
                    )
            trace_id = format(root.get_span_context().trace_id, "032x")
        return trace_id

    def close(self) -> None:
        self.provider.shutdown()
