"""Contrastive statistics against hand-computed values, the trigger's hysteresis, and feedback.

The set (all sent as real OTLP to a running daemon):
- precondition_verification: failed runs 4 LACKING + 1 PRESENT + 2 NA; successful runs
  1 LACKING + 4 PRESENT. So ER- = 4/5, ER+ = 1/5, Δ = 0.6, coverage = 4/7 failed runs,
  failure rate among runs that need it = 5/10.
- error_recovery: the 2 read-only failed runs repeat a failing call (LACKING) and no other run
  has an error, so its gap is large but rests on 2 failures, under min_failures = 3: it must
  not fire.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RunningDaemon, make_daemon, wait_for
from tests.conversations import Call, Conversation, ConversationSender, Say, User

READ = Call("get_reservation", {"reservation_id": "R-1001"}, {"reservation_id": "R-1001", "status": "confirmed"})
CANCEL = Call("cancel_reservation", {"reservation_id": "R-1001"}, {"status": "cancelled"})
BROKEN = Call("get_reservation", {"reservation_id": "R1001"}, None, "reservation R1001 not found")


def careless(outcome: str) -> Conversation:
    return Conversation([User("Cancel R-1001."), CANCEL, Say("Cancelled.")], outcome)


def careful(outcome: str) -> Conversation:
    steps = [User("Cancel R-1001."), READ, Say("Shall I cancel R-1001?"), User("Yes, please do."), CANCEL, Say("Done.")]
    return Conversation(steps, outcome)


def read_only(outcome: str, error: bool = False) -> Conversation:
    steps = [User("Status of R-1001?"), *([BROKEN, BROKEN] if error else []), READ, Say("It is confirmed.")]
    return Conversation(steps, outcome)


SET = (
    [careless("failure")] * 4
    + [careful("failure")]
    + [read_only("failure", error=True)] * 2
    + [careless("success")]
    + [careful("success")] * 4
)


def wilson(successes: int, total: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = successes / total
    center = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return center - half, center + half


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, list[str]]]:
    directory: Path = tmp_path_factory.mktemp("analysis")
    daemon = make_daemon(
        directory,
        analysis={"interval_s": 0.4, "min_failures": 3},
        trigger={"hold_passes": 2},
    ).start()
    sender = ConversationSender(daemon.http_url)
    trace_ids = [sender.send(conversation) for conversation in SET]
    sender.close()
    daemon.wait_analyzed()
    yield daemon, trace_ids
    daemon.stop()


def capability(daemon: RunningDaemon, name: str) -> dict:
    return next(item for item in daemon.get("/api/capabilities")["items"] if item["name"] == name)


def test_statistics_match_hand_computed_values(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    stats = capability(daemon, "precondition_verification")["windows"]["all"]
    assert (stats["n_failure"], stats["n_success"], stats["n_unknown"]) == (7, 5, 0)
    assert (stats["needed_failure"], stats["lacking_failure"]) == (5, 4)
    assert (stats["needed_success"], stats["lacking_success"]) == (5, 1)
    assert stats["er_minus"] == pytest.approx(0.8)
    assert stats["er_plus"] == pytest.approx(0.2)
    assert stats["delta"] == pytest.approx(0.6)
    assert stats["coverage"] == pytest.approx(4 / 7)
    assert stats["failure_rate"] == pytest.approx(0.5)
    assert (stats["er_minus_low"], stats["er_minus_high"]) == pytest.approx(wilson(4, 5))
    assert (stats["er_plus_low"], stats["er_plus_high"]) == pytest.approx(wilson(1, 5))
    assert (stats["failure_rate_low"], stats["failure_rate_high"]) == pytest.approx(wilson(5, 10))
    # The same figures for the last 24 h: every trajectory ended a minute ago.
    assert capability(daemon, "precondition_verification")["windows"]["24h"]["delta"] == pytest.approx(0.6)


def test_gap_holds_then_fires_exactly_one_training_request(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    # Once detected, the synthesize job moves it on to "environment".
    wait_for(lambda: capability(daemon, "precondition_verification")["state"] in ("gap_detected", "environment"))
    item = capability(daemon, "precondition_verification")
    assert item["selected"] and item["rank"] == 1
    assert item["open_training_request"]["source"] == "trigger"
    # Several more passes: still one request.
    first_pass = daemon.status()["analysis"]["pass_id"]
    wait_for(lambda: daemon.status()["analysis"]["pass_id"] >= first_pass + 3)
    # The request is the agent's own track: its service's statistics selected the gap.
    requests = [r for r in daemon.get("/api/training_requests")["items"] if r["capability"].startswith("precondition_verification")]
    assert [r["capability"] for r in requests] == ["precondition_verification.support-agent"]
    assert item["state_agent"] == "support-agent" and [track["track"] for track in item["tracks"]] == ["precondition_verification.support-agent"]
    detail = daemon.get("/api/capabilities/precondition_verification")
    path = [(t["from_state"], t["to_state"]) for t in reversed(detail["transitions"])]
    # Statistics may wobble while trajectories stream in; the gap is detected once, from watching.
    assert [step for step in path if step[1] == "gap_detected"] == [("watching", "gap_detected")]
    assert path[-1] in (("watching", "gap_detected"), ("gap_detected", "environment"))
    detected = next(t for t in detail["transitions"] if t["to_state"] == "gap_detected")
    assert "Δ=" in detected["reason"] and detected["stats"]


def test_gap_under_min_failures_watches_but_does_not_fire(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    item = capability(daemon, "error_recovery")
    stats = item["windows"]["all"]
    assert (stats["needed_failure"], stats["lacking_failure"]) == (2, 2)
    assert stats["delta"] == pytest.approx(1.0)
    assert not item["selected"]
    assert item["state"] == "watching"
    assert "enough evidence" in item["state_reason"]
    assert item["open_training_request"] is None


def test_healthy_capabilities_are_not_selected(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    item = capability(daemon, "tool_call_precision")
    assert item["state"] == "healthy" and not item["selected"]
    assert item["windows"]["all"]["lacking_failure"] == 0


def test_feedback_overrides_the_attribute_outcome(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, trace_ids = analyzed
    target = trace_ids[-1]  # a successful careful run, by its root-span attribute
    assert daemon.get(f"/api/trajectories/{target}")["outcome"] == "success"
    token = (daemon.db_path.parent / "api.token").read_text().strip()
    body = {"trajectory_id": target, "outcome": "failure", "comment": "the user called back: not cancelled"}
    refused = httpx.post(f"{daemon.api_url}/api/feedback", json=body, timeout=10)
    assert refused.status_code == 401
    response = httpx.post(
        f"{daemon.api_url}/api/feedback", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert response.status_code == 201, response.text
    trajectory = daemon.get(f"/api/trajectories/{target}")
    assert (trajectory["outcome"], trajectory["outcome_source"]) == ("failure", "feedback")
    assert {e["source"] for e in trajectory["outcome_evidence"]} == {"attribute", "feedback"}
    # The next statistics pass counts it as a failure.
    wait_for(lambda: capability(daemon, "precondition_verification")["windows"]["all"]["n_failure"] == 8)


def test_feedback_for_an_unknown_trajectory_is_404_and_bad_bodies_422(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    token = (daemon.db_path.parent / "api.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    missing = httpx.post(
        f"{daemon.api_url}/api/feedback", json={"trajectory_id": "nope", "outcome": "success"}, headers=headers
    )
    assert missing.status_code == 404
    bad = httpx.post(
        f"{daemon.api_url}/api/feedback", json={"trajectory_id": "x", "outcome": "maybe"}, headers=headers
    )
    assert bad.status_code == 422


def test_manual_train_request_is_refused_while_one_is_open(analyzed: tuple[RunningDaemon, list[str]]) -> None:
    daemon, _ = analyzed
    token = (daemon.db_path.parent / "api.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    created = httpx.post(f"{daemon.api_url}/api/capabilities/tool_call_precision/train", headers=headers, json={})
    assert created.status_code == 202 and created.json()["source"] == "manual"
    again = httpx.post(f"{daemon.api_url}/api/capabilities/tool_call_precision/train", headers=headers, json={})
    assert again.status_code == 409
    unknown = httpx.post(f"{daemon.api_url}/api/capabilities/flying/train", headers=headers, json={})
    assert unknown.status_code == 404
