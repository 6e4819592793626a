"""What a canary is judged against when its control arm has (almost) no outcomes in the canary
window: the control's routed failure rate before the canary began, named so in the verdict, or no
verdict at all. A canary is never passed on nothing.

A real daemon ingests agent traces and the router's spans (as the router writes them) over OTLP;
the router itself is down, so a verdict that passes shows as a failed attempt to promote.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import Store
from examples.traffic import generate, send
from tests.conftest import RunningDaemon, free_port, make_daemon, wait_for
from tests.otlp_builders import metric
from tests.otlp_builders import JSON, json_bytes, json_span, json_traces, new_span_id, post
from tests.lora_support import register_candidate

MINIMUM = 6  # canary outcomes before a verdict
REFERENCE = 5  # outcomes a reference needs
# precondition_verification: the base served the capability's traffic before the canary began.
# error_recovery: it never did, and serves nothing in the canary window either.
WITH_HISTORY, WITHOUT = "precondition_verification", "error_recovery"


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, int, dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("canary-reference")
    began = time.time_ns() - 1800 * 10**9  # both canaries began half an hour ago
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    for version, capability in enumerate((WITH_HISTORY, WITHOUT), start=1):
        adapter_id = register_candidate(store, capability, 1, f"/adapters/{capability}", version)
        store.query("UPDATE adapters SET state = 'canary', routed_since_ns = ? WHERE adapter_id = ?", [began, adapter_id])
    store.close()
    daemon = make_daemon(
        directory,
        analysis={"interval_s": 1.0},
        router={"port": free_port()},  # nothing listens: every router call fails at once
        promotion={"interval_s": 0.3, "canary_min_trajectories": MINIMUM, "reference_min_trajectories": REFERENCE},
    ).start()
    plans = generate(36, seed=5, failure_rate=0.5)
    send(plans, daemon.http_url, "http/protobuf", "log")
    # 12 before the canary on the base model (WITH_HISTORY); in the window, 12 on each canary.
    routed = [(WITH_HISTORY, "base", began - 600 * 10**9)] * 12
    routed += [(WITH_HISTORY, f"{WITH_HISTORY}@v1", began + 60 * 10**9)] * 12 + [(WITHOUT, f"{WITHOUT}@v1", began + 60 * 10**9)] * 12
    spans = []
    history = {"failures": 0, "total": 0}
    for plan, (capability, expert, start) in zip(plans, routed, strict=True):
        if expert == "base":
            history = {"failures": history["failures"] + (plan.outcome == "failure"), "total": history["total"] + 1}
        attributes = {"gen_ai.operation.name": "chat", "tracefix.router.capability": capability, "tracefix.router.adapter": expert}
        spans.append(json_span(plan.trace_id, new_span_id(), "chat base", parent_span_id=new_span_id(), attributes=attributes, kind=2, start=start))
    posted = post(f"{daemon.http_url}/v1/traces", json_bytes(json_traces(spans, "tracefix-router")), JSON)
    assert posted.status_code == 200, posted.text
    daemon.wait_assembled()
    yield daemon, began, history
    daemon.stop()


def test_without_control_outcomes_the_canary_is_judged_against_the_control_before_it(
    canaries: tuple[RunningDaemon, int, dict[str, Any]],
) -> None:
    daemon, _, history = canaries
    # Judged (not worse, or worse): either way the daemon then calls the router, which is down.
    adapter = wait_for(lambda: (item := daemon.get("/api/adapters/1")) and item["last_error"] and item, timeout_s=60)
    assert adapter["state"] == "canary"
    assert adapter["last_error"].startswith((f"router did not promote {WITH_HISTORY}@v1", f"router did not unload {WITH_HISTORY}@v1"))
    routing = adapter["routing"]
    assert routing["reference"]["name"] == "base before the canary"
    assert (routing["reference"]["failures"], routing["reference"]["total"]) == (history["failures"], history["total"])
    assert routing["adapter"]["total"] == 12
    assert "base before the canary" in routing["verdict"]["reason"] and "difference" in routing["verdict"]["reason"]


def test_with_no_reference_at_all_the_canary_waits_instead_of_passing(canaries: tuple[RunningDaemon, int, dict[str, Any]]) -> None:
    daemon, _, _ = canaries
    # Let the promote job judge the other canary first: passes are running, and this one's data is in.
    wait_for(lambda: daemon.get("/api/adapters/1")["last_error"], timeout_s=60)
    passes = metric(daemon, "tracefix_job_runs_total", job="promote")
    wait_for(lambda: metric(daemon, "tracefix_job_runs_total", job="promote") >= passes + 3, timeout_s=60)  # three more promote passes
    adapter = daemon.get("/api/adapters/2")
    assert adapter["state"] == "canary" and adapter["last_error"] is None  # never tried to promote it
    routing = adapter["routing"]
    assert routing["adapter"]["total"] == 12 and routing["reference"]["total"] == 0
    assert routing["reference"]["name"] == "base: fewer than 5 outcomes in the canary window (0) and before it (0)"
    assert "no reference to compare with" in routing["verdict"]["reason"]
    assert [entry["action"] for entry in daemon.get("/api/audit")["items"] if entry["adapter_id"] == 2] == []
