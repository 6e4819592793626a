"""examples/traffic.py: seeded agent trajectories with planted capability gaps, and their delivery over OTLP."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any

import jsonschema
import pytest

from examples.traffic import (
    CAPABILITIES,
    LACKING,
    NA,
    PRESENT,
    STATE_CHANGING_PREFIXES,
    SYSTEM_INSTRUCTIONS,
    TOOLS,
    Gap,
    GapProfile,
    TrajectoryPlan,
    generate,
    main,
    send,
    summarize,
)

TOOLS_BY_NAME = {tool["name"]: tool for tool in TOOLS}
VALIDATORS = {tool["name"]: jsonschema.Draft202012Validator(tool["parameters"]) for tool in TOOLS}
ID = re.compile(r"U-\d{4}|R-\d{5}|PM-\d{4}|SW\d{3,4}")
AMOUNT = re.compile(r"\$(\d+\.\d{2})")
CONFIRMATION_WORDS = re.compile(
    r"(?<![a-z])(yes|yeah|yep|confirm|go ahead|proceed|please do|do it|sure|ok|okay|correct|that's right)(?![a-z])"
)
# Every capability lacks often, in both outcomes, so that the combinations get exercised.
BUSY = GapProfile.of({name: (0.5, 0.25) for name in CAPABILITIES})


@pytest.fixture(scope="module")
def busy_plans() -> list[TrajectoryPlan]:
    return generate(1000, seed=11, failure_rate=0.4, gaps=BUSY)


@pytest.fixture(scope="module")
def default_plans() -> list[TrajectoryPlan]:
    return generate(1000, seed=5, failure_rate=0.4)


# --- reference rules: what each lack looks like in the transcript ----------------------------


def _text(message: dict[str, Any]) -> str:
    return "\n".join(part["content"] for part in message["parts"] if part["type"] == "text")


def _tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for part in message["parts"] if part["type"] == "tool_call"]


def _leaves(value: Any, key: str = ""):
    if isinstance(value, dict):
        for inner_key, inner in value.items():
            yield from _leaves(inner, inner_key)
    elif isinstance(value, list):
        for inner in value:
            yield from _leaves(inner, key)
    else:
        yield key, value


def _valid(arguments: dict[str, Any], name: str) -> bool:
    return name in VALIDATORS and VALIDATORS[name].is_valid(arguments)


def _key(call) -> str:
    return call.name + json.dumps(call.arguments, sort_keys=True)


def reference_labels(plan: TrajectoryPlan) -> dict[str, str]:
    calls = plan.calls
    labels: dict[str, str] = {}

    # tool_call_precision: an unknown tool, or arguments that fail the tool's JSON schema
    labels["tool_call_precision"] = PRESENT
    for call in calls:
        if not _valid(call.arguments, call.name):
            labels["tool_call_precision"] = LACKING

    # argument_grounding: an id argument seen in no user turn or tool result before the call
    labels["argument_grounding"] = PRESENT
    seen = SYSTEM_INSTRUCTIONS
    for message in plan.messages:
        if message["role"] == "user":
            seen += _text(message)
        elif message["role"] == "tool":
            seen += json.dumps(message["parts"][0]["response"])
        for part in _tool_calls(message):
            for _, value in _leaves(part["arguments"]):
                if isinstance(value, str) and ID.fullmatch(value) and value not in seen:
                    labels["argument_grounding"] = LACKING

    # precondition_verification: each write needs a read of the same reservation, then a "Yes..." turn
    writes = [call for call in calls if call.name.startswith(STATE_CHANGING_PREFIXES)]
    labels["precondition_verification"] = NA if not writes else PRESENT
    for write in writes:
        reads = [
            call
            for call in calls
            if call.name == "get_reservation"
            and not call.failed
            and call.message_index < write.message_index
            and call.arguments.get("reservation_id") == write.arguments.get("reservation_id")
        ]
        confirmed = reads and any(
            message["role"] == "user" and _text(message).startswith("Yes")
            for message in plan.messages[reads[-1].message_index : write.message_index]
        )
        if not confirmed:
            labels["precondition_verification"] = LACKING

    # error_recovery: after a failing call, the identical call fails again (or nothing works after)
    failed = [index for index, call in enumerate(calls) if call.failed]
    labels["error_recovery"] = NA if not failed else PRESENT
    for index in failed:
        after = calls[index + 1 :]
        if not any(not call.failed for call in after) or (
            after and after[0].failed and _key(after[0]) == _key(calls[index])
        ):
            labels["error_recovery"] = LACKING

    # multi_step_completion: three identical calls in a row, or no final answer
    keys = [_key(call) for call in calls]
    loops = any(keys[i] == keys[i + 1] == keys[i + 2] for i in range(len(keys) - 2))
    labels["multi_step_completion"] = LACKING if loops or plan.final_answer is None else PRESENT

    # structured_data_reasoning: every $ amount the agent states is a record value or a per-key sum
    stated = [
        float(amount)
        for message in plan.messages
        if message["role"] == "assistant"
        for amount in AMOUNT.findall(_text(message))
    ]
    if not stated:
        labels["structured_data_reasoning"] = NA
    else:
        numbers: set[float] = set()
        sums: Counter[str] = Counter()
        for call in calls:
            if call.result is None:
                continue
            for key, value in _leaves(call.result):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    numbers.add(round(float(value), 2))
                    sums[key] += value
        numbers |= {round(value, 2) for value in sums.values()}
        ok = all(any(abs(amount - known) < 0.005 for known in numbers) for amount in stated)
        labels["structured_data_reasoning"] = PRESENT if ok else LACKING
    return labels


# --- determinism and the gap frequencies ------------------------------------------------------


def test_same_seed_gives_the_same_plans():
    first = [plan.to_dict() for plan in generate(80, seed=3, failure_rate=0.3)]
    again = [plan.to_dict() for plan in generate(80, seed=3, failure_rate=0.3)]
    other = [plan.to_dict() for plan in generate(80, seed=4, failure_rate=0.3)]
    assert first == again
    assert first != other
    assert len({plan["trace_id"] for plan in first}) == 80
    assert all(re.fullmatch(r"[0-9a-f]{32}", plan["trace_id"]) for plan in first)


def test_exact_failure_count_and_all_scenarios(default_plans):
    assert sum(plan.outcome == "failure" for plan in default_plans) == 400
    assert set(Counter(plan.scenario for plan in default_plans)) == {
        "cancel_reservation", "change_flight", "price_total", "baggage_fees", "earlier_flight",
    }  # fmt: skip


@pytest.mark.parametrize("fixture", ["default_plans", "busy_plans"])
def test_configured_gap_frequencies_are_realized(fixture, request):
    plans = request.getfixturevalue(fixture)
    profile = GapProfile.default() if fixture == "default_plans" else BUSY
    for name in CAPABILITIES:
        gap = profile[name]
        for outcome, p in (("failure", gap.failed), ("success", gap.successful)):
            group = [plan for plan in plans if plan.outcome == outcome]
            rate = sum(plan.labels[name] == LACKING for plan in group) / len(group)
            tolerance = 4 * math.sqrt(p * (1 - p) / len(group)) + 0.01
            assert abs(rate - p) <= tolerance, (name, outcome, rate, p)


def test_needed_rates_do_not_depend_on_the_outcome(default_plans):
    """Where a capability has no gap, failed and successful runs need it equally often."""
    for name in ("tool_call_precision", "argument_grounding", "multi_step_completion", "structured_data_reasoning"):
        rates = []
        for outcome in ("failure", "success"):
            group = [plan for plan in default_plans if plan.outcome == outcome]
            rates.append(sum(plan.labels[name] != NA for plan in group) / len(group))
        assert abs(rates[0] - rates[1]) < 0.1, (name, rates)


# --- each lack shows exactly where it was planned ---------------------------------------------


@pytest.mark.parametrize("fixture", ["default_plans", "busy_plans"])
def test_labels_match_the_transcripts(fixture, request):
    for plan in request.getfixturevalue(fixture):
        assert reference_labels(plan) == plan.labels, (plan.index, plan.scenario, plan.realization)


def test_lacking_patterns(busy_plans):
    seen_variants: Counter[tuple[str, str]] = Counter()
    for plan in busy_plans:
        assert set(plan.realization) == plan.lacking
        calls = plan.calls
        for name, variant in plan.realization.items():
            seen_variants[(name, variant)] += 1
            if name == "tool_call_precision":
                invalid = {
                    _key(call)
                    for call in calls
                    if not _valid(call.arguments, call.name)
                }
                assert len(invalid) == 1
                bad = [call for call in calls if _key(call) in invalid]
                if variant == "wrong_type":
                    assert not any(call.failed for call in bad)
                    assert any(isinstance(value, str) and value in ("true", "false") or str(value).isdigit()
                               for call in bad for value in call.arguments.values())  # fmt: skip
                else:
                    assert all(call.failed for call in bad)
                    expected = "ToolNotFound" if variant == "unknown_tool" else "ValidationError"
                    assert {call.error_type for call in bad} == {expected}
            elif name == "argument_grounding":
                assert variant == "fabricated_reservation_id"
            elif name == "precondition_verification":
                write = next(call for call in calls if call.name.startswith(STATE_CHANGING_PREFIXES))
                reads = [c for c in calls if c.name == "get_reservation" and c.message_index < write.message_index]
                if variant == "no_read":
                    assert not reads
                else:
                    assert variant == "no_confirmation"
                    assert reads
                    between = plan.messages[reads[-1].message_index : write.message_index]
                    assert not any(message["role"] == "user" for message in between)
            elif name == "error_recovery":
                failing = [index for index, call in enumerate(calls) if call.failed]
                assert len(failing) == 2 and failing[1] == failing[0] + 1
                assert _key(calls[failing[0]]) == _key(calls[failing[1]])
                assert not calls[failing[1] + 1].failed
            elif name == "multi_step_completion":
                if variant == "truncated":
                    assert plan.final_answer is None and plan.messages[-1]["role"] == "tool"
                else:
                    keys = [_key(call) for call in calls]
                    runs = [i for i in range(len(keys) - 2) if keys[i] == keys[i + 1] == keys[i + 2]]
                    assert len(runs) == 1 and not any(calls[runs[0] + k].failed for k in range(3))
                    assert plan.final_answer
            elif name == "structured_data_reasoning":
                assert variant == "wrong_amount"
                assert AMOUNT.search(plan.final_answer or "")
    for expected in [
        ("tool_call_precision", "wrong_type"), ("tool_call_precision", "unknown_tool"),
        ("tool_call_precision", "missing_required"), ("argument_grounding", "fabricated_reservation_id"),
        ("precondition_verification", "no_read"), ("precondition_verification", "no_confirmation"),
        ("error_recovery", "identical_retry"), ("multi_step_completion", "loop"),
        ("multi_step_completion", "truncated"), ("structured_data_reasoning", "wrong_amount"),
    ]:  # fmt: skip
        assert seen_variants[expected] >= 5, expected


def test_clean_trajectories_validate_against_the_tool_schemas(busy_plans):
    checked = 0
    for plan in busy_plans:
        if plan.labels["tool_call_precision"] == LACKING:
            continue
        for call in plan.calls:
            VALIDATORS[call.name].validate(call.arguments)
            checked += 1
    assert checked > 1000


def test_not_needed_means_not_there(busy_plans):
    for plan in busy_plans:
        assistant_text = " ".join(_text(m) for m in plan.messages if m["role"] == "assistant")
        if plan.labels["error_recovery"] == NA:
            assert not any(call.failed for call in plan.calls)
        if plan.labels["precondition_verification"] == NA:
            assert not any(call.name.startswith(STATE_CHANGING_PREFIXES) for call in plan.calls)
        if plan.labels["structured_data_reasoning"] == NA:
            assert "$" not in assistant_text
        else:  # the one amount claim is in the final answer
            assert len(AMOUNT.findall(assistant_text)) == 1 and AMOUNT.search(plan.final_answer or "")
        assert len(plan.calls) >= 2
        # the first user turn never reads like a confirmation
        assert not CONFIRMATION_WORDS.search(_text(plan.messages[0]).lower())


def test_clean_successful_trajectory_reads_like_an_agent(default_plans):
    plan = next(
        p for p in default_plans
        if p.scenario == "cancel_reservation" and not p.lacking and p.labels["structured_data_reasoning"] == PRESENT
        and p.labels["error_recovery"] == NA
    )  # fmt: skip
    names = [call.name for call in plan.calls]
    assert names == ["get_user", "get_reservation", "cancel_reservation"]
    roles = [message["role"] for message in plan.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    assert _text(plan.messages[6]).startswith("Yes")
    refund = plan.calls[-1].result["refund_amount"]
    assert f"${refund:.2f}" in plan.final_answer
    assert len(plan.durations_ms) == len(plan.messages)


# --- the API around the plans -----------------------------------------------------------------


def test_gap_profile_parsing():
    profile = GapProfile.parse("precondition_verification=0.7:0.05, error_recovery=0.5:0.1")
    assert profile["precondition_verification"] == Gap(0.7, 0.05)
    assert profile["error_recovery"] == Gap(0.5, 0.1)
    assert profile["tool_call_precision"] == Gap(0.05, 0.05)
    assert GapProfile.parse("default") == GapProfile.default()
    assert GapProfile.default()["error_recovery"] == Gap(0.6, 0.05)
    assert GapProfile.parse("none") == GapProfile.noise()
    with pytest.raises(ValueError):
        GapProfile.parse("telepathy=0.5:0.1")
    with pytest.raises(ValueError):
        GapProfile.parse("error_recovery=1.5:0.1")
    with pytest.raises(ValueError):
        GapProfile.parse("error_recovery=0.5")


def test_summary_is_the_ground_truth(busy_plans):
    summary = summarize(busy_plans, BUSY)
    assert summary.trajectories == 1000 and summary.failed == 400 and summary.successful == 600
    for name in CAPABILITIES:
        lacking = {plan.trace_id for plan in busy_plans if plan.labels[name] == LACKING}
        assert set(summary.trace_ids[name][LACKING]) == lacking
        counts = summary.capabilities[name]
        assert counts["lacking_failed"] + counts["lacking_successful"] == len(lacking)
        assert sum(counts["failed"].values()) == 400
    assert summary.gaps["precondition_verification"] == {"failed": 0.5, "successful": 0.25}
    json.dumps(summary.to_dict())


def test_cli_dry_run(capsys):
    code = main(["--dry-run", "--trajectories", "40", "--seed", "2", "--gaps", "error_recovery=0.9:0.0"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["trajectories"] == 40 and data["failed"] == 16
    assert data["capabilities"]["error_recovery"]["lacking_successful"] == 0
    assert len(data["trace_ids"]["error_recovery"][LACKING]) == data["capabilities"]["error_recovery"]["lacking_failed"]


# --- end to end through a real daemon ---------------------------------------------------------


def test_sends_to_a_real_daemon_over_http(daemon):
    plans = generate(30, seed=21, failure_rate=0.4)
    summary = send(plans, daemon.http_url, "http/protobuf", "log")
    assert summary.exported_spans == summary.spans > 30 * 5
    assert summary.exported_logs == summary.logs == 30
    status = daemon.wait_assembled()
    assert status["counts"]["trajectories"] == 30, (status["counts"], status["ingest"])
    assert status["outcomes"]["success"] + status["outcomes"]["failure"] == 30
    assert status["outcomes"]["failure"] == sum(plan.outcome == "failure" for plan in plans) == 12
    assert status["counts"]["tool_calls"] == sum(len(plan.calls) for plan in plans)


def test_sends_over_grpc_with_the_outcome_as_an_attribute(daemon):
    plans = generate(12, seed=22, failure_rate=0.5)
    summary = send(plans, daemon.grpc_endpoint, "grpc", "attribute")
    assert summary.exported_spans == summary.spans and summary.logs == 0
    status = daemon.wait_assembled()
    assert status["counts"]["trajectories"] == 12, (status["counts"], status["ingest"])
    assert status["outcomes"]["failure"] == 6 and status["outcomes"]["success"] == 6
