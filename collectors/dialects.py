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
from dataclasses import dataclass, field
from typing import Any

import orjson

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


@dataclass(slots=True)
class ToolCallRequest:
    """A tool call the model asked for, inside an assistant message."""

    id: str | None
    name: str
    arguments: str  # JSON text exactly as sent; "{}" when none were recorded


@dataclass(slots=True)
class Message:
    """One chat message; the role is one of system, user, assistant, tool."""

    role: str
    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class ToolDefinition:
    """A tool offered to the model."""

    name: str
    description: str
    parameters: dict | None  # JSON schema of the arguments


@dataclass(slots=True)
class ToolExecution:
    """A tool the agent actually ran (a tool span)."""

    name: str
    call_id: str | None
    arguments: str | None
    result: str | None
    error: str | None


@dataclass(slots=True)
class SpanView:
    """The normalised LLM content of one span."""

    dialect: str  # "genai" | "genai_indexed" | "openinference" | "openllmetry" | "none"
    operation: str  # "chat" | "execute_tool" | "agent" | "workflow" | "embeddings" | "other"
    model: str | None = None
    agent_name: str | None = None
    conversation_id: str | None = None
    system_instructions: str | None = None
    input_messages: list[Message] = field(default_factory=list)
    output_messages: list[Message] = field(default_factory=list)
    tool_definitions: list[ToolDefinition] = field(default_factory=list)
    tool_execution: ToolExecution | None = None


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
_STRUCTURED_KEYS = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
)
_INFERENCE_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_CHOICE_EVENT = "gen_ai.choice"

# Flattened list attributes (`prefix.<index>.field...`), gathered in a single pass.
_FLATTENED = {
    "gen_ai.prompt.": "prompt",
    "gen_ai.completion.": "completion",
    "llm.request.functions.": "functions",
    "llm.input_messages.": "oi_input",
    "llm.output_messages.": "oi_output",
    "llm.tools.": "oi_tools",
}
_FLATTENED_PREFIXES = tuple(_FLATTENED)

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
_OPENINFERENCE_OPERATIONS = {
    "LLM": "chat",
    "TOOL": "execute_tool",
    "AGENT": "agent",
    "CHAIN": "workflow",
    "EMBEDDING": "embeddings",
}
_TRACELOOP_OPERATIONS = {
    "workflow": "workflow",
    "task": "workflow",  # a step of a workflow, like an OpenInference CHAIN
    "agent": "agent",
    "tool": "execute_tool",
}
_ROLES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system role
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "chatbot": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})

_UNPARSEABLE = object()  # what _decode returns for text that is not JSON


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


@dataclass(slots=True)
class _Span:
    """The raw span, with its arguments checked for type once."""

    name: str
    attributes: dict[str, Any]
    events: list[Any]
    status_code: Any
    status_message: str


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


# --- OpenTelemetry GenAI, structured ------------------------------------------------------


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


# --- OpenInference ------------------------------------------------------------------------


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


# --- GenAI indexed (also OpenLLMetry's LLM spans) -----------------------------------------


def _read_indexed(view: SpanView, attributes: dict[str, Any], groups: dict[str, dict]) -> None:
    view.dialect = "genai_indexed"
    request_type = attributes.get("llm.request.type")
    view.operation = "embeddings" if request_type == "embedding" else "chat"
    view.input_messages = _indexed_messages(groups.get("prompt"), "user")
    view.output_messages = _indexed_messages(groups.get("completion"), "assistant")
    view.system_instructions = _system_text(view.input_messages)
    for node in _ordered(groups.get("functions")):
        definition = _tool_definition(node)
        if definition is not None:
            view.tool_definitions.append(definition)


def _indexed_messages(tree: Any, default_role: str) -> list[Message]:
    messages: list[Message] = []
    for node in _ordered(tree):
        if not isinstance(node, dict):
            continue
        role = node.get("role")
        if role == "thinking":
            # OpenLLMetry records Anthropic's reasoning as a completion of its own.
            continue
        content = node.get("content")
        if content is None:
            content = node.get("refusal")
        text, tool_results = _content(content)
        messages.extend(tool_results)
        calls = [
            ToolCallRequest(
                id=_optional_text(call.get("id")),
                name=_text(call.get("name")),
                arguments=_arguments(call.get("arguments")),
            )
            for call in _ordered(node.get("tool_calls"))
            if isinstance(call, dict)
        ]
        function_call = node.get("function_call")
        if not calls and isinstance(function_call, dict):
            # The pre-tools OpenAI API: one unnamed call per message.
            name = _text(function_call.get("name"))
            calls.append(ToolCallRequest(None, name, _arguments(function_call.get("arguments"))))
        if text or calls or not tool_results:
            messages.append(
                Message(
                    _role(role, default_role),
                    text,
                    calls,
                    tool_call_id=_optional_text(node.get("tool_call_id")),
                    name=_optional_text(node.get("name")),
                    finish_reason=_optional_text(node.get("finish_reason")),
                )
            )
    return messages


# --- OpenLLMetry (Traceloop SDK) ----------------------------------------------------------


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


# --- GenAI span events (the form before structured attributes) ----------------------------


def _read_events(view: SpanView, events: list[Any]) -> None:
    inputs: list[Message] = []
    choices: list[tuple[int, Message]] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        name = event.get("name")
        if not isinstance(name, str):
            continue
        attributes = event.get("attributes")
        if not isinstance(attributes, dict):
            attributes = {}
        if name == _INFERENCE_DETAILS_EVENT and any(key in attributes for key in _STRUCTURED_KEYS):
            # The current conventions' opt-in event: same structured attributes, on an event.
            view.dialect = "genai"
            _read_genai_content(view, attributes)
            if view.operation == "other":
                view.operation = "chat"
            return
        role = _EVENT_ROLES.get(name)
        if role is None and name != _CHOICE_EVENT:
            continue
        body = _event_body(attributes)
        if role is not None:
            inputs.append(_openai_message(body, role))
            continue
        message = _decode(body.get("message"))
        if message is _UNPARSEABLE:
            message = {"content": body.get("message")}
        elif not isinstance(message, dict):
            message = {}
        choice = _openai_message(message, "assistant")
        choice.finish_reason = _optional_text(body.get("finish_reason")) or choice.finish_reason
        index = body.get("index")
        choices.append((index if type(index) is int else len(choices), choice))
    if inputs or choices:
        view.dialect = "genai"
        view.input_messages = inputs
        view.output_messages = [message for _, message in sorted(choices, key=lambda pair: pair[0])]
        view.system_instructions = _system_text(inputs)
        if view.operation == "other":
            view.operation = "chat"


def _event_body(attributes: dict[str, Any]) -> dict[str, Any]:
    # Semantic Kernel puts the whole event body, as JSON, in one `gen_ai.event.content`.
    packed = attributes.get("gen_ai.event.content")
    if packed is not None:
        data = _decode(packed)
        if isinstance(data, dict):
            return {**data, **attributes}
    return attributes


# --- Shapes shared by several dialects ----------------------------------------------------


def _openai_message(body: dict[str, Any], default_role: str) -> Message:
    """A message in OpenAI's chat shape: role, content, tool_calls, tool_call_id."""
    role = _role(body.get("role"), default_role)
    text, _ = _content(body.get("content"))
    call_id = None
    if role == "tool":
        call_id = body.get("tool_call_id")
        if call_id is None:
            call_id = body.get("id")  # `gen_ai.tool.message` events name it plain `id`
    return Message(
        role,
        text,
        _openai_tool_calls(body.get("tool_calls")),
        tool_call_id=_optional_text(call_id),
        name=_optional_text(body.get("name")),
        finish_reason=_optional_text(body.get("finish_reason")),
    )


def _openai_tool_calls(value: Any) -> list[ToolCallRequest]:
    data = _decode(value)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        return []
    calls = []
    for call in data:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            function = call  # already flat: {id, name, arguments}
        calls.append(
            ToolCallRequest(
                id=_optional_text(call.get("id")),
                name=_text(function.get("name")),
                arguments=_arguments(function.get("arguments")),
            )
        )
    return calls


def _content(value: Any) -> tuple[str, list[Message]]:
    """Text of a content field, and the tool results found in it (Anthropic's `tool_result`)."""
    if isinstance(value, str):
        # OpenLLMetry stores list content as JSON text; only a list of typed parts is that.
        if not value.startswith("["):
            return value, []
        data = _decode(value)
        if not (
            isinstance(data, list)
            and data
            and all(isinstance(part, dict) and "type" in part for part in data)
        ):
            return value, []
        value = data
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return _text(value), []
    results = [
        Message(
            "tool",
            _content(part.get("content"))[0],
            tool_call_id=_optional_text(part.get("tool_use_id")),
        )
        for part in value
        if isinstance(part, dict) and part.get("type") == "tool_result"
    ]
    return _parts_text(value), results


def _parts_text(parts: list[Any]) -> str:
    """Join the text parts of a content list; images, tool calls and reasoning are left out."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in _TEXT_PART_TYPES:
            # GenAI parts hold text in `content`, OpenAI's and Anthropic's in `text`.
            text = part.get("text", part.get("content"))
            if text is not None:
                texts.append(_text(text))
    return "\n".join(texts)


def _system_text(messages: list[Message]) -> str | None:
    text = "\n".join(message.content for message in messages if message.role == "system")
    return text or None


def _gather_flattened(attributes: dict[str, Any]) -> dict[str, dict]:
    """Rebuild the trees behind flattened `prefix.<index>.field` attributes, in one pass."""
    groups: dict[str, dict] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not key.startswith(_FLATTENED_PREFIXES):
            continue
        for prefix, group in _FLATTENED.items():
            if key.startswith(prefix):
                _insert(groups.setdefault(group, {}), key[len(prefix) :], value)
                break
    return groups


def _insert(tree: dict, path: str, value: Any) -> None:
    # Numeric segments become int keys so that index 10 sorts after 9.
    node = tree
    segments = path.split(".")
    for segment in segments[:-1]:
        key = int(segment) if segment.isdecimal() else segment
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            return  # a value already sits where a branch should be: malformed, skip
        node = child
    last = segments[-1]
    node.setdefault(int(last) if last.isdecimal() else last, value)


def _ordered(node: Any) -> list[Any]:
    """The children of a rebuilt tree node that sit under an index, in numeric order."""
    if not isinstance(node, dict):
        return []
    return [node[key] for key in sorted(key for key in node if type(key) is int)]


def _ordered_dicts(node: Any, wrapper: str) -> list[dict]:
    """Indexed OpenInference entries, each wrapped once more (`.<i>.tool_call.…`)."""
    entries = []
    for child in _ordered(node):
        inner = child.get(wrapper) if isinstance(child, dict) else None
        if isinstance(inner, dict):
            entries.append(inner)
    return entries


def _error(span: _Span) -> str | None:
    """Error text of a failed tool span: OTLP status 2, or an `error.type` attribute."""
    error_type = span.attributes.get("error.type")
    if span.status_code != 2 and error_type is None:
        return None
    if span.status_message:
        return span.status_message
    for event in span.events:
        if isinstance(event, dict) and event.get("name") == "exception":
            attributes = event.get("attributes")
            if isinstance(attributes, dict) and attributes.get("exception.message"):
                return _text(attributes["exception.message"])
    return _optional_text(error_type) or "error"


# --- Values -------------------------------------------------------------------------------


def _decode(value: Any) -> Any:
    """JSON text parsed, structured values as they are, `_UNPARSEABLE` for text that is not JSON."""
    if isinstance(value, (str, bytes, bytearray)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return _UNPARSEABLE
    return value


def _text(value: Any) -> str:
    """Any attribute value as text: strings as they are, structures as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return _dumps(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None or value == "" else _text(value)


def _unquoted(value: Any) -> str:
    # A function that returned a string is recorded as a JSON string literal.
    data = _decode(value)
    return data if isinstance(data, str) else _text(value)


def _arguments(value: Any) -> str:
    # Nothing recorded means a call without arguments, which is what "{}" says.
    return "{}" if value is None else _text(value)


def _schema(value: Any) -> dict | None:
    data = _decode(value)
    return data if isinstance(data, dict) else None


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, default=_text_fallback, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        # Nested too deep, or an integer beyond 64 bits.
        try:
            return str(value)
        except RecursionError:
            return ""


def _text_fallback(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _role(value: Any, default: str) -> str:
    if not isinstance(value, str) or not value:
        return default
    role = value.lower()
    return _ROLES.get(role, role)


def _first_text(attributes: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = _optional_text(attributes.get(key))
        if value is not None:
            return value
    return None
