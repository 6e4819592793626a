"""The daemon SIGKILLed in each promotion state, with a real daemon and a real `tracefix router`
process: approved (its load into the router under way: the router is stopped with SIGSTOP, so the
daemon's call is in flight when it dies), canary, live, and rolling back (the rollback's router
calls in flight). After the restart, the router serves exactly what the registry says is live or
canary, and every decision the audit log held before the kill is still there."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import RunningDaemon, free_port, make_daemon, wait_for
from tests.test_going_live import CAPABILITY, RouterProcess, _post, _state, two_candidates


def _stack(tmp_path: Path, tiny_model: Path, canary: bool) -> tuple[RunningDaemon, RouterProcess]:
    two_candidates(tmp_path, tiny_model)
    daemon = make_daemon(
        tmp_path,
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "routing": "classifier", "max_context_tokens": 2048},
        # A canary is never judged here: it waits for more routed outcomes than the test makes.
        promotion={"canary": canary, "interval_s": 0.3, "canary_min_trajectories": 10_000},
    ).start()  # fmt: skip
    return daemon, RouterProcess(daemon).start()


@pytest.fixture
def direct(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    daemon, router = _stack(tmp_path, tiny_model, canary=False)
    yield daemon, router
    _resume(router)
    router.stop()
    daemon.stop()


@pytest.fixture
def canaried(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess]]:
    daemon, router = _stack(tmp_path, tiny_model, canary=True)
    yield daemon, router
    router.stop()
    daemon.stop()


def _resume(router: RouterProcess) -> None:
    if router.process is not None and router.process.poll() is None:
        router.process.send_signal(signal.SIGCONT)


def _calling_router(daemon: RunningDaemon, router: RouterProcess) -> bool:
    """Whether the daemon has a connection open to the router's port: a call in flight."""
    port = int(router.url.rsplit(":", 1)[1])
    connections = psutil.Process(daemon.process.pid).net_connections(kind="tcp")  # type: ignore[union-attr]
    return any(connection.raddr and connection.raddr.port == port for connection in connections)


def _audit(daemon: RunningDaemon) -> list[tuple[str, str, int, str]]:
    return [(row["actor"], row["action"], row["adapter_id"], row["to_state"]) for row in daemon.get("/api/audit")["items"]][::-1]


def _agree(daemon: RunningDaemon, router: RouterProcess) -> dict[str, str]:
    """The registry's live and canary versions, once the router serves exactly them in those roles."""
    token = {"Authorization": f"Bearer {(daemon.directory / 'router.token').read_text().strip()}"}

    def both() -> dict[str, str] | None:
        wanted = {
            f"{item['capability']}@v{item['version']}": item["state"]
            for item in daemon.get("/api/adapters")["items"] if item["state"] in ("live", "canary")
        }  # fmt: skip
        served = httpx.get(f"{router.url}/admin/routing", headers=token, timeout=10).json()["adapters"]
        serving = {item["name"]: item["role"] for item in served if item["role"] != "retiring"}
        return wanted if wanted == serving else None

    return wait_for(both, timeout_s=60)


def _kill_and_restart(daemon: RunningDaemon) -> list[tuple[str, str, int, str]]:
    """SIGKILL the daemon, start it again on the same store; the audit log read before the kill."""
    before = _audit(daemon)
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    daemon.start()
    return before


def test_killed_while_approved_live_or_rolling_back_the_router_and_registry_agree_after_restart(
    direct: tuple[RunningDaemon, RouterProcess],
) -> None:
    daemon, router = direct
    # Approved, its load in flight: the router is stopped, so the daemon's call waits on it.
    router.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    assert _post(daemon, "/api/adapters/1/approve", {"reason": "fixes refunds"}).status_code == 200
    wait_for(lambda: _calling_router(daemon, router), timeout_s=30)
    before = _kill_and_restart(daemon)
    assert before == [("admin", "approve", 1, "approved")]
    _resume(router)  # it finishes loading what the dead daemon asked for
    assert _agree(daemon, router) == {f"{CAPABILITY}@v1": "live"}
    assert _audit(daemon)[: len(before)] == before and _state(daemon, 1) == "live"

    # Live.
    before = _kill_and_restart(daemon)
    assert _agree(daemon, router) == {f"{CAPABILITY}@v1": "live"} and _audit(daemon) == before

    # Rolling back v2 to v1: the rollback's router calls are in flight when the daemon dies. The
    # caller gets no answer, so the rollback was never acknowledged: after the restart the router
    # serves whatever the registry holds, and the audit keeps every decision made before. The
    # promote job is held off meanwhile (a restart with an interval it never reaches), so the only
    # call to the router is the rollback's.
    assert _post(daemon, "/api/adapters/2/approve").status_code == 200
    wait_for(lambda: _state(daemon, 2) == "live")
    _agree(daemon, router)
    daemon.sections["promotion"]["interval_s"] = 3600
    daemon.write_config()
    _kill_and_restart(daemon)
    assert not _calling_router(daemon, router)
    router.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    answered: list[object] = []
    thread = threading.Thread(
        target=lambda: answered.append(_rollback(daemon)), daemon=True
    )  # the API call blocks on the stopped router
    thread.start()
    wait_for(lambda: _calling_router(daemon, router), timeout_s=30)
    daemon.sections["promotion"]["interval_s"] = 0.3
    daemon.write_config()
    before = _kill_and_restart(daemon)
    thread.join(30)
    assert answered and answered[0] != 200  # the caller saw no acknowledgement
    assert before[-1][1:] == ("go_live", 2, "live")  # the rollback had recorded nothing yet
    _resume(router)
    agreed = _agree(daemon, router)
    assert agreed in ({f"{CAPABILITY}@v2": "live"}, {f"{CAPABILITY}@v1": "live"}), agreed
    assert _audit(daemon)[: len(before)] == before


def _rollback(daemon: RunningDaemon) -> object:
    try:
        return _post(daemon, "/api/adapters/2/rollback", {"reason": "more failures on refunds"}).status_code
    except httpx.TransportError as error:  # the daemon died under the call
        return type(error).__name__


def test_killed_in_canary_the_router_keeps_the_canary_in_its_role(canaried: tuple[RunningDaemon, RouterProcess]) -> None:
    daemon, router = canaried
    assert _post(daemon, "/api/adapters/1/approve").status_code == 200
    assert _agree(daemon, router) == {f"{CAPABILITY}@v1": "canary"}
    before = _kill_and_restart(daemon)
    assert [entry[1:] for entry in before] == [("approve", 1, "approved"), ("canary", 1, "canary")]
    assert _agree(daemon, router) == {f"{CAPABILITY}@v1": "canary"} and _audit(daemon) == before
