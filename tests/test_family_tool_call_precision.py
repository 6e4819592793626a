"""The tool_call_precision family on the airline (OpenAI-shaped) and retail (flat) tool sets: the
ground truth always scores 1.0, every documented partial behaviour earns exactly its level, weak
policies stay low, malformed output never raises, and instances are byte-identical across processes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainer.environment import (
    Environment,
    Instance,
    assistant_call,
    assistant_text,
    load_tools,
    noop_policy,
    random_policy,
    rollout,
    solution_policy,
)
from trainer.families.tool_call_precision import ToolCallPrecisionFamily
from trainer.simulation import schema_error
from trainer.world import Values, properties, required

from tests.family_support import TOOL_SETS, run_in_another_process

TOOLS = TOOL_SETS
FAMILY = ToolCallPrecisionFamily()
REWARDS = FAMILY.rewards
CASES = [(tool_set, difficulty) for tool_set in sorted(TOOLS) for difficulty in FAMILY.levels]


def play(instance: Instance, messages: list[Any]) -> float:
    """Reset, then feed the assistant messages until the episode ends; the episode's reward."""
    instance.reset()
    for message in messages:
        result = instance.step(message)
        assert isinstance(result.messages, list)
        if result.done:
            break
    return instance.reward()


def transcript(tool_set: str, seed: int, difficulty: int) -> str:
    instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
    messages = instance.reset()
    for message in instance.solution():
        result = instance.step(message)
        messages.append(message)
        messages.extend(result.messages)
        if result.done:
            break
    return json.dumps({"messages": messages, "reward": instance.reward(), "hint": instance.hint()}, sort_keys=True)


def test_family_declares_its_capability_and_levels() -> None:
    assert FAMILY.name == FAMILY.capability == "tool_call_precision"
    assert FAMILY.levels == (1, 2)
    assert max(REWARDS.values()) == 1.0 and min(REWARDS.values()) == 0.0
    for level in set(REWARDS.values()):
        assert str(level) in FAMILY.__doc__


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for seed in range(200):
        instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
        assert schema_error(instance.target, instance.gold) is None
        replay = rollout(instance, solution_policy(instance))
        assert replay.reward == 1.0, (seed, replay.messages, replay.events)
        assert replay.success and replay.messages[-1]["role"] == "assistant"
        assert [message["role"] == "assistant" for message in replay.messages] == replay.from_policy


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_the_request_states_every_gold_value(tool_set: str, difficulty: int) -> None:
    for seed in range(40):
        instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
        user = instance.reset()[1]["content"]
        for value in instance.gold.values():
            shown = value if isinstance(value, str) else json.dumps(value)
            assert shown in user, (seed, value, user)
        if difficulty == 1:
            assert list(instance.gold) == required(instance.target)
        else:
            assert list(instance.gold) == list(properties(instance.target))
            if instance.distractor is not None:
                name, value = instance.distractor
                assert value != instance.gold[name] and str(value) in user


def test_difficulty_two_adds_distractors() -> None:
    with_distractor = sum(FAMILY.instance(TOOLS["airline"], seed, 2).distractor is not None for seed in range(50))
    assert with_distractor >= 40
    assert all(FAMILY.instance(TOOLS["airline"], seed, 1).distractor is None for seed in range(20))


def _wrong_value(instance: Any) -> dict[str, Any]:
    """Gold arguments with one value replaced by another schema-valid one (the distractor if any)."""
    arguments = dict(instance.gold)
    if instance.distractor is not None:
        name, value = instance.distractor
        arguments[name] = value
        return arguments
    name = next(key for key, value in arguments.items() if not isinstance(value, bool))
    schema = properties(instance.target)[name]
    for seed in range(50):
        value = Values(seed).value(name, schema)
        if value != arguments[name]:
            arguments[name] = value
            return arguments
    raise AssertionError(f"no other value for {name}")


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_each_partial_behaviour_earns_its_documented_reward(tool_set: str, difficulty: int) -> None:
    tools = TOOLS[tool_set]
    for seed in range(12):
        def fresh() -> Any:
            return FAMILY.instance(tools, seed, difficulty)

        instance = fresh()
        name, gold = instance.target.name, instance.gold
        other = next(tool.name for tool in tools if tool.name != name)
        done = assistant_text("Done.")
        assert play(fresh(), [assistant_call(name, gold), done]) == REWARDS["exact_call"] == 1.0
        # exactly one call: a second one (same message or next turn) caps the exact call
        assert play(fresh(), [assistant_call(name, gold), assistant_call(name, gold), done]) == REWARDS["exact_call_then_extra_calls"] == 0.6
        both = {"role": "assistant", "content": assistant_call(name, gold)["content"] + assistant_call(other, {})["content"]}
        assert play(fresh(), [both, done]) == 0.6
        # right tool, schema-valid, a value wrong
        assert schema_error(instance.target, _wrong_value(instance)) is None
        assert play(fresh(), [assistant_call(name, _wrong_value(instance)), done]) == REWARDS["right_tool_wrong_value"] == 0.6
        # right tool, an optional value missing (difficulty 2 asks for all of them) or an extra one
        optional = [key for key in properties(instance.target) if key not in required(instance.target)]
        if difficulty == 2 and optional:
            fewer = {key: value for key, value in gold.items() if key != optional[0]}
            assert play(fresh(), [assistant_call(name, fewer), done]) == 0.6
        # right tool, arguments that fail the schema or are not JSON
        assert play(fresh(), [assistant_call(name, {}), done]) == REWARDS["right_tool_invalid_arguments"] == 0.3
        extra = {**gold, "unexpected_field": 1}
        expected = 0.3 if instance.target.parameters.get("additionalProperties") is False else 0.6
        assert play(fresh(), [assistant_call(name, extra), done]) == expected
        not_json = {"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": "{{oops"}}</tool_call>'}
        assert play(fresh(), [not_json, done]) == 0.3
        # a well-formed call to another declared tool; an undeclared tool; no call at all
        assert play(fresh(), [assistant_call(other, {}), done]) == REWARDS["other_declared_tool"] == 0.1
        assert play(fresh(), [assistant_call("transfer_to_human_agents", gold), done]) == REWARDS["undeclared_tool"] == 0.0
        assert play(fresh(), [done]) == REWARDS["no_valid_call"] == 0.0
        # only the first call attempt is scored: a wrong first call is not repaired later
        assert play(fresh(), [assistant_call(other, {}), assistant_call(name, gold), done]) == 0.1


def test_results_and_episode_end() -> None:
    instance = FAMILY.instance(TOOLS["airline"], 4, 1)
    instance.reset()
    first = instance.step(assistant_call(instance.target.name, instance.gold))
    assert not first.done and len(first.messages) == 1
    reply = first.messages[0]
    assert reply["role"] == "tool" and reply["name"] == instance.target.name
    assert isinstance(json.loads(reply["content"]), dict) and "error" not in json.loads(reply["content"])
    last = instance.step(assistant_text("All set."))
    assert last.done and last.messages == []
    unknown = FAMILY.instance(TOOLS["airline"], 4, 1)
    unknown.reset()
    result = unknown.step(assistant_call("nope", {}))
    assert json.loads(result.messages[0]["content"]) == {"error": "unknown tool nope"}
    assert any(event.startswith("unknown_tool") for event in unknown.events)


def test_turn_limit_ends_the_episode() -> None:
    instance = FAMILY.instance(TOOLS["retail"], 1, 1)
    instance.reset()
    results = [instance.step(assistant_call(instance.target.name, instance.gold)) for _ in range(instance.max_turns)]
    assert [result.done for result in results] == [False] * (instance.max_turns - 1) + [True]
    assert instance.reward() == 0.6


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
def test_weak_policies_stay_low(tool_set: str) -> None:
    environment = Environment(FAMILY, TOOLS[tool_set])
    noop = [rollout(environment.instance(seed), noop_policy).reward for seed in range(50)]
    rand = [rollout(environment.instance(seed), random_policy(seed)).reward for seed in range(50)]
    assert sum(noop) / 50 < 0.3 and sum(rand) / 50 < 0.3
    assert max(noop) == 0.0


MALFORMED = [
    {"role": "assistant", "content": '<tool_call>{"name": "get_reservation", "arguments": {</tool_call>'},
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


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("message", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_output_scores_low_without_raising(tool_set: str, message: Any) -> None:
    instance = FAMILY.instance(TOOLS[tool_set], 9, 2)
    instance.reset()
    result = instance.step(message)
    assert result.done and instance.reward() == 0.0
    if isinstance(message, dict) and "<tool_call>" in str(message.get("content")):
        assert any(event.startswith("parse_error:") for event in instance.events)


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("arguments", ["[1, 2]", "5", '"text"', "null"])
def test_non_object_arguments_score_as_invalid(tool_set: str, arguments: str) -> None:
    instance = FAMILY.instance(TOOLS[tool_set], 2, 1)
    instance.reset()
    name = instance.target.name
    result = instance.step({"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'})
    assert "error" in json.loads(result.messages[0]["content"])
    instance.step(assistant_text("ok"))
    assert instance.reward() == REWARDS["right_tool_invalid_arguments"]
    other = FAMILY.instance(TOOLS[tool_set], 2, 1)
    other.reset()
    wrong = next(tool.name for tool in TOOLS[tool_set] if tool.name != name)
    other.step({"role": "assistant", "content": f'<tool_call>{{"name": "{wrong}", "arguments": {arguments}}}</tool_call>'})
    assert other.reward() == 0.0


def test_openai_tool_calls_are_accepted() -> None:
    instance = FAMILY.instance(TOOLS["airline"], 11, 1)
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "abc", "type": "function", "function": {"name": instance.target.name, "arguments": json.dumps(instance.gold)}}],
    }
    instance.reset()
    result = instance.step(message)
    assert result.messages[0]["tool_call_id"] == "abc"
    instance.step(assistant_text("done"))
    assert instance.reward() == 1.0


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
def test_system_prompt_lists_exactly_the_target_tools(tool_set: str) -> None:
    other = "retail" if tool_set == "airline" else "airline"
    for difficulty in FAMILY.levels:
        opening = FAMILY.instance(TOOLS[tool_set], 3, difficulty).reset()
        assert [message["role"] for message in opening] == ["system", "user"]
        system = opening[0]["content"]
        for tool in TOOLS[tool_set]:
            assert json.dumps(tool.to_openai()["function"], separators=(",", ":")) in system
        assert not any(f'"name":"{tool.name}"' in system for tool in TOOLS[other])
        listing = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        assert [json.loads(line)["name"] for line in listing] == [tool.name for tool in TOOLS[tool_set]]
        assert [json.loads(line)["parameters"] for line in listing] == [tool.parameters for tool in TOOLS[tool_set]]


def test_hint_is_one_line_naming_the_call() -> None:
    for seed in range(10):
        instance = FAMILY.instance(TOOLS["retail"], seed, 2)
        hint = instance.hint()
        assert "\n" not in hint and instance.target.name in hint


def test_unusable_tool_sets_are_refused() -> None:
    bare = load_tools([{"name": "ping", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}])
    assert FAMILY.unusable(bare) and FAMILY.unusable([])
    assert FAMILY.unusable(TOOLS["airline"]) is None and FAMILY.unusable(TOOLS["retail"]) is None
    with pytest.raises(ValueError):
        Environment(FAMILY, bare)


def test_same_seed_same_instance_and_different_seeds_differ() -> None:
    assert transcript("airline", 5, 2) == transcript("airline", 5, 2)
    assert len({transcript("retail", seed, 1) for seed in range(10)}) == 10


def test_transcript_is_identical_in_another_process() -> None:
    keys = [(tool_set, seed, difficulty) for tool_set in sorted(TOOLS) for seed in (0, 7, 123) for difficulty in (1, 2)]
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); "
        "from test_family_tool_call_precision import transcript; "
        f"print(json.dumps([transcript(*key) for key in {keys!r}]))"
    )
    assert json.loads(run_in_another_process(code)) == [transcript(*key) for key in keys]
