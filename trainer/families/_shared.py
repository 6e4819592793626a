"""What several families share: how the simulated user words values and verbs, and the episode of
calls to the target's tools that a simulated backend answers (``ToolUseInstance``), or that ends at
the agent's plain-text answer (``AnsweringInstance``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import orjson

from tracefix.trainer.environment import (
    Instance,
    Message,
    ParsedTurn,
    StepResult,
    Tool,
    ToolCall,
    parse_assistant,
    render_system_prompt,
    tool_message,
)
from tracefix.trainer.simulation import schema_error

# -- wording -----------------------------------------------------------------------------------------


def phrase(name: str) -> str:
    """How a person names a parameter: ``reservation_id`` → ``reservation id``."""
    return name.replace("_", " ").replace("-", " ").strip() or name


def spoken(value: Any) -> str:
    """A value as the user writes it; strings with spaces or punctuation are quoted so their ends are clear."""
    if isinstance(value, str):
        return f'"{value}"' if (not value or any(ch in value for ch in " ,;:\"'")) else value
    return orjson.dumps(value).decode()


def shown(value: Any) -> str:
    """A value as a message shows it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def and_join(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def singular(noun: str) -> str:
    if noun.endswith("ies") and len(noun) > 4:
        return noun[:-3] + "y"
    if noun.endswith("s") and not noun.endswith("ss") and len(noun) > 3:
        return noun[:-1]
    return noun


def plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


# The past tense of the verbs write tools start with (``cancel_reservation`` → ``cancelled``).
PAST = {
    "cancel": "cancelled", "update": "updated", "modify": "modified", "book": "booked", "create": "created",
    "delete": "deleted", "send": "sent", "transfer": "transferred", "issue": "issued", "add": "added",
    "remove": "removed",
}  # fmt: skip


# -- the episode -------------------------------------------------------------------------------------


class ToolUseInstance(Instance):
    """An episode of calls to the target's tools, answered by a simulated backend; it ends at the first
    turn without a readable call, or at the turn limit.

    Subclasses set ``instructions`` and ``user_text`` (the opening request), and implement ``_execute``
    (a call the backend accepts); ``_read``, ``_answer`` and ``_without_calls`` can be extended.
    """

    instructions: str = ""
    user_text: str = ""
    formats: bool = True  # whether the backend also checks the ``format`` keywords of the schemas

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.by_name = {tool.name: tool for tool in self.tools}
        self.turns = 0
        self.done = False

    def reset(self) -> list[Message]:
        self.entities.rewind()
        return [
            {"role": "system", "content": render_system_prompt(self.instructions, self.tools)},
            {"role": "user", "content": self.user_text},
        ]

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult([], True)
        self.turns += 1
        parsed = self._read(assistant)
        if not parsed.calls:
            return self._without_calls(parsed)
        messages = self._answer(parsed.calls)
        self.done = self.done or self.turns >= self.max_turns  # `_answer` may have ended the episode
        return StepResult(messages, self.done)

    def _read(self, assistant: Message) -> ParsedTurn:
        """The turn's calls and text; every parse error is an event."""
        parsed = parse_assistant(assistant)
        for error in parsed.errors:
            self.events.append(f"parse_error: {error}")
        return parsed

    def _without_calls(self, parsed: ParsedTurn) -> StepResult:
        """A turn without a readable call: the agent is done."""
        self.done = True
        return StepResult([], True)

    def _answer(self, calls: list[ToolCall]) -> list[Message]:
        """The tool results of one turn's calls, in order."""
        return [tool_message(call, self._tool_result(call, index)) for index, call in enumerate(calls)]

    def _tool_result(self, call: ToolCall, index: int) -> Any:
        """What the backend answers one call (`index`: its place in the turn): an error for an undeclared
        tool or arguments the tool's schema rejects (both events), otherwise what ``_execute`` returns."""
        tool = self.by_name.get(call.name)
        if tool is None:
            self.events.append(f"unknown_tool: {call.name}")
            return {"error": f"unknown tool {call.name}"}
        problem = schema_error(tool, call.arguments, self.formats)
        if problem is not None:
            self.events.append(f"schema_violation: {call.name}: {problem}")
            return {"error": f"invalid arguments for {call.name}: {problem}"}
        return self._dress(call, self._execute(call, tool, index))

    @abstractmethod
    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        """The simulated result of a call to the declared `tool` whose arguments (an object) pass its schema."""


FORMAT_REMINDER = (
    "Your tool call could not be read. Call a tool as "
    '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>, or answer in plain text.'
)


class AnsweringInstance(ToolUseInstance):
    """A tool-use episode that ends at the agent's plain-text answer (``final_text``): an unreadable call
    is answered with a format reminder, and a message that is not an object or a step after the end
    is an event."""

    final_text: str | None = None

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            self.events.append("step_after_end")
        return super().step(assistant)

    def _read(self, assistant: Message) -> ParsedTurn:
        if not isinstance(assistant, dict):
            self.events.append(f"malformed_message: {type(assistant).__name__}")
        return super()._read(assistant)

    def _without_calls(self, parsed: ParsedTurn) -> StepResult:
        if parsed.errors:
            self.done = self.turns >= self.max_turns
            return StepResult([{"role": "user", "content": FORMAT_REMINDER}], self.done)
        self.final_text = parsed.text.strip()
        if not self.final_text:
            self.events.append("empty_answer")
        self.done = True
        return StepResult([], True)
