"""OpenTelemetry GenAI indexed attributes (gen_ai.prompt.N.…), also OpenLLMetry's LLM spans."""

from __future__ import annotations

from typing import Any

from tracefix.collectors.dialects.model import Message, SpanView, ToolCallRequest
from tracefix.collectors.dialects.values import _arguments, _optional_text, _role, _text
from tracefix.collectors.dialects.shapes import _content, _ordered, _system_text
from tracefix.collectors.dialects.genai import _tool_definition

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
