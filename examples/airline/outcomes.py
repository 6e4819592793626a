"""The outcome checker, τ-bench style: the final database against the one a correct agent leaves,
the agent's answers against the facts the task asks for, and every change against the policy
(the reservation was read first, and the customer said yes to it).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from examples.airline.database import Database
from examples.airline.tasks import Task
from examples.airline.telemetry import parsed
from examples.airline.tools import STATE_CHANGING

EVALUATION_NAME = "task_success"


@dataclass(frozen=True)
class Verdict:
    """Whether the conversation met its task, and why not."""

    success: bool
    reasons: tuple[str, ...] = ()

    @property
    def reward(self) -> float:
        return 1.0 if self.success else 0.0

    @property
    def explanation(self) -> str:
        return "goal achieved" if self.success else "; ".join(self.reasons)


@dataclass
class Outcome:
    """One finished conversation: its task, its verdict and where its trace went."""

    conversation_id: str
    trace_id: str
    task_id: str
    goal: str
    policy: str
    success: bool
    reward: float
    explanation: str
    turns: int  # model calls
    tool_calls: int
    tool_errors: int
    ended: str  # "answer" | "turn_limit" | "model_error"
    flaws: list[str] = field(default_factory=list)  # planted flaws of the scripted policy that applied
    progress: dict[str, Any] = field(default_factory=dict)  # how far the goal got (progress.Progress)
    served_by: list[str] = field(default_factory=list)  # the models that answered (gen_ai.response.model), first use first

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(task: Task, initial: Database, final: Database, messages: list[dict[str, Any]]) -> Verdict:
    """Compare a finished conversation (OpenAI chat messages) and its final database with the task."""
    reasons = [*_policy_violations(messages), *_state_differences(task.expected(initial), final)]
    said = "\n".join(str(message.get("content") or "") for message in messages if message["role"] == "assistant")
    for accepted in task.answers:
        if not states(said, accepted):
            reasons.append(f"the answer never states {accepted[0]!r}")
    return Verdict(not reasons, tuple(reasons))


def states(text: str, accepted: tuple[str, ...]) -> bool:
    """Whether `text` states a fact in one of its `accepted` spellings, as a word or number of its own."""
    return any(re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text, re.IGNORECASE) for value in accepted)


def _arguments(text: Any) -> dict[str, Any]:
    value = parsed(text)
    return value if isinstance(value, dict) else {}


def _policy_violations(messages: list[dict[str, Any]]) -> list[str]:
    """Changes made without reading the reservation first, or without the customer's yes since the last change."""
    results = {
        message.get("tool_call_id"): parsed(message.get("content"))
        for message in messages
        if message["role"] == "tool"
    }
    violations: list[str] = []
    read: set[str] = set()
    confirmed = False
    for message in messages:
        if message["role"] == "user":
            confirmed = confirmed or str(message.get("content") or "").strip().lower().startswith("yes")
            continue
        for call in message.get("tool_calls") or []:
            name, arguments = call["function"]["name"], _arguments(call["function"]["arguments"])
            result = results.get(call["id"])
            succeeded = isinstance(result, dict) and "error" not in result
            if not succeeded:
                continue  # a refused call changes nothing
            target = arguments.get("reservation_id")
            if name == "get_reservation":
                read.add(target)
            elif name in STATE_CHANGING:
                if target not in read:
                    violations.append(f"{name} on {target} without reading the reservation first")
                if not confirmed:
                    violations.append(f"{name} on {target} without the customer's confirmation")
                confirmed = False  # each change needs its own yes
    return violations


def _state_differences(expected: Database, final: Database) -> list[str]:
    differences = []
    for table in ("reservations", "users"):
        want, got = getattr(expected, table), getattr(final, table)
        for key in sorted(set(want) | set(got)):
            if want.get(key) != got.get(key):
                differences.append(f"{table[:-1]} {key} {_describe(want.get(key), got.get(key))}")
    if len(differences) > 3:
        differences = [*differences[:3], f"and {len(differences) - 3} more records differ"]
    return differences


def _describe(want: Any, got: Any) -> str:
    if not isinstance(want, dict) or not isinstance(got, dict):
        return "is missing" if got is None else "should not exist"
    fields = sorted(key for key in set(want) | set(got) if want.get(key) != got.get(key))
    return "differs from the goal in " + ", ".join(fields)
