"""Replay of the real failures behind a gap: the first user turn of each failed trajectory labelled
LACKING, with the agent's own system prompt and tools, answered by the base and by the adapter; the
capability's own rule labeler judges each answer.

Only the first assistant turn can be reproduced without the original tool results, so a case
counts where the labeler can judge that turn (not NA for both models): e.g. a state-changing call
before any read (precondition verification), a call that fails its schema (tool call precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from trainer.environment import Instance, Message, StepResult, Tool, parse_assistant, render_system_prompt
from trainer.rollouts import Sampling, generate_rollouts


class _FirstTurn(Instance):
    """An episode that is the real trajectory's opening and ends after one assistant turn."""

    max_turns = 1

    def __init__(self, tools: Sequence[Tool], system: str, user: str) -> None:
        super().__init__(tools, 0, 1)
        self.system, self.user = system, user
        self.answer: Message | None = None

    def reset(self) -> list[Message]:
        return [{"role": "system", "content": render_system_prompt(self.system, self.tools)}, {"role": "user", "content": self.user}]

    def step(self, assistant: Message) -> StepResult:
        self.answer = assistant
        return StepResult([], True)

    def reward(self) -> float:
        return 0.0

    def solution(self) -> list[Message]:
        return []


def _trajectory(case: dict[str, Any], answer: Message, tools: Sequence[Tool]) -> Any:
    """The one-turn trajectory the capability's labeler reads."""
    from daemon.analysis.capabilities import ToolCall, ToolSpec, Trajectory, Turn

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


def replay(
    model: Any, tokenizer: Any, capability: str, cases: list[dict[str, Any]], tools: Sequence[Tool], sampling: Sampling,
    capabilities: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Base (adapter disabled) vs adapter on each case's first turn, judged by the capability's labeler
    as the daemon configured it (`capabilities`: its [capabilities] settings)."""
    from daemon.analysis.capabilities import load_registry
    from daemon.core.settings import CapabilitySettings

    registry = load_registry(CapabilitySettings.model_validate(capabilities or {}))
    if capability not in registry or not cases:
        return {"cases": 0, "reproducible": 0, "reason": "no rule labeler or no failed trajectories to replay"}
    labeler = registry[capability].labeler
    greedy = Sampling(sampling.max_new_tokens, 0.0, max_turns=1, max_length=sampling.max_length)

    def judge() -> list[tuple[str, str, str]]:
        instances = [_FirstTurn(tools, case.get("system") or "", case["user"]) for case in cases]
        generate_rollouts(model, tokenizer, instances, greedy)
        verdicts = []
        for case, instance in zip(cases, instances, strict=True):
            answer = instance.answer or {}
            judgement = labeler.label(_trajectory(case, answer, tools))
            verdicts.append((judgement.label.value, judgement.reason, _excerpt(answer)))
        return verdicts

    with model.disable_adapter():
        base = judge()
    adapter = judge()
    reproducible = [index for index in range(len(cases)) if base[index][0] != "NA" or adapter[index][0] != "NA"]
    return {
        "cases": len(cases),
        "reproducible": len(reproducible),
        "base_lacking": sum(base[index][0] == "LACKING" for index in reproducible),
        "adapter_lacking": sum(adapter[index][0] == "LACKING" for index in reproducible),
        "items": [
            {
                "trajectory_id": case["trajectory_id"],
                "base": base[index][0], "base_reason": base[index][1], "base_answer": base[index][2],
                "adapter": adapter[index][0], "adapter_reason": adapter[index][1], "adapter_answer": adapter[index][2],
            }  # fmt: skip
            for index, case in enumerate(cases)
        ],
    }


def _excerpt(answer: Message, limit: int = 300) -> str:
    """The start of an answer, as the report shows it next to the labeler's reason."""
    text = str(answer.get("content") or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"
