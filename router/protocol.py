"""OpenAI's chat completions protocol: requests validated as OpenAI validates them, conversations
rendered for a chat template without tool support, and responses, stream chunks and errors in
OpenAI's shapes, so the official client and any agent framework work unchanged.

Tools go into the system prompt in the ``<tool_call>{json}</tool_call>`` format the trainer uses
(the format every adapter learned), and tool calls come back parsed from the model's text.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tracefix.daemon.core import generalist
from tracefix.router.backend import Sampling, held_back
from tracefix.trainer.environment import assistant_call, load_tools, parse_assistant, render_system_prompt

TOOL_TAG = "<tool_call>"


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class Strict(BaseModel):
    # Strict: OpenAI answers "5" for an integer with a 400, it does not read it as 5.
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCallIn(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class FunctionDefinition(Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Strict):
    include_usage: bool = False


class ChatRequest(Strict):
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=128)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # OpenAI's request metadata: up to 16 string pairs. `conversation_id` names the conversation the
    # request belongs to (as `gen_ai.conversation.id` does in its spans): it holds the conversation's
    # routing and canary arm and is recorded on the router's span. `agent` names the agent, whose
    # generalist serves where no targeted adapter does.
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and len(metadata) > 16:
            raise ValueError("metadata takes at most 16 pairs")
        if metadata is not None and any(len(key) > 64 or len(value) > 512 for key, value in metadata.items()):
            raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return metadata

    @model_validator(mode="after")
    def _checks(self) -> ChatRequest:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop takes at most 4 sequences")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [tool.function.name for tool in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        return self

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def first_user_turn(self) -> str | None:
        return next((message.text() for message in self.messages if message.role == "user"), None)

    def instructions(self) -> str | None:
        """The request's first system (or developer) message: the agent's instructions, by which the
        router recognises an agent that names none in its metadata."""
        return next((message.text() for message in self.messages if message.role in ("system", "developer")), None)

    @property
    def conversation_id(self) -> str | None:
        return (self.metadata or {}).get("conversation_id") or None

    @property
    def agent(self) -> str | None:
        return (self.metadata or {}).get(generalist.METADATA_KEY) or None

    def sampling(self, max_tokens: int) -> Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return Sampling(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=tuple(stop for stop in stops if stop),
            seed=self.seed,
        )


def parse_request(body: bytes) -> ChatRequest:
    """The request, or a 400 naming the first field at fault the way OpenAI does (``messages[0].role``)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as error:
        issue = error.errors()[0]
        param = _param(issue["loc"])
        raise ApiError(400, f"{issue['msg']} (at {param or 'body'})", param=param) from None


def _param(location: tuple[Any, ...]) -> str | None:
    """pydantic's error location as OpenAI writes a parameter: ``messages[0].content``. The names of
    union members it inserts (``str``, ``list[TextPart]``, ``NamedToolChoice``) are no parameters."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _FIELD.match(part) and part not in _TYPE_NAMES:
            text += f".{part}" if text else part
    return text or None


_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def prompt_messages(request: ChatRequest) -> list[dict[str, str]]:
    """The conversation as plain role/content messages for the chat template, tools in the system prompt."""
    messages = [_plain(message) for message in request.messages]
    if request.uses_tools:
        try:
            tools = load_tools([tool.function.model_dump(exclude_none=True) for tool in request.tools or []])
        except ValueError as error:
            raise ApiError(400, str(error), param="tools") from None
        instructions = messages.pop(0)["content"] if messages and messages[0]["role"] == "system" else ""
        system = render_system_prompt(instructions, tools).lstrip()
        if request.tool_choice == "required":
            system += "\nAnswer with a tool call."
        elif isinstance(request.tool_choice, NamedToolChoice):
            system += f"\nAnswer with a call of the tool {request.tool_choice.function.name}."
        messages.insert(0, {"role": "system", "content": system})
    return messages


def stored_prompt_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A stored trajectory's conversation (rows of the store's ``messages`` and ``trajectory_tools``)
    rendered as this router renders a request for the model: what an adapter trained on it sees
    again when it serves. ValueError when the rows are not a conversation OpenAI's API would take."""

    def call(item: dict[str, Any]) -> dict[str, Any]:
        arguments = item.get("arguments")
        text = arguments if isinstance(arguments, str) else orjson.dumps(arguments if arguments is not None else {}).decode()
        return {"id": item.get("id") or "call", "type": "function", "function": {"name": item.get("name") or "", "arguments": text}}

    def message(row: dict[str, Any]) -> dict[str, Any]:
        calls = row.get("tool_calls") or "[]"
        calls = orjson.loads(calls) if isinstance(calls, str) else calls
        out: dict[str, Any] = {"role": row["role"], "content": row.get("content")}
        if calls and row["role"] == "assistant":
            out["tool_calls"] = [call(item) for item in calls]
            out["content"] = out["content"] or None
        if row["role"] == "tool":
            out["tool_call_id"] = row.get("tool_call_id") or ""
        return out

    def tool(row: dict[str, Any]) -> dict[str, Any]:
        parameters = row.get("parameters")
        parameters = orjson.loads(parameters) if isinstance(parameters, str) else parameters
        function = {"name": row["tool_name"], "description": row.get("description") or None, "parameters": parameters}
        return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}

    try:
        request = ChatRequest(model="stored", messages=[message(row) for row in messages], tools=[tool(row) for row in tools] or None)
        return prompt_messages(request)
    except (ValidationError, orjson.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"not a conversation the router would take: {error}") from None
    except ApiError as error:
        raise ValueError(error.message) from None


def _plain(message: Message) -> dict[str, str]:
    role = "system" if message.role == "developer" else message.role
    content = message.text()
    for call in message.tool_calls or []:
        try:
            arguments = orjson.loads(call.function.arguments)
        except orjson.JSONDecodeError:
            arguments = call.function.arguments  # as the client sent it; the model sees what it said
        content += assistant_call(call.function.name, arguments)["content"]
    return {"role": role, "content": content}


def tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(remaining text, tool calls in OpenAI's shape) parsed from the model's text; a call whose
    arguments are not JSON stays in the text, where the agent sees what the model wrote."""
    parsed = parse_assistant(text)
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": orjson.dumps(call.arguments).decode()},
        }
        for call in parsed.calls
        if call.arguments is not None
    ]
    if not calls:
        return text, []
    return parsed.text or None, calls


def choice(index: int, text: str, reason: str, tools: bool) -> dict[str, Any]:
    """One choice of a non-streamed completion."""
    content, calls = tool_calls(text) if tools else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"index": index, "message": message, "logprobs": None, "finish_reason": "tool_calls" if calls else reason}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(
    completion_id: str, created: int, model: str, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None
) -> bytes:
    """One server-sent event of a streamed completion."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return b"data: " + orjson.dumps(body) + b"\n\n"


def delta(index: int, fields: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": reason}


class ChoiceStream:
    """One choice's text as stream deltas. With tools, text that may turn into a tool call (a tag,
    the start of one, or a reply that opens with ``{``) is held back until the choice ends, then
    sent as ``tool_calls``, or as text if it was none."""

    def __init__(self, tools: bool) -> None:
        self.tools = tools
        self.text = ""
        self.sent = 0

    def feed(self, text: str) -> str:
        """Text of this delta that can be sent now."""
        self.text += text
        if not self.tools:
            end = len(self.text)
        elif not self.text.strip() or self.text.lstrip().startswith("{"):
            end = self.sent
        elif (tag := self.text.find(TOOL_TAG, self.sent)) >= 0:
            end = tag
        else:
            end = len(self.text) - held_back(self.text, (TOOL_TAG,))
        ready = self.text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return ready

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(text still to send, tool calls) once the choice has ended."""
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        if not self.tools:
            return rest, []
        content, calls = tool_calls(rest)
        return content or "", calls
