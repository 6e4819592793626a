"""Tests for collectors.dialects: one span's attributes, in each dialect, as one SpanView.

The attribute dicts mirror what each instrumentation library emits, after OTLP AnyValue
decoding (strings stay strings, arrays become lists, kvlists become dicts).
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import orjson
import pytest

from tracefix.collectors.dialects import (
    Message,
    SpanView,
    ToolCallRequest,
    ToolDefinition,
    ToolExecution,
    conversation_id,
    interpret,
)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
    "additionalProperties": False,
}
CALL_ID = "call_VSPygqKTWdrhaFErNvMV18Yl"
ERROR = 2


# --- OpenTelemetry GenAI, structured --------------------------------------------------------

GENAI_INPUT = [
    {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
    {
        "role": "assistant",
        "parts": [
            {
                "type": "tool_call",
                "id": CALL_ID,
                "name": "get_weather",
                "arguments": {"location": "Paris", "unit": "celsius"},
            }
        ],
    },
    {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": CALL_ID, "response": "rainy, 14°C"}],
    },
]
GENAI_OUTPUT = [
    {
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "content": "The tool said rainy; answer briefly."},
            {"type": "text", "content": "It is rainy and 14°C in Paris."},
        ],
        "finish_reason": "stop",
    }
]
GENAI_SYSTEM = [{"type": "text", "content": "You are a weather assistant."}]
GENAI_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": WEATHER_SCHEMA,
    }
]


def genai_chat(encode: Any) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": "chatcmpl-9J3uIL87gldCFtiIbyaOvTeYBRA3l",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 97,
        "gen_ai.usage.output_tokens": 52,
        "gen_ai.conversation.id": "conv_5j66UpCpwteGg4YSxUnt7lPY",
        "server.address": "api.openai.com",
        "gen_ai.system_instructions": encode(GENAI_SYSTEM),
        "gen_ai.input.messages": encode(GENAI_INPUT),
        "gen_ai.output.messages": encode(GENAI_OUTPUT),
        "gen_ai.tool.definitions": encode(GENAI_TOOLS),
    }


@pytest.mark.parametrize("encode", [json.dumps, lambda value: value], ids=["json-text", "structured"])
def test_genai_full_conversation(encode: Any) -> None:
    view = interpret("chat gpt-4o", genai_chat(encode), [], status_code=1)

    assert view.dialect == "genai"
    assert view.operation == "chat"
    assert view.model == "gpt-4o"
    assert view.conversation_id == "conv_5j66UpCpwteGg4YSxUnt7lPY"
    assert view.system_instructions == "You are a weather assistant."
    user, assistant, tool = view.input_messages
    assert user == Message("user", "Weather in Paris?")
    assert assistant.role == "assistant"
    assert assistant.content == ""
    [call] = assistant.tool_calls
    assert (call.id, call.name) == (CALL_ID, "get_weather")
    assert orjson.loads(call.arguments) == {"location": "Paris", "unit": "celsius"}
    assert tool == Message("tool", "rainy, 14°C", tool_call_id=CALL_ID)
    # The reasoning part is not merged into the answer.
    assert view.output_messages == [
        Message("assistant", "It is rainy and 14°C in Paris.", finish_reason="stop")
    ]
    assert view.tool_definitions == [
        ToolDefinition("get_weather", "Current weather for a city", WEATHER_SCHEMA)
    ]
    assert view.tool_execution is None


def test_genai_tool_call_arguments_sent_as_text_are_kept_verbatim() -> None:
    arguments = '{"location": "Paris",  "unit": "celsius"}'
    messages = [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Let me check."},
                {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": arguments},
                {"type": "tool_call", "id": "c2", "name": "get_time", "arguments": "{not json"},
            ],
        }
    ]
    view = interpret("chat", {"gen_ai.output.messages": json.dumps(messages)}, [])

    [message] = view.output_messages
    assert message.content == "Let me check."
    assert message.tool_calls == [
        ToolCallRequest("c1", "get_weather", arguments),
        ToolCallRequest("c2", "get_time", "{not json"),
    ]
    # No gen_ai.operation.name, but messages: still a chat.
    assert view.operation == "chat"


def test_genai_several_tool_responses_in_one_message_become_one_tool_message_each() -> None:
    messages = [
        {
            "role": "user",
            "parts": [
                {"type": "tool_call_response", "id": "c1", "response": {"temp": 14, "sky": "rain"}},
                {"type": "tool_call_response", "id": "c2", "response": "10:42"},
                {"type": "text", "content": "And tomorrow?"},
            ],
        }
    ]
    view = interpret("chat claude", {"gen_ai.input.messages": messages}, [])

    first, second, user = view.input_messages
    assert (first.role, first.tool_call_id) == ("tool", "c1")
    assert orjson.loads(first.content) == {"temp": 14, "sky": "rain"}
    assert second == Message("tool", "10:42", tool_call_id="c2")
    assert user == Message("user", "And tomorrow?")


def test_genai_openai_shaped_messages_are_accepted() -> None:
    # Some SDKs log OpenAI chat messages under the GenAI attribute names.
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": CALL_ID,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": CALL_ID, "content": "rainy"},
    ]
    view = interpret("chat", {"gen_ai.input.messages": json.dumps(messages)}, [])

    assert view.input_messages == [
        Message("user", "Weather in Paris?"),
        Message("assistant", "", [ToolCallRequest(CALL_ID, "get_weather", '{"location":"Paris"}')]),
        Message("tool", "rainy", tool_call_id=CALL_ID),
    ]


def test_genai_roles_are_normalised() -> None:
    messages = [
        {"role": "human", "parts": [{"type": "text", "content": "a"}]},
        {"role": "ai", "parts": [{"type": "text", "content": "b"}]},
        {"role": "model", "parts": [{"type": "text", "content": "c"}]},
        {"role": "function", "parts": [{"type": "text", "content": "d"}]},
        {"role": "developer", "parts": [{"type": "text", "content": "e"}]},
    ]
    view = interpret("chat", {"gen_ai.input.messages": messages}, [])

    assert [m.role for m in view.input_messages] == ["user", "assistant", "assistant", "tool", "system"]
    # Without gen_ai.system_instructions, a system message still gives the instructions.
    assert view.system_instructions == "e"


def test_genai_tool_definitions_in_openai_nesting() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": json.dumps(WEATHER_SCHEMA),
            },
        },
        {"type": "function", "name": "ping", "description": "Health check"},
        {"type": "function", "name": "broken", "description": "", "parameters": "{cut off"},
    ]
    view = interpret("chat", {"gen_ai.tool.definitions": json.dumps(tools)}, [])

    assert view.tool_definitions == [
        ToolDefinition("get_weather", "Current weather for a city", WEATHER_SCHEMA),
        ToolDefinition("ping", "Health check", None),
        ToolDefinition("broken", "", None),
    ]


def test_genai_invalid_json_is_kept_as_text() -> None:
    truncated = '[{"role": "user", "parts": [{"type": "text", "content": "Weather in Pa'
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": truncated,
        "gen_ai.output.messages": "not json at all",
        "gen_ai.system_instructions": "You are terse.",
    }
    view = interpret("chat", attributes, [])

    assert view.input_messages == [Message("user", truncated)]
    assert view.output_messages == [Message("assistant", "not json at all")]
    assert view.system_instructions == "You are terse."

    # Valid JSON that is only a string literal is still just text.
    view = interpret("chat", {"gen_ai.output.messages": '"Done."'}, [])
    assert view.output_messages == [Message("assistant", "Done.")]


def test_genai_agent_span() -> None:
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "TravelPlanner",
        "gen_ai.agent.id": "asst_5j66UpCpwteGg4YSxUnt7lPY",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.conversation.id": "thread_9",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "Plan 2 days in Rome"}]}]
        ),
    }
    view = interpret("invoke_agent TravelPlanner", attributes, [])

    assert (view.dialect, view.operation) == ("genai", "agent")
    assert view.agent_name == "TravelPlanner"
    assert view.conversation_id == "thread_9"
    assert view.input_messages == [Message("user", "Plan 2 days in Rome")]


def test_genai_tool_span_success() -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": CALL_ID,
        "gen_ai.tool.description": "Current weather for a city",
        "gen_ai.tool.call.arguments": '{"location": "Paris"}',
        "gen_ai.tool.call.result": '{"temp": 14, "sky": "rain"}',
    }
    view = interpret("execute_tool get_weather", attributes, [], status_code=1)

    assert (view.dialect, view.operation) == ("genai", "execute_tool")
    assert view.tool_execution == ToolExecution(
        name="get_weather",
        call_id=CALL_ID,
        arguments='{"location": "Paris"}',
        result='{"temp": 14, "sky": "rain"}',
        error=None,
    )


def test_genai_tool_span_error_and_name_from_span_name() -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": CALL_ID,
        "gen_ai.tool.call.arguments": {"location": "Atlantis"},
        "error.type": "LookupError",
    }
    view = interpret(
        "execute_tool get_weather", attributes, [], status_code=ERROR, status_message="unknown city"
    )

    execution = view.tool_execution
    assert execution is not None
    assert execution.name == "get_weather"
    assert orjson.loads(execution.arguments or "") == {"location": "Atlantis"}
    assert execution.result is None
    assert execution.error == "unknown city"


def test_genai_tool_span_error_text_fallbacks() -> None:
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather"}
    exception = {
        "name": "exception",
        "time_unix_nano": 1,
        "attributes": {"exception.type": "TimeoutError", "exception.message": "read timed out"},
    }

    def error(attributes: dict[str, Any], events: list[Any], status: int) -> str | None:
        execution = interpret("execute_tool get_weather", attributes, events, status).tool_execution
        assert execution is not None
        return execution.error

    assert error(base, [], ERROR) == "error"
    assert error(base, [exception], ERROR) == "read timed out"
    assert error({**base, "error.type": "TimeoutError"}, [], ERROR) == "TimeoutError"
    # error.type alone marks a failure even when the status was left unset.
    assert error({**base, "error.type": "TimeoutError"}, [], 0) == "TimeoutError"
    assert error(base, [], 1) is None


def test_genai_inference_details_event() -> None:
    event = {
        "name": "gen_ai.client.inference.operation.details",
        "time_unix_nano": 1_700_000_000_000_000_000,
        "attributes": {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": json.dumps(GENAI_INPUT),
            "gen_ai.output.messages": json.dumps(GENAI_OUTPUT),
        },
    }
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}
    view = interpret("chat gpt-4o", attributes, [event])

    assert (view.dialect, view.operation, view.model) == ("genai", "chat", "gpt-4o")
    assert [m.role for m in view.input_messages] == ["user", "assistant", "tool"]
    assert view.output_messages[0].content == "It is rainy and 14°C in Paris."


# --- GenAI indexed (OpenLLMetry LLM spans) --------------------------------------------------

OPENLLMETRY_CHAT = {
    "llm.request.type": "chat",
    "gen_ai.system": "openai",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.response.model": "gpt-4o-2024-08-06",
    "llm.is_streaming": False,
    "gen_ai.usage.prompt_tokens": 120,
    "gen_ai.usage.completion_tokens": 18,
    "traceloop.workflow.name": "weather_agent",
    "traceloop.association.properties.session_id": "sess-42",
    "llm.request.functions.0.name": "get_weather",
    "llm.request.functions.0.description": "Current weather for a city",
    "llm.request.functions.0.parameters": json.dumps(WEATHER_SCHEMA),
    "gen_ai.prompt.0.role": "system",
    "gen_ai.prompt.0.content": "You are a weather assistant.",
    "gen_ai.prompt.1.role": "user",
    "gen_ai.prompt.1.content": "Weather in Paris?",
    "gen_ai.prompt.2.role": "assistant",
    "gen_ai.prompt.2.tool_calls.0.id": CALL_ID,
    "gen_ai.prompt.2.tool_calls.0.name": "get_weather",
    "gen_ai.prompt.2.tool_calls.0.arguments": '{"location":"Paris"}',
    "gen_ai.prompt.3.role": "tool",
    "gen_ai.prompt.3.content": "rainy, 14°C",
    "gen_ai.prompt.3.tool_call_id": CALL_ID,
    "gen_ai.completion.0.finish_reason": "stop",
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.content": "It is rainy and 14°C in Paris.",
}


def test_indexed_full_conversation() -> None:
    view = interpret("openai.chat", OPENLLMETRY_CHAT, [])

    assert (view.dialect, view.operation) == ("genai_indexed", "chat")
    assert view.model == "gpt-4o"
    assert view.conversation_id == "sess-42"
    assert view.system_instructions == "You are a weather assistant."
    assert view.input_messages == [
        Message("system", "You are a weather assistant."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", [ToolCallRequest(CALL_ID, "get_weather", '{"location":"Paris"}')]),
        Message("tool", "rainy, 14°C", tool_call_id=CALL_ID),
    ]
    assert view.output_messages == [
        Message("assistant", "It is rainy and 14°C in Paris.", finish_reason="stop")
    ]
    assert view.tool_definitions == [
        ToolDefinition("get_weather", "Current weather for a city", WEATHER_SCHEMA)
    ]


def test_indexed_completion_with_parallel_tool_calls() -> None:
    attributes = {
        "llm.request.type": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Weather in Paris and Rome?",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.tool_calls.1.id": "call_2",
        "gen_ai.completion.0.tool_calls.1.name": "get_weather",
        "gen_ai.completion.0.tool_calls.1.arguments": '{"location":"Rome"}',
        "gen_ai.completion.0.tool_calls.0.id": "call_1",
        "gen_ai.completion.0.tool_calls.0.name": "get_weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"location":"Paris"}',
    }
    [message] = interpret("openai.chat", attributes, []).output_messages

    assert message.finish_reason == "tool_calls"
    assert [(c.id, c.arguments) for c in message.tool_calls] == [
        ("call_1", '{"location":"Paris"}'),
        ("call_2", '{"location":"Rome"}'),
    ]


def test_indexed_indices_sort_numerically() -> None:
    items = [(f"gen_ai.prompt.{i}.content", f"turn {i}") for i in range(12)]
    items += [(f"gen_ai.prompt.{i}.role", "user" if i % 2 == 0 else "assistant") for i in range(12)]
    random.Random(7).shuffle(items)
    view = interpret("openai.chat", dict(items), [])

    assert [m.content for m in view.input_messages] == [f"turn {i}" for i in range(12)]
    assert view.input_messages[10].role == "user"


def test_indexed_sparse_indices() -> None:
    attributes = {
        "gen_ai.prompt.5.role": "user",
        "gen_ai.prompt.5.content": "second",
        "gen_ai.prompt.2.role": "user",
        "gen_ai.prompt.2.content": "first",
    }
    view = interpret("openai.chat", attributes, [])

    assert [m.content for m in view.input_messages] == ["first", "second"]


def test_indexed_openai_list_content_is_decoded_to_text() -> None:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    attributes = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": json.dumps(content),
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": "[1, 2, 3] is a list",
    }
    view = interpret("openai.chat", attributes, [])

    assert view.input_messages[0].content == "What is in this picture?"
    assert view.input_messages[1].content == "[1, 2, 3] is a list"


def test_indexed_anthropic_tool_result_and_thinking() -> None:
    # What OpenLLMetry's Anthropic instrumentation records for a tool round trip.
    tool_result = [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "rainy, 14°C"}]
    attributes = {
        "gen_ai.system": "Anthropic",
        "llm.request.type": "completion",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "llm.request.functions.0.name": "get_weather",
        "llm.request.functions.0.description": "Current weather for a city",
        "llm.request.functions.0.input_schema": json.dumps(WEATHER_SCHEMA),
        "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": "You are a weather assistant.",
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": "Weather in Paris?",
        "gen_ai.prompt.2.role": "assistant",
        "gen_ai.prompt.2.content": json.dumps([{"type": "text", "text": "Checking."}]),
        "gen_ai.prompt.2.tool_calls.0.id": "toolu_01A",
        "gen_ai.prompt.2.tool_calls.0.name": "get_weather",
        "gen_ai.prompt.2.tool_calls.0.arguments": '{"location": "Paris"}',
        "gen_ai.prompt.3.role": "user",
        "gen_ai.prompt.3.content": json.dumps(tool_result),
        "gen_ai.completion.0.role": "thinking",
        "gen_ai.completion.0.content": "The user wants the weather.",
        "gen_ai.completion.1.role": "assistant",
        "gen_ai.completion.1.content": "It is rainy in Paris.",
        "gen_ai.completion.1.finish_reason": "end_turn",
    }
    view = interpret("anthropic.chat", attributes, [])

    assert view.dialect == "genai_indexed"
    assert view.input_messages[2].content == "Checking."
    assert view.input_messages[2].tool_calls[0].id == "toolu_01A"
    assert view.input_messages[3] == Message("tool", "rainy, 14°C", tool_call_id="toolu_01A")
    assert len(view.input_messages) == 4
    assert view.output_messages == [
        Message("assistant", "It is rainy in Paris.", finish_reason="end_turn")
    ]
    assert view.tool_definitions[0].parameters == WEATHER_SCHEMA


# --- OpenInference --------------------------------------------------------------------------

OPENINFERENCE_LLM = {
    "openinference.span.kind": "LLM",
    "llm.system": "openai",
    "llm.provider": "openai",
    "llm.model_name": "gpt-4o-2024-08-06",
    "llm.invocation_parameters": '{"model": "gpt-4o", "temperature": 0}',
    "session.id": "phoenix-session-1",
    "input.mime_type": "application/json",
    "input.value": '{"messages": "..."}',
    "llm.tools.0.tool.json_schema": json.dumps(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": WEATHER_SCHEMA,
            },
        }
    ),
    "llm.tools.1.tool.json_schema": json.dumps(
        {"name": "get_time", "description": "Local time", "parameters": {"type": "object"}}
    ),
    "llm.input_messages.0.message.role": "system",
    "llm.input_messages.0.message.content": "You are a weather assistant.",
    "llm.input_messages.1.message.role": "user",
    "llm.input_messages.1.message.contents.0.message_content.type": "text",
    "llm.input_messages.1.message.contents.0.message_content.text": "Weather in Paris?",
    "llm.input_messages.1.message.contents.1.message_content.type": "image",
    "llm.input_messages.1.message.contents.1.message_content.image.image.url": "https://x/y.png",
    "llm.input_messages.2.message.role": "assistant",
    "llm.input_messages.2.message.tool_calls.0.tool_call.id": CALL_ID,
    "llm.input_messages.2.message.tool_calls.0.tool_call.function.name": "get_weather",
    "llm.input_messages.2.message.tool_calls.0.tool_call.function.arguments": '{"location": "Paris"}',
    "llm.input_messages.3.message.role": "tool",
    "llm.input_messages.3.message.content": "rainy, 14°C",
    "llm.input_messages.3.message.tool_call_id": CALL_ID,
    "llm.input_messages.3.message.name": "get_weather",
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.content": "It is rainy and 14°C in Paris.",
    "llm.token_count.prompt": 120,
    "llm.token_count.completion": 18,
    "output.mime_type": "application/json",
}


def test_openinference_full_conversation() -> None:
    view = interpret("ChatCompletion", OPENINFERENCE_LLM, [])

    assert (view.dialect, view.operation) == ("openinference", "chat")
    assert view.model == "gpt-4o-2024-08-06"
    assert view.conversation_id == "phoenix-session-1"
    assert view.system_instructions == "You are a weather assistant."
    assert view.input_messages == [
        Message("system", "You are a weather assistant."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", [ToolCallRequest(CALL_ID, "get_weather", '{"location": "Paris"}')]),
        Message("tool", "rainy, 14°C", tool_call_id=CALL_ID, name="get_weather"),
    ]
    assert view.output_messages == [Message("assistant", "It is rainy and 14°C in Paris.")]
    assert view.tool_definitions == [
        ToolDefinition("get_weather", "Current weather for a city", WEATHER_SCHEMA),
        ToolDefinition("get_time", "Local time", {"type": "object"}),
    ]


def test_openinference_tool_definition_variants() -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        # Newer instrumentations name the tool explicitly; that wins over the schema.
        "llm.tools.0.tool.name": "search",
        "llm.tools.0.tool.description": "Web search",
        "llm.tools.0.tool.json_schema": json.dumps({"type": "object", "properties": {"q": {}}}),
        # Anthropic's native definition.
        "llm.tools.1.tool.json_schema": json.dumps(
            {"name": "get_weather", "description": "Weather", "input_schema": WEATHER_SCHEMA}
        ),
        "llm.tools.2.tool.json_schema": "{truncated",
    }
    view = interpret("Messages", attributes, [])

    assert view.tool_definitions == [
        ToolDefinition("search", "Web search", {"type": "object", "properties": {"q": {}}}),
        ToolDefinition("get_weather", "Weather", WEATHER_SCHEMA),
    ]


def test_openinference_tool_span_success() -> None:
    attributes = {
        "openinference.span.kind": "TOOL",
        "tool.name": "get_weather",
        "tool.description": "Current weather for a city",
        "tool.parameters": json.dumps(WEATHER_SCHEMA),
        "tool_call.id": CALL_ID,
        "input.value": '{"location": "Paris"}',
        "input.mime_type": "application/json",
        "output.value": "rainy, 14°C",
        "session.id": "phoenix-session-1",
    }
    view = interpret("get_weather", attributes, [], status_code=1)

    assert (view.dialect, view.operation) == ("openinference", "execute_tool")
    assert view.tool_execution == ToolExecution(
        "get_weather", CALL_ID, '{"location": "Paris"}', "rainy, 14°C", None
    )


def test_openinference_tool_span_error() -> None:
    attributes = {
        "openinference.span.kind": "TOOL",
        "tool.name": "get_weather",
        "input.value": '{"location": "Atlantis"}',
    }
    view = interpret(
        "get_weather", attributes, [], status_code=ERROR, status_message="KeyError: 'Atlantis'"
    )

    assert view.tool_execution is not None
    assert view.tool_execution.error == "KeyError: 'Atlantis'"
    assert view.tool_execution.result is None


@pytest.mark.parametrize(
    ("kind", "operation"),
    [
        ("AGENT", "agent"),
        ("CHAIN", "workflow"),
        ("EMBEDDING", "embeddings"),
        ("RETRIEVER", "other"),
        ("GUARDRAIL", "other"),
    ],
)
def test_openinference_span_kinds(kind: str, operation: str) -> None:
    attributes = {"openinference.span.kind": kind, "agent.name": "Planner", "input.value": "hi"}
    view = interpret("span", attributes, [])

    assert (view.dialect, view.operation, view.agent_name) == ("openinference", operation, "Planner")


# --- OpenLLMetry (Traceloop SDK) ------------------------------------------------------------


def test_openllmetry_tool_span_success() -> None:
    attributes = {
        "traceloop.span.kind": "tool",
        "traceloop.entity.name": "get_weather",
        "traceloop.entity.path": "weather_agent",
        "traceloop.workflow.name": "weather_agent",
        "traceloop.entity.input": json.dumps(
            {"args": [], "kwargs": {"location": "Paris", "unit": "celsius"}}
        ),
        "traceloop.entity.output": json.dumps("rainy, 14°C"),
        "traceloop.association.properties.session_id": "sess-42",
    }
    view = interpret("get_weather.tool", attributes, [], status_code=0)

    assert (view.dialect, view.operation) == ("openllmetry", "execute_tool")
    assert view.conversation_id == "sess-42"
    execution = view.tool_execution
    assert execution is not None
    assert execution.name == "get_weather"
    assert orjson.loads(execution.arguments or "") == {"location": "Paris", "unit": "celsius"}
    assert execution.result == "rainy, 14°C"
    assert execution.error is None


def test_openllmetry_tool_span_positional_arguments_and_error() -> None:
    entity_input = json.dumps({"args": ["Atlantis"], "kwargs": {}})
    attributes = {
        "traceloop.span.kind": "tool",
        "traceloop.entity.name": "get_weather",
        "traceloop.entity.input": entity_input,
    }
    exception = {
        "name": "exception",
        "time_unix_nano": 1,
        "attributes": {"exception.type": "KeyError", "exception.message": "'Atlantis'"},
    }
    view = interpret("get_weather.tool", attributes, [exception], status_code=ERROR)

    execution = view.tool_execution
    assert execution is not None
    # Only positional arguments: the whole input is kept rather than an empty kwargs.
    assert execution.arguments == entity_input
    assert execution.result is None
    assert execution.error == "'Atlantis'"


@pytest.mark.parametrize(
    ("kind", "operation", "agent"),
    [("workflow", "workflow", None), ("task", "workflow", None), ("agent", "agent", "trip_planner")],
)
def test_openllmetry_span_kinds(kind: str, operation: str, agent: str | None) -> None:
    attributes = {
        "traceloop.span.kind": kind,
        "traceloop.entity.name": "trip_planner",
        "traceloop.workflow.name": "trip_planner",
        "traceloop.entity.input": json.dumps({"args": ["Rome"], "kwargs": {}}),
    }
    view = interpret(f"trip_planner.{kind}", attributes, [])

    assert (view.dialect, view.operation, view.agent_name) == ("openllmetry", operation, agent)
    assert view.tool_execution is None


# --- GenAI span events (the older event form) -----------------------------------------------


def event(name: str, attributes: dict[str, Any], at: int = 0) -> dict[str, Any]:
    return {"name": name, "time_unix_nano": 1_700_000_000_000_000_000 + at, "attributes": attributes}


SYSTEM_PROMPT = "You are a weather assistant."


def test_events_full_conversation() -> None:
    tool_call = {
        "id": CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'},
    }
    events = [
        event("gen_ai.system.message", {"gen_ai.system": "openai", "content": SYSTEM_PROMPT}),
        event("gen_ai.user.message", {"gen_ai.system": "openai", "content": "Weather in Paris?"}, 1),
        event("gen_ai.assistant.message", {"gen_ai.system": "openai", "tool_calls": [tool_call]}, 2),
        event("gen_ai.tool.message", {"content": "rainy, 14°C", "id": CALL_ID}, 3),
        event(
            "gen_ai.choice",
            {
                "gen_ai.system": "openai",
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "It is rainy in Paris."},
            },
            4,
        ),
        event("exception", {"exception.message": "unrelated"}, 5),
    ]
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}
    view = interpret("chat gpt-4o", attributes, events)

    assert (view.dialect, view.operation, view.model) == ("genai", "chat", "gpt-4o")
    assert view.system_instructions == "You are a weather assistant."
    assert view.input_messages == [
        Message("system", "You are a weather assistant."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", [ToolCallRequest(CALL_ID, "get_weather", '{"location": "Paris"}')]),
        Message("tool", "rainy, 14°C", tool_call_id=CALL_ID),
    ]
    assert view.output_messages == [
        Message("assistant", "It is rainy in Paris.", finish_reason="stop")
    ]


def test_events_choices_sorted_by_index_and_json_encoded_bodies() -> None:
    events = [
        event(
            "gen_ai.choice",
            {"index": 1, "finish_reason": "stop", "message": json.dumps({"content": "B"})},
        ),
        event(
            "gen_ai.choice",
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "tool_calls": json.dumps(
                        [{"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]
                    )
                },
            },
        ),
    ]
    view = interpret("chat", {}, events)

    first, second = view.output_messages
    assert first.finish_reason == "tool_calls"
    assert first.role == "assistant"
    [call] = first.tool_calls
    assert (call.id, call.name, orjson.loads(call.arguments)) == ("c1", "f", {"x": 1})
    assert (second.content, second.finish_reason) == ("B", "stop")


def test_events_ignored_when_structured_attributes_exist() -> None:
    attributes = {"gen_ai.input.messages": json.dumps(GENAI_INPUT[:1])}
    events = [event("gen_ai.user.message", {"content": "from the event"})]
    view = interpret("chat", attributes, events)

    assert view.input_messages == [Message("user", "Weather in Paris?")]


# --- Precedence, fallbacks, conversation id -------------------------------------------------


def test_precedence_between_dialects() -> None:
    structured = {"gen_ai.input.messages": json.dumps(GENAI_INPUT[:1])}
    openinference = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "from openinference",
    }
    indexed = {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "from indexed"}
    traceloop = {"traceloop.span.kind": "workflow", "traceloop.entity.name": "wf"}

    def read(*parts: dict[str, Any]) -> tuple[str, str]:
        attributes = {key: value for part in parts for key, value in part.items()}
        view = interpret("span", attributes, [event("gen_ai.user.message", {"content": "e"})])
        return view.dialect, view.input_messages[0].content if view.input_messages else ""

    assert read(structured, openinference, indexed, traceloop) == ("genai", "Weather in Paris?")
    assert read(openinference, indexed, traceloop) == ("openinference", "from openinference")
    assert read(indexed, traceloop) == ("genai_indexed", "from indexed")
    assert read(traceloop) == ("openllmetry", "")
    assert read() == ("genai", "e")


@pytest.mark.parametrize(
    ("operation_name", "operation"),
    [(None, "other"), ("chat", "chat"), ("text_completion", "chat"), ("embeddings", "embeddings")],
)
def test_span_without_llm_content(operation_name: str | None, operation: str) -> None:
    attributes: dict[str, Any] = {"http.request.method": "POST", "url.full": "https://api.openai.com"}
    if operation_name is not None:
        attributes["gen_ai.operation.name"] = operation_name
    view = interpret("POST", attributes, [])

    assert view == SpanView(dialect="none", operation=operation)


def test_conversation_id_precedence() -> None:
    keys = ["gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id"]
    attributes = {key: f"from {key}" for key in keys}

    assert conversation_id(attributes) == "from gen_ai.conversation.id"
    del attributes["gen_ai.conversation.id"]
    assert conversation_id(attributes) == "from session.id"
    del attributes["session.id"]
    assert conversation_id(attributes) == "from traceloop.association.properties.session_id"
    assert conversation_id({"session.id": 12345}) == "12345"
    assert conversation_id({"http.route": "/chat"}) is None


# --- Junk input -----------------------------------------------------------------------------

JUNK_VALUES: list[Any] = [
    None,
    42,
    -1.5,
    True,
    b"\xff\xfe",
    "",
    "[",
    "{}",
    "[1, 2, 3]",
    '"just a string"',
    "null",
    [1, 2, 3],
    [None, "x", 3.5, [], {}],
    [{"role": 7, "parts": 9}, {"parts": [1, None, {"type": None}, {"type": "tool_call"}]}],
    [{"role": "user", "parts": [{"type": "text", "content": {"nested": [1, 2]}}]}],
    [{"role": None, "content": [1, {"type": "tool_result", "content": 9}], "tool_calls": "x"}],
    [{"role": "tool", "content": {"type": "text"}, "tool_calls": [{"function": []}, 4]}],
    {"unexpected": "object"},
    {"function": 3},
    [[[[["deep"]]]]],
    json.dumps([[{"type": "text"}]] * 3),
    "[" * 2000,
]
JUNK_KEYS = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.tool.name",
    "gen_ai.prompt.0.content",
    "gen_ai.prompt.0.role",
    "gen_ai.prompt.x.content",
    "gen_ai.prompt.1",
    "gen_ai.prompt.1.tool_calls",
    "gen_ai.completion.0.tool_calls.0.arguments",
    "llm.request.functions.0.parameters",
    "llm.input_messages.0.message",
    "llm.input_messages.0.message.contents.0.message_content.text",
    "llm.input_messages.0.message.tool_calls.0.tool_call",
    "llm.output_messages.²",
    "llm.tools.0.tool.json_schema",
    "llm.tools.0.tool",
    "openinference.span.kind",
    "traceloop.span.kind",
    "traceloop.entity.input",
    "traceloop.entity.output",
    "error.type",
    "gen_ai.conversation.id",
]


def test_junk_input_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(1234)
    junk_events: list[Any] = [
        None,
        "event",
        {"name": None},
        {"name": ["gen_ai.choice"]},
        {"name": "gen_ai.choice", "attributes": "oops"},
        {"name": "gen_ai.choice", "attributes": {"message": "[not json", "index": "first"}},
        {"name": "gen_ai.assistant.message", "attributes": {"tool_calls": 5, "content": [1, {}]}},
        {"name": "gen_ai.tool.message", "attributes": {"gen_ai.event.content": "{bad"}},
        {
            "name": "gen_ai.client.inference.operation.details",
            "attributes": {"gen_ai.input.messages": 3},
        },
        {"name": "exception", "attributes": {"exception.message": 7}},
    ]
    with caplog.at_level(logging.WARNING, logger="tracefix.collectors.dialects"):
        for value in JUNK_VALUES:
            for key in JUNK_KEYS:
                for operation in (None, "chat", "execute_tool"):
                    attributes = {key: value, "gen_ai.request.model": "m"}
                    if operation is not None:
                        attributes["gen_ai.operation.name"] = operation
                    view = interpret("execute_tool x", attributes, rng.sample(junk_events, 3), ERROR)
                    assert isinstance(view, SpanView)
                    assert view.model == "m"
        # Wrong types for the arguments themselves.
        for attributes, events in [(None, None), ([1, 2], "x"), ({1: "a", None: "b"}, [1])]:
            view = interpret(None, attributes, events, "2", None)  # type: ignore[arg-type]
            assert isinstance(view, SpanView)
    # The safety net in interpret() logs a warning: none means every reader coped by itself.
    assert caplog.records == []


def test_junk_values_degrade_to_partial_views() -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.input.messages": 42,
        "gen_ai.output.messages": [1, 2, {"role": "assistant", "parts": "nope"}],
        "gen_ai.tool.definitions": [{"description": "nameless"}, 5, {"name": "ok", "parameters": 3}],
        "gen_ai.system_instructions": [{"type": "text", "content": "Be brief."}, 7],
    }
    view = interpret("chat gpt-4o", attributes, [])

    assert (view.dialect, view.model) == ("genai", "gpt-4o")
    assert view.input_messages == []
    assert view.output_messages == [Message("assistant", "")]
    assert view.tool_definitions == [ToolDefinition("ok", "", None)]
    assert view.system_instructions == "Be brief."
