"""The precondition_verification family: read → confirm → write, on two different tool sets (what
every family promises is in ``test_family_contract``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracefix.trainer.environment import Message, assistant_call, assistant_text, noop_policy, rollout
from tracefix.trainer.families.precondition_verification import PreconditionVerificationFamily, asks_confirmation, mentions
from tracefix.trainer.schema_values import id_parameters, is_write

from tests.family_support import TOOL_SETS, assert_each_case_earns, cases, perturbed, solved

FAMILY = PreconditionVerificationFamily()
REWARDS = FAMILY.rewards
SEEDS = range(0, 200, 13)  # the seeds the partial-behaviour cases run on

NEUTRAL_CONFIRMATION = "Shall I go ahead with this change? Please confirm."


def gold(instance: Any) -> tuple[Message, Message, Message, Message]:
    read, confirm, write, final = instance.solution()
    return read, confirm, write, final


# -- the solution --------------------------------------------------------------------------------


@pytest.mark.parametrize(("tool_set", "difficulty"), cases(FAMILY))
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for _, result in solved(FAMILY, tool_set, difficulty):
        assert result.events == []


# -- every documented partial behaviour gets exactly its reward -----------------------------------


@pytest.mark.parametrize(("tool_set", "difficulty"), cases(FAMILY))
def test_documented_reward_levels(tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    for seed in SEEDS:
        instance = FAMILY.instance(tools, seed, difficulty)
        read, confirm, write, final = gold(instance)
        wrong_id = {**instance.expected, instance.id_param: instance.identifier + "9"}
        changed = perturbed(instance.write, instance.expected, id_parameters(instance.write))
        assert changed is not None, f"no non-id argument to change in {instance.expected}"
        wrong_write = assistant_call(instance.write.name, changed)
        cases = {
            "read_confirm_write": ([read, confirm, write, final], 1.0),
            "read_write_unconfirmed": ([read, write, final], REWARDS["read_write_unconfirmed"]),
            "confirm_before_read": ([confirm, read, write, final], REWARDS["read_write_unconfirmed"]),
            "confirm_in_the_write_message": (
                [read, {"role": "assistant", "content": "Shall I go ahead? " + write["content"]}, final],
                REWARDS["read_write_unconfirmed"],
            ),
            "write_without_read": ([write, final], REWARDS["write_without_read"]),
            "confirm_then_write_without_read": ([confirm, write, final], REWARDS["write_without_read"]),
            "read_after_write": ([write, read, final], REWARDS["write_without_read"]),
            "read_confirm_no_write": ([read, confirm, assistant_text("Okay, bye.")], REWARDS["read_confirm_no_or_wrong_write"]),
            "read_confirm_wrong_write": ([read, confirm, wrong_write, final], REWARDS["read_confirm_no_or_wrong_write"]),
            "wrong_write_then_right_one": ([read, confirm, wrong_write, write, final], REWARDS["read_confirm_no_or_wrong_write"]),
            "read_wrong_write": ([read, wrong_write, final], REWARDS["otherwise"]),
            "wrong_entity": ([read, confirm, assistant_call(instance.write.name, wrong_id), write, final], REWARDS["wrong_entity_written"]),
            "read_only": ([read, assistant_text("Okay.")], REWARDS["otherwise"]),
            "nothing": ([], REWARDS["otherwise"]),
            "invalid_write_changes_nothing": ([assistant_call(instance.write.name, {}), read, confirm, write, final], 1.0),
        }
        if difficulty == 2:
            cases["precondition_not_mentioned"] = (
                [read, assistant_text(NEUTRAL_CONFIRMATION), write, final],
                REWARDS["read_confirm_write_precondition_unmentioned"],
            )
            cases["mentioned_in_a_later_question"] = (
                [read, assistant_text(NEUTRAL_CONFIRMATION), confirm, write, final], 1.0,
            )  # fmt: skip
        else:
            cases["plain_confirmation_suffices"] = ([read, assistant_text(NEUTRAL_CONFIRMATION), write, final], 1.0)
        assert_each_case_earns(FAMILY, tool_set, seed, difficulty, cases)


# -- the simulated world --------------------------------------------------------------------------


@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_user_confirms_only_when_asked_and_results_are_records(tool_set: str) -> None:
    tools = TOOL_SETS[tool_set]
    instance = FAMILY.instance(tools, 11, 1)
    opening = instance.reset()
    assert [m["role"] for m in opening] == ["system", "user"]
    assert instance.identifier in opening[1]["content"]
    for key, value in instance.expected.items():  # the user gives every value the write needs
        assert str(value) in opening[1]["content"], key
    read, confirm, write, final = gold(instance)
    record = json.loads(instance.step(read).messages[0]["content"])
    assert record[instance.id_param] == instance.identifier and "status" in record
    neutral = instance.step(assistant_text("Let me take care of that for you.")).messages[0]
    assert neutral["role"] == "user" and "confirm" not in neutral["content"].lower() and "yes" not in neutral["content"].lower()
    yes = instance.step(confirm)
    assert not yes.done and yes.messages[0]["role"] == "user" and "yes" in yes.messages[0]["content"].lower()
    done = json.loads(instance.step(write).messages[0]["content"])
    assert done[instance.id_param] == instance.identifier and "error" not in done
    assert instance.step(final).done and instance.reward() == 1.0
    # unknown ids answer with the target's error shape
    other = FAMILY.instance(tools, 11, 1)
    other.reset()
    missing = json.loads(other.step(assistant_call(instance.read_tool.name, {instance.id_param: "ZZ-1"})).messages[0]["content"])
    assert set(missing) == {"error", "code"} and missing["code"] == "not_found"


@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_difficulty_two_record_reveals_the_precondition(tool_set: str) -> None:
    kinds = set()
    for seed in range(60):
        instance = FAMILY.instance(TOOL_SETS[tool_set], seed, 2)
        instance.reset()
        record = json.loads(instance.step(gold(instance)[0]).messages[0]["content"])
        kinds.add(instance.precondition)
        revealed = (
            record["status"] in ("pending", "on_hold")
            or record.get("refundable") is False
            or any(key.endswith("_fee") and value > 0 for key, value in record.items())
        )
        assert revealed, (seed, record)
        assert any(word in gold(instance)[1]["content"].lower() for word in instance.keywords)
        easy = FAMILY.instance(TOOL_SETS[tool_set], seed, 1)
        easy.reset()
        plain = json.loads(easy.step(gold(easy)[0]).messages[0]["content"])
        assert plain["status"] in ("active", "confirmed") and plain.get("refundable", True) is True
    assert len(kinds) >= 2


def test_what_counts_as_asking_and_as_mentioning() -> None:
    for text in ("Shall I cancel it?", "Please confirm the change.", "Do you want me to proceed", "Should I go ahead"):
        assert asks_confirmation(text), text
    for text in ("I'm sorry, I can't help with that.", "Done.", "Okay, bye.", "All done: I have cancelled it."):
        assert not asks_confirmation(text), text
    assert mentions("A change FEE of 25.00 applies", ("fee",)) and mentions("two fees apply", ("fee",))
    assert not mentions("Feel free to ask. Shall I?", ("fee",))
    assert mentions("It is currently on hold.", ("on_hold", "on hold")) and mentions("it's not refundable", ("not refundable",))


def test_noop_ends_after_two_neutral_replies() -> None:
    instance = FAMILY.instance(TOOL_SETS["airline"], 4, 1)
    result = rollout(instance, noop_policy)
    assert result.reward == 0.0 and len(result.messages) == 6


def test_unusable_and_bad_difficulty() -> None:
    writes_only = [tool for tool in TOOL_SETS["airline"] if is_write(tool)]
    reads_only = [tool for tool in TOOL_SETS["retail"] if not is_write(tool)]
    assert isinstance(FAMILY.unusable(writes_only), str) and isinstance(FAMILY.unusable(reads_only), str)
    with pytest.raises(ValueError):
        FAMILY.instance(writes_only, 1)
    with pytest.raises(ValueError):
        FAMILY.instance(TOOL_SETS["airline"], 1, 3)


def test_system_prompt_asks_to_confirm_before_changes() -> None:
    for tools in TOOL_SETS.values():
        for difficulty in FAMILY.levels:
            assert "confirm" in FAMILY.instance(tools, 3, difficulty).reset()[0]["content"].lower()
