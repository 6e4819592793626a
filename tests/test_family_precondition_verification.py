"""The precondition_verification family: read → confirm → write, on two different tool sets."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from typing import Any

import pytest

from trainer.environment import (
    Message,
    assistant_call,
    assistant_text,
    noop_policy,
    random_policy,
    rollout,
    solution_policy,
)
from trainer.families.precondition_verification import PreconditionVerificationFamily, asks_confirmation, mentions
from trainer.world import id_parameters, is_write, properties

from tests.family_support import FIXTURES, TOOL_SETS, run_in_another_process

FAMILY = PreconditionVerificationFamily()
REWARDS = FAMILY.rewards
SEEDS = range(0, 200, 13)  # the seeds the partial-behaviour cases run on

NEUTRAL_CONFIRMATION = "Shall I go ahead with this change? Please confirm."


def play(instance: Any, messages: list[Message]) -> float:
    instance.reset()
    for message in messages:
        instance.step(message)
    return instance.reward()


def gold(instance: Any) -> tuple[Message, Message, Message, Message]:
    read, confirm, write, final = instance.solution()
    return read, confirm, write, final


def perturbed(instance: Any) -> dict[str, Any]:
    """The expected write with one non-id value changed (still schema-valid): a wrong write."""
    tool, expected = instance.write, dict(instance.expected)
    for key, value in expected.items():
        if key in id_parameters(tool):
            continue
        schema = properties(tool)[key]
        if schema.get("enum"):
            expected[key] = next(option for option in schema["enum"] if option != value)
        elif isinstance(value, bool):
            expected[key] = not value
        elif isinstance(value, int):
            low, high = schema.get("minimum", 1), schema.get("maximum", value + 2)
            expected[key] = next(option for option in range(int(low), int(high) + 1) if option != value)
        elif isinstance(value, float):
            expected[key] = round(value + 1.5, 2)
        elif schema.get("format") == "date":
            expected[key] = (dt.date.fromisoformat(value) + dt.timedelta(days=1)).isoformat()
        else:
            expected[key] = f"{value}-X"
        return expected
    raise AssertionError(f"no non-id argument to change in {expected}")


# -- the solution and the floors ------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for seed in range(200):
        instance = FAMILY.instance(TOOL_SETS[tool_set], seed, difficulty)
        result = rollout(instance, solution_policy(instance))
        assert result.reward == 1.0 and result.success, (seed, result.events, result.messages[-4:])
        assert result.events == []


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_noop_and_random_policies_stay_under_the_floor(tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    noop = [rollout(FAMILY.instance(tools, seed, difficulty), noop_policy).reward for seed in range(50)]
    chance = [rollout(FAMILY.instance(tools, seed, difficulty), random_policy(seed)).reward for seed in range(50)]
    assert statistics.fmean(noop) < 0.3 and statistics.fmean(chance) < 0.3


# -- every documented partial behaviour gets exactly its reward -----------------------------------


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_documented_reward_levels(tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    for seed in SEEDS:
        instance = FAMILY.instance(tools, seed, difficulty)
        read, confirm, write, final = gold(instance)
        wrong_id = {**instance.expected, instance.id_param: instance.identifier + "9"}
        wrong_write = assistant_call(instance.write.name, perturbed(instance))
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
        for case, (messages, expected) in cases.items():
            got = play(FAMILY.instance(tools, seed, difficulty), messages)
            assert got == expected, (tool_set, difficulty, seed, case, got)


def test_rewards_are_documented_in_the_class_docstring() -> None:
    doc = PreconditionVerificationFamily.__doc__ or ""
    for key, value in REWARDS.items():
        assert re.search(rf"{value}\s+``{key}``", doc), key
    assert max(REWARDS.values()) == 1.0 and FAMILY.levels == (1, 2)
    assert FAMILY.name == FAMILY.capability == "precondition_verification"


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
    for tools in TOOL_SETS.values():
        assert FAMILY.unusable(tools) is None
    writes_only = [tool for tool in TOOL_SETS["airline"] if is_write(tool)]
    reads_only = [tool for tool in TOOL_SETS["retail"] if not is_write(tool)]
    assert isinstance(FAMILY.unusable(writes_only), str) and isinstance(FAMILY.unusable(reads_only), str)
    with pytest.raises(ValueError):
        FAMILY.instance(writes_only, 1)
    with pytest.raises(ValueError):
        FAMILY.instance(TOOL_SETS["airline"], 1, 3)


def test_hint_is_one_line() -> None:
    for tools in TOOL_SETS.values():
        for difficulty in FAMILY.levels:
            hint = FAMILY.instance(tools, 2, difficulty).hint()
            assert hint and "\n" not in hint


# -- malformed output -----------------------------------------------------------------------------

MALFORMED = {
    "invalid_json_in_tag": {"role": "assistant", "content": '<tool_call>{"name": "x", "arguments": {</tool_call>'},
    "bare_string": "get the reservation please",
    "empty_message": {"role": "assistant", "content": ""},
    "no_content": {"role": "assistant"},
    "arguments_not_an_object": None,  # filled per tool set below
    "arguments_not_json": None,
    "unknown_tool": {"role": "assistant", "content": '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'},
    "content_parts": {"role": "assistant", "content": [{"type": "text", "text": "<tool_call>{oops</tool_call>"}]},
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_malformed_output_scores_low_without_exceptions(tool_set: str, case: str) -> None:
    tools = TOOL_SETS[tool_set]
    instance = FAMILY.instance(tools, 8, 2)
    name = instance.read_tool.name
    message = MALFORMED[case]
    if case == "arguments_not_an_object":
        message = {"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": [1, 2]}}</tool_call>'}
    elif case == "arguments_not_json":
        message = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": "{nope"}}]}
    instance.reset()
    answer = instance.step(message)
    assert answer.messages and instance.events
    for reply in answer.messages:
        if reply["role"] == "tool":
            assert set(json.loads(reply["content"])) >= {"error", "code"}
    assert instance.reward() < 0.3
    result = rollout(FAMILY.instance(tools, 8, 2), lambda messages: message)
    assert result.reward < 0.3 and result.events


# -- the target's tools, exactly -------------------------------------------------------------------


@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_system_prompt_lists_exactly_the_targets_tools(tool_set: str) -> None:
    tools = TOOL_SETS[tool_set]
    other = TOOL_SETS["retail" if tool_set == "airline" else "airline"]
    for difficulty in FAMILY.levels:
        system = FAMILY.instance(tools, 3, difficulty).reset()[0]
        assert system["role"] == "system" and "confirm" in system["content"].lower()
        listing = system["content"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        declared = [json.loads(line) for line in listing]
        assert declared == [tool.to_openai()["function"] for tool in tools]
        assert not any(f'"name":"{tool.name}"' in system["content"] for tool in other)


# -- determinism across processes ------------------------------------------------------------------

TRANSCRIPT = """
import json, sys
from pathlib import Path
from trainer.environment import load_tools, rollout, solution_policy
from trainer.families.precondition_verification import PreconditionVerificationFamily, asks_confirmation, mentions

def transcript(tool_set, seed, difficulty):
    tools = load_tools(json.loads((Path({fixtures!r}) / f"{{tool_set}}.json").read_text()))
    instance = PreconditionVerificationFamily().instance(tools, seed, difficulty)
    result = rollout(instance, solution_policy(instance))
    return json.dumps({{"messages": result.messages, "reward": result.reward, "events": result.events}}, sort_keys=True)
"""


def test_transcripts_are_identical_in_another_process() -> None:
    namespace: dict[str, Any] = {}
    exec(TRANSCRIPT.format(fixtures=str(FIXTURES)), namespace)  # noqa: S102 - the same code both sides
    cases = [(tool_set, seed, difficulty) for tool_set in sorted(TOOL_SETS) for seed in (0, 17) for difficulty in FAMILY.levels]
    script = TRANSCRIPT.format(fixtures=str(FIXTURES)) + f"\nprint(json.dumps([transcript(*case) for case in {cases!r}]))"
    assert json.loads(run_in_another_process(script)) == [namespace["transcript"](*case) for case in cases]
