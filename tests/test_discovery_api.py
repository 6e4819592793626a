"""Capability discovery through the daemon API, against a real local OpenAI-compatible server that
replays recorded fixtures (no model runs here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RunningDaemon, free_port, make_daemon
from tests.conversations import ConversationSender
from tests.test_analysis import SET
from tests.test_llm_labeler import FixtureServer


@pytest.fixture(scope="module")
def replaying() -> Iterator[FixtureServer]:
    server = FixtureServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def daemon_with_llm(tmp_path_factory: pytest.TempPathFactory, replaying: FixtureServer) -> Iterator[RunningDaemon]:
    directory: Path = tmp_path_factory.mktemp("discover")
    daemon = make_daemon(directory, analysis={"interval_s": 0.5}, llm={"base_url": replaying.base_url}).start()
    sender = ConversationSender(daemon.http_url)
    for conversation in SET:
        sender.send(conversation)
    sender.close()
    daemon.wait_analyzed()
    yield daemon
    daemon.stop()


def _post(daemon: RunningDaemon, body: dict) -> httpx.Response:
    token = (daemon.db_path.parent / "api.token").read_text().strip()
    return httpx.post(
        f"{daemon.api_url}/api/capabilities/discover", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def test_discovery_proposes_new_capabilities_from_contrasted_runs(
    daemon_with_llm: RunningDaemon, replaying: FixtureServer
) -> None:
    response = _post(daemon_with_llm, {"samples": 2})
    assert response.status_code == 200, response.text
    proposals = response.json()["capabilities"]
    # Normalised to snake_case; the built-in it already knows is dropped.
    assert proposals == [
        {
            "name": "confirm_before_changes",
            "description": "Reads the booking and asks the user to confirm before cancelling or changing it.",
        }
    ]
    prompt = replaying.prompts()[-1]
    assert "FAILED run 1 of 2" in prompt and "SUCCESSFUL run 1 of 2" in prompt


def test_discovery_needs_the_token(daemon_with_llm: RunningDaemon) -> None:
    response = httpx.post(f"{daemon_with_llm.api_url}/api/capabilities/discover", json={}, timeout=30)
    assert response.status_code == 401


def test_discovery_with_an_unreachable_endpoint_is_a_clear_502(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, llm={"base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 0}).start()
    try:
        sender = ConversationSender(daemon.http_url)
        for conversation in SET[:2] + SET[-2:]:
            sender.send(conversation)
        sender.close()
        daemon.wait_assembled()
        response = _post(daemon, {"samples": 1})
        assert response.status_code == 502
        assert "discovery failed" in response.json()["detail"]
    finally:
        daemon.stop()
