"""One loop per agent: a daemon watching three services — a careless airline agent whose runs all
fail, a careful one whose runs all succeed, and an orders agent with tools of its own that fails
the same way — computes each agent's own statistics beside those over all agents, selects on each
agent's own runs, and builds each selected agent's environment from that agent's own tools
(``daemon.core.tracks``). All sent as real OTLP to a running daemon."""

from __future__ import annotations

import time
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

ORDER_TOOLS = [
    {
        "type": "function", "name": "get_order", "description": "Read an order by id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
    {
        "type": "function", "name": "refund_order", "description": "Refund an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
]  # fmt: skip
ORDERS_SYSTEM = "You are the orders agent of ShopCo. Confirm with the user before refunding an order."
REFUND = Call("refund_order", {"order_id": "O-2001"}, {"status": "refunded"})
ORDER = Call("get_order", {"order_id": "O-2001"}, {"order_id": "O-2001", "status": "delivered", "total": 42.0})
ORDERS_FAILING = Conversation([User("Refund O-2001."), REFUND, Say("Refunded.")], "failure", tools=ORDER_TOOLS, system=ORDERS_SYSTEM)
ORDERS_WORKING = Conversation(
    [User("Refund O-2001."), ORDER, Say("Shall I refund O-2001?"), User("Yes."), REFUND, Say("Done.")],
    "success", tools=ORDER_TOOLS, system=ORDERS_SYSTEM,
)  # fmt: skip
TRACK = "precondition_verification"


@pytest.fixture(scope="module")
def two_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    # The scripted flows fail as the careless agent does, but are not trained for (train = false).
    daemon = make_daemon(
        tmp_path_factory.mktemp("agents"), analysis={"interval_s": 0.4, "min_failures": 3},
        capabilities={"agents": [{"name": "scripted-flows", "train": False}]},
    ).start()  # fmt: skip
    for service, conversations in (
        ("careless-agent", [CARELESS] * 6), ("careful-agent", [CAREFUL] * 5), ("orders-agent", [ORDERS_FAILING] * 5 + [ORDERS_WORKING] * 3),
        ("scripted-flows", [CARELESS] * 4),
    ):  # fmt: skip
        sender = ConversationSender(daemon.http_url, service)
        for conversation in conversations:
            sender.send(conversation)
        sender.close()
    daemon.wait_analyzed()
    yield daemon
    daemon.stop()


def _stats(items: list[dict], capability: str) -> dict:
    return next(item for item in items if item["capability"] == capability)


def _wait(check: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_each_agent_is_listed_with_its_outcomes(two_agents: RunningDaemon) -> None:
    listed = {item["service_name"]: item for item in two_agents.get("/api/agents")["items"]}
    assert set(listed) == {"careless-agent", "careful-agent", "orders-agent", "scripted-flows"}
    assert (listed["careless-agent"]["trajectories"], listed["careless-agent"]["failure"], listed["careless-agent"]["success"]) == (6, 6, 0)
    assert (listed["careful-agent"]["trajectories"], listed["careful-agent"]["success"]) == (5, 5)
    assert listed["careless-agent"]["agent_name"] == "support"


def test_an_agents_own_statistics_count_only_its_trajectories(two_agents: RunningDaemon) -> None:
    pooled = next(item for item in two_agents.get("/api/capabilities")["items"] if item["name"] == TRACK)
    pooled = pooled["windows"]["all"]
    # Over all agents, the careful agent's successes are the careless one's contrast.
    assert (pooled["n_failure"], pooled["n_success"], pooled["er_minus"]) == (15, 8, 1.0)

    careless = two_agents.get("/api/agents/careless-agent/capabilities")
    assert careless["window"] == "all" and careless["drives_tracks"]
    own = _stats(careless["items"], TRACK)
    assert (own["n_failure"], own["n_success"], own["lacking_failure"]) == (6, 0, 6)
    assert own["er_minus"] == 1.0 and own["er_plus"] is None and own["er_plus_low"] is None  # no successes of its own
    careful = _stats(two_agents.get("/api/agents/careful-agent/capabilities")["items"], TRACK)
    assert (careful["n_failure"], careful["n_success"], careful["lacking_success"], careful["er_plus"]) == (0, 5, 0, 0.0)
    # A service's own rows are stored with each pass: they drive its track (with no successes of
    # its own, ER+ counts as 0, as over all agents). The careful agent has no failures: no gap.
    assert own["pass_id"] > 0 and own["selected"] is True and own["track"] == f"{TRACK}.careless-agent"
    assert careful["selected"] is False and careful["state"] == "healthy"
    # Matched by gen_ai.agent.name as well (every service here names its agent "support"): computed
    # on demand (pass 0), driving nothing.
    both = two_agents.get("/api/agents/support/capabilities")
    assert not both["drives_tracks"] and _stats(both["items"], TRACK)["pass_id"] == 0
    assert (_stats(both["items"], TRACK)["n_failure"], _stats(both["items"], TRACK)["n_success"]) == (15, 8)
    history = two_agents.get(f"/api/capabilities/{TRACK}", agent="careless-agent")["history"]
    assert history and {row["agent"] for row in history} == {"careless-agent"}


def test_two_agents_get_two_selections_and_environments_of_their_own_tools(two_agents: RunningDaemon) -> None:
    wanted = {f"{TRACK}.careless-agent": "careless-agent", f"{TRACK}.orders-agent": "orders-agent"}

    def built() -> bool:
        return {item["capability"] for item in two_agents.get("/api/environments")["items"]} >= set(wanted)

    _wait(built)
    requests = {item["capability"] for item in two_agents.get("/api/training_requests")["items"]}
    # None for the careful agent (no gap), none for the flows (selected, but not trained for).
    assert {request for request in requests if request.startswith(TRACK)} == set(wanted)
    flows = _stats(two_agents.get("/api/agents/scripted-flows/capabilities")["items"], TRACK)
    assert flows["selected"] and flows["state"] == "watching" and "train = false" in flows["state_reason"]
    environments = {item["capability"]: item for item in two_agents.get("/api/environments")["items"]}
    airline, orders = environments[f"{TRACK}.careless-agent"], environments[f"{TRACK}.orders-agent"]
    assert (airline["service_name"], orders["service_name"]) == ("careless-agent", "orders-agent")
    assert {tool["name"] for tool in airline["tools"]} == {"get_reservation", "cancel_reservation", "list_items"}
    assert {tool["name"] for tool in orders["tools"]} == {"get_order", "refund_order"}
    assert airline["status"] == orders["status"] == "checked", (airline["checks"], orders["checks"])
    item = next(item for item in two_agents.get("/api/capabilities")["items"] if item["name"] == TRACK)
    assert {track["track"] for track in item["tracks"] if track["state"] == "environment"} == set(wanted)


def test_a_manual_request_names_its_agent(two_agents: RunningDaemon) -> None:
    url = f"{two_agents.api_url}/api/capabilities/error_recovery/train"
    headers = {"Authorization": f"Bearer {(two_agents.db_path.parent / 'api.token').read_text().strip()}"}
    which = httpx.post(url, headers=headers, json={}, timeout=10)
    assert which.status_code == 422 and "careful-agent" in which.json()["detail"]
    unknown = httpx.post(url, headers=headers, json={"agent": "nobody"}, timeout=10)
    assert unknown.status_code == 404 and "orders-agent" in unknown.json()["detail"]
    made = httpx.post(url, headers=headers, json={"agent": "careful-agent"}, timeout=10)
    assert made.status_code == 202 and made.json()["capability"] == "error_recovery.careful-agent"


def test_an_unknown_agent_or_window_is_a_clear_error(two_agents: RunningDaemon) -> None:
    missing = httpx.get(f"{two_agents.api_url}/api/agents/nobody/capabilities", timeout=10)
    assert missing.status_code == 404 and "careful-agent" in missing.json()["detail"]
    window = httpx.get(f"{two_agents.api_url}/api/agents/careful-agent/capabilities", params={"window": "3y"}, timeout=10)
    assert window.status_code == 422 and "unknown window '3y'" in window.json()["detail"]
    assert two_agents.get("/api/agents/careful-agent/capabilities", window="24h")["window"] == "24h"


def test_the_health_page_shows_one_agents_own_statistics(two_agents: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dashboard import app

    test = app(two_agents.config_path, monkeypatch, "views/health.py")
    pooled = test.dataframe[0].value.set_index("capability").loc[TRACK]
    assert pooled["failed runs lacking / needing"] == "15 / 15"
    agents = test.selectbox(key="health_agent")
    assert agents.options == ["all agents", "careful-agent", "careless-agent", "orders-agent", "scripted-flows", "support"]
    agents.select("careless-agent").run()
    assert not test.exception
    own = test.dataframe[0].value.set_index("capability").loc[TRACK]
    assert own["failed runs lacking / needing"] == "6 / 6" and pd.isna(own["ER+ (successes)"])  # no successes of its own
    assert own["selected"]  # the agent's own runs select its gap
    assert any("careless-agent's own runs" in caption.value for caption in test.caption)


def test_the_router_is_told_each_tracks_agent_by_its_instructions(two_agents: RunningDaemon) -> None:
    """What the daemon sends with a track's adapter so the router recognises the agent's requests
    that name none: the digests of the agent's own system instructions (read in process, after the
    daemon has stopped: it is the store's only writer while it runs)."""
    from tracefix.daemon.app.service import Daemon
    from tracefix.daemon.core import tracks
    from tracefix.daemon.core.settings import load_settings
    from tests.conversations import SYSTEM

    two_agents.stop()
    daemon = Daemon(load_settings(two_agents.config_path))
    try:
        assert daemon.instructions(f"{TRACK}.orders-agent") == [tracks.instructions_key(ORDERS_SYSTEM)]
        assert daemon.instructions(f"{TRACK}.careless-agent") == [tracks.instructions_key(SYSTEM)]
        assert daemon.instructions(TRACK) == []  # a bare capability serves every agent
    finally:
        daemon.store.close()
