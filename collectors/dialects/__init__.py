"""Read the LLM content of one span, whichever instrumentation library wrote it.

Agents reach us traced by several libraries that spell the same facts differently: the
OpenTelemetry GenAI semantic conventions (structured attributes today; indexed attributes and
span events before that), OpenInference (Arize Phoenix) and OpenLLMetry (Traceloop).
:func:`interpret` folds them all into one :class:`SpanView`, so the rest of tracefix sees a
single shape.

The input comes off the network and may have been truncated on the way in, so no reader here
trusts a type: missing keys, wrong types and JSON that does not parse all degrade to less
information, never to an exception.
"""

from __future__ import annotations

import logging
from typing import Any

from tracefix.collectors.dialects.model import Message, SpanView, ToolCallRequest, ToolDefinition, ToolExecution, _Span
from tracefix.collectors.dialects.values import _first_text
from tracefix.collectors.dialects.shapes import _gather_flattened, _STRUCTURED_KEYS
from tracefix.collectors.dialects.genai import _read_genai
from tracefix.collectors.dialects.openinference import _read_openinference
from tracefix.collectors.dialects.indexed import _read_indexed
from tracefix.collectors.dialects.traceloop import _read_traceloop
from tracefix.collectors.dialects.events import _read_events

__all__ = [
    "Message",
    "SpanView",
    "ToolCallRequest",
    "ToolDefinition",
    "ToolExecution",
    "conversation_id",
    "interpret",
]


logger = logging.getLogger(__name__)


_CONVERSATION_KEYS = (
    "gen_ai.conversation.id",
    "session.id",
    "traceloop.association.properties.session_id",
)


# The model asked for is more stable than the dated name some providers answer with.
_MODEL_KEYS = (
    "gen_ai.request.model",
    "gen_ai.response.model",
    "llm.model_name",
    "embedding.model_name",
)


_AGENT_KEYS = ("gen_ai.agent.name", "agent.name")


_GENAI_OPERATIONS = {
    "chat": "chat",
    "text_completion": "chat",
    "generate_content": "chat",
    "execute_tool": "execute_tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "invoke_workflow": "workflow",
    "embeddings": "embeddings",
}


def conversation_id(attributes: dict[str, Any]) -> str | None:
    """The conversation (session) a span belongs to, in any dialect."""
    for key in _CONVERSATION_KEYS:
        value = attributes.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def interpret(
    name: str,
    attributes: dict[str, Any],
    events: list[dict[str, Any]],
    status_code: int = 0,
    status_message: str = "",
) -> SpanView:
    """Interpret one span's attributes and events, in any supported dialect, as a SpanView."""
    try:
        return _interpret(name, attributes, events, status_code, status_message)
    except Exception:
        # Every reader is written not to raise; this only keeps one bug from stalling the
        # background pass that calls us for every span.
        logger.warning("could not interpret span %r", name, exc_info=True)
        return SpanView(dialect="none", operation="other")


def _interpret(
    name: Any, attributes: Any, events: Any, status_code: Any, status_message: Any
) -> SpanView:
    if not isinstance(attributes, dict):
        attributes = {}
    span = _Span(
        name=name if isinstance(name, str) else "",
        attributes=attributes,
        events=events if isinstance(events, list) else [],
        status_code=status_code,
        status_message=status_message if isinstance(status_message, str) else "",
    )
    operation_name = attributes.get("gen_ai.operation.name")
    operation = "other"
    if isinstance(operation_name, str):
        operation = _GENAI_OPERATIONS.get(operation_name, "other")
    view = SpanView(
        dialect="none",
        operation=operation,
        model=_first_text(attributes, _MODEL_KEYS),
        agent_name=_first_text(attributes, _AGENT_KEYS),
        conversation_id=conversation_id(attributes),
    )

    # Precedence: structured GenAI > OpenInference > indexed GenAI > OpenLLMetry > events.
    if operation_name == "execute_tool" or any(key in attributes for key in _STRUCTURED_KEYS):
        _read_genai(view, span)
        return view
    groups = _gather_flattened(attributes)
    if (
        "openinference.span.kind" in attributes
        or "oi_input" in groups
        or "oi_output" in groups
        or "oi_tools" in groups
    ):
        _read_openinference(view, span, groups)
    elif "prompt" in groups or "completion" in groups or "functions" in groups:
        _read_indexed(view, attributes, groups)
    elif "traceloop.span.kind" in attributes or "traceloop.entity.name" in attributes:
        _read_traceloop(view, span)
    elif span.events:
        _read_events(view, span.events)
    return view
