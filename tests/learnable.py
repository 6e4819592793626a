"""A trivially learnable environment for trainer tests: one turn, a short prompt, reward 1 when the
reply contains the letter "e". A tiny random model (built with a large initializer range, so its
next-token distribution is peaked rather than uniform) earns it about half the time with one-token
replies: groups show variance from the first step, and GRPO has something to climb."""

from __future__ import annotations

from collections.abc import Sequence

from tracefix.trainer.environment import Family, Instance, Message, StepResult, Tool, assistant_text


class LetterInstance(Instance):
    max_turns = 1

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.reply: str | None = None

    def reset(self) -> list[Message]:
        self.reply = None
        return [{"role": "system", "content": "Reply."}, {"role": "user", "content": f"Go {self.seed % 7}."}]

    def step(self, assistant: Message) -> StepResult:
        self.reply = assistant.get("content") or ""
        return StepResult([{"role": "user", "content": "Thanks."}], True)

    def reward(self) -> float:
        return float("e" in (self.reply or "").lower())

    def solution(self) -> list[Message]:
        return [assistant_text("e")]

    def hint(self) -> str:
        return "Use the letter e."


class LetterFamily(Family):
    name = capability = "letter_e"
    rewards = {"the reply contains the letter e": 1.0}

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int) -> Instance:
        return LetterInstance(tools, seed, difficulty)
