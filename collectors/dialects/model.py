"""What a span says, once read: the shapes every dialect is folded into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


@dataclass(slots=True)
class _Span:
    """The raw span, with its arguments checked for type once."""

    name: str
    attributes: dict[str, Any]
    events: list[Any]
    status_code: Any
    status_message: str
