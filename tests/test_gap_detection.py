"""A few hundred realistic trajectories with two planted gaps: the right capabilities are selected,
each real gap triggers exactly one training request, and the labels agree with the ground truth.

Traffic comes from examples/traffic.py (the demo agent's generator) over real OTLP; the daemon
runs with its default selection rule (Δ ≥ 0.20, coverage ≥ 0.10, ≥ 20 failures, 2 passes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.traffic import SERVICE_NAME, generate, send
from tests.conftest import REPO, RunningDaemon, make_daemon

GAPS = "precondition_verification=0.7:0.05,error_recovery=0.6:0.05"
PLANTED = {"precondition_verification", "error_recovery"}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, list]]:
    directory: Path = tmp_path_factory.mktemp("gaps")
    daemon = make_daemon(directory, analysis={"interval_s": 0.5}).start()
    plans = generate(300, seed=11, failure_rate=0.4, gaps=GAPS)
    send(plans, daemon.http_url, "http/protobuf", "log")
    daemon.wait_analyzed(timeout_s=60)
    yield daemon, plans
    daemon.stop()


def _capabilities(daemon: RunningDaemon) -> dict[str, dict]:
    return {item["name"]: item for item in daemon.get("/api/capabilities")["items"]}


def test_labels_agree_with_the_planted_ground_truth(loaded: tuple[RunningDaemon, list]) -> None:
    daemon, plans = loaded
    disagreements = []
    for plan in plans[:80]:
        labels = {label["capability"]: label["label"] for label in daemon.get(f"/api/trajectories/{plan.conversation_id}")["labels"]}
        for capability, expected in plan.labels.items():
            if labels.get(capability) != expected:
                disagreements.append((plan.conversation_id, capability, expected, labels.get(capability)))
    assert not disagreements, disagreements[:5]


def test_exactly_the_planted_gaps_are_selected(loaded: tuple[RunningDaemon, list]) -> None:
    daemon, _ = loaded
    items = _capabilities(daemon)
    selected = {name for name, item in items.items() if item["selected"]}
    assert selected == PLANTED
    for name in PLANTED:
        stats = items[name]["windows"]["all"]
        assert stats["delta"] >= 0.2 and stats["coverage"] >= 0.1 and stats["needed_failure"] >= 20
    # Ranked by coverage among the selected.
    ranked = sorted(PLANTED, key=lambda name: items[name]["rank"])
    coverages = [items[name]["windows"]["all"]["coverage"] for name in ranked]
    assert coverages == sorted(coverages, reverse=True)


def test_each_real_gap_triggers_one_training_request_and_gets_a_checked_environment(
    loaded: tuple[RunningDaemon, list],
) -> None:
    daemon, _ = loaded
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = {name: item["state"] for name, item in _capabilities(daemon).items()}
        if all(states[name] == "environment" for name in PLANTED):
            break
        time.sleep(0.3)
    passes = daemon.status()["analysis"]["pass_id"]
    while daemon.status()["analysis"]["pass_id"] < passes + 2:
        assert time.monotonic() < deadline + 30, "no two analysis passes after the gaps were found"
        time.sleep(0.2)
    requests = daemon.get("/api/training_requests")["items"]
    # One agent sent the traffic: each request is its own track of the capability (<capability>.<agent>).
    assert sorted(request["capability"] for request in requests) == sorted(f"{name}.{SERVICE_NAME}" for name in PLANTED)
    states = {name: item["state"] for name, item in _capabilities(daemon).items()}
    assert {name for name, state in states.items() if state == "environment"} == PLANTED
    # The environment speaks the agent's own tools, and its checks passed.
    environments = daemon.get("/api/environments")["items"]
    assert sorted(environment["capability"] for environment in environments) == sorted(f"{name}.{SERVICE_NAME}" for name in PLANTED)
    assert {environment["service_name"] for environment in environments} == {SERVICE_NAME}
    declared = {tool["tool_name"] for tool in daemon.get("/api/tools")["items"]}
    for environment in environments:
        assert environment["status"] == "checked", environment["checks"]
        assert environment["checks"]["solution"]["min"] == 1.0
        assert {tool["name"] for tool in environment["tools"]} == declared
        assert environment["request_id"] in {request["request_id"] for request in requests}
    transitions = daemon.get("/api/capabilities/precondition_verification")["transitions"]
    assert transitions[0]["to_state"] == "environment"


def test_cli_shows_the_selected_capabilities_with_evidence(loaded: tuple[RunningDaemon, list]) -> None:
    daemon, _ = loaded
    command = [sys.executable, "-m", "tracefix.daemon.app.cli"]
    shown = subprocess.run(
        [*command, "capabilities", "--json", "--config", str(daemon.config_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    shown_json = json.loads(shown.stdout)
    items = shown_json["items"]
    assert shown_json["diagnosis"] is None  # the rules found the gaps: nothing to diagnose
    assert {item["name"] for item in items if item["selected"]} == PLANTED
    for item in items:  # each selected capability comes with failed runs that lack it, and why
        evidence = item.get("evidence", [])
        assert len(evidence) == (3 if item["selected"] else 0), item["name"]
        assert all(row["label"] == "LACKING" and row["outcome"] == "failure" and row["span_ids"] for row in evidence)
    table = subprocess.run(
        [*command, "capabilities", "--config", str(daemon.config_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"precondition_verification for {SERVICE_NAME} environment" in " ".join(table.stdout.split())  # the agent's track
    shown_first = next(item for item in items if item["name"] == "precondition_verification")["evidence"][0]
    assert f"e.g. {shown_first['trajectory_id']}: {shown_first['reason'][:40]}" in " ".join(table.stdout.split())
    evidence = subprocess.run(
        [*command, "trajectories", "--capability", "precondition_verification", "--label", "LACKING",
         "--json", "--config", str(daemon.config_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    page = json.loads(evidence.stdout)
    assert page["total"] > 20
    assert all(item["label"] == "LACKING" and "without" in item["reason"] and item["span_ids"] for item in page["items"])
