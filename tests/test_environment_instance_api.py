"""`GET /api/environments/{id}/instance` on a real daemon: a stored environment's seeded instance,
built in the daemon at the difficulty its gate settled on, with its ground-truth solution played
through; a clear 404 for an id it does not have and a 409 for an environment it cannot build."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import AnalysisStore, Store
from examples.traffic import TOOLS
from tests.conftest import RunningDaemon, make_daemon
from tracefix.trainer.checks import check
from tracefix.trainer.families import build_environment

DEFINITIONS = [{"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]} for tool in TOOLS]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, int, int]]:
    """A daemon whose database holds a validated precondition_verification environment (built at
    difficulty 1, the gate settled on 2) and one of a family no plugin registers."""
    directory: Path = tmp_path_factory.mktemp("instance")
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    analysis = AnalysisStore(store)
    environment = build_environment({"family": "precondition_verification", "tools": DEFINITIONS})
    validated = analysis.add_environment(
        "precondition_verification", environment.spec(), "skyways-support-agent", DEFINITIONS, None, "checked",
        check(environment, 5).to_dict(),
    )  # fmt: skip
    analysis.set_environment_status(validated, "checked", "validated", {"passed": True, "difficulty": 2})
    unknown = analysis.add_environment(
        "juggling", {"family": "juggling", "version": "1", "difficulty": 1, "tools_hash": "-"}, "skyways-support-agent",
        DEFINITIONS, None, "checked", {"passed": True},
    )  # fmt: skip
    store.close()
    daemon = make_daemon(directory).start()
    yield daemon, validated, unknown
    daemon.stop()


def _instance(daemon: RunningDaemon, environment_id: int, **params: int) -> httpx.Response:
    return httpx.get(f"{daemon.api_url}/api/environments/{environment_id}/instance", params=params, timeout=30)


def test_an_instance_replays_its_solution_at_the_difficulty_the_gate_settled_on(stored: tuple[RunningDaemon, int, int]) -> None:
    daemon, validated, _ = stored
    response = _instance(daemon, validated, seed=3)
    assert response.status_code == 200, response.text
    instance = response.json()
    assert (instance["environment_id"], instance["family"], instance["seed"]) == (validated, "precondition_verification", 3)
    assert instance["difficulty"] == 2 and instance["solution_reward"] == 1.0
    assert "get_reservation" in instance["hint"]
    messages = instance["messages"]
    assert [message["role"] for message in messages[:2]] == ["system", "user"]
    assert all(f'"name":"{tool["name"]}"' in messages[0]["content"] for tool in TOOLS)  # the agent's own tools
    assert any("<tool_call>" in (message.get("content") or "") for message in messages if message["role"] == "assistant")
    assert _instance(daemon, validated, seed=3).json() == instance  # seeded: the same instance again
    assert _instance(daemon, validated, seed=4).json()["messages"] != messages
    assert _instance(daemon, validated).json()["seed"] == 0


def test_an_unknown_environment_is_a_404_and_one_the_daemon_cannot_build_a_409(stored: tuple[RunningDaemon, int, int]) -> None:
    daemon, validated, unknown = stored
    missing = _instance(daemon, 9999)
    assert missing.status_code == 404 and missing.json()["detail"] == "no environment 9999"
    refused = _instance(daemon, unknown)
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(f"environment {unknown} cannot be instantiated here: unknown environment family 'juggling'")
    assert _instance(daemon, validated, seed=-1).status_code == 422
