"""How far a conversation got toward its goal: the steps of the goal's reference solution, in
order, the ones the agent reached, and the first one it missed with the capability that step
needed. This is where a goal breaks, and so what to train next.

Each goal's reference solution is the one the scripted agent follows (policies.py) and the outcome
checker enforces (outcomes.py): identify the customer, read the reservation, (search, or look up
the policy), get the customer's yes to a change, make it, and answer. A step is reached when it
happens after the previous one; the capability of a missed step is read from what the agent did
instead (built-in capability names, daemon/analysis/builtin_capabilities/):

- no tool call where one was needed, as the first thing → ``tool_call_precision``; a call to the
  step's tool whose arguments break its schema → ``tool_call_precision`` too;
- the step's tool called with identifiers that are not the customer's or the records'
  → ``argument_grounding``;
- the same call repeated after it failed, or a stop right after an error → ``error_recovery``;
- a change made before the customer and the reservation were read, or without the customer's yes
  → ``precondition_verification``;
- the chain abandoned part way (an answer, a question, or the turn limit, with steps left)
  → ``multi_step_completion``;
- a final answer that does not state the fact the customer asked for → ``structured_data_reasoning``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from examples.airline.outcomes import states
from examples.airline.tasks import GOALS, Task
from examples.airline.telemetry import parsed
from examples.airline.tools import STATE_CHANGING, TOOLS

# The reference solution of each goal, step by step.
GOAL_STEPS: dict[str, tuple[str, ...]] = {
    "cancel_reservation": ("identify", "read", "confirm", "write", "answer"),
    "change_flight": ("identify", "read", "search", "confirm", "write", "answer"),
    "fix_passenger_name": ("identify", "read", "confirm", "write", "answer"),
    "baggage_allowance": ("identify", "read", "policy", "answer"),
}
_REQUIRED = {tool["name"]: set(tool["parameters"].get("required", ())) for tool in TOOLS}


@dataclass(frozen=True)
class Progress:
    """Where one conversation got: ``reached`` of ``steps`` in order; the first missed step and the
    capability it needed (None when every step was reached)."""

    goal: str
    steps: tuple[str, ...]
    reached: int
    missed: str | None
    capability: str | None
    why: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Event:
    kind: str  # "call" (a tool call and its result), "say" (agent text) or "user"
    text: str = ""
    tool: str = ""
    arguments: Any = None
    ok: bool = False


def _events(messages: Sequence[dict[str, Any]]) -> list[_Event]:
    """The conversation as the agent's calls (with whether they succeeded), texts and the customer's replies."""
    results = {message.get("tool_call_id"): message.get("content") for message in messages if message["role"] == "tool"}
    events: list[_Event] = []
    for message in messages[1:]:  # after the system message
        if message["role"] == "user":
            events.append(_Event("user", str(message.get("content") or "")))
        elif message["role"] == "assistant":
            if message.get("content"):
                events.append(_Event("say", str(message["content"])))
            for call in message.get("tool_calls") or []:
                result = parsed(results.get(call["id"]))
                ok = isinstance(result, dict) and "error" not in result
                events.append(_Event("call", tool=call["function"]["name"], arguments=parsed(call["function"]["arguments"]), ok=ok))
    return events


def _expected(task: Task, step: str) -> tuple[str, dict[str, Any]]:
    """The tool a tool step calls and the arguments it must carry (a subset of the call's)."""
    if step == "write":
        name, arguments = task.actions[0]
        return name, dict(arguments)
    if step == "identify":
        return "get_user", {"user_id": task.user_id}
    if step == "read":
        return "get_reservation", {"reservation_id": task.reservation_id}
    if step == "search":
        return "search_flights", {"date": task.details["date"]}
    return "get_baggage_policy", {}  # the policy step: any cabin and membership the call gives


def _matches(event: _Event, tool: str, arguments: dict[str, Any]) -> bool:
    if event.kind != "call" or event.tool != tool or not event.ok or not isinstance(event.arguments, dict):
        return False
    return all(event.arguments.get(key) == value for key, value in arguments.items())


def _states_fact(task: Task, text: str) -> bool:
    return all(states(text, accepted) for accepted in task.answers)  # the checker's own matching


def progress(task: Task, messages: Sequence[dict[str, Any]]) -> Progress:
    """How far the conversation (OpenAI chat messages, system first) got toward `task`'s goal."""
    steps = GOAL_STEPS[task.goal]
    events = _events(messages)
    cursor = 0
    for reached, step in enumerate(steps):
        found = _find(task, step, events, cursor)
        if found is None:
            capability, why = _diagnose(task, step, events, cursor, reached)
            return Progress(task.goal, steps, reached, step, capability, why)
        cursor = found + 1
    return Progress(task.goal, steps, len(steps), None, None, None)


def _find(task: Task, step: str, events: list[_Event], start: int) -> int | None:
    """Where `step` happens at or after `start` (an index into `events`), or None."""
    for index in range(start, len(events)):
        event = events[index]
        if step == "confirm":
            if event.kind == "call" and event.tool in STATE_CHANGING:
                return None  # a change came first: the yes, if any, came too late
            if event.kind == "user" and event.text.strip().lower().startswith("yes"):
                return index
        elif step == "answer":
            if event.kind == "say" and (not task.answers or _states_fact(task, event.text)):
                return index
        elif _matches(event, *_expected(task, step)):
            return index
    return None


def _diagnose(task: Task, step: str, events: list[_Event], start: int, reached: int) -> tuple[str, str]:
    """The capability the missed `step` needed, from what the agent did instead after `start`."""
    after = events[start:]
    calls = [event for event in after if event.kind == "call"]
    if step == "answer":
        if any(event.kind == "say" for event in after):
            return "structured_data_reasoning", "the answer does not state what was asked"
        return "multi_step_completion", "no answer after the last step"
    if step == "confirm":
        change = next((event for event in calls if event.tool in STATE_CHANGING), None)
        if change is not None:
            return "precondition_verification", f"{change.tool} without the customer's yes"
        return "multi_step_completion", "the change was never proposed to the customer"
    tool, arguments = _expected(task, step)
    early = next((event for event in calls if event.tool in STATE_CHANGING), None)
    if early is not None and step in ("identify", "read"):
        return "precondition_verification", f"{early.tool} before the {step} step"
    own = [event for event in calls if event.tool == tool]
    if own:
        first = own[0]
        if not isinstance(first.arguments, dict) or not _REQUIRED[tool] <= set(first.arguments):
            return "tool_call_precision", f"{tool} called with arguments that break its schema"
        if len(own) > 1 and all(event.arguments == first.arguments for event in own):
            return "error_recovery", f"{tool} repeated with the same arguments after it failed"
        wrong = sorted(key for key, value in arguments.items() if first.arguments.get(key) != value)
        if wrong:
            return "argument_grounding", f"{tool} called with other {', '.join(wrong)} than the customer's or the records'"
        return "error_recovery", f"{tool} failed and was not called again correctly"
    if calls and not calls[-1].ok and calls[-1] is after[-1]:
        return "error_recovery", f"stopped after {calls[-1].tool} failed"
    if reached == 0 and not calls and any(event.kind == "say" for event in after):
        return "tool_call_precision", f"answered in text instead of calling {tool}"
    if calls:
        return "multi_step_completion", f"called {', '.join(sorted({event.tool for event in calls}))} but never {tool}"
    return "multi_step_completion", f"stopped before calling {tool}"


def step_table(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per goal: conversations, the share reaching each step of its reference solution, and the
    most common first missed steps with their capabilities. `records` are Progress.as_dict()s."""
    by_goal: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_goal.setdefault(record["goal"], []).append(record)
    rows = []
    for goal in GOALS:
        items = by_goal.get(goal)
        if not items:
            continue
        steps = GOAL_STEPS[goal]
        reaching = [sum(item["reached"] > index for item in items) for index in range(len(steps))]
        breaks = Counter((item["missed"], item["capability"]) for item in items if item["missed"])
        rows.append({
            "goal": goal, "conversations": len(items), "steps": list(steps), "reaching": reaching,
            "breaks": [{"step": step, "capability": capability, "count": count} for (step, capability), count in breaks.most_common()],
        })  # fmt: skip
    return rows
