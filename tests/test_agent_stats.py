"""Statistics scoped to one agent: a daemon watching two services (a careless agent whose runs all
fail, and a careful one whose runs all succeed) pools them for selection, while each agent's own
view counts only its trajectories, so the careless agent gets no contrast from the other's
successes. All sent as real OTLP to a running daemon."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pandas as pd
import pytest

from tests.conftest import RunningDaemon, make_daemon
from tests.conversations import Call, Conversation, ConversationSender, Say, User

READ = Call("get_reservation", {"reservation_id": "R-1001"}, {"reservation_id": "R-1001", "status": "confirmed"})
CANCEL = Call("cancel_reservation", {"reservation_id": "R-1001"}, {"status": "cancelled"})
CARELESS = Conversation([User("Cancel R-1001."), CANCEL, Say("Cancelled.")], "failure")
CAREFUL = Conversation([User("Cancel R-1001."), READ, Say("Shall I cancel R-1001?"), User("Yes, please do."), CANCEL, Say("Done.")], "success")


@pytest.fixture(scope="module")
def two_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    daemon = make_daemon(tmp_path_factory.mktemp("agents"), analysis={"interval_s": 0.4, "min_failures": 3}).start()
    for service, conversation, count in (("careless-agent", CARELESS, 6), ("careful-agent", CAREFUL, 5)):
        sender = ConversationSender(daemon.http_url, service)
        for _ in range(count):
            sender.send(conversation)
        sender.close()
    daemon.wait_analyzed()
    yield daemon
    daemon.stop()


def _stats(items: list[dict], capability: str) -> dict:
    return next(item for item in items if item["capability"] == capability)


def test_each_agent_is_listed_with_its_outcomes(two_agents: RunningDaemon) -> None:
    listed = {item["service_name"]: item for item in two_agents.get("/api/agents")["items"]}
    assert set(listed) == {"careless-agent", "careful-agent"}
    assert (listed["careless-agent"]["trajectories"], listed["careless-agent"]["failure"], listed["careless-agent"]["success"]) == (6, 6, 0)
    assert (listed["careful-agent"]["trajectories"], listed["careful-agent"]["success"]) == (5, 5)
    assert listed["careless-agent"]["agent_name"] == "support"


def test_an_agents_own_statistics_count_only_its_trajectories(two_agents: RunningDaemon) -> None:
    pooled = next(item for item in two_agents.get("/api/capabilities")["items"] if item["name"] == "precondition_verification")
    pooled = pooled["windows"]["all"]
    # Pooled, the careful agent's successes are the contrast: ER- 1.0 vs ER+ 0.0.
    assert (pooled["n_failure"], pooled["n_success"], pooled["er_minus"], pooled["er_plus"]) == (6, 5, 1.0, 0.0)

    careless = two_agents.get("/api/agents/careless-agent/capabilities")
    assert careless["window"] == "all"
    own = _stats(careless["items"], "precondition_verification")
    assert (own["n_failure"], own["n_success"], own["lacking_failure"]) == (6, 0, 6)
    assert own["er_minus"] == 1.0 and own["er_plus"] is None and own["er_plus_low"] is None  # no successes of its own
    careful = _stats(two_agents.get("/api/agents/careful-agent/capabilities")["items"], "precondition_verification")
    assert (careful["n_failure"], careful["n_success"], careful["lacking_success"], careful["er_plus"]) == (0, 5, 0, 0.0)
    # Matched by gen_ai.agent.name as well: both services name their agent "support".
    both = _stats(two_agents.get("/api/agents/support/capabilities")["items"], "precondition_verification")
    assert (both["n_failure"], both["n_success"]) == (6, 5)
    # Computed on demand (pass 0) and never stored as a pass of their own; `selected` is what the
    # rule would decide on these runs alone (with no successes, ER+ counts as 0, as pooled).
    assert own["pass_id"] == 0 and own["selected"] is True
    assert all(row["pass_id"] > 0 for row in two_agents.get("/api/capabilities/precondition_verification")["history"])


def test_an_unknown_agent_or_window_is_a_clear_error(two_agents: RunningDaemon) -> None:
    missing = httpx.get(f"{two_agents.api_url}/api/agents/nobody/capabilities", timeout=10)
    assert missing.status_code == 404 and "careful-agent" in missing.json()["detail"]
    window = httpx.get(f"{two_agents.api_url}/api/agents/careful-agent/capabilities", params={"window": "3y"}, timeout=10)
    assert window.status_code == 422 and "unknown window '3y'" in window.json()["detail"]
    assert two_agents.get("/api/agents/careful-agent/capabilities", window="24h")["window"] == "24h"


def test_the_health_page_shows_one_agents_own_statistics(two_agents: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dashboard import app

    test = app(two_agents.config_path, monkeypatch, "views/health.py")
    pooled = test.dataframe[0].value.set_index("capability").loc["precondition_verification"]
    assert pooled["failed runs lacking / needing"] == "6 / 6" and pooled["ER+ (successes)"] == 0.0
    agents = test.selectbox(key="health_agent")
    assert agents.options == ["all agents", "careful-agent", "careless-agent", "support"]
    agents.select("careless-agent").run()
    assert not test.exception
    own = test.dataframe[0].value.set_index("capability").loc["precondition_verification"]
    assert own["failed runs lacking / needing"] == "6 / 6" and pd.isna(own["ER+ (successes)"])  # no successes of its own
    assert not own["selected"]  # one agent's view selects nothing
    assert any("careless-agent's trajectories only" in caption.value for caption in test.caption)
