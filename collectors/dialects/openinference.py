"""OpenInference (Arize Phoenix): llm.input_messages.N.message.…, input.value, llm.tools.…"""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import _Span, Message, SpanView, ToolCallRequest, ToolDefinition, ToolExecution
from tracefix.collectors.dialects.values import _arguments, _decode, _optional_text, _role, _schema, _text
from tracefix.collectors.dialects.shapes import _error, _ordered, _ordered_dicts, _system_text

_OPENINFERENCE_OPERATIONS = {
    "LLM": "chat",
    "TOOL": "execute_tool",
    "AGENT": "agent",
    "CHAIN": "workflow",
    "EMBEDDING": "embeddings",
}


def _read_openinference(view: SpanView, span: _Span, groups: dict[str, dict]) -> None:
    attributes = span.attributes
    view.dialect = "openinference"
    kind = attributes.get("openinference.span.kind")
    if isinstance(kind, str):
        view.operation = _OPENINFERENCE_OPERATIONS.get(kind.upper(), "other")
    else:
        # No kind but flattened LLM messages: an LLM span missing its marker.
        view.operation = "chat" if kind is None else "other"
    view.input_messages = _openinference_messages(groups.get("oi_input"), "user")
    view.output_messages = _openinference_messages(groups.get("oi_output"), "assistant")
    view.system_instructions = _system_text(view.input_messages)
    for node in _ordered(groups.get("oi_tools")):
        definition = _openinference_tool(node)
        if definition is not None:
            view.tool_definitions.append(definition)
    if view.operation == "execute_tool":
        arguments = attributes.get("input.value")
        result = attributes.get("output.value")
        view.tool_execution = ToolExecution(
            name=_optional_text(attributes.get("tool.name")) or span.name,
            call_id=_optional_text(attributes.get("tool_call.id")),
            arguments=None if arguments is None else _text(arguments),
            result=None if result is None else _text(result),
            error=_error(span),
        )


def _openinference_messages(tree: Any, default_role: str) -> list[Message]:
    messages = []
    for node in _ordered(tree):
        message = node.get("message") if isinstance(node, dict) else None
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if content is not None and content != "":
            text = _text(content)
        else:
            text = "\n".join(
                _text(part.get("text"))
                for part in _ordered_dicts(message.get("contents"), "message_content")
                if part.get("type", "text") == "text" and part.get("text") is not None
            )
        calls = []
        for call in _ordered_dicts(message.get("tool_calls"), "tool_call"):
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            calls.append(
                ToolCallRequest(
                    id=_optional_text(call.get("id")),
                    name=_text(function.get("name")),
                    arguments=_arguments(function.get("arguments")),
                )
            )
        messages.append(
            Message(
                _role(message.get("role"), default_role),
                text,
                calls,
                tool_call_id=_optional_text(message.get("tool_call_id")),
                name=_optional_text(message.get("name")),
            )
        )
    return messages


def _openinference_tool(node: Any) -> ToolDefinition | None:
    """`llm.tools.<i>.tool.*`: explicit name and description win over the JSON schema's."""
    tool = node.get("tool") if isinstance(node, dict) else None
    if not isinstance(tool, dict):
        return None
    schema = _decode(tool.get("json_schema"))
    if not isinstance(schema, dict):
        schema = {}
    function = schema.get("function")
    if isinstance(function, dict):
        schema = function
    name = _optional_text(tool.get("name")) or _optional_text(schema.get("name"))
    if name is None:
        return None
    description = tool.get("description")
    if description is None:
        description = schema.get("description")
    if "name" not in schema and "properties" in schema:
        # Some providers record only the parameter schema under json_schema.
        parameters = schema
    else:
        parameters = schema.get("parameters", schema.get("input_schema"))
    return ToolDefinition(name, _text(description), _schema(parameters))
