"""The structured_data_reasoning environment family: solvable, scored as documented, robust (what every
family promises is in ``test_family_contract``)."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from tracefix.trainer.environment import Message, assistant_call, assistant_text, load_tools, rollout, solution_policy
from tracefix.trainer.families.structured_data_reasoning import (
    SYSTEM_INSTRUCTIONS,
    StructuredDataReasoningFamily,
    StructuredDataReasoningInstance,
    money,
    numbers_in,
)
from tracefix.trainer.schema_values import is_read

from tests.family_support import TOOL_SETS, cases, play, solved

TOOLSETS = TOOL_SETS
FAMILY = StructuredDataReasoningFamily()
CASES = cases(FAMILY)


def make(toolset: str, seed: int, difficulty: int) -> StructuredDataReasoningInstance:
    return FAMILY.instance(TOOLSETS[toolset], seed, difficulty)


def read_call(instance: StructuredDataReasoningInstance) -> Message:
    return instance.solution()[0]


def find(toolset: str, difficulty: int, kind: str) -> StructuredDataReasoningInstance:
    for seed in range(300):
        instance = make(toolset, seed, difficulty)
        if instance.kind == kind:
            return instance
    raise AssertionError(f"no {kind} question on {toolset}")


def spoken_gold(instance: StructuredDataReasoningInstance, delta: Decimal = Decimal(0)) -> str:
    value = instance.gold + delta
    return money(int(value * 100)) if instance.is_money else str(int(value))


# -- the ground truth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_solution_scores_one_on_200_seeds(toolset: str, difficulty: int) -> None:
    kinds = set()
    for instance, episode in solved(FAMILY, toolset, difficulty):
        assert episode.events == []
        kinds.add(instance.kind)
    expected = {"sum_price", "sum_count", "max_price", "min_price"} if difficulty == 1 else {"product", "count_price_above", "count_count_at_least"}
    assert kinds == expected


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_gold_is_computed_from_the_records(toolset: str, difficulty: int) -> None:
    for seed in range(40):
        instance = make(toolset, seed, difficulty)
        assert is_read(instance.target)
        _, replies, _ = play(instance, [read_call(instance)])
        result = orjson.loads(replies[0]["content"])
        scheme = instance.scheme
        records = result[scheme.list_key]
        prices = [Decimal(str(record[scheme.price_field])) for record in records]
        counts = [record[scheme.count_field] for record in records]
        expected = {
            "sum_price": sum(prices),
            "sum_count": Decimal(sum(counts)),
            "max_price": max(prices),
            "min_price": min(prices),
            "product": sum(price * count for price, count in zip(prices, counts)),
        }
        if instance.kind in expected:
            assert instance.gold == expected[instance.kind]
        elif instance.kind == "count_price_above":
            threshold = Decimal(instance.threshold) / 100
            assert instance.gold == sum(1 for price in prices if price > threshold)
            assert 0 < instance.gold < len(records)
        else:
            assert instance.gold == sum(1 for count in counts if count >= instance.threshold)
            assert 0 < instance.gold < len(records)
        for name, value in instance.arguments.items():
            assert str(value) in instance.user_text  # the user states the read's arguments


def test_rewards_are_the_documented_levels() -> None:
    assert FAMILY.rewards == {"correct_value": 1.0, "read_right_wrong_value": 0.5, "read_right_no_number": 0.3, "no_correct_read": 0.0}


# -- documented partial behaviours --------------------------------------------------------------------


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_partial_rewards(toolset: str, difficulty: int) -> None:
    for seed in range(15):
        instance = make(toolset, seed, difficulty)
        call = read_call(instance)
        right = assistant_text(f"It comes to {spoken_gold(instance)}.")
        wrong = assistant_text(f"It comes to {spoken_gold(instance, Decimal(1))}.")
        cases = [
            ([call, right], 1.0),
            ([call, wrong], 0.5),
            ([call, assistant_text("I have looked that up for you.")], 0.3),
            ([call], 0.3),  # no final answer (turn limit)
            ([right], 0.0),  # the right number without the read
            ([assistant_text("I cannot see your data.")], 0.0),
        ]
        for messages, expected in cases:
            reward, _, _ = play(make(toolset, seed, difficulty), messages)
            assert reward == expected, (seed, messages, expected)


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_wrong_read_arguments_earn_nothing(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 3, difficulty)
    arguments = dict(instance.arguments)
    name = next(iter(arguments))
    if instance.target.name == "search_flights":
        arguments["date"] = "2030-01-01"
    else:
        arguments[name] = "nobody@example.com" if "email" in name else "X-00000"
    reward, replies, _ = play(instance, [assistant_call(instance.target.name, arguments), assistant_text(spoken_gold(instance))])
    content = orjson.loads(replies[0]["content"])
    assert "error" in content or content[instance.scheme.list_key] == []
    assert reward == 0.0


def test_unknown_ids_return_an_error_object() -> None:
    instance = next(make("retail", seed, 1) for seed in range(50) if make("retail", seed, 1).target.name != "lookup_customer")
    _, replies, _ = play(instance, [assistant_call(instance.target.name, {"order_number": "O-00001"})])
    assert orjson.loads(replies[0]["content"]) == {"error": "order O-00001 not found"}


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_only_the_final_answer_counts(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 8, difficulty)
    call = read_call(instance)
    chatty = {"role": "assistant", "content": f"Maybe {spoken_gold(instance)}? Let me check. " + call["content"]}
    reward, _, _ = play(instance, [chatty, assistant_text("Here you go, all checked.")])
    assert reward == 0.3
    # a later read does not matter; the last plain-text message is the answer
    reward, _, _ = play(make(toolset, 8, difficulty), [call, call, assistant_text(f"The answer: {spoken_gold(instance)}")])
    assert reward == 1.0


@pytest.mark.parametrize(("toolset", "difficulty"), CASES)
def test_number_formats_are_understood(toolset: str, difficulty: int) -> None:
    instance = make(toolset, 21, difficulty)
    gold = instance.gold
    plain = f"{gold:.2f}" if instance.is_money else str(int(gold))
    answers = [
        f"The result is {spoken_gold(instance)}.",
        f"Total: {plain}",
        f"{plain}",
        f"That is USD {gold:,.2f} in total." if instance.is_money else f"There are {plain} of them.",
        f"For {instance.arguments and next(iter(instance.arguments.values()))} on 2026-03-02 at 10:30: {spoken_gold(instance)}",
        f"**{spoken_gold(instance)}**",
    ]
    for text in answers:
        reward, _, _ = play(make(toolset, 21, difficulty), [read_call(instance), assistant_text(text)])
        assert reward == 1.0, text


def test_spamming_numbers_is_not_a_correct_answer() -> None:
    instance = make("retail", 4, 1)
    decoys = [gold for gold in (Decimal(1), Decimal(2)) if gold != instance.gold]
    text = f"Maybe {decoys[0]}, or {spoken_gold(instance)}, or {decoys[1]}."
    reward, _, _ = play(make("retail", 4, 1), [read_call(instance), assistant_text(text)])
    assert reward == 0.5


def test_numbers_from_the_question_do_not_count_as_the_answer() -> None:
    instance = find("airline", 2, "count_price_above")
    threshold = instance.threshold // 100
    text = f"Above ${threshold} there are {int(instance.gold)} of them."
    reward, _, _ = play(make("airline", instance.seed, 2), [read_call(instance), assistant_text(text)])
    assert reward == 1.0
    # a threshold given back as the answer is a stated (wrong) value
    reward, _, _ = play(make("airline", instance.seed, 2), [read_call(instance), assistant_text(f"${threshold}.")])
    assert reward == 0.5


def test_numbers_in() -> None:
    assert numbers_in("$1,234.50 and USD 12.5, -4, 3.") == [Decimal("1234.50"), Decimal("12.5"), Decimal(-4), Decimal(3)]
    assert numbers_in("Order O-12345 (SW1234) on 2026-03-04 at 10:30, ref CNF-100200") == []
    assert numbers_in("€99 or £1,000,000.01 or 12 dollars") == [Decimal(99), Decimal("1000000.01"), Decimal(12)]
    assert numbers_in("1.5k items") == []


def test_money_formatting() -> None:
    assert money(123456) == "$1,234.56" and money(5) == "$0.05"


# -- robustness ----------------------------------------------------------------------------------------------


def test_malformed_call_is_answered_and_the_episode_goes_on() -> None:
    unreadable = {"role": "assistant", "content": "<tool_call>not json at all"}
    not_an_object = {"role": "assistant", "content": '<tool_call>{"name": "find_order", "arguments": [1, 2]}</tool_call>'}
    instance = make("retail", 2, 2)
    reward, replies, done = play(instance, [unreadable, not_an_object, *instance.solution()])
    assert replies[0]["role"] == "user" and "<tool_call>" in replies[0]["content"]
    assert replies[1]["role"] == "tool" and "JSON object" in orjson.loads(replies[1]["content"])["error"]
    assert reward == 1.0 and done


def test_other_tools_are_answered_without_credit() -> None:
    instance = make("airline", 0, 1)
    write = assistant_call("cancel_reservation", {"reservation_id": "R-1", "reason": "other"})
    peek = assistant_call("get_user", {"user_id": "U-00000"})
    reward, replies, _ = play(instance, [write, peek, *instance.solution()])
    assert all("error" in orjson.loads(reply["content"]) for reply in replies[:2])
    assert reward == 1.0


# -- the target's own format ---------------------------------------------------------------------------


def test_instances_speak_with_the_family_instructions() -> None:
    assert StructuredDataReasoningInstance.instructions == SYSTEM_INSTRUCTIONS


def test_hint_names_the_read() -> None:
    for toolset, difficulty in CASES:
        instance = make(toolset, 1, difficulty)
        assert instance.target.name in instance.hint()


def test_unusable_tool_sets() -> None:
    writes_only = load_tools([{"name": "cancel_order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}])
    assert FAMILY.unusable(writes_only)
    with pytest.raises(ValueError):
        FAMILY.instance(writes_only, 0, 1)
    generic = load_tools([{"name": "get_invoice", "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"}}, "required": ["invoice_id"]}}])
    for seed in range(20):
        instance = FAMILY.instance(generic, seed, 2)
        assert rollout(instance, solution_policy(instance)).reward == 1.0
    assert instance.scheme.list_key == "invoices"
