"""Outcomes of trajectories, from the evidence agents and evaluators send (DESIGN.md section 3):
gen_ai.evaluation.result log records or span events, then root-span tracefix.outcome / tracefix.reward,
else unknown."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import RunningDaemon, make_daemon

from otlp_builders import (
    JSON,
    AgentRecorder,
    SpanExportResult,
    SpanKind,
    export_http,
    export_logs_grpc,
    export_logs_http,
    hex_span_id,
    hex_trace_id,
    json_bytes,
    json_log,
    json_logs,
    post,
    record_logs,
    send_sentinel_and_wait,
)

EVALUATION = "gen_ai.evaluation.result"


def _evaluation(label: str | None = None, score: float | None = None, name: str = "task_success") -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.evaluation.name": name}
    if label is not None:
        attributes["gen_ai.evaluation.score.label"] = label
    if score is not None:
        attributes["gen_ai.evaluation.score.value"] = score
    return attributes


@dataclass
class Outcomes:
    """The stopped daemon after every scenario was delivered, with what each delivery answered."""

    daemon: RunningDaemon
    trajectories: dict[str, str] = field(default_factory=dict)
    deliveries: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    view: dict[str, tuple] = field(default_factory=dict)

    def outcome(self, scenario: str) -> tuple:
        """(outcome, reward, outcome_source) of a scenario's trajectory."""
        return self.view[self.trajectories[scenario]]


def _run(
    recorder: AgentRecorder,
    root_attributes: dict[str, Any] | None = None,
    root_events: list[dict[str, Any]] | None = None,
    child_attributes: dict[str, Any] | None = None,
    conversation_id: str | None = None,
) -> list:
    """One agent run: a root span and one model call under it."""
    session = {"gen_ai.conversation.id": conversation_id} if conversation_id else {}
    root = recorder.start("invoke_agent solver", {**(root_attributes or {}), **session}, kind=SpanKind.SERVER)
    chat = recorder.start("chat small-model", {"gen_ai.operation.name": "chat", **(child_attributes or {}), **session}, parent=root)
    recorder.end(chat)
    for event in root_events or []:
        root.add_event(EVALUATION, event, timestamp=recorder.tick())
    recorder.end(root)
    return recorder.take()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcomes]:
    daemon = make_daemon(tmp_path_factory.mktemp("outcomes")).start()
    result = Outcomes(daemon)
    recorder = AgentRecorder("solver-agent")
    try:
        # An evaluator that reports before the agent's spans arrive.
        early = _run(recorder)
        result.trajectories["evaluation before spans"] = hex_trace_id(early[0])
        early_evaluation = {"event_name": EVALUATION, "attributes": _evaluation("pass"), "trace_id": hex_trace_id(early[0])}
        result.deliveries["early evaluation"] = export_logs_http(daemon, record_logs("evaluator", [early_evaluation]))

        runs: dict[str, list] = {
            "log event_name": _run(recorder),
            "log event.name attribute": _run(recorder),
            "log over grpc": _run(recorder),
            "span event": _run(recorder, root_events=[_evaluation("incorrect", 0.0)]),
            "root outcome success": _run(recorder, {"tracefix.outcome": "success"}),
            "root outcome failure": _run(recorder, {"tracefix.outcome": "FAILURE"}),
            "reward 0.5": _run(recorder, {"tracefix.reward": 0.5}),
            "reward 1.0": _run(recorder, {"tracefix.reward": 1.0}),
            "evaluation fail beats root success": _run(recorder, {"tracefix.outcome": "success", "tracefix.reward": 1.0}),
            "span event pass beats root reward 0": _run(recorder, {"tracefix.reward": 0.0}, root_events=[_evaluation("pass")]),
            "no evidence": _run(recorder),
            "outcome on a child span only": _run(recorder, child_attributes={"tracefix.outcome": "success"}),
            "score without label": _run(recorder),
            "latest evaluation wins": _run(recorder),
            "conversation turn 1": _run(recorder, conversation_id="conv-graded"),
            "conversation turn 2": _run(recorder, conversation_id="conv-graded"),
        }
        for scenario, spans in runs.items():
            result.trajectories[scenario] = hex_trace_id(spans[0])
            result.deliveries[scenario] = export_http(daemon, spans)
        result.deliveries["evaluation before spans"] = export_http(daemon, early)
        result.trajectories["conversation"] = "conv-graded"

        def trace_of(scenario: str) -> str:
            return result.trajectories[scenario]

        root_of_fail = next(span for span in runs["evaluation fail beats root success"] if span.parent is None)

        def graded(scenario: str, attributes: dict[str, Any], **extra: Any) -> dict[str, Any]:
            return {"event_name": EVALUATION, "attributes": attributes, "trace_id": trace_of(scenario), **extra}

        sdk_logs = record_logs(
            "evaluator",
            [
                graded("log event_name", _evaluation("pass", 1.0)),
                graded("evaluation fail beats root success", _evaluation("fail"), span_id=hex_span_id(root_of_fail)),
                graded("score without label", _evaluation(score=1.0)),
                graded("latest evaluation wins", _evaluation("fail"), timestamp=recorder.tick()),
                graded("latest evaluation wins", _evaluation("pass"), timestamp=recorder.tick()),
                # An unrelated event on a trajectory decides nothing.
                graded(
                    "no evidence",
                    {"gen_ai.evaluation.score.label": "pass"},
                    event_name="gen_ai.client.inference.operation.details",
                ),
            ],
        )
        result.deliveries["sdk logs"] = export_logs_http(daemon, sdk_logs)
        result.deliveries["grpc logs"] = export_logs_grpc(
            daemon, record_logs("evaluator", [graded("log over grpc", _evaluation("Correct"))])
        )
        json_records = [
            # No eventName field: the event is named by its `event.name` attribute.
            json_log(
                attributes={"event.name": EVALUATION, **_evaluation("FAIL", 0.2)},
                trace_id=trace_of("log event.name attribute"),
            ),
            # No trace context at all: graded by conversation.
            json_log(event_name=EVALUATION, attributes={"gen_ai.conversation.id": "conv-graded", **_evaluation("resolved")}),
        ]
        result.deliveries["json logs"] = post(f"{daemon.http_url}/v1/logs", json_bytes(json_logs(json_records, "evaluator")), JSON)
        send_sentinel_and_wait(daemon)
        result.status = daemon.status()
    finally:
        daemon.stop()
    result.view = {
        row[0]: tuple(row[1:])
        for row in daemon.query("SELECT trajectory_id, outcome, reward, outcome_source FROM trajectory_outcomes")
    }
    yield result


def test_every_scenario_was_delivered(outcomes: Outcomes) -> None:
    for name, delivery in outcomes.deliveries.items():
        if isinstance(delivery, SpanExportResult):
            assert delivery is SpanExportResult.SUCCESS, name
        elif hasattr(delivery, "status_code"):
            assert delivery.status_code == 200, (name, delivery.text)
        else:
            assert delivery.name == "SUCCESS", name


def test_evaluation_log_record_with_event_name_field_decides_success(outcomes: Outcomes) -> None:
    assert outcomes.outcome("log event_name") == ("success", 1.0, "evaluation")


def test_evaluation_log_record_named_by_event_name_attribute_decides_failure(outcomes: Outcomes) -> None:
    # Labels match case-insensitively; the score travels along as the reward.
    assert outcomes.outcome("log event.name attribute") == ("failure", 0.2, "evaluation")


def test_evaluation_log_record_over_grpc_decides_the_outcome(outcomes: Outcomes) -> None:
    assert outcomes.outcome("log over grpc") == ("success", None, "evaluation")


def test_evaluation_span_event_decides_the_outcome(outcomes: Outcomes) -> None:
    assert outcomes.outcome("span event") == ("failure", 0.0, "evaluation")


def test_evaluation_score_without_label_is_judged_by_the_success_threshold(outcomes: Outcomes) -> None:
    assert outcomes.outcome("score without label") == ("success", 1.0, "evaluation")


@pytest.mark.parametrize(("scenario", "expected"), [("root outcome success", "success"), ("root outcome failure", "failure")])
def test_root_span_tracefix_outcome_decides_without_an_evaluation(outcomes: Outcomes, scenario: str, expected: str) -> None:
    outcome, _, source = outcomes.outcome(scenario)
    assert (outcome, source) == (expected, "attribute")


@pytest.mark.parametrize(("scenario", "expected"), [("reward 0.5", ("failure", 0.5)), ("reward 1.0", ("success", 1.0))])
def test_root_span_tracefix_reward_is_success_only_at_one(outcomes: Outcomes, scenario: str, expected: tuple) -> None:
    assert outcomes.outcome(scenario) == (*expected, "attribute")


def test_evaluation_log_beats_the_root_span_outcome_attribute(outcomes: Outcomes) -> None:
    assert outcomes.outcome("evaluation fail beats root success")[::2] == ("failure", "evaluation")


def test_evaluation_span_event_beats_the_root_span_reward(outcomes: Outcomes) -> None:
    assert outcomes.outcome("span event pass beats root reward 0")[::2] == ("success", "evaluation")


def test_latest_evaluation_of_a_trajectory_wins(outcomes: Outcomes) -> None:
    assert outcomes.outcome("latest evaluation wins")[::2] == ("success", "evaluation")


def test_trajectory_without_any_evidence_is_unknown(outcomes: Outcomes) -> None:
    assert outcomes.outcome("no evidence") == ("unknown", None, None)


def test_outcome_attribute_on_a_child_span_is_not_evidence(outcomes: Outcomes) -> None:
    assert outcomes.outcome("outcome on a child span only") == ("unknown", None, None)


def test_evaluation_that_arrives_before_its_spans_is_applied_once_they_arrive(outcomes: Outcomes) -> None:
    assert outcomes.outcome("evaluation before spans")[::2] == ("success", "evaluation")


def test_evaluation_log_carrying_only_a_conversation_id_grades_that_conversation(outcomes: Outcomes) -> None:
    turns = {outcomes.trajectories["conversation turn 1"], outcomes.trajectories["conversation turn 2"]}
    assert not turns & set(outcomes.view)  # both traces joined the conversation's trajectory
    assert outcomes.outcome("conversation")[::2] == ("success", "evaluation")


def test_status_counts_each_outcome_like_the_view(outcomes: Outcomes) -> None:
    by_outcome: dict[str, int] = {}
    for outcome, _, _ in outcomes.view.values():
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
    assert outcomes.status["outcomes"] == {name: by_outcome.get(name, 0) for name in ("success", "failure", "unknown")}
    assert outcomes.status["counts"]["trajectories"] == len(outcomes.view)
    # 17 scenario trajectories (two traces share one) and the sentinel.
    assert len(outcomes.view) == 17
