"""What several built-in capabilities share: the shape of an id (its value, its key), the words of
a tool's name that say what it does, every scalar of a JSON value, a call's or turn's span and
position, the user's confirmation (not asked, not negated) and which tools change state; and the
capabilities' descriptions, which their entry points register them with."""

from __future__ import annotations

import re
from typing import Any

import orjson

from tracefix.daemon.analysis.capabilities import ToolCall, Trajectory
from tracefix.daemon.analysis.profile import AgentProfile
from tracefix.daemon.core.settings import CapabilitySettings

# Identifier-like values: a letter-digit mix such as R-48213, ORD5521, a UUID; plain words,
# plain small numbers and dates are not ids.
_ID_VALUE = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_\-:.]{2,63}$|^[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}$")
# Words of tool names that say what a tool does, not what it is about (get_reservation: "reservation").
_GENERIC_VERBS = frozenset({"fetch", "find", "list", "lookup", "search", "show", "read", "check", "query", "update", "create", "delete", "send", "book", "cancel", "transfer", "make", "with", "from", "info", "details", "data"})
_ID_KEY = re.compile(r"(^|_)(id|ids|number|code|ref|reference)$", re.IGNORECASE)


def _span(call_or_turn: Any) -> tuple[str, ...]:
    return (call_or_turn.span_id,) if getattr(call_or_turn, "span_id", None) else ()


def _walk(value: Any, key: str = "") -> list[tuple[str, Any]]:
    """Every scalar in a JSON value with the key it sits under (list items inherit their list's key)."""
    leaves: list[tuple[str, Any]] = []
    stack = [(key, value)]
    while stack:  # iterative: nested generators cost more than the labeling itself
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((str(inner_key), inner) for inner_key, inner in value.items())
        elif isinstance(value, list):
            stack.extend((key, inner) for inner in value)
        else:
            leaves.append((key, value))
    return leaves


def _call_key(call: ToolCall) -> tuple[str, str]:
    parsed = call.parsed_arguments()
    text = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode() if parsed is not None else (call.arguments or "")
    return call.name, text


def _turn_of(trajectory: Trajectory, call: ToolCall) -> int:
    """The conversation position a call happened at (calls without a message come last)."""
    return call.message_position if call.message_position is not None else len(trajectory.turns)


# Sentences end after . ! ? or a line break; the "?" stays with its sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_NEGATED = re.compile(r"\b(?:not|don't|do not|didn't|never|no need to|can't|cannot|wouldn't|won't)\s+(?:\w+\s+){0,2}$")


def _confirms(settings: CapabilitySettings, text: str) -> bool:
    """A confirming phrase in a sentence that is no question ("How can we proceed?") and not negated."""
    for sentence in _SENTENCE_END.split(text.lower()):
        if sentence.rstrip().endswith("?"):
            continue
        for phrase in settings.confirmation_phrases:
            for match in re.finditer(rf"(?<![a-z']){re.escape(phrase)}(?![a-z])", sentence):
                if not _NEGATED.search(sentence[max(0, match.start() - 24) : match.start()]):
                    return True
    return False


def _changes_state(settings: CapabilitySettings, tool: str, profile: AgentProfile | None) -> bool:
    """Whether `tool` changes state: the agent's profile says, else [capabilities]' names and prefixes."""
    if profile is not None and profile.state_changing_tools is not None:
        return tool in profile.state_changing_tools
    return settings.changes_state(tool)


DESCRIPTIONS = {
    "tool_call_precision": "Calls only declared tools, with arguments that satisfy each tool's JSON schema.",
    "argument_grounding": "Takes identifiers for tool arguments from the user or from earlier tool results, never invents them.",
    "precondition_verification": "Before a state-changing call, reads the entity and gets the user's explicit confirmation.",
    "error_recovery": "After a tool error, changes course (fixes the call or tries another way) instead of repeating or giving up.",
    "multi_step_completion": "Carries a chain of dependent tool calls through to the final step and answer, without looping.",
    "structured_data_reasoning": "States and writes values that agree with the JSON records the tools returned.",
}
