"""GenAI span events, the form before structured attributes (gen_ai.user.message, gen_ai.choice, …)."""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import Message, SpanView
from tracefix.collectors.dialects.values import _decode, _optional_text, _UNPARSEABLE
from tracefix.collectors.dialects.shapes import _openai_message, _STRUCTURED_KEYS, _system_text
from tracefix.collectors.dialects.genai import _read_genai_content

_INFERENCE_DETAILS_EVENT = "gen_ai.client.inference.operation.details"


_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


_CHOICE_EVENT = "gen_ai.choice"


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
