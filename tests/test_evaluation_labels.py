"""Your evaluators as labels: gen_ai.evaluation.result events mapped by [[capabilities.evaluations]]
become a capability's labels, with the evaluator's explanation and evidence span, and feed the
statistics, the selection and the trigger like any label; they never decide a run's outcome.

A real daemon receives real OTLP from the OpenTelemetry SDK: the agent's traces, evaluations as span
events of an evaluator's span and as log records, and one evaluation exported after its trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningDaemon, make_daemon, wait_for

from tracefix.daemon.core.settings import ConfigError, load_settings
from otlp_builders import (
    GET_ARGUMENTS,
    ORDER_RECORD,
    SUPPORT_CONVERSATION,
    AgentRecorder,
    Call,
    Conversation,
    Msg,
    export_http,
    export_logs_http,
    hex_span_id,
    hex_trace_id,
    record_conversation,
    record_logs,
    send_sentinel_and_wait,
)

EVALUATION = "gen_ai.evaluation.result"
POLICY_DESCRIPTION = "Follows the shop's refund and cancellation policy."
MAPPINGS = f"""
[[capabilities.evaluations]]
name = "policy_adherence"
capability = "policy_adherence"
description = "{POLICY_DESCRIPTION}"
lacking_labels = ["violated"]
present_labels = ["followed"]
na_labels = ["not_applicable"]

[[capabilities.evaluations]]
name = "verification_judge"
capability = "precondition_verification"
lacking_below = 0.5
"""
LOOKUP_ONLY = Conversation(
    messages=[
        Msg("user", "Where is my order A-1001?"),
        Msg("assistant", calls=(Call("call_1", "get_order", GET_ARGUMENTS),)),
        Msg("tool", ORDER_RECORD, tool_call_id="call_1"),
        Msg("assistant", "Your order A-1001 has shipped."),
    ]
)
FAILED_LACKING, SUCCESS_PRESENT, SUCCESS_LACKING, FAILED_NA = 8, 6, 2, 2


def _evaluation(name: str, label: str | None = None, score: float | None = None, explanation: str | None = None) -> dict:
    attributes: dict[str, Any] = {"gen_ai.evaluation.name": name}
    if label is not None:
        attributes["gen_ai.evaluation.score.label"] = label
    if score is not None:
        attributes["gen_ai.evaluation.score.value"] = score
    if explanation is not None:
        attributes["gen_ai.evaluation.explanation"] = explanation
    return attributes


@dataclass
class Scenario:
    trajectory_id: str
    evidence: str | None = None  # the span id an evaluation should point at


@dataclass
class Traffic:
    """The running daemon after every scenario was delivered and analyzed."""

    daemon: RunningDaemon
    scenarios: dict[str, Scenario] = field(default_factory=dict)
    before_late: dict[str, Any] = field(default_factory=dict)

    def trajectory(self, scenario: str) -> dict[str, Any]:
        return self.daemon.get(f"/api/trajectories/{self.scenarios[scenario].trajectory_id}")

    def label(self, scenario: str, capability: str) -> dict[str, Any]:
        labels = [label for label in self.trajectory(scenario)["labels"] if label["capability"] == capability]
        assert len(labels) == 1, labels
        return labels[0]


class Agent:
    """Records agent runs and the evaluators' verdicts on them, to be exported in one go."""

    def __init__(self) -> None:
        self.recorder = AgentRecorder("shop-agent")
        self.logs: list[dict[str, Any]] = []

    def run(
        self, outcome: str | None = None, conversation: Conversation = SUPPORT_CONVERSATION, conversation_id: str | None = None
    ) -> Any:
        attributes = {"tracefix.outcome": outcome} if outcome else None
        return record_conversation(
            self.recorder, "genai", conversation, conversation_id=conversation_id, root_attributes=attributes
        )

    def judged_by_span(self, root: Any, attributes: dict[str, Any]) -> str:
        """An evaluator's span in the run's trace carrying the evaluation as a span event; its id."""
        judge = self.recorder.start("evaluate run", parent=root)
        judge.add_event(EVALUATION, attributes, timestamp=self.recorder.tick())
        self.recorder.end(judge)
        return hex_span_id(judge)

    def judged_by_log(self, root: Any, attributes: dict[str, Any], span_id: str | None = None) -> str:
        """The evaluation as a log record in the run's trace context; the span id it carries."""
        span_id = span_id or hex_span_id(root)
        self.logs.append({"event_name": EVALUATION, "attributes": attributes, "trace_id": hex_trace_id(root), "span_id": span_id})
        return span_id

    def send(self, daemon: RunningDaemon) -> None:
        spans = self.recorder.take()
        if spans:
            assert export_http(daemon, spans).name == "SUCCESS"
        if self.logs:
            assert export_logs_http(daemon, record_logs("evaluator", self.logs)).name == "SUCCESS"
            self.logs = []


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    daemon = make_daemon(tmp_path_factory.mktemp("evaluations"), analysis={"interval_s": 0.3, "min_failures": 5})
    daemon.config_path.write_text(daemon.config_path.read_text() + MAPPINGS)
    daemon.start()
    result = Traffic(daemon)
    agent = Agent()
    try:
        # The contrast: failed runs judged "violated", successful ones mostly "followed".
        for index in range(FAILED_LACKING):
            root = agent.run("failure")
            verdict = _evaluation("policy_adherence", "Violated", explanation=f"cancelled against the policy (run {index})")
            if index % 2:
                evidence = agent.judged_by_log(root, verdict)
            else:
                evidence = agent.judged_by_span(root, verdict)
            result.scenarios[f"failed {index}"] = Scenario(hex_trace_id(root), evidence)
        for index in range(SUCCESS_PRESENT + SUCCESS_LACKING):
            root = agent.run("success")
            label = "FOLLOWED" if index < SUCCESS_PRESENT else "violated"
            verdict = _evaluation("policy_adherence", label, explanation="checked the order status first")
            if index % 2:
                agent.judged_by_span(root, verdict)
            else:
                agent.judged_by_log(root, verdict)
            result.scenarios[f"success {index}"] = Scenario(hex_trace_id(root))
        for index in range(FAILED_NA):
            root = agent.run("failure")
            agent.judged_by_span(root, _evaluation("policy_adherence", "not_applicable", explanation="no policy involved"))
            result.scenarios[f"failed not applicable {index}"] = Scenario(hex_trace_id(root))

        # Evidence on a tool span: the log record names the cancel_order call it judged.
        root = agent.run()
        tool = next(span for span in agent.recorder.finished() if span.name == "execute_tool cancel_order"
                    and hex_trace_id(span) == hex_trace_id(root))  # fmt: skip
        verdict = _evaluation("policy_adherence", "violated", explanation="cancelled a shipped order")
        result.scenarios["log on tool span"] = Scenario(hex_trace_id(root), agent.judged_by_log(root, verdict, hex_span_id(tool)))

        # A log record with no trace context, only the conversation id: it labels that conversation.
        agent.run(conversation_id="conv-judged")
        verdict = _evaluation("policy_adherence", "violated", explanation="refunded twice")
        agent.logs.append({"event_name": EVALUATION, "attributes": {"gen_ai.conversation.id": "conv-judged", **verdict}})
        result.scenarios["conversation"] = Scenario("conv-judged")

        # A built-in capability with a mapping: the judge's score where it arrived, the rule elsewhere.
        result.scenarios["rule only"] = Scenario(hex_trace_id(agent.run()))
        root = agent.run()
        evidence = agent.judged_by_span(root, _evaluation("verification_judge", score=0.5, explanation="read, then asked"))
        result.scenarios["judge at threshold"] = Scenario(hex_trace_id(root), evidence)
        root = agent.run(conversation=LOOKUP_ONLY)
        evidence = agent.judged_by_log(root, _evaluation("verification_judge", score=0.2, explanation="never verified"))
        result.scenarios["judge below threshold"] = Scenario(hex_trace_id(root), evidence)
        root = agent.run(conversation=LOOKUP_ONLY)
        agent.judged_by_log(root, _evaluation("verification_judge", label="unsure"))
        result.scenarios["judge undecided"] = Scenario(hex_trace_id(root))

        # Outcomes: a mapped evaluation's low score decides nothing; an unmapped one still does.
        root = agent.run("success")
        agent.judged_by_log(root, _evaluation("verification_judge", score=0.2))
        result.scenarios["mapped score on a success"] = Scenario(hex_trace_id(root))
        root = agent.run()
        agent.judged_by_span(root, _evaluation("verification_judge", score=0.0))
        result.scenarios["mapped score only"] = Scenario(hex_trace_id(root))
        root = agent.run()
        agent.judged_by_log(root, _evaluation("task_success", score=0.0))
        result.scenarios["unmapped score"] = Scenario(hex_trace_id(root))

        late = agent.run(conversation=LOOKUP_ONLY)
        result.scenarios["late"] = Scenario(hex_trace_id(late))
        agent.send(daemon)
        send_sentinel_and_wait(daemon)
        daemon.wait_analyzed()
        result.before_late = result.label("late", "policy_adherence")

        # The evaluator reports after the trace was assembled and labeled.
        result.scenarios["late"].evidence = agent.judged_by_log(
            late, _evaluation("policy_adherence", "violated", explanation="promised a refund the policy forbids")
        )
        agent.send(daemon)
        send_sentinel_and_wait(daemon)
        daemon.wait_analyzed()
        yield result
    finally:
        daemon.stop()


def test_evaluation_in_a_span_event_is_the_label_with_its_explanation_and_evaluator_span(traffic: Traffic) -> None:
    label = traffic.label("failed 0", "policy_adherence")
    assert label["label"] == "LACKING"
    assert label["reason"] == "policy_adherence: cancelled against the policy (run 0)"
    assert label["span_ids"] == [traffic.scenarios["failed 0"].evidence]
    assert label["labeler"] == "evaluations"


def test_evaluation_in_a_log_record_points_at_the_span_the_record_names(traffic: Traffic) -> None:
    label = traffic.label("log on tool span", "policy_adherence")
    assert (label["label"], label["reason"]) == ("LACKING", "policy_adherence: cancelled a shipped order")
    tool_span = traffic.scenarios["log on tool span"].evidence
    assert label["span_ids"] == [tool_span]
    tool_calls = traffic.trajectory("log on tool span")["tool_calls"]
    assert tool_span in {call["span_id"] for call in tool_calls if call["tool_name"] == "cancel_order"}


def test_evaluation_log_without_trace_context_labels_its_conversation(traffic: Traffic) -> None:
    label = traffic.label("conversation", "policy_adherence")
    assert (label["label"], label["reason"], label["span_ids"]) == ("LACKING", "policy_adherence: refunded twice", [])


def test_labels_match_case_insensitively(traffic: Traffic) -> None:
    assert traffic.label("success 0", "policy_adherence")["label"] == "PRESENT"  # "FOLLOWED" vs "followed"
    assert traffic.label("failed 1", "policy_adherence")["label"] == "LACKING"  # "Violated" vs "violated"
    assert traffic.label("failed not applicable 0", "policy_adherence")["label"] == "NA"


def test_capability_a_mapping_introduces_is_na_where_no_evaluation_arrived(traffic: Traffic) -> None:
    label = traffic.label("rule only", "policy_adherence")
    assert (label["label"], label["reason"]) == ("NA", "no policy_adherence evaluation arrived")


def test_late_evaluation_relabels_the_trajectory(traffic: Traffic) -> None:
    assert traffic.before_late["label"] == "NA"
    label = traffic.label("late", "policy_adherence")
    assert label["label"] == "LACKING"
    assert label["reason"] == "policy_adherence: promised a refund the policy forbids"
    assert label["span_ids"] == [traffic.scenarios["late"].evidence]


def test_statistics_of_the_mapped_capability_count_the_evaluations(traffic: Traffic) -> None:
    items = {item["name"]: item for item in traffic.daemon.get("/api/capabilities")["items"]}
    policy = items["policy_adherence"]
    assert policy["description"] == POLICY_DESCRIPTION
    assert policy["environment_family"] is None and not policy["builtin"]
    stats = policy["windows"]["all"]
    assert stats["needed_failure"] == FAILED_LACKING and stats["lacking_failure"] == FAILED_LACKING
    assert stats["needed_success"] == SUCCESS_PRESENT + SUCCESS_LACKING and stats["lacking_success"] == SUCCESS_LACKING
    assert stats["er_minus"] == pytest.approx(1.0)
    assert stats["er_plus"] == pytest.approx(SUCCESS_LACKING / (SUCCESS_PRESENT + SUCCESS_LACKING))
    # Every failed run counts in the coverage's denominator: the NA ones and the unmapped-score one.
    assert stats["coverage"] == pytest.approx(FAILED_LACKING / (FAILED_LACKING + FAILED_NA + 1))
    assert policy["selected"] is True


def test_selected_mapped_capability_triggers_one_training_request(traffic: Traffic) -> None:
    def requested() -> list[dict[str, Any]]:
        items = traffic.daemon.get("/api/training_requests")["items"]
        return [item for item in items if item["capability"] == "policy_adherence.shop-agent"]  # the agent's own track

    assert len(wait_for(requested, timeout_s=30)) == 1
    item = traffic.daemon.get("/api/capabilities/policy_adherence")
    assert item["state"] not in ("healthy", "watching") and item["state_agent"] == "shop-agent"


def test_dashboard_lists_the_lacking_runs_with_the_evaluators_reasons(traffic: Traffic) -> None:
    page = traffic.daemon.get("/api/trajectories", capability="policy_adherence", label="LACKING", limit=100)
    lacking = FAILED_LACKING + SUCCESS_LACKING + 3  # the tool-span run, the conversation and the late one
    assert page["total"] == lacking
    assert all(item["reason"].startswith("policy_adherence: ") for item in page["items"])
    with_evidence = [item for item in page["items"] if item["trajectory_id"] != "conv-judged"]
    assert all(len(item["span_ids"]) == 1 for item in with_evidence) and len(with_evidence) == lacking - 1


def test_mapped_score_overrides_the_rule_of_a_builtin_capability(traffic: Traffic) -> None:
    at_threshold = traffic.label("judge at threshold", "precondition_verification")
    assert (at_threshold["label"], at_threshold["reason"]) == ("PRESENT", "verification_judge: read, then asked")
    assert at_threshold["span_ids"] == [traffic.scenarios["judge at threshold"].evidence]
    below = traffic.label("judge below threshold", "precondition_verification")
    assert (below["label"], below["reason"]) == ("LACKING", "verification_judge: never verified")  # the rule says NA here
    without_explanation = traffic.label("mapped score on a success", "precondition_verification")
    assert (without_explanation["label"], without_explanation["reason"]) == (
        "LACKING", "verification_judge: score 0.2, below 0.5",
    )  # fmt: skip


def test_builtin_capability_falls_back_to_its_rule_where_no_evaluation_decides(traffic: Traffic) -> None:
    rule = traffic.label("rule only", "precondition_verification")
    # The rule's own verdict: the change (cancel order A-1001) is the one the user's message asked for,
    # and nothing says this agent's policy wants a separate yes, so that message authorizes it.
    assert rule["label"] == "PRESENT" and "as the user's own message stated" in rule["reason"]
    assert rule["labeler"] == "rules.precondition_verification" and "+evaluations." in rule["labeler_version"]
    undecided = traffic.label("judge undecided", "precondition_verification")  # label "unsure" is not mapped
    assert (undecided["label"], undecided["reason"]) == ("NA", "no state-changing tool was called")
    capability = traffic.daemon.get("/api/capabilities/precondition_verification")
    assert capability["builtin"] is True and capability["environment_family"] == "precondition_verification"


def test_mapped_evaluation_does_not_decide_the_outcome(traffic: Traffic) -> None:
    success = traffic.trajectory("mapped score on a success")
    assert (success["outcome"], success["outcome_source"]) == ("success", "attribute")
    only = traffic.trajectory("mapped score only")
    assert only["outcome"] == "unknown" and only["outcome_evidence"] == []
    unmapped = traffic.trajectory("unmapped score")  # the same score from an unmapped evaluation decides
    assert (unmapped["outcome"], unmapped["outcome_source"]) == ("failure", "evaluation")
    policy_failure = traffic.trajectory("failed 0")
    assert (policy_failure["outcome"], policy_failure["outcome_source"]) == ("failure", "attribute")


def test_mapping_to_a_capability_name_that_is_not_snake_case_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[capabilities.evaluations]]\nname = "policy_adherence"\ncapability = "Policy-Adherence"\n')
    with pytest.raises(ConfigError, match=r"capabilities\.evaluations\.0\.capability: .*not a snake_case name"):
        load_settings(config, environ={})
