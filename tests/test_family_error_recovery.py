"""The error_recovery family: the first call fails with an actionable error, on two different tool sets
(what every family promises is in ``test_family_contract``)."""

from __future__ import annotations

import collections
import json

import pytest

from tracefix.trainer.environment import assistant_call, assistant_text
from tracefix.trainer.families.error_recovery import ErrorRecoveryFamily
from tracefix.trainer.schema_values import id_parameters, properties

from tests.family_support import TOOL_SETS, assert_each_case_earns, cases, perturbed, solved

FAMILY = ErrorRecoveryFamily()
REWARDS = FAMILY.rewards
SEEDS = range(0, 200, 7)  # the seeds the partial-behaviour cases run on


# -- the solution --------------------------------------------------------------------------------


@pytest.mark.parametrize(("tool_set", "difficulty"), cases(FAMILY))
def test_solution_scores_one_on_200_seeds(tool_set: str, difficulty: int) -> None:
    for _, result in solved(FAMILY, tool_set, difficulty):
        errors = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"][:-1]
        assert errors and all(set(error) >= {"error", "code"} for error in errors)  # every call before the last failed
        assert len(errors) == (1 if difficulty == 1 else 2)


def test_error_kinds_fit_each_tool_set() -> None:
    kinds = {name: collections.Counter(FAMILY.instance(tools, seed, 1).plan.kind for seed in range(200)) for name, tools in TOOL_SETS.items()}
    assert set(kinds["airline"]) == {"not_found", "date_format", "enum_value", "transient"}
    assert set(kinds["retail"]) == {"not_found", "transient"}  # no dates, no enums there
    hard = {FAMILY.instance(tools, seed, 2).plan.kind for tools in TOOL_SETS.values() for seed in range(100)}
    assert "transient" not in hard  # difficulty 2 chains a schema-fitting kind with a rate limit


# -- every documented partial behaviour gets exactly its reward -----------------------------------


@pytest.mark.parametrize(("tool_set", "difficulty"), cases(FAMILY))
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
        wrong = perturbed(plan.tool, plan.expected, {*id_parameters(plan.tool), plan.param})
        if wrong is not None:
            wrong_calls = [assistant_call(plan.tool.name, wrong)] * sends
            cases["wrong_call_executed"] = ([first, *wrong_calls, *calls[1:], final], REWARDS["wrong_call_executed"])
        if plan.kind == "enum_value":
            other = next(option for option in properties(plan.tool)[plan.param]["enum"] if option != plan.expected[plan.param])
            wrong_calls = [assistant_call(plan.tool.name, {**plan.expected, plan.param: other})] * sends
            cases["wrong_enum_value"] = ([first, *wrong_calls, *calls[1:], final], REWARDS["wrong_call_executed"])
        assert_each_case_earns(FAMILY, tool_set, seed, difficulty, cases, plan.kind)


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


def test_an_unknown_difficulty_is_refused() -> None:
    with pytest.raises(ValueError):
        FAMILY.instance(TOOL_SETS["airline"], 1, 3)
