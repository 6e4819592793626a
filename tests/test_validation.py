"""The validation gate's statistics and remedies, with policies of known skill.

The policies here replay an instance's ground-truth solution with a set probability (seeded per
seed and rollout) and otherwise do nothing: their expected reward is known, so the gate's
decisions can be checked exactly. The gate against the real base model comes with the trainer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tracefix.trainer.environment import Instance, Policy, load_tools, noop_policy, solution_policy
from tracefix.trainer.families import load_families
from tracefix.daemon.core.settings import ValidationSettings
from tracefix.trainer.validation import HintedInstance, one_at_a_time, validate

TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "airline.json").read_text()))
FAMILY = next(f for f in load_families().values() if f.capability == "precondition_verification")
SETTINGS = ValidationSettings(seeds=20, group_size=8)


def skilled(plain: dict[int, float], hinted: float = 0.0):  # type: ignore[no-untyped-def]
    """Solves with probability plain[difficulty], or `hinted` when the prompt carries the hint."""

    def policy_for(instance: Instance, index: int) -> Policy:
        chance = hinted if isinstance(instance, HintedInstance) else plain[instance.difficulty]
        if random.Random(instance.seed * 1000 + index).random() < chance:
            return solution_policy(instance)
        return noop_policy

    return one_at_a_time(policy_for)


def test_a_base_of_middling_skill_passes_without_remedies() -> None:
    report = validate(FAMILY, TOOLS, skilled({1: 0.45, 2: 0.2}), SETTINGS)
    assert report.passed and report.remedy is None and report.difficulty == 1
    attempt = report.attempts[0]
    assert 0.3 <= attempt.mean <= 0.6 and attempt.std > 0.2 and attempt.variance_groups > 0.6


def test_a_weak_base_gets_hints_in_half_the_rollouts() -> None:
    report = validate(FAMILY, TOOLS, skilled({1: 0.05, 2: 0.0}, hinted=0.9), SETTINGS)
    assert report.passed and report.hint_share == 0.5
    assert report.remedy == "hints in 50% of each group's rollouts"
    assert [a.verdict for a in report.attempts] == ["too_weak", "too_weak", "ok"]


def test_a_strong_base_gets_a_harder_difficulty() -> None:
    report = validate(FAMILY, TOOLS, skilled({1: 0.97, 2: 0.45}), SETTINGS)
    assert report.passed and report.difficulty == 2 and report.remedy == "difficulty 2"
    assert report.attempts[0].verdict == "too_strong"


def test_a_hopeless_base_fails_the_gate_with_every_attempt_recorded() -> None:
    report = validate(FAMILY, TOOLS, skilled({1: 0.0, 2: 0.0}, hinted=0.0), SETTINGS)
    assert not report.passed
    assert len(report.attempts) == 3 and all(a.verdict == "too_weak" for a in report.attempts)
    assert report.to_dict()["attempts"][0]["mean"] == 0.0


def test_hinted_instances_carry_the_hint_in_the_system_prompt() -> None:
    from tracefix.trainer.environment import Environment

    instance = Environment(FAMILY, TOOLS).instance(4)
    hint = instance.hint()
    system = HintedInstance(Environment(FAMILY, TOOLS).instance(4)).reset()[0]["content"]
    assert hint and system.endswith(f"Hint: {hint}")
    assert hint not in instance.reset()[0]["content"]


def test_an_attempt_is_played_in_one_call_with_its_hinted_share_first_in_each_group() -> None:
    calls: list[list[tuple[int, int, bool]]] = []

    def play(instances, indices):  # type: ignore[no-untyped-def]
        calls.append([(instance.seed, index, isinstance(instance, HintedInstance)) for instance, index in zip(instances, indices, strict=True)])
        return [0.0] * len(instances)

    settings = ValidationSettings(seeds=3, group_size=4, hint_shares=[0.5])
    report = validate(FAMILY, TOOLS, play, settings)
    assert [a.hint_share for a in report.attempts] == [0.0, 0.5]  # the lowest difficulty: no easier one to try
    assert len(calls) == len(report.attempts) and all(len(call) == 12 for call in calls)
    assert calls[0] == [(seed, index, False) for seed in range(3) for index in range(4)]
    assert calls[1] == [(seed, index, index < 2) for seed in range(3) for index in range(4)]


def test_a_player_that_loses_rollouts_is_an_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="3 rewards for 4 rollouts"):
        validate(FAMILY, TOOLS, lambda instances, indices: [0.0] * (len(instances) - 1), ValidationSettings(seeds=1, group_size=4))
