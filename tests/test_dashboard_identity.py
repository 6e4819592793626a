"""Who approved: every decision from the dashboard names a person in the audit log. With named
tokens, each person gives their own before the first approval; with Streamlit's login (OIDC), the
dashboard acts for the logged-in person through a delegate token; a dashboard others can reach
with neither refuses to start. A real daemon over HTTP; the pages run in Streamlit's AppTest (its
simulated `st.user` stands for an identity provider, which cannot run here)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from tracefix.daemon.core.settings import Settings
from tracefix.dashboard.identity import TOKEN_KEY
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon
from tests.test_dashboard import APP, router_down, seed_pipeline

TOKENS = {"alice": "alice-secret-token-0001", "dashboard": "dashboard-secret-token-0002"}


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon with trained candidates whose API knows alice's token and the dashboard's delegate."""
    directory = tmp_path_factory.mktemp("identity")
    seed_pipeline(directory)
    daemon = make_daemon(
        directory, api={"tokens": TOKENS, "delegates": ["dashboard"]}, dashboard={"port": free_port(), "refresh_s": 0},
        router=router_down(),
    ).start()  # fmt: skip
    yield daemon
    daemon.stop()


def _page(config: Path, monkeypatch: pytest.MonkeyPatch, user: dict[str, Any] | None = None) -> AppTest:
    monkeypatch.setenv("TRACEFIX_CONFIG", str(config))
    test = AppTest.from_file(APP, default_timeout=60)
    test.user = user or {"is_logged_in": False}
    test.run()
    test.switch_page("views/adapters.py").run()
    assert not test.exception, [item.value for item in test.exception]
    return test


def _candidate(daemon: RunningDaemon) -> int:
    return next(item["adapter_id"] for item in daemon.get("/api/adapters")["items"] if item["state"] == "candidate")


def _actors(daemon: RunningDaemon, adapter_id: int) -> list[str]:
    return [row["actor"] for row in daemon.get("/api/audit", adapter_id=adapter_id)["items"]]


def test_with_named_tokens_each_person_gives_their_own_before_approving(team: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    test = _page(team.config_path, monkeypatch)
    adapter_id = _candidate(team)
    assert test.button(key=f"approve_{adapter_id}").disabled
    assert any("Give your API token" in warning.value for warning in test.warning)
    test.text_input(key=TOKEN_KEY).input("not-a-token").run()
    assert any("does not accept this token" in error.value for error in test.error)
    test.text_input(key=TOKEN_KEY).input(TOKENS["alice"]).run()
    assert any("approving as alice" in caption.value for caption in test.caption)
    test.button(key=f"approve_{adapter_id}").click().run()
    assert not test.error, [error.value for error in test.error]
    assert _actors(team, adapter_id) == ["alice"]


def test_with_a_login_the_dashboard_acts_for_the_logged_in_person(
    team: RunningDaemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "login.toml"
    config.write_text(team.config_path.read_text().replace("[dashboard]\n", "[dashboard]\nlogin = true\n", 1))
    logged_out = _page(config, monkeypatch)
    adapter_id = _candidate(team)
    assert logged_out.button(key=f"approve_{adapter_id}").disabled and logged_out.button(key="login")
    assert any("Log in to approve" in warning.value for warning in logged_out.warning)

    logged_in = _page(config, monkeypatch, {"is_logged_in": True, "email": "bob@example.com", "name": "Bob"})
    assert any("approving as bob@example.com (via dashboard)" in caption.value for caption in logged_in.caption)
    logged_in.button(key=f"approve_{adapter_id}").click().run()
    assert not logged_in.error, [error.value for error in logged_in.error]
    assert _actors(team, adapter_id) == ["bob@example.com (via dashboard)"]


def test_only_a_delegate_token_may_name_the_person_it_acts_for(team: RunningDaemon) -> None:
    def whoami(token: str, actor: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **({"X-Tracefix-Actor": actor} if actor is not None else {})}
        return httpx.get(f"{team.api_url}/api/whoami", headers=headers, timeout=10)

    assert whoami(TOKENS["alice"]).json() == {"actor": "alice"}
    assert whoami(TOKENS["dashboard"], "carol@example.com").json() == {"actor": "carol@example.com (via dashboard)"}
    refused = whoami(TOKENS["alice"], "mallory@example.com")
    assert refused.status_code == 403 and "may not act for someone else" in refused.json()["detail"]
    assert whoami(TOKENS["dashboard"], "x" * 201).status_code == 422  # no name a person has
    assert whoami("wrong").status_code == 401


def test_a_dashboard_beyond_loopback_without_named_people_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="beyond loopback"):
        Settings.model_validate({"dashboard": {"host": "0.0.0.0"}})
    with pytest.raises(ValueError, match="delegates must list"):
        Settings.model_validate({"dashboard": {"login": True}, "api": {"tokens": TOKENS}})
    assert Settings.model_validate({"dashboard": {"host": "0.0.0.0"}, "api": {"tokens": TOKENS}}).dashboard.host == "0.0.0.0"
    config = tmp_path / "open.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "t.duckdb"}"\n[dashboard]\nhost = "0.0.0.0"\nport = {free_port()}\n')
    started = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "dashboard", "--config", str(config)], cwd=REPO, capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert started.returncode != 0 and "beyond loopback" in started.stderr, started.stderr[-2000:]
