"""The argument_grounding family on the airline (OpenAI-shaped) and retail (flat) tool sets: the id
the second call needs comes only from the first call's result; the ground truth always scores 1.0,
each documented partial behaviour earns exactly its level and unknown ids answer with an error
object (what every family promises is in ``test_family_contract``)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from tracefix.trainer.environment import Environment, assistant_call, assistant_text, load_tools, rollout, solution_policy
from tracefix.trainer.families.argument_grounding import ArgumentGroundingFamily, chains
from tracefix.trainer.simulation import schema_error

from tests.family_support import TOOL_SETS, UNREADABLE_TURNS, cases, play, solved

TOOLS = TOOL_SETS
FAMILY = ArgumentGroundingFamily()
REWARDS = FAMILY.rewards
CASES = cases(FAMILY)
DONE = assistant_text("Here you go.")


def altered(identifier: str) -> str:
    """The id with its last character changed (an 'almost copied' id)."""
    last = identifier[-1]
    return identifier[:-1] + ("1" if last != "1" else "2") if last.isdigit() else identifier[:-1] + ("a" if last != "a" else "b")


def test_rewards_are_the_documented_levels() -> None:
    assert REWARDS == {
        "both_calls_grounded": 1.0,
        "second_call_id_not_grounded": 0.5,
        "first_call_only": 0.25,
        "no_right_first_call": 0.0,
    }
    for level in ("1.0", "0.5", "0.25", "0.0"):
        assert level in FAMILY.__doc__


def test_natural_chains_are_preferred() -> None:
    airline = {(c.first.name, c.second.name, c.parameter) for c in chains(TOOLS["airline"]) if c.tier == 0}
    assert airline == {("get_user", "get_reservation", "reservation_id"), ("get_reservation", "get_user", "user_id")}
    retail = {(c.first.name, c.second.name, c.parameter) for c in chains(TOOLS["retail"]) if c.tier == 0}
    assert retail == {("lookup_customer", "find_order", "order_number"), ("lookup_customer", "list_order_items", "order_number")}
    used = {(FAMILY.instance(TOOLS["airline"], seed, 1).first.name) for seed in range(30)}
    assert used == {"get_user", "get_reservation"}


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for instance, replay in solved(FAMILY, tool_set, difficulty):
        user, first_result = replay.messages[1]["content"], replay.messages[3]["content"]
        # the grounded id is never in the user's text, only in the first result
        assert instance.target not in user and instance.target in first_result
        assert schema_error(instance.first, instance.gold_first) is None
        assert schema_error(instance.second, instance.gold_second) is None
        assert not any(event.startswith("ungrounded_id") for event in replay.events)
        record = json.loads(first_result)
        assert isinstance(record, dict) and "error" not in record
        assert isinstance(json.loads(replay.messages[5]["content"]), dict)


@pytest.mark.parametrize(("tool_set", "difficulty"), CASES)
def test_each_partial_behaviour_earns_its_documented_reward(tool_set: str, difficulty: int) -> None:
    for seed in range(12):
        fresh = partial(FAMILY.instance, TOOLS[tool_set], seed, difficulty)
        instance = fresh()
        first, second, parameter = instance.first.name, instance.second.name, instance.parameter
        gold_first, gold_second = instance.gold_first, instance.gold_second
        good_first, good_second = assistant_call(first, gold_first), assistant_call(second, gold_second)

        assert play(fresh(), [good_first, good_second, DONE])[0] == REWARDS["both_calls_grounded"] == 1.0
        # extra optional arguments on the first call are fine
        if first == "get_user":
            assert play(fresh(), [assistant_call(first, {**gold_first, "include_reservations": True}), good_second, DONE])[0] == 1.0

        # first call right, the second id invented or altered (the altered one is not found)
        invented = assistant_call(second, {**gold_second, parameter: altered(instance.target)})
        reward, replies, _ = play(fresh(), [good_first, invented, DONE])
        assert reward == REWARDS["second_call_id_not_grounded"] == 0.5
        assert json.loads(replies[-1]["content"]) == {"error": f"{parameter.removesuffix('_id').removesuffix('_number').replace('_', ' ')} {altered(instance.target)} not found"}
        if difficulty == 2:
            # the id the user misremembers, and another listed candidate: both not the needed one
            assert play(fresh(), [good_first, assistant_call(second, {**gold_second, parameter: instance.misremembered}), DONE])[0] == 0.5
            listed = [key for key in instance.world if key != instance.target]
            reward, replies, _ = play(fresh(), [good_first, assistant_call(second, {**gold_second, parameter: listed[0]}), DONE])
            assert reward == 0.5 and "error" not in json.loads(replies[-1]["content"])
        # second tool called with arguments that fail its schema
        assert play(fresh(), [good_first, assistant_call(second, {}), DONE])[0] == 0.5

        # first call right only
        assert play(fresh(), [good_first, DONE])[0] == REWARDS["first_call_only"] == 0.25
        # a guess at the second call before grounding it is not repaired by a later right call
        guess = assistant_call(second, {**gold_second, parameter: altered(instance.target)})
        assert play(fresh(), [guess, good_first, good_second, DONE])[0] == 0.25

        # the first call never right
        assert play(fresh(), [DONE])[0] == REWARDS["no_right_first_call"] == 0.0
        assert play(fresh(), [good_second, DONE])[0] == 0.0  # skipping the lookup (id from nowhere)
        wrong_first = {key: (value + "x" if isinstance(value, str) else value) for key, value in gold_first.items()}
        reward, replies, _ = play(fresh(), [assistant_call(first, wrong_first), good_second, DONE])
        assert reward == 0.0
        assert json.loads(replies[0]["content"])["error"].endswith("not found")
        assert play(fresh(), [assistant_call(first, {}), DONE])[0] == 0.0
        assert play(fresh(), [assistant_call("transfer_to_human_agents", {}), DONE])[0] == 0.0


def test_unknown_ids_answer_with_an_error_object() -> None:
    instance = next(
        candidate
        for candidate in (FAMILY.instance(TOOLS["airline"], seed, 1) for seed in range(50))
        if candidate.second.name == "get_reservation"
    )
    instance.reset()
    result = instance.step(assistant_call("get_reservation", {"reservation_id": "R-12345"}))
    assert json.loads(result.messages[0]["content"]) == {"error": "reservation R-12345 not found"}
    assert "ungrounded_id: reservation_id=R-12345" in instance.events
    result = instance.step(assistant_call("get_user", {"user_id": "U-00000"}))
    assert json.loads(result.messages[0]["content"]) == {"error": "user U-00000 not found"}
    retail = FAMILY.instance(TOOLS["retail"], 3, 1)
    retail.reset()
    result = retail.step(assistant_call("lookup_customer", {"email": "nobody@example.com"}))
    assert json.loads(result.messages[0]["content"]) == {"error": "customer nobody@example.com not found"}


def test_parallel_calls_in_one_message_are_answered_in_order() -> None:
    instance = FAMILY.instance(TOOLS["retail"], 8, 1)
    both = {"role": "assistant", "content": assistant_call(instance.first.name, instance.gold_first)["content"] + assistant_call("nope", {})["content"]}
    instance.reset()
    result = instance.step(both)
    assert [message["name"] for message in result.messages] == [instance.first.name, "nope"]
    assert json.loads(result.messages[1]["content"]) == {"error": "unknown tool nope"}


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("message", UNREADABLE_TURNS, ids=range(len(UNREADABLE_TURNS)))
def test_an_unreadable_second_turn_keeps_only_the_first_calls_credit(tool_set: str, message: Any) -> None:
    grounded = FAMILY.instance(TOOLS[tool_set], 9, 2)
    assert play(grounded, [assistant_call(grounded.first.name, grounded.gold_first), message, DONE])[0] == 0.25


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("arguments", ["[1, 2]", "5", '"{oops"', "null"])
def test_non_object_arguments_score_low(tool_set: str, arguments: str) -> None:
    instance = FAMILY.instance(TOOLS[tool_set], 2, 1)
    first = instance.first.name
    bad = {"role": "assistant", "content": f'<tool_call>{{"name": "{first}", "arguments": {arguments}}}</tool_call>'}
    reward, replies, _ = play(instance, [bad, DONE])
    assert reward == 0.0 and "error" in json.loads(replies[0]["content"])
    grounded = FAMILY.instance(TOOLS[tool_set], 2, 1)
    second = {"role": "assistant", "content": f'<tool_call>{{"name": "{grounded.second.name}", "arguments": {arguments}}}</tool_call>'}
    assert play(grounded, [assistant_call(first, grounded.gold_first), second, DONE])[0] == 0.5


def test_tool_sets_without_a_natural_chain_still_work() -> None:
    flights = load_tools(
        [
            {"name": "search_flights", "parameters": {"type": "object", "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["origin", "destination"]}},
            {"name": "book_flight", "parameters": {"type": "object", "properties": {"flight_number": {"type": "string", "pattern": "^SW[0-9]{4}$"}, "passenger_name": {"type": "string"}}, "required": ["flight_number", "passenger_name"]}},
        ]
    )  # fmt: skip
    customers = load_tools(
        [
            {"name": "lookup_customer", "parameters": {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]}},
            {"name": "get_customer", "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]}},
        ]
    )  # fmt: skip
    for tools, style in ((flights, None), (customers, "own")):
        assert FAMILY.unusable(tools) is None
        for difficulty in FAMILY.levels:
            for seed in range(30):
                instance = FAMILY.instance(tools, seed, difficulty)
                if style:
                    assert instance.style == style
                replay = rollout(instance, solution_policy(instance))
                assert replay.reward == 1.0, (seed, replay.messages)
                assert instance.target not in replay.messages[1]["content"]
    booking = FAMILY.instance(flights, 1, 1)
    assert (booking.first.name, booking.second.name, booking.parameter) == ("search_flights", "book_flight", "flight_number")
    assert "passenger name" in booking.reset()[1]["content"]


def test_tool_sets_without_an_id_chain_are_refused() -> None:
    no_ids = load_tools([
        {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
    ])  # fmt: skip
    single = load_tools([{"name": "get_order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}])
    assert FAMILY.unusable(no_ids) and FAMILY.unusable(single)
    with pytest.raises(ValueError):
        Environment(FAMILY, no_ids)


def test_hint_names_both_calls() -> None:
    for seed in range(10):
        instance = FAMILY.instance(TOOLS["airline"], seed, 2)
        assert instance.first.name in instance.hint() and instance.second.name in instance.hint()
