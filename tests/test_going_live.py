"""Promotion end to end, with a real daemon and a real `tracefix router` process sharing a config:
a candidate approved through the API goes live in the router without a restart, a newer version
replaces it, a rollback restores it, a router killed with SIGKILL in the middle of a swap is brought back to the
registry's live set, and the router's spans of served requests reach the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import openai
import peft  # noqa: F401  (installed by make test: never skipped)

from tracefix.daemon.core.settings import StoreSettings  # noqa: E402
from tracefix.daemon.store.store import Store  # noqa: E402
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon, wait_for  # noqa: E402
from tests.lora_support import make_adapter, register_candidate  # noqa: E402
from tests.otlp_builders import metric  # noqa: E402

CAPABILITY = "error_recovery"


class RouterProcess:
    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.url = f"http://127.0.0.1:{daemon.sections['router']['port']}"
        self.process: subprocess.Popen | None = None

    def start(self) -> RouterProcess:
        log = (self.daemon.directory / "router.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(self.daemon.config_path)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.daemon.directory / "router.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("router did not become healthy")

    def models(self) -> set[str]:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        return {model.id for model in client.models.list()}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)


def two_candidates(tmp_path: Path, tiny_model: Path) -> list[Path]:
    """Two trained versions of one capability, registered as candidates in the store at `tmp_path`
    (before its daemon starts); their directories."""
    paths = [make_adapter(tiny_model, tmp_path / "adapters" / f"v{version}", CAPABILITY, version, version) for version in (1, 2)]
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    for version, path in enumerate(paths, start=1):
        register_candidate(store, CAPABILITY, version, path, version)
    store.close()
    return paths


@pytest.fixture
def stack(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess, list[Path]]]:
    paths = two_candidates(tmp_path, tiny_model)
    daemon = make_daemon(
        tmp_path,
        analysis={"interval_s": 0.5},
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "routing": "classifier", "max_context_tokens": 2048},
        promotion={"canary": False, "interval_s": 0.5},  # the canary path is tests/test_canary.py
    )
    daemon.start()
    router = RouterProcess(daemon).start()
    yield daemon, router, paths
    router.stop()
    daemon.stop()


def _token(daemon: RunningDaemon) -> dict[str, str]:
    return {"Authorization": f"Bearer {(daemon.directory / 'api.token').read_text().strip()}"}


def _post(daemon: RunningDaemon, path: str, body: Any = None, auth: bool = True) -> httpx.Response:
    return httpx.post(f"{daemon.api_url}{path}", json=body, headers=_token(daemon) if auth else {}, timeout=30)


def _cli(daemon: RunningDaemon, *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", *arguments, "--config", str(daemon.config_path)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def _state(daemon: RunningDaemon, adapter_id: int) -> str:
    return daemon.get(f"/api/adapters/{adapter_id}")["state"]


def test_approval_goes_live_a_newer_version_replaces_it_and_rollback_restores_it(
    stack: tuple[RunningDaemon, RouterProcess, list[Path]],
) -> None:
    daemon, router, _ = stack
    assert _post(daemon, "/api/adapters/1/approve", auth=False).status_code == 401
    assert _post(daemon, "/api/adapters/1/reject", {"reason": ""}).status_code == 422
    assert _post(daemon, "/api/adapters/1/approve", {"reason": "fixes refunds"}).status_code == 200
    wait_for(lambda: _state(daemon, 1) == "live")
    assert router.models() == {"base", f"{CAPABILITY}@v1"}
    # The router's classifier reads what the capability is, not just its name.
    (served,) = daemon.get("/api/routing")["router"]["adapters"]
    assert served["description"] == daemon.get(f"/api/capabilities/{CAPABILITY}")["description"] != CAPABILITY
    assert _post(daemon, "/api/adapters/1/approve").status_code == 409  # live: not a candidate any more

    # The CLI takes the same path (with the daemon's token).
    assert _cli(daemon, "adapters", "reject", "2").returncode == 2  # --reason is required
    approved = _cli(daemon, "adapters", "approve", "2", "--reason", "better on held-out seeds")
    assert approved.returncode == 0 and "candidate → approved" in approved.stdout
    wait_for(lambda: _state(daemon, 2) == "live")
    assert _state(daemon, 1) == "retired"
    wait_for(lambda: router.models() == {"base", f"{CAPABILITY}@v2"})

    rolled = _post(daemon, "/api/adapters/2/rollback", {"reason": "more failures on refunds"})
    assert rolled.status_code == 200, rolled.text
    assert (_state(daemon, 2), _state(daemon, 1)) == ("rolled_back", "live")
    wait_for(lambda: router.models() == {"base", f"{CAPABILITY}@v1"})

    listed = json.loads(_cli(daemon, "adapters", "list", "--json").stdout)
    assert {(item["version"], item["state"]) for item in listed} == {(1, "live"), (2, "rolled_back")}
    audit = [(row["actor"], row["action"], row["adapter_id"], row["to_state"]) for row in daemon.get("/api/audit")["items"]][::-1]
    assert audit == [
        ("admin", "approve", 1, "approved"), ("promotion", "go_live", 1, "live"),
        ("admin", "approve", 2, "approved"), ("promotion", "retire", 1, "retired"), ("promotion", "go_live", 2, "live"),
        ("admin", "rollback", 2, "rolled_back"), ("admin", "restore", 1, "live"),
    ]  # fmt: skip


def test_a_killed_router_is_brought_back_to_the_live_set_and_its_spans_reach_the_daemon(
    stack: tuple[RunningDaemon, RouterProcess, list[Path]],
) -> None:
    daemon, router, _ = stack
    assert _post(daemon, "/api/adapters/1/approve").status_code == 200
    wait_for(lambda: _state(daemon, 1) == "live")
    # Killed in the middle of the swap to v2: the promote job is loading it, or about to.
    assert _post(daemon, "/api/adapters/2/approve").status_code == 200
    router.stop(signal.SIGKILL)
    # Down for several promote passes: the outage is logged once and shown by the gauge.
    wait_for(lambda: metric(daemon, "tracefix_router_reconciled") == 0)
    passes = metric(daemon, "tracefix_job_runs_total", job="promote")
    wait_for(lambda: metric(daemon, "tracefix_job_runs_total", job="promote") >= passes + 3)
    assert daemon.log_path.read_text().count("router not reconciled") == 1
    router.start()  # starts with the base model only
    wait_for(lambda: _state(daemon, 2) == "live" and router.models() == {"base", f"{CAPABILITY}@v2"}, timeout_s=60)
    assert metric(daemon, "tracefix_router_reconciled") == 1 and "router reconciled again" in daemon.log_path.read_text()
    assert _state(daemon, 1) == "retired"
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=f"{CAPABILITY}@v2", messages=[{"role": "user", "content": "My refund failed."}], max_tokens=4, seed=1
    )
    assert answer.model == f"{CAPABILITY}@v2"
    # The served request comes back through the collector as a trajectory of the router.
    served = wait_for(lambda: daemon.get("/api/trajectories", service="tracefix-router")["items"])
    detail = daemon.get(f"/api/trajectories/{served[0]['trajectory_id']}")
    assert detail["service_name"] == "tracefix-router"
