"""Canary and automatic rollback end to end: a real daemon, a real `tracefix router` process, and an
agent instrumented with the OpenTelemetry SDK that passes its trace context to the router, so each
conversation's trajectory carries the router's span (which version served it) and its outcome.

v1 approved → canary on half of the capability's traffic (the rest on the base model) → not worse
→ live. v2 approved → canary against v1 → fails more → rolled back on its own, v1 keeps serving.
v1 then fails more than before its promotion → the live watch rolls it back. Every decision is in
the audit log with its numbers, and counted in `tracefix_adapter_rollbacks_total`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import openai
import peft  # noqa: F401  (installed by make test: never skipped)

from opentelemetry import propagate  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

from tracefix.daemon.promotion.router_client import RouterAdmin  # noqa: E402
from tracefix.daemon.core.settings import StoreSettings, load_settings  # noqa: E402
from tracefix.daemon.store.store import Store  # noqa: E402
from tests.conftest import RunningDaemon, free_port, make_daemon, wait_for  # noqa: E402
from tests.lora_support import make_adapter, register_candidate  # noqa: E402
from tests.otlp_builders import metric, metric_at  # noqa: E402
from tests.test_going_live import RouterProcess, _post, _state  # noqa: E402

CAPABILITY = "error_recovery"
V1, V2 = f"{CAPABILITY}@v1", f"{CAPABILITY}@v2"
MINIMUM = 8  # routed trajectories with outcomes before a verdict (default 50)


class Agent:
    """Conversations of one request each through the router, traced like a user's agent: the
    outcome is decided by the test from the version that answered."""

    def __init__(self, daemon: RunningDaemon, router: RouterProcess) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{daemon.http_url}/v1/traces")))
        self.tracer = self.provider.get_tracer("tests.canary")
        self.client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
        self.numbers = itertools.count()
        self.served: list[str] = []

    def converse(self, outcome: Callable[[str], str]) -> str:
        number = next(self.numbers)
        with self.tracer.start_as_current_span("invoke_agent support") as root:
            root.set_attribute("gen_ai.conversation.id", f"conversation-{number}")
            headers: dict[str, str] = {}
            propagate.inject(headers)
            answer = self.client.chat.completions.create(
                model="base", messages=[{"role": "user", "content": f"Ticket {number}: my refund failed twice."}],
                max_tokens=1, seed=number, extra_headers=headers,
            )  # fmt: skip
            root.set_attribute("tracefix.outcome", outcome(answer.model))
        self.served.append(answer.model)
        return answer.model

    def until(self, done: Callable[[], bool], outcome: Callable[[str], str], most: int = 120) -> None:
        for _ in range(most):
            if done():
                return
            self.converse(outcome)
        wait_for(done, timeout_s=90)

    def close(self) -> None:
        self.provider.shutdown()


def _serving(
    tmp_path: Path, tiny_model: Path, candidates: list[tuple[str, int]], **promotion: int
) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    """A daemon with these (capability, version) candidates registered, and a router whose fixed
    routing makes every request the first capability's traffic, split between canary and control."""
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    for run_id, (capability, version) in enumerate(candidates, start=1):
        path = make_adapter(tiny_model, tmp_path / "adapters" / f"{capability}-v{version}", capability, version, 60 + run_id)
        register_candidate(store, capability, version, path, run_id)
    store.close()
    daemon = make_daemon(
        tmp_path,
        analysis={"interval_s": 0.5},
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "routing": "fixed", "fixed_adapter": candidates[0][0], "max_context_tokens": 2048},
        promotion={
            "interval_s": 0.3, "canary_fraction": 0.5, "canary_min_trajectories": MINIMUM, "watch_min_trajectories": MINIMUM,
            **promotion,
        },  # fmt: skip
    )
    daemon.start()
    router = RouterProcess(daemon).start()
    yield daemon, router
    router.stop()
    daemon.stop()


@pytest.fixture
def stack(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    yield from _serving(tmp_path, tiny_model, [(CAPABILITY, 1), (CAPABILITY, 2)])


def _rollbacks(daemon: RunningDaemon, stage: str) -> float:
    return metric(daemon, "tracefix_adapter_rollbacks_total", capability=CAPABILITY, stage=stage)


def test_a_canary_is_promoted_a_worse_one_is_rolled_back_and_the_live_watch_rolls_back_a_regression(
    stack: tuple[RunningDaemon, RouterProcess],
) -> None:
    daemon, router = stack
    agent = Agent(daemon, router)
    try:
        # v1 takes half of the capability's traffic; the base model serves the rest.
        assert _post(daemon, "/api/adapters/1/approve", {"reason": "fixes refunds"}).status_code == 200
        wait_for(lambda: _state(daemon, 1) == "canary", timeout_s=90)
        assert router.models() == {"base", V1}
        table = daemon.get("/api/routing")["router"]
        assert table["canaries"][CAPABILITY] == {"name": V1, "share": 0.5, "control": None}
        # Both arms succeed: v1 is not worse than the base model, so it takes all the traffic.
        agent.until(lambda: _state(daemon, 1) == "live", lambda served: "success")
        assert {"base", V1} <= set(agent.served), agent.served  # both arms were served
        served_live = {agent.converse(lambda served: "success") for _ in range(4)}
        assert served_live == {V1}  # promoted: no more control traffic
        baseline = daemon.get("/api/adapters/1")["baseline"]
        assert baseline["failures"] == 0 and baseline["total"] >= 1

        # v2 fails where v1 succeeds: the canary is rolled back on its own and v1 keeps serving.
        assert _post(daemon, "/api/adapters/2/approve").status_code == 200
        wait_for(lambda: _state(daemon, 2) == "canary", timeout_s=90)
        agent.until(lambda: _state(daemon, 2) == "rolled_back", lambda served: "failure" if served == V2 else "success")
        assert _state(daemon, 1) == "live"
        wait_for(lambda: router.models() == {"base", V1}, timeout_s=90)
        assert _rollbacks(daemon, "canary") == 1

        # Later v1 regresses against its pre-promotion failure rate: the watch rolls it back.
        agent.until(lambda: _state(daemon, 1) == "rolled_back", lambda served: "failure")
        wait_for(lambda: router.models() == {"base"}, timeout_s=90)
        assert _rollbacks(daemon, "live") == 1
        capability = daemon.get(f"/api/capabilities/{CAPABILITY}")
        assert capability["state"] == "cooldown"
        # What the router served, read back from its spans: every request of the agent, per expert.
        served = Counter(agent.served)
        routing = wait_for(lambda: (r := daemon.get("/api/routing")) and {e["expert"]: e["requests"] for e in r["experts"]} == served and r, timeout_s=90)
        assert sum(point["requests"] for point in routing["series"]) == len(agent.served)
        assert routing["latency"]["routing_p95_ms"] >= routing["latency"]["routing_p50_ms"] > 0
    finally:
        agent.close()

    audit = [(row["actor"], row["action"], row["adapter_id"], row["to_state"], row["reason"]) for row in daemon.get("/api/audit")["items"]][::-1]
    assert [entry[:4] for entry in audit] == [
        ("admin", "approve", 1, "approved"), ("promotion", "canary", 1, "canary"), ("promotion", "go_live", 1, "live"),
        ("admin", "approve", 2, "approved"), ("promotion", "canary", 2, "canary"), ("promotion", "rollback", 2, "rolled_back"),
        ("promotion", "rollback", 1, "rolled_back"),
    ]  # fmt: skip
    assert "not worse than base" in audit[2][4]
    assert f"canary {V2} failure rate 1.00" in audit[5][4] and f"worse than {V1}" in audit[5][4]
    assert f"live {V1}" in audit[6][4] and "worse than before promotion" in audit[6][4]


def test_a_canary_rolled_back_by_hand_leaves_the_previous_state_serving(stack: tuple[RunningDaemon, RouterProcess]) -> None:
    daemon, router = stack
    assert _post(daemon, "/api/adapters/1/approve").status_code == 200
    wait_for(lambda: _state(daemon, 1) == "canary", timeout_s=90)
    assert _post(daemon, "/api/adapters/1/rollback", {"reason": ""}).status_code == 422
    rolled = _post(daemon, "/api/adapters/1/rollback", {"reason": "complaints from the canary"})
    assert rolled.status_code == 200, rolled.text
    assert _state(daemon, 1) == "rolled_back"
    wait_for(lambda: router.models() == {"base"}, timeout_s=90)
    assert daemon.get("/api/routing")["router"]["canaries"] == {}
    assert _rollbacks(daemon, "canary") == 0  # counted only when the daemon decides

    # A version the registry took out of service that the router serves anyway (a load that raced
    # the rollback, an operator's hand) is unloaded by the next promote pass.
    # The promote pass runs every 0.3 s and may unload it before the test could list it, so that it
    # was loaded is read from the router's swap counter, which only grows.
    adapter = daemon.get("/api/adapters/1")
    loaded_before = metric_at(router.url, "tracefix_router_swaps_total", outcome="loaded")
    RouterAdmin(load_settings(daemon.config_path)).load(V1, CAPABILITY, 1, adapter["path"], CAPABILITY, 0.5)
    assert metric_at(router.url, "tracefix_router_swaps_total", outcome="loaded") == loaded_before + 1
    wait_for(lambda: router.models() == {"base"}, timeout_s=30)
    assert _state(daemon, 1) == "rolled_back"


SECOND = "precondition_verification"


@pytest.fixture
def two_capabilities(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    """Candidates for two capabilities; the test switches fixed routing between them (a tiny random
    model's classifier never picks the second)."""
    yield from _serving(
        tmp_path, tiny_model, [(CAPABILITY, 1), (SECOND, 1)], reference_min_trajectories=MINIMUM, watch_min_trajectories=1000
    )


def test_two_capabilities_adapters_go_live_one_after_the_other_and_both_serve_routed_traffic(
    two_capabilities: tuple[RunningDaemon, RouterProcess],
) -> None:
    daemon, router = two_capabilities
    admin = RouterAdmin(load_settings(daemon.config_path))
    agent = Agent(daemon, router)
    try:
        for adapter_id, capability in ((1, CAPABILITY), (2, SECOND)):
            assert _post(daemon, f"/api/adapters/{adapter_id}/approve", {"reason": "the next gap"}).status_code == 200
            wait_for(lambda: _state(daemon, adapter_id) == "canary", timeout_s=90)
            admin.set_routing("fixed", capability)  # its traffic from now on, split by its canary
            agent.until(lambda: _state(daemon, adapter_id) == "live", lambda served: "success")
        assert _state(daemon, 1) == "live"  # the first stays live next to the second
        assert router.models() == {"base", V1, f"{SECOND}@v1"}
        served = {}
        for capability in (CAPABILITY, SECOND):
            admin.set_routing("fixed", capability)
            served[capability] = {agent.converse(lambda served: "success") for _ in range(3)}
    finally:
        agent.close()
    assert served == {CAPABILITY: {V1}, SECOND: {f"{SECOND}@v1"}}
    routing = wait_for(lambda: (r := daemon.get("/api/routing")) and {e["expert"] for e in r["experts"]} >= {V1, f"{SECOND}@v1"} and r, timeout_s=90)
    assert {V1, f"{SECOND}@v1", "base"} <= {expert["expert"] for expert in routing["experts"]}
    audit = [(row["adapter_id"], row["to_state"]) for row in daemon.get("/api/audit")["items"]][::-1]
    assert audit == [(1, "approved"), (1, "canary"), (1, "live"), (2, "approved"), (2, "canary"), (2, "live")]
