"""Gate retraining follows the live set: with [gate] enabled, a real daemon trains a token-level gate
(in a real subprocess, tiny model) for exactly the live adapters and switches a real `tracefix
router` to routing mode `gate`; when a second capability goes live, the router falls back to
classifier routing at the swap and the daemon trains a new gate for both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import openai
import peft  # noqa: F401  (installed by make test: never skipped)

from tracefix.daemon.core.settings import StoreSettings  # noqa: E402
from tracefix.daemon.store.store import AnalysisStore, Store  # noqa: E402
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon, wait_for  # noqa: E402
from tests.lora_support import make_adapter, register_candidate  # noqa: E402
from tests.test_going_live import RouterProcess, _post, _state  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402

DEFINITIONS = json.loads((REPO / "tests" / "fixtures" / "tools" / "retail.json").read_text())
CAPABILITIES = ("error_recovery", "tool_call_precision")


@pytest.fixture
def stack(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    analysis = AnalysisStore(store)
    families = load_families()
    for number, capability in enumerate(CAPABILITIES, start=1):
        family = families[capability]
        environment = Environment(family, load_tools(DEFINITIONS), family.levels[0])
        environment_id = analysis.add_environment(capability, environment.spec(), "shop", DEFINITIONS, None, "checked", {"passed": True})
        path = make_adapter(tiny_model, tmp_path / "adapters" / capability, capability, 1, number)
        register_candidate(store, capability, 1, path, number, environment_id)
    store.close()
    daemon = make_daemon(
        tmp_path,
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "routing": "classifier", "max_context_tokens": 2048},
        promotion={"canary": False, "interval_s": 0.5},
        gate={"enabled": True, "steps": 3, "examples_per_adapter": 2},
    )
    daemon.start()
    router = RouterProcess(daemon).start()
    yield daemon, router
    router.stop()
    daemon.stop()


def _gate(daemon: RunningDaemon) -> dict:
    return daemon.get("/api/routing")


def test_the_gate_is_retrained_for_each_live_set_and_the_router_routes_with_it(stack: tuple[RunningDaemon, RouterProcess]) -> None:
    daemon, router = stack
    assert _post(daemon, "/api/adapters/1/approve").status_code == 200
    wait_for(lambda: _state(daemon, 1) == "live")
    first = wait_for(
        lambda: (routing := _gate(daemon))["gate"] and routing["gate"].get("status") == "serving" and routing, timeout_s=180
    )
    assert first["gate"]["adapters"] == ["error_recovery@v1"] and first["router"]["mode"] == "gate", first
    assert first["router"]["gate"]["adapters"] == ["error_recovery@v1"]
    report = first["gate"]["report"]
    assert report["steps"] == 3 and report["labelled_tokens"] > 0

    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(model="base", messages=[{"role": "user", "content": "Refund order 7"}], max_tokens=2)
    assert answer.model == "gate", (answer.model, _gate(daemon)["router"])
    # The router's span of that request carries the gate's expert shares, read back per expert.
    shares = wait_for(lambda: _gate(daemon)["token_shares"], timeout_s=90)
    assert {row["expert"] for row in shares} == {"base", "error_recovery@v1"}, shares
    assert sum(row["share"] for row in shares) == pytest.approx(1.0, abs=1e-3), shares

    assert _post(daemon, "/api/adapters/2/approve").status_code == 200
    wait_for(lambda: _state(daemon, 2) == "live")
    both = ["error_recovery@v1", "tool_call_precision@v1"]
    second = wait_for(
        lambda: (routing := _gate(daemon))["gate"]["adapters"] == both and routing["gate"].get("status") == "serving" and routing,
        timeout_s=180,
    )
    assert second["router"]["mode"] == "gate" and second["router"]["gate"]["adapters"] == both
    assert second["gate"]["path"] != first["gate"]["path"] and Path(second["gate"]["path"]).exists()
