"""Judging a training run's replay of real failures (``trainer.replay``): each answer the base and the
adapter gave to a failed trajectory's opening is labelled by the capability's own rule labeler, as
this daemon's [capabilities] configure it.

A case counts where the labeler can judge that first turn (not NA for both models): e.g. a
state-changing call before any read (precondition verification), a call that fails its schema
(tool call precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tracefix.daemon.analysis.capabilities import ToolCall, ToolSpec, Trajectory, Turn, load_registry
from tracefix.daemon.core.settings import CapabilitySettings
from tracefix.trainer.environment import Message, Tool, parse_assistant

EXCERPT = 300  # characters of an answer shown next to the labeler's reason


def replayed_trajectory(case: dict[str, Any], answer: Message, tools: Sequence[Tool]) -> Trajectory:
    """The one-turn trajectory the capability's labeler reads: the case's user turn and the answer."""
    parsed = parse_assistant(answer)
    calls = [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": orjson.dumps(call.arguments).decode()}}
        for call in parsed.calls
    ]
    turns = [
        Turn(0, "user", case["user"], [], None, "replay-user"),
        Turn(1, "assistant", parsed.text, calls, None, "replay-assistant"),
    ]
    tool_calls = [
        ToolCall(index, call.name, call.id, None if call.arguments is None else orjson.dumps(call.arguments).decode(), None, None, 1, "replay-assistant")
        for index, call in enumerate(parsed.calls)
    ]
    specs = {tool.name: ToolSpec(tool.name, tool.description, tool.parameters) for tool in tools}
    return Trajectory(case["trajectory_id"], "replay", "unknown", turns, tool_calls, specs)


def judge(replayed: dict[str, Any], capability: str, tools: Sequence[Tool], settings: CapabilitySettings) -> dict[str, Any]:
    """The replay report: per case, the base's and the adapter's label with the labeler's reason and
    the answer's start; how many cases are reproducible and how many of those each lacks."""
    registry = load_registry(settings)
    answers = replayed.get("answers") or []
    if capability not in registry or not answers:
        return {"cases": 0, "reproducible": 0, "reason": "no rule labeler or no failed trajectories to replay"}
    labeler = registry[capability].labeler

    def verdict(item: dict[str, Any], who: str) -> tuple[str, str, str]:
        answer = item.get(who) or {}
        judgement = labeler.label(replayed_trajectory(item, answer, tools))
        return judgement.label.value, judgement.reason, _excerpt(answer)

    base = [verdict(item, "base") for item in answers]
    adapter = [verdict(item, "adapter") for item in answers]
    reproducible = [index for index in range(len(answers)) if base[index][0] != "NA" or adapter[index][0] != "NA"]
    return {
        "cases": len(answers),
        "reproducible": len(reproducible),
        "base_lacking": sum(base[index][0] == "LACKING" for index in reproducible),
        "adapter_lacking": sum(adapter[index][0] == "LACKING" for index in reproducible),
        "items": [
            {
                "trajectory_id": item["trajectory_id"],
                "base": base[index][0], "base_reason": base[index][1], "base_answer": base[index][2],
                "adapter": adapter[index][0], "adapter_reason": adapter[index][1], "adapter_answer": adapter[index][2],
            }  # fmt: skip
            for index, item in enumerate(answers)
        ],
    }


def judged(evaluation: dict[str, Any], capability: str, tools: Sequence[Tool], settings: CapabilitySettings) -> dict[str, Any]:
    """An evaluation report with its replay's answers judged (unchanged where there are none)."""
    replayed = evaluation.get("replay")
    if not isinstance(replayed, dict) or "answers" not in replayed:
        return evaluation
    return {**evaluation, "replay": judge(replayed, capability, tools, settings)}


def _excerpt(answer: Message) -> str:
    """The start of an answer, as the report shows it next to the labeler's reason."""
    text = str(answer.get("content") or "")
    return text if len(text) <= EXCERPT else text[: EXCERPT - 1] + "…"
