"""A stored conversation as an episode: what imitation learns from (``trainer.imitation``) and what a
targeted run rehearses of its generalist (``trainer.recipes.Rehearsal``).

A stored conversation is laid out exactly like a warm-start demonstration
(`trainer.rollouts.demonstration`): the agent's turns are the policy's tokens, everything between
them (tool results, the customer's turns) is the environment's and carries no loss. The messages
come in already rendered as the model sees them (tools in the system prompt, calls as tagged text:
`router.protocol.prompt_messages`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracefix.trainer.environment import Instance, Message, StepResult
from tracefix.trainer.rollouts import demonstration


class RecordedConversation(Instance):
    """A stored conversation replayed as an episode: its opening, then after each of the agent's
    turns the messages that followed it, until its last turn."""

    def __init__(self, messages: Sequence[Message]) -> None:
        super().__init__([], 0, 1)
        agent = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
        if not agent:
            raise ValueError("a conversation to imitate needs at least one assistant turn")
        self.opening = [dict(message) for message in messages[: agent[0]]]
        if not any(message["role"] == "user" for message in self.opening):
            raise ValueError("a conversation to imitate needs a user turn before the agent's first")
        ends = [*agent[1:], len(messages)]
        self.turns = [(dict(messages[index]), [dict(message) for message in messages[index + 1 : end]]) for index, end in zip(agent, ends)]
        self.max_turns = len(self.turns)
        self.taken = 0

    def reset(self) -> list[Message]:
        self.taken = 0
        return [dict(message) for message in self.opening]

    def step(self, assistant: Message) -> StepResult:
        following = self.turns[self.taken][1]
        self.taken += 1
        return StepResult([dict(message) for message in following], self.taken >= len(self.turns))

    def reward(self) -> float:
        return 1.0  # only successful conversations are imitated

    def solution(self) -> list[Message]:
        return [assistant for assistant, _ in self.turns]


def conversation_sequence(tokenizer: Any, messages: Sequence[Message], max_length: int) -> tuple[list[int], list[int]]:
    """(token ids, mask) of one conversation; mask 1 on the agent's own tokens. A conversation longer
    than `max_length` keeps the turns that fit."""
    return demonstration(tokenizer, RecordedConversation(messages), max_length).sequence()


def read_conversations(path: str | Path) -> tuple[list[Any], list[Any]]:
    """A generalist run's ``conversations.json``: the conversations it learned from and those it was
    scored on. ``RequestError`` when the file cannot be read as that."""
    from tracefix.trainer.jobs import RequestError

    try:
        data = json.loads(Path(path).read_text())
        return list(data["train"]), list(data["held_out"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RequestError(f"cannot read the conversations of {path}: {error}") from None
