"""The multi_step_completion environment family: solvable, scored as documented, robust, deterministic
(what every family promises is in ``test_family_contract``)."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from tracefix.trainer.environment import Message, assistant_call, assistant_text, load_tools, rollout, solution_policy
from tracefix.trainer.families.multi_step_completion import SYSTEM_INSTRUCTIONS, MultiStepCompletionFamily, MultiStepCompletionInstance
from tracefix.trainer.schema_values import Values, is_write, key_parameters, properties, required

from tests.family_support import TOOL_SETS, cases, play, solved, transcript

TOOLSETS = TOOL_SETS
FAMILY = MultiStepCompletionFamily()
PER_STEP = {1: 0.4, 2: 0.2667}
CASES = cases(FAMILY)


def make(toolset: str, seed: int, difficulty: int) -> MultiStepCompletionInstance:
    return FAMILY.instance(TOOLSETS[toolset], seed, difficulty)


def chain_calls(instance: MultiStepCompletionInstance) -> list[Message]:
    return instance.solution()[:-1]


def other_value(tool, name: str, value: Any) -> Any:
    """A different schema-valid value for a non-key argument."""
    schema = properties(tool)[name]
    if schema.get("enum"):
        return next(option for option in schema["enum"] if option != value)
    if schema.get("type") == "integer":
        low = schema.get("minimum", value - 1)
        return value - 1 if value - 1 >= low else value + 1
    if schema.get("type") == "number":
        return round(value + 1.0, 2)
    if schema.get("format") == "date":
        day = int(value[-2:])
        return value[:-2] + f"{day % 28 + 1:02d}"
    return value + "x"


# -- the ground truth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_solution_scores_one_on_200_seeds(toolset: str, difficulty: int) -> None:
    for instance, episode in solved(FAMILY, toolset, difficulty):
        assert len(instance.steps) == (3 if difficulty == 2 else 2)
        assert episode.events == []


def test_the_ground_truth_reports_the_confirmation_code() -> None:
    assert re.search(r"CNF-\d{6}", transcript(FAMILY, "airline", 0, 1))


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_chain_is_dependent_and_ends_with_a_write(toolset: str, difficulty: int) -> None:
    for seed in range(30):
        instance = make(toolset, seed, difficulty)
        messages = instance.reset()
        user = messages[1]["content"]
        assert is_write(instance.steps[-1].link.tool)
        for earlier, later in zip(instance.steps, instance.steps[1:]):
            fresh_keys = [name for name in later.link.fresh if name in key_parameters(later.link.tool)]
            assert fresh_keys, (seed, later.link)
            for name in fresh_keys:
                value = later.arguments[name]
                assert earlier.result[name] == value  # revealed by the previous result...
                assert str(value) not in user  # ...and never by the user
        for name, value in instance.steps[0].arguments.items():
            assert str(value) in user


def test_each_step_of_a_3_step_chain_earns_a_third_of_the_chain_credit() -> None:
    assert FAMILY.rewards["each_step_of_3_step_chain"] == round(0.8 / 3, 4)


# -- documented partial behaviours --------------------------------------------------------------------


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_stopping_early_keeps_partial_credit(toolset: str, difficulty: int) -> None:
    for seed in range(10):
        instance = make(toolset, seed, difficulty)
        calls = chain_calls(instance)
        for done_steps in range(len(calls) + 1):
            instance = make(toolset, seed, difficulty)
            reward, _, done = play(instance, calls[:done_steps] + [assistant_text("I think that's all for now.")])
            assert done
            assert reward == round(done_steps * 0.8 / len(calls), 4)
            assert reward == {0: 0.0, 1: PER_STEP[difficulty], 2: (0.8 if difficulty == 1 else 0.5333), 3: 0.8}[done_steps]


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_every_step_but_no_outcome_in_the_answer(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 3, difficulty)
    calls = chain_calls(instance)
    assert play(instance, calls)[0] == 0.8  # turn limit / no answer yet
    instance = make(toolset, 3, difficulty)
    assert play(instance, calls + [assistant_text("Your request has been completed.")])[0] == 0.8
    instance = make(toolset, 3, difficulty)
    code = instance.outcome
    assert play(instance, calls + [assistant_text(f"Done, the code is {code.lower()}.")])[0] == 1.0


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_looping_ends_the_episode_and_caps_at_0_2(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 5, difficulty)
    first = chain_calls(instance)[0]
    reward, replies, done = play(instance, [first, first, first, assistant_text("Done.")])
    assert done and reward == 0.2  # one step earned PER_STEP, capped at 0.2
    assert len(replies) == 3
    assert any(event.startswith("loop") for event in instance.events)

    instance = make(toolset, 5, difficulty)
    calls = chain_calls(instance)
    stuck = calls[-2]  # the last read, repeated: 3 identical calls in a row
    reward, _, done = play(instance, calls[:-1] + [stuck, stuck, calls[-1]])
    assert done and reward == 0.2
    assert instance.progress == len(calls) - 1

    instance = make(toolset, 5, difficulty)
    wrong = assistant_call(instance.steps[0].link.tool.name, {name: "nope" for name in instance.steps[0].arguments})
    reward, _, done = play(instance, [wrong, wrong, wrong, *calls])
    assert done and reward == 0.0


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_wrong_write_ends_the_episode_keeping_credit(toolset: str, difficulty: int) -> None:
    for seed in range(10):
        instance = make(toolset, seed, difficulty)
        last = instance.steps[-1]
        changeable = [name for name in required(last.link.tool) if name not in key_parameters(last.link.tool)]
        if not changeable:
            continue
        arguments = dict(last.arguments)
        arguments[changeable[0]] = other_value(last.link.tool, changeable[0], arguments[changeable[0]])
        calls = chain_calls(instance)
        reward, replies, done = play(instance, calls[:-1] + [assistant_call(last.link.tool.name, arguments), *calls[-1:]])
        assert done
        assert reward == round((len(calls) - 1) * 0.8 / len(calls), 4)
        assert "error" not in orjson.loads(replies[-1]["content"])
        assert any(event.startswith("wrong_write") for event in instance.events)
        break
    else:
        pytest.fail("no seed with a changeable write argument")


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_unknown_ids_get_an_error_and_no_credit(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 7, difficulty)
    calls = chain_calls(instance)
    second = instance.steps[1]
    guessed = dict(second.arguments)
    values = Values(999)
    for name in second.link.fresh:
        if name in key_parameters(second.link.tool):
            guessed[name] = values.key_value(name, properties(second.link.tool)[name])  # schema-valid, unknown
            assert guessed[name] != second.arguments[name]
    reward, replies, done = play(instance, [calls[0], assistant_call(second.link.tool.name, guessed)])
    assert not done
    assert "not found" in orjson.loads(replies[-1]["content"])["error"]
    assert reward == PER_STEP[difficulty]
    # skipping straight to a later step without its looked-up value is the same: an error
    instance = make(toolset, 7, difficulty)
    reward, replies, _ = play(instance, [assistant_call(second.link.tool.name, guessed)])
    assert "error" in orjson.loads(replies[-1]["content"]) and reward == 0.0


def test_out_of_chain_reads_are_answered_without_credit() -> None:
    tools = TOOLSETS["airline"]
    for seed in range(40):
        instance = make("airline", seed, 1)
        names = [step.link.tool.name for step in instance.steps]
        if names == ["get_user", "update_reservation"]:
            break
    else:
        pytest.fail("no get_user → update_reservation chain")
    calls = chain_calls(instance)
    reservation = instance.steps[1].arguments["reservation_id"]
    peek = assistant_call("get_reservation", {"reservation_id": reservation})
    reward, replies, done = play(instance, [calls[0], peek, calls[1], instance.solution()[-1]])
    assert done and reward == 1.0
    assert orjson.loads(replies[1]["content"])["reservation_id"] == reservation
    assert [tool.name for tool in tools] == [tool.name for tool in instance.tools]


# -- robustness ----------------------------------------------------------------------------------------------


def test_malformed_call_is_answered_with_format_reminder() -> None:
    unreadable = {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": {user_id: U-1}</tool_call>'}
    not_an_object = {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": [1, 2]}</tool_call>'}
    instance = make("retail", 2, 1)
    reward, replies, done = play(instance, [unreadable, *instance.solution()])
    assert replies[0]["role"] == "user" and "<tool_call>" in replies[0]["content"]
    assert reward == 1.0 and done
    instance = make("airline", 2, 1)
    _, replies, done = play(instance, [not_an_object])
    assert replies[0]["role"] == "tool" and "JSON object" in orjson.loads(replies[0]["content"])["error"]
    assert not done


# -- the target's own format ---------------------------------------------------------------------------


def test_instances_speak_with_the_family_instructions() -> None:
    assert MultiStepCompletionInstance.instructions == SYSTEM_INSTRUCTIONS


def test_hint_names_the_chain() -> None:
    for toolset, difficulty in CASES:
        instance = make(toolset, 1, difficulty)
        for step in instance.steps:
            assert step.link.tool.name in instance.hint()


def test_unusable_tool_sets() -> None:
    tools = load_tools([{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    assert FAMILY.unusable(tools)
    with pytest.raises(ValueError):
        FAMILY.instance(tools, 0, 1)
    # tools without a write still form a read-only chain; the outcome is a reference code
    reads = [tool for tool in TOOLSETS["airline"] if not is_write(tool)]
    instance = FAMILY.instance(reads, 4, 2)
    assert rollout(instance, solution_policy(instance)).reward == 1.0
    assert instance.outcome_field == "reference"


# -- determinism --------------------------------------------------------------------------------------------


def test_tool_order_seen_earlier_does_not_change_an_instance() -> None:
    from tracefix.trainer.families import multi_step_completion

    expected = [transcript(FAMILY, "retail", seed, 2) for seed in range(6)]
    multi_step_completion._CHAIN_CACHE.clear()
    reordered = list(reversed(TOOLSETS["retail"]))
    for seed in range(6):
        FAMILY.instance(reordered, seed, 2)
    assert [transcript(FAMILY, "retail", seed, 2) for seed in range(6)] == expected
