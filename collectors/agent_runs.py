"""Agent runs recorded by benchmarks, turned into the OTLP an instrumented agent would have sent.

τ-bench (`historical_trajectories/*.json`) and τ²-bench (simulation results) keep each run as an
OpenAI chat transcript with the run's reward. :func:`trace_request` renders one :class:`AgentRun`
as an OTLP/JSON export request in the OpenTelemetry GenAI semantic conventions: an
`invoke_agent` root, one `chat` span per model turn (`gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions`, `gen_ai.tool.definitions`), one
`execute_tool` span per tool result, and the reward as a `gen_ai.evaluation.result` event. The
requests then go through the collector like live traffic (collectors/importer.py). Each format's
reader is a module of its own (collectors/tau_bench.py, collectors/tau2_bench.py,
collectors/messages_format.py); collectors/run_formats.py names them.

Ids are derived from the run's identity, so importing the same file twice stores each run once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracefix.daemon.core.semconv import EVALUATION_EVENT, decoded

# Spacing of the made-up clock: benchmark files carry no timestamps, only the order of messages.
_STEP_NS = 1_000_000_000
_KIND_INTERNAL, _KIND_CLIENT = 1, 3


class RunFormatError(ValueError):
    """The file is not in the format it was named as; the message says what is wrong."""


@dataclass(slots=True)
class AgentRun:
    """One recorded run: its transcript as OpenAI chat messages, the tools offered and its reward.

    A tool message may carry `"error": "<text>"` when the tool failed (the benchmark knows it).
    """

    run_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reward: float | None
    evaluation_name: str
    attributes: dict[str, Any] = field(default_factory=dict)
    # The agent that made the run, where the file names it: its service.name and gen_ai.agent.name.
    agent: str | None = None


# --- reading files -------------------------------------------------------------------------------


def load_json(path: Path, what: str) -> Any:
    """The JSON document in `path`; RunFormatError naming `what` was expected when it is none."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunFormatError(f"no such file: {path}") from None
    except orjson.JSONDecodeError as error:
        raise RunFormatError(f"{path} is not JSON ({error}); expected {what}") from None


def load_tools(path: Path) -> list[dict[str, Any]]:
    """Tool definitions in OpenAI's function format (a list, or `{"tools": [...]}`)."""
    tools = load_json(path, "a list of OpenAI function definitions")
    if isinstance(tools, dict):
        tools = tools.get("tools")
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RunFormatError(f"{path}: expected a list of OpenAI function definitions")
    return tools


# --- OTLP ---------------------------------------------------------------------------------------


def _hex(*parts: object, size: int) -> str:
    return hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).hexdigest()[: size * 2]


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"stringValue": orjson.dumps(value).decode()}


def _attributes(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attributes.items() if value is not None]


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        calls.append({"id": call.get("id"), "name": function.get("name"), "arguments": decoded(function.get("arguments"))})
    return calls


def genai_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the GenAI conventions' structured form (role and parts)."""
    role = message["role"]
    if role == "tool":
        part = {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content") or ""}
        return {"role": "tool", "parts": [part]}
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"type": "text", "content": message["content"]})
    parts.extend({"type": "tool_call", **call} for call in _calls(message))
    rendered: dict[str, Any] = {"role": role, "parts": parts}
    if role == "assistant":
        rendered["finish_reason"] = "tool_call" if message.get("tool_calls") else "stop"
    return rendered


def _definitions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function definitions in the conventions' flat form."""
    flat = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        flat.append({"type": "function", **{key: function[key] for key in ("name", "description", "parameters") if key in function}})
    return flat


def trace_request(
    run: AgentRun, start_ns: int, service_name: str, agent_name: str, model: str | None = None
) -> tuple[dict[str, Any], int]:
    """One OTLP/JSON trace export request for `run`, and the time its last span ends."""
    trace_id = _hex(service_name, run.run_id, size=16)
    root_id = _hex(trace_id, "root", size=8)
    clock = start_ns
    spans: list[dict[str, Any]] = []

    def span(name: str, kind: int, attributes: dict[str, Any], begin: int, end: int, **extra: Any) -> None:
        spans.append(
            {
                "traceId": trace_id, "spanId": _hex(trace_id, len(spans) + 1, size=8), "parentSpanId": root_id,
                "name": name, "kind": kind, "startTimeUnixNano": str(begin), "endTimeUnixNano": str(end),
                "attributes": _attributes(attributes), **extra,
            }
        )  # fmt: skip

    system = "\n\n".join(m.get("content") or "" for m in run.messages if m["role"] == "system") or None
    instructions = [{"type": "text", "content": system}] if system else None
    definitions = _definitions(run.tools) or None
    history: list[dict[str, Any]] = []
    arguments_by_id: dict[str, Any] = {}
    for message in run.messages:
        role = message["role"]
        if role == "system":
            continue
        if role == "assistant":
            span(
                f"chat {model}" if model else "chat", _KIND_CLIENT,
                {
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                    "gen_ai.conversation.id": run.run_id, "gen_ai.system_instructions": instructions,
                    "gen_ai.tool.definitions": definitions, "gen_ai.input.messages": list(history),
                    "gen_ai.output.messages": [genai_message(message)],
                },
                clock, clock + _STEP_NS,
            )  # fmt: skip
            arguments_by_id.update((call["id"], call["arguments"]) for call in _calls(message) if call["id"])
        elif role == "tool":
            error = message.get("error")
            status = {"status": {"code": 2, "message": error}} if error else {}
            span(
                f"execute_tool {message.get('name') or ''}".strip(), _KIND_INTERNAL,
                {
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": message.get("name"),
                    "gen_ai.tool.call.id": message.get("tool_call_id"),
                    "gen_ai.tool.call.arguments": arguments_by_id.get(message.get("tool_call_id")),
                    "gen_ai.tool.call.result": message.get("content") or "", "error.type": "tool_error" if error else None,
                },
                clock, clock + _STEP_NS, **status,
            )  # fmt: skip
        history.append(genai_message(message))
        clock += _STEP_NS
    end = clock + _STEP_NS
    events = []
    if run.reward is not None:
        events.append(
            {
                "name": EVALUATION_EVENT, "timeUnixNano": str(end),
                "attributes": _attributes({
                    "gen_ai.evaluation.name": run.evaluation_name, "gen_ai.evaluation.score.value": run.reward,
                    "gen_ai.evaluation.score.label": "pass" if run.reward >= 1 else "fail",
                }),
            }
        )  # fmt: skip
    root = {
        "traceId": trace_id, "spanId": root_id, "name": f"invoke_agent {agent_name}", "kind": _KIND_INTERNAL,
        "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end),
        "attributes": _attributes({
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent_name,
            "gen_ai.conversation.id": run.run_id, "gen_ai.request.model": model, **run.attributes,
        }),
        "events": events,
    }  # fmt: skip
    request = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": service_name})},
                "scopeSpans": [{"scope": {"name": "tracefix.import", "version": "1"}, "spans": [root, *spans]}],
            }
        ]
    }
    return request, end


def trace_requests(
    runs: list[AgentRun],
    service_name: str | None,
    agent_name: str | None,
    model: str | None = None,
    end_ns: int | None = None,
    default_service: str = "imported",
    default_agent: str = "imported",
) -> Iterator[dict[str, Any]]:
    """One export request per run, laid one after another so that the last ends at `end_ns` (now).

    A run's service.name is `service_name` when given, else the agent its file names, else
    `default_service`; its gen_ai.agent.name likewise from `agent_name` and `default_agent`.
    """
    end_ns = time.time_ns() if end_ns is None else end_ns
    clock = end_ns - sum(len(run.messages) + 1 for run in runs) * _STEP_NS
    for run in runs:
        service = service_name or run.agent or default_service
        request, clock = trace_request(run, clock, service, agent_name or run.agent or default_agent, model)
        yield request
