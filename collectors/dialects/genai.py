"""OpenTelemetry GenAI semantic conventions, structured attributes (gen_ai.input.messages, …)."""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import _Span, Message, SpanView, ToolCallRequest, ToolDefinition, ToolExecution
from tracefix.collectors.dialects.values import _arguments, _decode, _optional_text, _role, _schema, _text, _UNPARSEABLE
from tracefix.collectors.dialects.shapes import _error, _openai_message, _parts_text, _system_text

def _read_genai(view: SpanView, span: _Span) -> None:
    view.dialect = "genai"
    _read_genai_content(view, span.attributes)
    if "gen_ai.operation.name" not in span.attributes and (
        view.input_messages or view.output_messages
    ):
        view.operation = "chat"
    if view.operation == "execute_tool":
        attributes = span.attributes
        call_arguments = attributes.get("gen_ai.tool.call.arguments")
        call_result = attributes.get("gen_ai.tool.call.result")
        view.tool_execution = ToolExecution(
            name=_optional_text(attributes.get("gen_ai.tool.name"))
            or _tool_name_from_span_name(span.name),
            call_id=_optional_text(attributes.get("gen_ai.tool.call.id")),
            arguments=None if call_arguments is None else _text(call_arguments),
            result=None if call_result is None else _text(call_result),
            error=_error(span),
        )


def _read_genai_content(view: SpanView, source: dict[str, Any]) -> None:
    """The structured content attributes, found on the span or on its details event."""
    view.input_messages = _genai_messages(source.get("gen_ai.input.messages"), "user")
    view.output_messages = _genai_messages(source.get("gen_ai.output.messages"), "assistant")
    view.tool_definitions = _tool_definitions(source.get("gen_ai.tool.definitions"))
    # Some SDKs keep the system prompt as an input message instead.
    view.system_instructions = _instructions_text(
        source.get("gen_ai.system_instructions")
    ) or _system_text(view.input_messages)


def _genai_messages(value: Any, default_role: str) -> list[Message]:
    """Messages of `gen_ai.input.messages` / `gen_ai.output.messages`, text or structured."""
    if value is None:
        return []
    data = _decode(value)
    if data is _UNPARSEABLE:
        # Often a value cut short by a size limit: keep what arrived as the message text.
        return [Message(default_role, _text(value))]
    if isinstance(data, dict):
        data = [data]
    elif isinstance(data, str):
        return [Message(default_role, data)] if data else []
    if not isinstance(data, list):
        return []
    messages: list[Message] = []
    for item in data:
        if isinstance(item, dict):
            messages.extend(_genai_message(item, default_role))
        elif isinstance(item, str):
            messages.append(Message(default_role, item))
    return messages


def _genai_message(item: dict[str, Any], default_role: str) -> list[Message]:
    """One structured message; each tool_call_response part becomes a tool message of its own."""
    parts = item.get("parts")
    if parts is None and "content" in item:
        # Some SDKs log OpenAI-shaped messages under the GenAI attribute names.
        return [_openai_message(item, default_role)]
    name = _optional_text(item.get("name"))
    texts: list[str] = []
    calls: list[ToolCallRequest] = []
    messages: list[Message] = []
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("content")))
        elif kind == "tool_call":
            calls.append(
                ToolCallRequest(
                    id=_optional_text(part.get("id")),
                    name=_text(part.get("name")),
                    arguments=_arguments(part.get("arguments")),
                )
            )
        elif kind == "tool_call_response":
            messages.append(
                Message(
                    "tool",
                    _text(part.get("response")),
                    tool_call_id=_optional_text(part.get("id")),
                    name=name,
                )
            )
        # reasoning, blob, file and uri parts are not conversation text: left out.
    if texts or calls or not messages:
        role = _role(item.get("role"), default_role)
        messages.append(
            Message(
                role,
                "\n".join(texts),
                calls,
                tool_call_id=_optional_text(item.get("tool_call_id")) if role == "tool" else None,
                name=name,
                finish_reason=_optional_text(item.get("finish_reason")),
            )
        )
    return messages


def _instructions_text(value: Any) -> str | None:
    """`gen_ai.system_instructions`: an array of parts, though plain text turns up too."""
    if value is None:
        return None
    data = _decode(value)
    if data is _UNPARSEABLE:
        return _text(value) or None
    if isinstance(data, dict):
        data = [data]
    if isinstance(data, list):
        return _parts_text(data) or None
    return _text(data) or None


def _tool_definitions(value: Any) -> list[ToolDefinition]:
    """`gen_ai.tool.definitions`: GenAI's flat form or OpenAI's `{"function": {...}}` nesting."""
    data = _decode(value)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        return []
    definitions = []
    for item in data:
        definition = _tool_definition(item)
        if definition is not None:
            definitions.append(definition)
    return definitions


def _tool_definition(item: Any) -> ToolDefinition | None:
    if not isinstance(item, dict):
        return None
    function = item.get("function")
    if isinstance(function, dict):
        item = function
    name = _optional_text(item.get("name"))
    if name is None:
        return None
    parameters = item.get("parameters")
    if parameters is None:
        # Anthropic and MCP call the same schema by other names.
        parameters = item.get("input_schema", item.get("inputSchema"))
    return ToolDefinition(name, _text(item.get("description")), _schema(parameters))


def _tool_name_from_span_name(name: str) -> str:
    # The conventions name tool spans "execute_tool {gen_ai.tool.name}".
    if name.startswith("execute_tool "):
        return name[len("execute_tool ") :].strip()
    return ""
