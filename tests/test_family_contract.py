"""What every environment family promises, on the airline (OpenAI-shaped) and retail (flat) tool
sets: it is named and documented as its capability, an instance is the same for the same seed and in
another process, weak policies stay low, the system prompt lists exactly the target's tools, the hint
is one line; and, per kind of episode (one call, a final answer, a dialogue), malformed output
scores low without raising."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tracefix.trainer.environment import (
    Environment,
    Family,
    noop_policy,
    parse_assistant,
    random_policy,
    render_system_prompt,
    rollout,
)
from tracefix.trainer.families.argument_grounding import ArgumentGroundingFamily
from tracefix.trainer.families.error_recovery import ErrorRecoveryFamily
from tracefix.trainer.families.multi_step_completion import MultiStepCompletionFamily
from tracefix.trainer.families.precondition_verification import PreconditionVerificationFamily
from tracefix.trainer.families.structured_data_reasoning import StructuredDataReasoningFamily
from tracefix.trainer.families.tool_call_precision import ToolCallPrecisionFamily

from tests.family_support import (
    MALFORMED_TURNS,
    TOOL_SETS,
    UNREADABLE_TURNS,
    malformed_dialogue_turns,
    play,
    run_in_another_process,
    transcript,
)

ONE_CALL = [ToolCallPrecisionFamily(), ArgumentGroundingFamily()]
ANSWERING = [MultiStepCompletionFamily(), StructuredDataReasoningFamily()]
DIALOGUES = [ErrorRecoveryFamily(), PreconditionVerificationFamily()]
FAMILIES = ONE_CALL + ANSWERING + DIALOGUES
EVERY_CASE = [(family, tool_set, difficulty) for family in FAMILIES for tool_set in sorted(TOOL_SETS) for difficulty in family.levels]


def named(value: Any) -> str:
    """Test ids: a family by its name."""
    return value.name if isinstance(value, Family) else str(value)


@pytest.mark.parametrize("family", FAMILIES, ids=named)
def test_family_is_named_and_documented_as_its_capability(family: Family) -> None:
    assert family.name == family.capability == type(family).__module__.rsplit(".", 1)[1]
    assert family.levels == (1, 2)
    assert max(family.rewards.values()) == 1.0 and min(family.rewards.values()) == 0.0
    for value in family.rewards.values():
        assert str(value) in (type(family).__doc__ or ""), value
    assert Environment(family, TOOL_SETS["airline"], 2).spec()["rewards"] == family.rewards


@pytest.mark.parametrize("family", DIALOGUES, ids=named)
def test_dialogue_families_list_every_reward_level_by_key(family: Family) -> None:
    for key, value in family.rewards.items():
        assert re.search(rf"{value}\s+``{key}``", type(family).__doc__ or ""), key


@pytest.mark.parametrize("family", FAMILIES, ids=named)
def test_fixture_tool_sets_are_usable_and_no_tools_are_refused(family: Family) -> None:
    assert family.unusable(TOOL_SETS["airline"]) is None and family.unusable(TOOL_SETS["retail"]) is None
    assert isinstance(family.unusable([]), str) and family.unusable([])
    with pytest.raises(ValueError):
        family.instance([], 1)
    with pytest.raises(ValueError):
        Environment(family, [])


@pytest.mark.parametrize("family", FAMILIES, ids=named)
def test_same_seed_same_instance_and_different_seeds_differ(family: Family) -> None:
    for tool_set in sorted(TOOL_SETS):
        assert transcript(family, tool_set, 5, 2) == transcript(family, tool_set, 5, 2)
        assert len({transcript(family, tool_set, seed, 1) for seed in range(10)}) == 10


@pytest.mark.parametrize("family", FAMILIES, ids=named)
def test_transcript_is_identical_in_another_process(family: Family) -> None:
    keys = [(tool_set, seed, difficulty) for tool_set in sorted(TOOL_SETS) for seed in (0, 1, 2, 7, 17, 123) for difficulty in family.levels]
    script = (
        "import json\n"
        "from tests.family_support import transcript\n"
        f"from {type(family).__module__} import {type(family).__name__}\n"
        f"print(json.dumps([transcript({type(family).__name__}(), *key) for key in {keys!r}]))\n"
    )
    assert json.loads(run_in_another_process(script)) == [transcript(family, *key) for key in keys]


@pytest.mark.parametrize(("family", "tool_set", "difficulty"), EVERY_CASE, ids=named)
def test_noop_and_random_policies_stay_low(family: Family, tool_set: str, difficulty: int) -> None:
    environment = Environment(family, TOOL_SETS[tool_set], difficulty)
    noop = [rollout(environment.instance(seed), noop_policy).reward for seed in range(50)]
    chance = [rollout(environment.instance(seed), random_policy(seed)).reward for seed in range(50)]
    assert sum(noop) / 50 < 0.3 and sum(chance) / 50 < 0.3
    assert max(noop) == 0.0


@pytest.mark.parametrize(("family", "tool_set", "difficulty"), EVERY_CASE, ids=named)
def test_system_prompt_lists_exactly_the_targets_tools(family: Family, tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    other = TOOL_SETS["retail" if tool_set == "airline" else "airline"]
    for seed in range(5):
        instance = family.instance(tools, seed, difficulty)
        opening = instance.reset()
        assert [message["role"] for message in opening] == ["system", "user"]
        system = opening[0]["content"]
        assert system == render_system_prompt(instance.instructions, tools)
        for tool in tools:
            assert json.dumps(tool.to_openai()["function"], separators=(",", ":")) in system
        listing = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        assert [json.loads(line) for line in listing] == [tool.to_openai()["function"] for tool in tools]
        assert not any(tool.name in system for tool in other)


@pytest.mark.parametrize(("family", "tool_set", "difficulty"), EVERY_CASE, ids=named)
def test_hint_is_one_line(family: Family, tool_set: str, difficulty: int) -> None:
    for seed in range(10):
        hint = family.instance(TOOL_SETS[tool_set], seed, difficulty).hint()
        assert isinstance(hint, str) and hint and "\n" not in hint


# -- malformed output, per kind of episode -------------------------------------------------------------


@pytest.mark.parametrize("message", UNREADABLE_TURNS, ids=range(len(UNREADABLE_TURNS)))
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
@pytest.mark.parametrize("family", ONE_CALL, ids=named)
def test_an_unreadable_turn_ends_a_one_call_episode_at_zero(family: Family, tool_set: str, message: Any) -> None:
    instance = family.instance(TOOL_SETS[tool_set], 9, 2)
    instance.reset()
    result = instance.step(message)
    assert result.done and instance.reward() == 0.0
    if isinstance(message, dict) and "<tool_call>" in str(message.get("content")):
        assert any(event.startswith("parse_error:") for event in instance.events)


# tool_call_precision's seed 3 is a stated instance (a repeated exact call), seed 1 a lookup one (a repeated read)
@pytest.mark.parametrize(
    ("family", "tool_set", "seed", "reward"),
    [(ONE_CALL[0], "retail", 3, 0.6), (ONE_CALL[0], "retail", 1, 0.4), (ONE_CALL[1], "airline", 1, 0.25)], ids=named,
)  # fmt: skip
def test_the_turn_limit_ends_a_one_call_episode(family: Family, tool_set: str, seed: int, reward: float) -> None:
    instance = family.instance(TOOL_SETS[tool_set], seed, 1)
    first_call = instance.solution()[0]
    instance.reset()
    results = [instance.step(first_call) for _ in range(instance.max_turns)]
    assert [result.done for result in results] == [False] * (instance.max_turns - 1) + [True]
    assert instance.reward() == reward  # the first call repeated until the limit


@pytest.mark.parametrize("message", MALFORMED_TURNS, ids=range(len(MALFORMED_TURNS)))
@pytest.mark.parametrize("difficulty", (1, 2))
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
@pytest.mark.parametrize(("family", "seed", "ceiling"), [(ANSWERING[0], 11, 0.2), (ANSWERING[1], 13, 0.0)], ids=named)
def test_malformed_turns_before_an_answer_score_low_without_exceptions(
    family: Family, seed: int, ceiling: float, tool_set: str, difficulty: int, message: Any
) -> None:
    instance = family.instance(TOOL_SETS[tool_set], seed, difficulty)
    episode = rollout(instance, lambda messages: message)
    assert episode.reward <= ceiling and not episode.success
    if isinstance(message, dict) and message.get("content"):
        assert instance.events  # the parse problem is observable
    # a malformed turn does not derail a policy that then does the right thing
    instance = family.instance(TOOL_SETS[tool_set], seed, difficulty)
    reward, _, _ = play(instance, [message, *instance.solution()])
    assert reward in (1.0, 0.0)  # a bare text ends the episode (0.0); a broken call is just answered


@pytest.mark.parametrize("case", sorted(malformed_dialogue_turns("any_tool")))
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
@pytest.mark.parametrize("family", DIALOGUES, ids=named)
def test_malformed_dialogue_turns_score_low_without_exceptions(family: Family, tool_set: str, case: str) -> None:
    tools = TOOL_SETS[tool_set]
    instance = family.instance(tools, 8, 2)
    first_tool = parse_assistant(instance.solution()[0]).calls[0].name  # the tool the ground truth calls first
    message = malformed_dialogue_turns(first_tool)[case]
    instance.reset()
    answer = instance.step(message)
    assert answer.messages and instance.events
    for reply in answer.messages:
        if reply["role"] == "tool":
            assert set(json.loads(reply["content"])) >= {"error", "code"}
    assert instance.reward() < 0.3
    result = rollout(family.instance(tools, 8, 2), lambda messages: message)
    assert result.reward < 0.3 and result.events
