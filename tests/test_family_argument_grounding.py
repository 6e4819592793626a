"""The argument_grounding family on the airline (OpenAI-shaped) and retail (flat) tool sets: the id
the second call needs comes only from the first call's result; the ground truth always scores 1.0,
each documented partial behaviour earns exactly its level, weak policies stay low, malformed output
never raises, unknown ids answer with an error object, and instances are identical across processes."""

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
from trainer.families.argument_grounding import ArgumentGroundingFamily, chains
from trainer.simulation import schema_error

from tests.family_support import TOOL_SETS, run_in_another_process

TOOLS = TOOL_SETS
FAMILY = ArgumentGroundingFamily()
REWARDS = FAMILY.rewards
CASES = [(tool_set, difficulty) for tool_set in sorted(TOOLS) for difficulty in FAMILY.levels]
DONE = assistant_text("Here you go.")


def play(instance: Instance, messages: list[Any]) -> tuple[float, list[dict[str, Any]]]:
    """Reset, feed the assistant messages until the episode ends: the reward and the tool results."""
    instance.reset()
    replies: list[dict[str, Any]] = []
    for message in messages:
        result = instance.step(message)
        replies.extend(result.messages)
        if result.done:
            break
    return instance.reward(), replies


def altered(identifier: str) -> str:
    """The id with its last character changed (an 'almost copied' id)."""
    last = identifier[-1]
    return identifier[:-1] + ("1" if last != "1" else "2") if last.isdigit() else identifier[:-1] + ("a" if last != "a" else "b")


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
    assert FAMILY.name == FAMILY.capability == "argument_grounding"
    assert FAMILY.levels == (1, 2)
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
    for seed in range(200):
        instance = FAMILY.instance(TOOLS[tool_set], seed, difficulty)
        replay = rollout(instance, solution_policy(instance))
        assert replay.reward == 1.0, (seed, replay.messages, replay.events)
        assert replay.success and replay.messages[-1]["role"] == "assistant"
        assert [message["role"] == "assistant" for message in replay.messages] == replay.from_policy
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
    tools = TOOLS[tool_set]
    for seed in range(12):
        def fresh() -> Any:
            return FAMILY.instance(tools, seed, difficulty)

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
        reward, replies = play(fresh(), [good_first, invented, DONE])
        assert reward == REWARDS["second_call_id_not_grounded"] == 0.5
        assert json.loads(replies[-1]["content"]) == {"error": f"{parameter.removesuffix('_id').removesuffix('_number').replace('_', ' ')} {altered(instance.target)} not found"}
        if difficulty == 2:
            # the id the user misremembers, and another listed candidate: both not the needed one
            assert play(fresh(), [good_first, assistant_call(second, {**gold_second, parameter: instance.misremembered}), DONE])[0] == 0.5
            listed = [key for key in instance.world if key != instance.target]
            reward, replies = play(fresh(), [good_first, assistant_call(second, {**gold_second, parameter: listed[0]}), DONE])
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
        reward, replies = play(fresh(), [assistant_call(first, wrong_first), good_second, DONE])
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


def test_turn_limit_ends_the_episode() -> None:
    instance = FAMILY.instance(TOOLS["airline"], 1, 1)
    instance.reset()
    results = [instance.step(assistant_call(instance.first.name, instance.gold_first)) for _ in range(instance.max_turns)]
    assert [result.done for result in results] == [False] * (instance.max_turns - 1) + [True]
    assert instance.reward() == 0.25


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
def test_weak_policies_stay_low(tool_set: str) -> None:
    for difficulty in FAMILY.levels:
        environment = Environment(FAMILY, TOOLS[tool_set], difficulty)
        noop = [rollout(environment.instance(seed), noop_policy).reward for seed in range(50)]
        rand = [rollout(environment.instance(seed), random_policy(seed)).reward for seed in range(50)]
        assert sum(noop) / 50 < 0.3 and sum(rand) / 50 < 0.3
        assert max(noop) == 0.0


MALFORMED = [
    {"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": {</tool_call>'},
    {"role": "assistant", "content": "<tool_call>{broken"},
    "just a bare string",
    {"role": "assistant", "content": "just a bare string"},
    {},
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": ["not", "text"]},
    {"role": "assistant", "content": "{not json at all}"},
    {"role": "assistant", "tool_calls": 5},
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
    # after a right first call, a malformed second turn keeps only the first call's credit
    grounded = FAMILY.instance(TOOLS[tool_set], 9, 2)
    assert play(grounded, [assistant_call(grounded.first.name, grounded.gold_first), message, DONE])[0] == 0.25


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
@pytest.mark.parametrize("arguments", ["[1, 2]", "5", '"{oops"', "null"])
def test_non_object_arguments_score_low(tool_set: str, arguments: str) -> None:
    instance = FAMILY.instance(TOOLS[tool_set], 2, 1)
    first = instance.first.name
    bad = {"role": "assistant", "content": f'<tool_call>{{"name": "{first}", "arguments": {arguments}}}</tool_call>'}
    reward, replies = play(instance, [bad, DONE])
    assert reward == 0.0 and "error" in json.loads(replies[0]["content"])
    grounded = FAMILY.instance(TOOLS[tool_set], 2, 1)
    second = {"role": "assistant", "content": f'<tool_call>{{"name": "{grounded.second.name}", "arguments": {arguments}}}</tool_call>'}
    assert play(grounded, [assistant_call(first, grounded.gold_first), second, DONE])[0] == 0.5


@pytest.mark.parametrize("tool_set", sorted(TOOLS))
def test_system_prompt_lists_exactly_the_target_tools(tool_set: str) -> None:
    other = "retail" if tool_set == "airline" else "airline"
    for difficulty in FAMILY.levels:
        opening = FAMILY.instance(TOOLS[tool_set], 3, difficulty).reset()
        assert [message["role"] for message in opening] == ["system", "user"]
        system = opening[0]["content"]
        listing = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        assert [json.loads(line)["name"] for line in listing] == [tool.name for tool in TOOLS[tool_set]]
        assert [json.loads(line)["parameters"] for line in listing] == [tool.parameters for tool in TOOLS[tool_set]]
        assert not any(f'"name":"{tool.name}"' in system for tool in TOOLS[other])


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


def test_unusable_tool_sets_are_refused() -> None:
    no_ids = load_tools([
        {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
    ])  # fmt: skip
    single = load_tools([{"name": "get_order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}])
    assert FAMILY.unusable(no_ids) and FAMILY.unusable(single) and FAMILY.unusable([])
    assert FAMILY.unusable(TOOLS["airline"]) is None and FAMILY.unusable(TOOLS["retail"]) is None
    with pytest.raises(ValueError):
        Environment(FAMILY, no_ids)


def test_hint_is_one_line_naming_both_calls() -> None:
    for seed in range(10):
        instance = FAMILY.instance(TOOLS["airline"], seed, 2)
        hint = instance.hint()
        assert "\n" not in hint and instance.first.name in hint and instance.second.name in hint


def test_same_seed_same_instance_and_different_seeds_differ() -> None:
    assert transcript("retail", 5, 2) == transcript("retail", 5, 2)
    assert len({transcript("airline", seed, 1) for seed in range(10)}) == 10


def test_transcript_is_identical_in_another_process() -> None:
    keys = [(tool_set, seed, difficulty) for tool_set in sorted(TOOLS) for seed in (0, 7, 123) for difficulty in (1, 2)]
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); "
        "from test_family_argument_grounding import transcript; "
        f"print(json.dumps([transcript(*key) for key in {keys!r}]))"
    )
    assert json.loads(run_in_another_process(code)) == [transcript(*key) for key in keys]
