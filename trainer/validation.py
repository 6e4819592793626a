"""The paper's validation gate: roll out the base policy in seeded groups and accept an environment
only when it can teach — mean reward 0.3–0.6, reward std > 0.2, > 60 % of groups with variance.

When the base is too weak (typical for a 135M model) the remedies are tried in order: hints in
25 %, then 50 % of each group's rollouts (the hint text is reported so the trainer strips it
before the gradient step), then an easier difficulty. When it is too strong, a harder difficulty.
What was needed is recorded in the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tracefix.daemon.core.settings import ValidationSettings
from tracefix.trainer.environment import Environment, Family, Instance, Message, Policy, Tool, rollout

# A policy for one rollout: (instance, index of the rollout within its group) -> policy.
PolicyFactory = Callable[[Instance, int], Policy]
# Plays an attempt's rollouts, all at once if it can: the instances (a hinted one wrapped in
# HintedInstance) and each one's index within its group -> each one's reward, in order.
Player = Callable[[Sequence[Instance], Sequence[int]], list[float]]


def one_at_a_time(policy_for: PolicyFactory) -> Player:
    """A player that rolls out each instance alone with its own policy (a scripted one, say)."""

    def play(instances: Sequence[Instance], indices: Sequence[int]) -> list[float]:
        return [rollout(instance, policy_for(instance, index)).reward for instance, index in zip(instances, indices, strict=True)]

    return play


@dataclass(slots=True)
class Attempt:
    difficulty: int
    hint_share: float
    mean: float
    std: float
    variance_groups: float
    verdict: str  # "ok" | "too_weak" | "too_strong" | "no_variance"


@dataclass(slots=True)
class ValidationReport:
    passed: bool
    difficulty: int
    hint_share: float
    remedy: str | None
    attempts: list[Attempt] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "attempts": [asdict(attempt) for attempt in self.attempts]}


class HintedInstance(Instance):
    """An instance whose system prompt carries its hint; rollouts from it are marked hinted."""

    def __init__(self, inner: Instance) -> None:  # noqa: D107 - wraps, does not build a world
        self.inner = inner
        self.tools, self.seed, self.difficulty = inner.tools, inner.seed, inner.difficulty
        self.random, self.events, self.max_turns = inner.random, inner.events, inner.max_turns

    def reset(self) -> list[Message]:
        messages = self.inner.reset()
        hint = self.inner.hint()
        if hint and messages and messages[0].get("role") == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\nHint: {hint}"}
        return messages

    def step(self, assistant: Message):  # type: ignore[no-untyped-def]
        return self.inner.step(assistant)

    def reward(self) -> float:
        return self.inner.reward()

    def solution(self) -> list[Message]:
        return self.inner.solution()

    def hint(self) -> str | None:
        return self.inner.hint()


def measure(environment: Environment, play: Player, settings: ValidationSettings, hint_share: float) -> Attempt:
    """Roll out `seeds` groups of `group_size` (one call of ``play``); the first `hint_share` of
    each group is hinted."""
    hinted = round(hint_share * settings.group_size)
    instances: list[Instance] = []
    indices = list(range(settings.group_size)) * settings.seeds
    for seed in range(settings.seeds):
        for index in range(settings.group_size):
            instance = environment.instance(seed)
            instances.append(HintedInstance(instance) if index < hinted else instance)
    rewards = play(instances, indices)
    if len(rewards) != len(instances):
        raise ValueError(f"the player returned {len(rewards)} rewards for {len(instances)} rollouts")
    groups = [rewards[start : start + settings.group_size] for start in range(0, len(rewards), settings.group_size)]
    with_variance = sum(max(group) > min(group) for group in groups)
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    share = with_variance / settings.seeds
    if mean < settings.mean_low:
        verdict = "too_weak"
    elif mean > settings.mean_high:
        verdict = "too_strong"
    elif std <= settings.min_std or share <= settings.min_variance_groups:
        verdict = "no_variance"
    else:
        verdict = "ok"
    return Attempt(environment.difficulty, hint_share, round(mean, 4), round(std, 4), round(share, 4), verdict)


def validate(
    family: Family,
    tools: Sequence[Tool],
    play: Player,
    settings: ValidationSettings = ValidationSettings(),
    difficulty: int | None = None,
) -> ValidationReport:
    """Find the first (difficulty, hint share) at which the base policy's rewards can teach."""
    levels = list(family.levels)
    level = difficulty if difficulty is not None else levels[0]
    attempts: list[Attempt] = []
    tried: set[int] = set()
    while level not in tried:
        tried.add(level)
        environment = Environment(family, list(tools), level)
        for share in (0.0, *settings.hint_shares):
            attempt = measure(environment, play, settings, share)
            attempts.append(attempt)
            if attempt.verdict == "ok":
                remedy = None
                if share:
                    remedy = f"hints in {share:.0%} of each group's rollouts"
                if level != (difficulty if difficulty is not None else levels[0]):
                    remedy = ", ".join(filter(None, [f"difficulty {level}", remedy]))
                return ValidationReport(True, level, share, remedy, attempts)
            if attempt.verdict == "too_strong":
                break  # hints only make it easier
        position = levels.index(level)
        if attempts[-1].verdict == "too_strong" and position + 1 < len(levels):
            level = levels[position + 1]
        elif attempts[-1].verdict != "too_strong" and position > 0:
            level = levels[position - 1]
    return ValidationReport(False, level, 0.0, None, attempts)
