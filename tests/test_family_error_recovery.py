"""The error_recovery family: the first call fails with an actionable error, on two different tool sets."""

from __future__ import annotations

import collections
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
from trainer.families.error_recovery import ErrorRecoveryFamily
from trainer.world import id_parameters, properties

from tests.family_support import FIXTURES, TOOL_SETS, run_in_another_process

FAMILY = ErrorRecoveryFamily()
REWARDS = FAMILY.rewards
SEEDS = range(0, 200, 7)  # the seeds the partial-behaviour cases run on


def play(instance: Any, messages: list[Message]) -> float:
    instance.reset()
    for message in messages:
        instance.step(message)
    return instance.reward()


def perturbed(instance: Any) -> dict[str, Any] | None:
    """The expected arguments with one non-id, non-error value changed (still schema-valid), if any."""
    plan = instance.plan
    expected = dict(plan.expected)
    for key, value in expected.items():
        schema = properties(plan.tool)[key]
        if key in id_parameters(plan.tool) or key == plan.param or "pattern" in schema:
            continue
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
        elif "@" in str(value):
            continue
        else:
            expected[key] = f"{value}-X"
        return expected
    return None


# -- the solution and the floors ------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for seed in range(200):
        instance = FAMILY.instance(TOOL_SETS[tool_set], seed, difficulty)
        result = rollout(instance, solution_policy(instance))
        assert result.reward == 1.0 and result.success, (seed, result.events, result.messages[-4:])
        errors = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"][:-1]
        assert errors and all(set(error) >= {"error", "code"} for error in errors)  # every call before the last failed
        assert len(errors) == (1 if difficulty == 1 else 2)


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_noop_and_random_policies_stay_under_the_floor(tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    noop = [rollout(FAMILY.instance(tools, seed, difficulty), noop_policy).reward for seed in range(50)]
    chance = [rollout(FAMILY.instance(tools, seed, difficulty), random_policy(seed)).reward for seed in range(50)]
    assert statistics.fmean(noop) < 0.3 and statistics.fmean(chance) < 0.3


def test_error_kinds_fit_each_tool_set() -> None:
    kinds = {name: collections.Counter(FAMILY.instance(tools, seed, 1).plan.kind for seed in range(200)) for name, tools in TOOL_SETS.items()}
    assert set(kinds["airline"]) == {"not_found", "date_format", "enum_value", "transient"}
    assert set(kinds["retail"]) == {"not_found", "transient"}  # no dates, no enums there
    hard = {FAMILY.instance(tools, seed, 2).plan.kind for tools in TOOL_SETS.values() for seed in range(100)}
    assert "transient" not in hard  # difficulty 2 chains a schema-fitting kind with a rate limit


# -- every documented partial behaviour gets exactly its reward -----------------------------------


@pytest.mark.parametrize("difficulty", FAMILY.levels)
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_documented_reward_levels(tool_set: str, difficulty: int) -> None:
    tools = TOOL_SETS[tool_set]
    for seed in SEEDS:
        instance = FAMILY.instance(tools, seed, difficulty)
        plan = instance.plan
        solution = instance.solution()
        first, calls, final = solution[0], solution[:-1], solution[-1]
        right = assistant_call(plan.tool.name, plan.expected)
        report = assistant_text("Sorry, the system returned an error and I could not complete this.")
        cases = {
            "fixed_and_answered": (solution, 1.0),
            "fixed_no_final_answer": (calls, REWARDS["fixed_no_final_answer"]),
            "gave_up_reporting_error": ([first, report], REWARDS["gave_up_reporting_error"]),
            "gave_up_silently": ([first, assistant_text("Done.")], REWARDS["no_fix"]),
            "report_without_any_call": ([report], REWARDS["no_fix"]),
            "nothing": ([], REWARDS["no_fix"]),
            "empty_arguments": ([assistant_call(plan.tool.name, {}), report], REWARDS["no_fix"]),
        }
        if plan.kind != "transient":
            cases["repeated_failing_call"] = ([first, first, *calls[1:], final], REWARDS["repeated_failing_call"])
            cases["repeat_then_report"] = ([first, first, report], REWARDS["repeated_failing_call"])
        if plan.kind == "not_found":
            wrong_id = {**plan.expected, plan.param: plan.expected[plan.param] + "7"}
            cases["guessing_another_id"] = ([first, assistant_call(plan.tool.name, wrong_id), report], REWARDS["gave_up_reporting_error"])
        if plan.kind in ("date_format", "enum_value") and difficulty == 1:
            cases["error_avoided"] = ([right, final], 1.0)
        if difficulty == 2:
            cases["fixed_but_not_retried"] = ([*calls[:-1], report], REWARDS["gave_up_reporting_error"])
        # a call that gets past the error but carries a wrong value; sent until the backend executes it
        sends = 1 + plan.transients - (1 if plan.kind == "transient" else 0)
        wrong = perturbed(instance)
        if wrong is not None:
            wrong_calls = [assistant_call(plan.tool.name, wrong)] * sends
            cases["wrong_call_executed"] = ([first, *wrong_calls, *calls[1:], final], REWARDS["wrong_call_executed"])
        if plan.kind == "enum_value":
            other = next(option for option in properties(plan.tool)[plan.param]["enum"] if option != plan.expected[plan.param])
            wrong_calls = [assistant_call(plan.tool.name, {**plan.expected, plan.param: other})] * sends
            cases["wrong_enum_value"] = ([first, *wrong_calls, *calls[1:], final], REWARDS["wrong_call_executed"])
        for case, (messages, expected) in cases.items():
            got = play(FAMILY.instance(tools, seed, difficulty), messages)
            assert got == expected, (tool_set, difficulty, seed, plan.kind, case, got)


def test_rewards_are_documented_in_the_class_docstring() -> None:
    doc = ErrorRecoveryFamily.__doc__ or ""
    for key, value in REWARDS.items():
        assert re.search(rf"{value}\s+``{key}``", doc), key
    assert max(REWARDS.values()) == 1.0 and FAMILY.levels == (1, 2)
    assert FAMILY.name == FAMILY.capability == "error_recovery"


# -- the simulated backend ------------------------------------------------------------------------


@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_errors_say_how_to_fix_the_call(tool_set: str) -> None:
    seen = set()
    for seed in range(80):
        instance = FAMILY.instance(TOOL_SETS[tool_set], seed, 1)
        plan = instance.plan
        opening = instance.reset()
        assert [m["role"] for m in opening] == ["system", "user"]
        for value in plan.naive.values():  # the user gives every value, in their own words
            assert (value if isinstance(value, str) else json.dumps(value)) in opening[1]["content"]
        error = json.loads(instance.step(instance.solution()[0]).messages[0]["content"])
        assert set(error) >= {"error", "code"}
        if plan.kind == "not_found":
            assert f"did you mean {plan.expected[plan.param]}?" in error["error"] and error["code"] == "not_found"
        elif plan.kind == "date_format":
            assert "YYYY-MM-DD" in error["error"]
        elif plan.kind == "enum_value":
            assert all(option in error["error"] for option in properties(plan.tool)[plan.param]["enum"])
        else:
            assert error["code"] == "rate_limited" and "retry" in error["error"]
        seen.add(plan.kind)
        result = instance.step(instance.solution()[1]).messages[0]
        assert "error" not in json.loads(result["content"])
    assert "not_found" in seen and "transient" in seen


def test_the_executed_result_is_a_record_and_unknown_ids_fail() -> None:
    tools = TOOL_SETS["retail"]
    seed = next(seed for seed in range(100) if FAMILY.instance(tools, seed, 1).plan.tool.name == "find_order")
    instance = FAMILY.instance(tools, seed, 1)
    instance.reset()
    for message in instance.solution()[:-1]:
        last = instance.step(message).messages[0]
    record = json.loads(last["content"])
    assert record["order_number"] == instance.plan.expected["order_number"] and "status" in record
    missing = json.loads(instance.step(assistant_call("find_order", {"order_number": "O-00000"})).messages[0]["content"])
    assert "error" not in missing  # the task's read already succeeded and answers again
    other = FAMILY.instance(tools, seed, 1)
    other.reset()
    unknown = json.loads(other.step(assistant_call("list_order_items", {"order_number": "O-00000"})).messages[0]["content"])
    assert unknown["code"] == "not_found"


def test_unusable_and_bad_difficulty() -> None:
    for tools in TOOL_SETS.values():
        assert FAMILY.unusable(tools) is None
    assert isinstance(FAMILY.unusable([]), str)
    with pytest.raises(ValueError):
        FAMILY.instance([], 1)
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
    "bare_string": "cancel it please",
    "empty_message": {"role": "assistant", "content": ""},
    "no_content": {"role": "assistant"},
    "arguments_not_an_object": None,  # filled per instance below
    "arguments_not_json": None,
    "unknown_tool": {"role": "assistant", "content": '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'},
    "content_parts": {"role": "assistant", "content": [{"type": "text", "text": "<tool_call>{oops</tool_call>"}]},
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
def test_malformed_output_scores_low_without_exceptions(tool_set: str, case: str) -> None:
    tools = TOOL_SETS[tool_set]
    instance = FAMILY.instance(tools, 8, 2)
    name = instance.plan.tool.name
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
        assert system["role"] == "system"
        listing = system["content"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        declared = [json.loads(line) for line in listing]
        assert declared == [tool.to_openai()["function"] for tool in tools]
        assert not any(f'"name":"{tool.name}"' in system["content"] for tool in other)


# -- determinism across processes ------------------------------------------------------------------

TRANSCRIPT = """
import json, sys
from pathlib import Path
from trainer.environment import load_tools, rollout, solution_policy
from trainer.families.error_recovery import ErrorRecoveryFamily

def transcript(tool_set, seed, difficulty):
    tools = load_tools(json.loads((Path({fixtures!r}) / f"{{tool_set}}.json").read_text()))
    instance = ErrorRecoveryFamily().instance(tools, seed, difficulty)
    result = rollout(instance, solution_policy(instance))
    return json.dumps({{"messages": result.messages, "reward": result.reward, "events": result.events}}, sort_keys=True)
"""


def test_transcripts_are_identical_in_another_process() -> None:
    namespace: dict[str, Any] = {}
    exec(TRANSCRIPT.format(fixtures=str(FIXTURES)), namespace)  # noqa: S102 - the same code both sides
    cases = [(tool_set, seed, difficulty) for tool_set in sorted(TOOL_SETS) for seed in (0, 1, 2, 17) for difficulty in FAMILY.levels]
    script = TRANSCRIPT.format(fixtures=str(FIXTURES)) + f"\nprint(json.dumps([transcript(*case) for case in {cases!r}]))"
    assert json.loads(run_in_another_process(script)) == [namespace["transcript"](*case) for case in cases]
