"""The built-in capability argument_grounding: takes identifiers for tool arguments from the user or
from earlier tool results, never invents them. Its rule labeler finds the id-like arguments of each
call (by their value's shape or their key) and looks for each, as a whole token, in what came before."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tracefix.daemon.analysis.builtin_capabilities._shared import (
    DESCRIPTIONS, _ID_KEY, _ID_VALUE, _span, _turn_of, _walk,
)  # fmt: skip
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory
from tracefix.daemon.core.settings import CapabilitySettings

_DATE_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _id_values(arguments: Any) -> list[str]:
    """Argument values that identify an entity (by their shape, or by a key like `reservation_id`)."""
    found = []
    for key, value in _walk(arguments):
        if isinstance(value, int) and not isinstance(value, bool) and _ID_KEY.search(key) and value > 999:
            found.append(str(value))
        elif isinstance(value, str) and not _DATE_LIKE.match(value):
            if _ID_VALUE.match(value) or (_ID_KEY.search(key) and len(value) >= 2 and " " not in value):
                found.append(value)
    return found


@dataclass(slots=True)
class ArgumentGrounding:
    """LACKING when an id-like argument was never seen in a user turn or an earlier tool result."""

    name: str = "rules.argument_grounding"
    version: str = "2"

    def label(self, trajectory: Trajectory) -> Judgement:
        grounded_calls = 0
        for call in trajectory.tool_calls:
            ids = _id_values(call.parsed_arguments())
            if not ids:
                continue
            position = _turn_of(trajectory, call)
            seen = [
                turn.content
                for turn in trajectory.turns[:position]
                if turn.role in ("user", "tool", "system")
            ]
            seen += [earlier.result or "" for earlier in trajectory.tool_calls[: call.position]]
            haystack = "\n".join(seen)
            for value in ids:
                # As a whole token: "t4" is not grounded by "t44", "8190333" is by "gift_card_8190333".
                if value not in haystack or not re.search(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", haystack):
                    return Judgement(
                        Label.LACKING,
                        f"{call.name} argument {value!r} appears in no user turn or tool result before it",
                        _span(call),
                    )
            grounded_calls += 1
        if not grounded_calls:
            return Judgement(Label.NA, "no call takes an identifier")
        return Judgement(Label.PRESENT, f"identifiers of {grounded_calls} calls come from the context")


def argument_grounding(settings: CapabilitySettings) -> Capability:
    return Capability("argument_grounding", DESCRIPTIONS["argument_grounding"], ArgumentGrounding(), "argument_grounding", True)
