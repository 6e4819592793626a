"""Shapes several dialects share: OpenAI-style messages and tool calls, content parts, flattened
attribute trees, a span's error."""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import _Span, Message, ToolCallRequest
from tracefix.collectors.dialects.values import _arguments, _decode, _optional_text, _role, _text

_STRUCTURED_KEYS = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
)


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


_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


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
