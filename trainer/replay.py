"""Replay of the real failures behind a gap: the first user turn of each failed trajectory labelled
LACKING, with the agent's own system prompt and tools, answered by the base and by the adapter.

Only the first assistant turn can be reproduced without the original tool results. The trainer
generates the answers; the daemon judges them with the capability's own rule labeler, as its
registry configures it (``daemon/pipeline/replay_judge.py``), so the trainer needs none of the
daemon's analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracefix.trainer.environment import Instance, Message, StepResult, Tool, render_system_prompt
from tracefix.trainer.rollouts import Sampling, generate_rollouts


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


def replay(model: Any, tokenizer: Any, cases: list[dict[str, Any]], tools: Sequence[Tool], sampling: Sampling) -> dict[str, Any]:
    """The base's (adapter disabled) and the adapter's greedy first turn on each case's opening."""
    if not cases:
        return {"cases": 0, "answers": []}
    greedy = Sampling(sampling.max_new_tokens, 0.0, max_turns=1, max_length=sampling.max_length)

    def answers() -> list[Message]:
        instances = [_FirstTurn(tools, case.get("system") or "", case["user"]) for case in cases]
        generate_rollouts(model, tokenizer, instances, greedy)
        return [instance.answer or {} for instance in instances]

    with model.disable_adapter():
        base = answers()
    adapter = answers()
    return {
        "cases": len(cases),
        "answers": [
            {"trajectory_id": case["trajectory_id"], "user": case["user"], "base": base_answer, "adapter": adapter_answer}
            for case, base_answer, adapter_answer in zip(cases, base, adapter, strict=True)
        ],
    }
