"""What the environment-family tests share: the fixture tool sets, playing and replaying episodes,
the malformed turns each kind of episode is fed, and a fresh interpreter to check that an instance
is the same in another process."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from tracefix.trainer.environment import Family, Instance, Message, Rollout, Tool, load_tools, rollout, solution_policy
from tracefix.trainer.schema_values import properties

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "tools"


def load_tool_set(name: str) -> list[Tool]:
    """The fixture tool set `name` (``airline``, ``retail``)."""
    return load_tools(json.loads((FIXTURES / f"{name}.json").read_text()))


TOOL_SETS = {name: load_tool_set(name) for name in ("airline", "retail")}


def cases(family: Family) -> list[tuple[str, int]]:
    """Every (tool set, difficulty level) the family is tested on."""
    return [(tool_set, difficulty) for tool_set in sorted(TOOL_SETS) for difficulty in family.levels]


def run_in_another_process(script: str) -> str:
    """The stdout of `script` run by a fresh interpreter with another hash seed (``hash()`` must not leak in)."""
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True).stdout


# -- episodes ---------------------------------------------------------------------------------------


def play(instance: Instance, messages: list[Any]) -> tuple[float, list[Message], bool]:
    """Reset, then feed every assistant message (those after the end must change nothing): the
    reward, the environment's replies and whether the episode ended."""
    instance.reset()
    replies: list[Message] = []
    done = False
    for message in messages:
        result = instance.step(message)
        assert isinstance(result.messages, list)
        replies.extend(result.messages)
        done = result.done
    return instance.reward(), replies, done


def assert_each_case_earns(family: Family, tool_set: str, seed: int, difficulty: int, cases: dict[str, tuple[list[Any], float]], *context: Any) -> None:
    """Each case's messages, played on a fresh instance of the seed, earn exactly the case's reward."""
    for case, (messages, expected) in cases.items():
        got = play(family.instance(TOOL_SETS[tool_set], seed, difficulty), messages)[0]
        assert got == expected, (tool_set, difficulty, seed, *context, case, got)


def solved(family: Family, tool_set: str, difficulty: int, seeds: range = range(200)) -> Iterator[tuple[Instance, Rollout]]:
    """The ground truth of each seed, replayed: every one scores 1.0, ends with the policy's answer and
    marks exactly the policy's messages as its own."""
    for seed in seeds:
        instance = family.instance(TOOL_SETS[tool_set], seed, difficulty)
        replay = rollout(instance, solution_policy(instance))
        assert replay.reward == 1.0 and replay.success, (seed, replay.events, replay.messages[-4:])
        assert replay.messages[-1]["role"] == "assistant"
        assert [message["role"] == "assistant" for message in replay.messages] == replay.from_policy
        yield instance, replay


def transcript(family: Family, tool_set: str, seed: int, difficulty: int) -> str:
    """The ground-truth episode as canonical JSON: every message, the reward after each step, the
    events and the hint."""
    instance = family.instance(TOOL_SETS[tool_set], seed, difficulty)
    messages = instance.reset()
    rewards = []
    for message in instance.solution():
        result = instance.step(message)
        messages.append(message)
        messages.extend(result.messages)
        rewards.append(instance.reward())
    return json.dumps({"messages": messages, "rewards": rewards, "events": instance.events, "hint": instance.hint()}, sort_keys=True)


def perturbed(tool: Tool, arguments: dict[str, Any], fixed: Collection[str]) -> dict[str, Any] | None:
    """`arguments` with the first value that is not `fixed` (nor patterned, nor an email) changed to
    another schema-valid one; None when there is no such value."""
    changed = dict(arguments)
    for key, value in changed.items():
        schema = properties(tool)[key]
        if key in fixed or "pattern" in schema:
            continue
        if schema.get("enum"):
            changed[key] = next(option for option in schema["enum"] if option != value)
        elif isinstance(value, bool):
            changed[key] = not value
        elif isinstance(value, int):
            low, high = schema.get("minimum", 1), schema.get("maximum", value + 2)
            changed[key] = next(option for option in range(int(low), int(high) + 1) if option != value)
        elif isinstance(value, float):
            changed[key] = round(value + 1.5, 2)
        elif schema.get("format") == "date":
            changed[key] = (dt.date.fromisoformat(value) + dt.timedelta(days=1)).isoformat()
        elif "@" in str(value):
            continue
        else:
            changed[key] = f"{value}-X"
        return changed
    return None


# -- malformed output, per kind of episode -------------------------------------------------------------

# Turns without a readable call: each ends an episode of one call (tool_call_precision, argument_grounding).
UNREADABLE_TURNS: list[Any] = [
    {"role": "assistant", "content": '<tool_call>{"name": "get_reservation", "arguments": {</tool_call>'},
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": {</tool_call>'},
    {"role": "assistant", "content": "<tool_call>{broken"},
    "just a bare string",
    {"role": "assistant", "content": "just a bare string"},
    {"role": "assistant", "content": '"a bare JSON string"'},
    {},
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": ["not", "text"]},
    {"role": "assistant", "content": "{not json at all}"},
    {"role": "assistant", "tool_calls": 5},
    {"role": "assistant", "tool_calls": [{"function": "get_user"}]},
]

# Broken calls and messages fed to an episode that ends at a plain-text answer (multi_step_completion,
# structured_data_reasoning): an unreadable call is answered, a bare text is the (wrong) answer.
MALFORMED_TURNS: list[Any] = [
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": {user_id: U-1}</tool_call>'},
    {"role": "assistant", "content": '<tool_call>{"name": "find_order", "arguments": {order_number: O-1}</tool_call>'},
    {"role": "assistant", "content": "<tool_call>not json at all"},
    "just a bare string, not a message",
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": None},
    {},
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": [1, 2]}</tool_call>'},
    {"role": "assistant", "content": '<tool_call>{"name": "find_order", "arguments": [1, 2]}</tool_call>'},
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": "\\"U-1\\""}</tool_call>'},
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": "{broken"}</tool_call>'},
    {"role": "assistant", "content": '<tool_call>["get_user"]</tool_call>'},
    {"role": "assistant", "content": '<tool_call>["find_order"]</tool_call>'},
    {"role": "assistant", "content": None, "tool_calls": "garbage"},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_user", "arguments": 7}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "find_order", "arguments": 7}}]},
    {"role": "assistant", "content": '{"name": "get_user", "arguments": {"user_id": 5}'},
    {"role": "assistant", "content": '{"name": "find_order", "arguments": {"order_number": 5}'},
    42,
    None,
]


def malformed_dialogue_turns(tool_name: str) -> dict[str, Any]:
    """Broken turns, by case, of a dialogue with a simulated user and backend (error_recovery,
    precondition_verification); the calls with broken arguments name `tool_name`."""
    return {
        "invalid_json_in_tag": {"role": "assistant", "content": '<tool_call>{"name": "x", "arguments": {</tool_call>'},
        "bare_string": "cancel it please",
        "bare_request": "get the reservation please",
        "empty_message": {"role": "assistant", "content": ""},
        "no_content": {"role": "assistant"},
        "arguments_not_an_object": {"role": "assistant", "content": f'<tool_call>{{"name": "{tool_name}", "arguments": [1, 2]}}</tool_call>'},
        "arguments_not_json": {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": tool_name, "arguments": "{nope"}}],
        },
        "unknown_tool": {"role": "assistant", "content": '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'},
        "content_parts": {"role": "assistant", "content": [{"type": "text", "text": "<tool_call>{oops</tool_call>"}]},
    }
