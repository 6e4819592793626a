"""The tool_call_precision family on the airline (OpenAI-shaped) and retail (flat) tool sets: a
stated instance's request states every gold value, a lookup instance's request holds some back
behind the read it supports, the ground truth always scores 1.0 and every documented partial
behaviour earns exactly its level (what every family promises is in ``test_family_contract``)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from tracefix.trainer.environment import Environment, assistant_call, assistant_text, load_tools
from tracefix.trainer.families.tool_call_precision import LOOKUP_SHARE, ToolCallPrecisionFamily, lookup_reads
from tracefix.trainer.schema_values import Values, is_write, properties, required
from tracefix.trainer.simulation import schema_error

from tracefix.trainer.families._shared import phrase

from tests.family_support import TOOL_SETS, cases, play, solved

TOOLS = TOOL_SETS
FAMILY = ToolCallPrecisionFamily()
REWARDS = FAMILY.rewards
CASES = cases(FAMILY)


def seeds_of(tool_set: str, difficulty: int, lookup: bool, count: int) -> list[int]:
    """The first `count` seeds whose instance is a lookup instance (or a stated one)."""
    found = [seed for seed in range(400) if (FAMILY.instance(TOOLS[tool_set], seed, difficulty).lookup is not None) == lookup]
    return found[:count]


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for instance, _ in solved(FAMILY, tool_set, difficulty):
        assert schema_error(instance.target, instance.gold) is None


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_a_stated_request_states_every_gold_value(tool_set: str, difficulty: int) -> None:
    for seed in seeds_of(tool_set, difficulty, False, 40):
        instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
        assert instance.kind == "stated"
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


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_a_lookup_request_states_the_reads_ids_and_holds_values_back_in_its_record(tool_set: str, difficulty: int) -> None:
    share = sum(FAMILY.instance(TOOLS[tool_set], seed, difficulty).lookup is not None for seed in range(200)) / 200
    assert abs(share - LOOKUP_SHARE) < 0.1
    for seed in seeds_of(tool_set, difficulty, True, 40):
        instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
        user = instance.reset()[1]["content"]
        assert instance.kind == "lookup" and instance.lookup.name != instance.target.name
        assert list(instance.gold) == required(instance.target)
        assert list(instance.lookup_gold) == required(instance.lookup)
        for value in instance.lookup_gold.values():
            assert value in user, (seed, value, user)
        assert instance.held and set(instance.held) <= set(instance.gold) - set(instance.lookup_gold)
        for name, value in instance.gold.items():
            if name in instance.held:
                assert instance.record[name] == value
            else:
                assert (value if isinstance(value, str) else json.dumps(value)) in user, (seed, name, user)
        # the read the request supports returns the record; the same read with another id does not
        read = instance.step(assistant_call(instance.lookup.name, instance.lookup_gold)).messages[0]
        assert json.loads(read["content"]) == instance.record
        assert all(phrase(name) in instance.hint() for name in instance.held)


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
    arguments[name] = _other_value(instance.target, name, arguments[name])
    return arguments


def _other_value(tool: Any, name: str, value: Any) -> Any:
    """Another schema-valid value for parameter `name` of `tool`."""
    schema = properties(tool)[name]
    for seed in range(50):
        other = Values(seed).value(name, schema)
        if other != value:
            return other
    raise AssertionError(f"no other value for {name}")


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_each_partial_behaviour_earns_its_documented_reward(tool_set: str, difficulty: int) -> None:
    tools = TOOLS[tool_set]
    for seed in seeds_of(tool_set, difficulty, False, 12):
        fresh = partial(FAMILY.instance, tools, seed, difficulty)
        instance = fresh()
        name, gold = instance.target.name, instance.gold
        other = next(tool.name for tool in tools if tool.name != name)
        done = assistant_text("Done.")
        assert play(fresh(), [assistant_call(name, gold), done])[0] == REWARDS["exact_call"] == 1.0
        # exactly one call: a second one (same message or next turn) caps the exact call
        assert play(fresh(), [assistant_call(name, gold), assistant_call(name, gold), done])[0] == REWARDS["exact_call_then_extra_calls"] == 0.6
        both = {"role": "assistant", "content": assistant_call(name, gold)["content"] + assistant_call(other, {})["content"]}
        assert play(fresh(), [both, done])[0] == 0.6
        # right tool, schema-valid, a value wrong
        assert schema_error(instance.target, _wrong_value(instance)) is None
        assert play(fresh(), [assistant_call(name, _wrong_value(instance)), done])[0] == REWARDS["right_tool_wrong_value"] == 0.6
        # right tool, an optional value missing (difficulty 2 asks for all of them) or an extra one
        optional = [key for key in properties(instance.target) if key not in required(instance.target)]
        if difficulty == 2 and optional:
            fewer = {key: value for key, value in gold.items() if key != optional[0]}
            assert play(fresh(), [assistant_call(name, fewer), done])[0] == 0.6
        # right tool, arguments that fail the schema or are not JSON
        assert play(fresh(), [assistant_call(name, {}), done])[0] == REWARDS["right_tool_invalid_arguments"] == 0.3
        extra = {**gold, "unexpected_field": 1}
        expected = 0.3 if instance.target.parameters.get("additionalProperties") is False else 0.6
        assert play(fresh(), [assistant_call(name, extra), done])[0] == expected
        not_json = {"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": "{{oops"}}</tool_call>'}
        assert play(fresh(), [not_json, done])[0] == 0.3
        # a well-formed call to another declared tool; an undeclared tool; no call at all
        assert play(fresh(), [assistant_call(other, {}), done])[0] == REWARDS["other_declared_tool"] == 0.1
        assert play(fresh(), [assistant_call("transfer_to_human_agents", gold), done])[0] == REWARDS["undeclared_tool"] == 0.0
        assert play(fresh(), [done])[0] == REWARDS["no_valid_call"] == 0.0
        # only the first call attempt is scored: a wrong first call is not repaired later
        assert play(fresh(), [assistant_call(other, {}), assistant_call(name, gold), done])[0] == 0.1


def test_every_read_a_lookup_request_supports_is_one_that_returns_the_record() -> None:
    """When the request states ids for two reads, the held-back values would be unreachable through one
    of them: those ids go into the record too, unless both reads take the same ids (both serve)."""
    for tool_set, tools in TOOLS.items():
        for seed in seeds_of(tool_set, 1, True, 60):
            instance = FAMILY.instance(tools, seed, 1)
            stated = {name for name in instance.gold if name not in instance.held} | set(instance.lookup_gold)
            supported = {tool.name for tool in lookup_reads(tools) if set(required(tool)) <= stated}
            assert supported <= {tool.name for tool in instance.reads} and instance.lookup in instance.reads, (tool_set, seed)
    assert any(len(FAMILY.instance(TOOLS["retail"], seed, 1).reads) > 1 for seed in seeds_of("retail", 1, True, 20))


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_each_partial_behaviour_of_a_lookup_instance_earns_its_documented_reward(tool_set: str, difficulty: int) -> None:
    for seed in seeds_of(tool_set, difficulty, True, 12):
        fresh = partial(FAMILY.instance, TOOLS[tool_set], seed, difficulty)
        instance = fresh()
        read, target = instance.lookup.name, instance.target.name
        lookup, gold = instance.lookup_gold, instance.gold
        done = assistant_text("Done.")
        assert play(fresh(), [assistant_call(read, lookup), assistant_call(target, gold), done])[0] == 1.0
        # another read taking the same ids serves as well, and so do optional arguments its schema allows
        for other in instance.reads:
            ids = {name: lookup[name] for name in required(other)}
            flags = {name: True for name, schema in properties(other).items() if schema.get("type") == "boolean"}
            reward, replies, _ = play(fresh(), [assistant_call(other.name, {**ids, **flags}), assistant_call(target, gold), done])
            assert reward == 1.0 and json.loads(replies[0]["content"]) == instance.record, (seed, other.name)
        assert play(fresh(), [assistant_call(read, lookup), assistant_call(target, gold), assistant_call(read, lookup), done])[0] == 0.6
        wrong = {**gold, instance.held[0]: _other_value(instance.target, instance.held[0], gold[instance.held[0]])}
        assert play(fresh(), [assistant_call(read, lookup), assistant_call(target, wrong), done])[0] == 0.6
        # the read, then nothing, a target call failing its schema, or a repeated read
        assert play(fresh(), [assistant_call(read, lookup), done])[0] == REWARDS["read_then_no_valid_target_call"] == 0.4
        assert play(fresh(), [assistant_call(read, lookup), assistant_call(target, {}), done])[0] == 0.4
        assert play(fresh(), [assistant_call(read, lookup), assistant_call(read, lookup), assistant_call(target, gold), done])[0] == 0.4
        # the read with another id, or with arguments its schema refuses
        key = next(iter(lookup))
        other_id = {**lookup, key: _other_value(instance.lookup, key, lookup[key])}
        assert play(fresh(), [assistant_call(read, other_id), assistant_call(target, gold), done])[0] == REWARDS["read_with_wrong_value"] == 0.2
        assert play(fresh(), [assistant_call(read, {}), done])[0] == REWARDS["read_with_invalid_arguments"] == 0.1
        # the request's tool straight away, even with every value right (it could not know them), or a guess
        assert play(fresh(), [assistant_call(target, gold), done])[0] == REWARDS["target_before_read"] == 0.1
        assert play(fresh(), [assistant_call(target, {}), done])[0] == 0.1
        assert play(fresh(), [assistant_call("transfer_to_human_agents", lookup), done])[0] == 0.0
        assert play(fresh(), [done])[0] == 0.0


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


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("arguments", ["[1, 2]", "5", '"text"', "null"])
def test_non_object_arguments_score_as_invalid(tool_set: str, arguments: str) -> None:
    seed = seeds_of(tool_set, 1, False, 1)[0]
    instance = FAMILY.instance(TOOLS[tool_set], seed, 1)
    instance.reset()
    name = instance.target.name
    result = instance.step({"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'})
    assert "error" in json.loads(result.messages[0]["content"])
    instance.step(assistant_text("ok"))
    assert instance.reward() == REWARDS["right_tool_invalid_arguments"]
    other = FAMILY.instance(TOOLS[tool_set], seed, 1)
    other.reset()
    wrong = next(tool.name for tool in TOOLS[tool_set] if tool.name != name)
    other.step({"role": "assistant", "content": f'<tool_call>{{"name": "{wrong}", "arguments": {arguments}}}</tool_call>'})
    assert other.reward() == 0.0


def test_openai_tool_calls_are_accepted() -> None:
    instance = FAMILY.instance(TOOLS["airline"], seeds_of("airline", 1, False, 1)[0], 1)
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


def test_hint_names_the_call() -> None:
    for seed in range(10):
        instance = FAMILY.instance(TOOLS["retail"], seed, 2)
        assert instance.target.name in instance.hint()


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_it_asks_for_reads_only_where_the_tool_set_has_them(tool_set: str, difficulty: int) -> None:
    # A state change asked for and rewarded at once would teach skipping the read and the confirmation.
    tools = TOOLS[tool_set]
    assert any(is_write(tool) for tool in tools)
    asked = {FAMILY.instance(tools, seed, difficulty).target.name for seed in range(200)}
    assert asked and not any(is_write(tool) for tool in tools if tool.name in asked)
    # A tool set of writes alone still gets its instances, of those writes.
    writes = [tool for tool in tools if is_write(tool) and required(tool)]
    assert {FAMILY.instance(writes, seed, difficulty).target.name for seed in range(50)} <= {tool.name for tool in writes}


def test_tools_without_required_parameters_are_refused() -> None:
    bare = load_tools([{"name": "ping", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}])
    assert FAMILY.unusable(bare)
    with pytest.raises(ValueError):
        Environment(FAMILY, bare)
