"""OpenLLMetry (Traceloop SDK) workflow and task spans: traceloop.entity.input / output."""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import _Span, SpanView, ToolExecution
from tracefix.collectors.dialects.values import _decode, _dumps, _optional_text, _text, _unquoted
from tracefix.collectors.dialects.shapes import _error

_TRACELOOP_OPERATIONS = {
    "workflow": "workflow",
    "task": "workflow",  # a step of a workflow, like an OpenInference CHAIN
    "agent": "agent",
    "tool": "execute_tool",
}


def _read_traceloop(view: SpanView, span: _Span) -> None:
    attributes = span.attributes
    view.dialect = "openllmetry"
    kind = attributes.get("traceloop.span.kind")
    view.operation = _TRACELOOP_OPERATIONS.get(kind, "other") if isinstance(kind, str) else "other"
    entity = _optional_text(attributes.get("traceloop.entity.name"))
    if view.operation == "agent" and view.agent_name is None:
        view.agent_name = entity
    if view.operation == "execute_tool":
        result = attributes.get("traceloop.entity.output")
        view.tool_execution = ToolExecution(
            name=entity or span.name.removesuffix(".tool"),
            call_id=_optional_text(attributes.get("gen_ai.tool.call.id")),
            arguments=_traceloop_arguments(attributes.get("traceloop.entity.input")),
            result=None if result is None else _unquoted(result),
            error=_error(span),
        )


def _traceloop_arguments(value: Any) -> str | None:
    """The SDK records `{"args": [...], "kwargs": {...}}`; tools are called with keywords."""
    if value is None:
        return None
    data = _decode(value)
    if isinstance(data, dict) and isinstance(data.get("kwargs"), dict):
        kwargs = data["kwargs"]
        args = data.get("args")
        # Positional-only calls would lose everything if we kept the empty kwargs.
        if kwargs or not args:
            return _dumps(kwargs)
    return _text(value)
