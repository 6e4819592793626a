"""`tracefix up` as a user runs it: one real process supervising the daemon, the router (tiny model)
and the dashboard, each healthy on its own port; a child killed with SIGKILL is restarted; `tracefix
logs` shows each child's log; SIGTERM stops everything; a port that is taken fails the start with
the child's own error and leaves nothing running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import REPO, RunningDaemon, free_port, make_daemon, wait_for

import peft  # noqa: F401  (installed by make test: never skipped)


def _children(up: subprocess.Popen) -> dict[str, psutil.Process]:
    found = {}
    for child in psutil.Process(up.pid).children():
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        for name in ("daemon", "router", "dashboard"):
            if f"tracefix.daemon.app.cli {name}" in command or (name == "dashboard" and "streamlit" in command):
                found[name] = child
    return found


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def configured(tmp_path: Path, tiny_model: Path) -> RunningDaemon:
    return make_daemon(
        tmp_path,
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "max_context_tokens": 2048, "export_spans": False},
        dashboard={"port": free_port()},
    )


def _start(configured: RunningDaemon, *extra: str) -> subprocess.Popen:
    output = (configured.directory / "up.out").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "up", "--config", str(configured.config_path), *extra],
        cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.fixture
def up(configured: RunningDaemon) -> Iterator[subprocess.Popen]:
    process = _start(configured)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()
    for child in psutil.Process().children(recursive=True):
        if "tracefix.daemon.app.cli" in " ".join(child.cmdline()) or "streamlit" in " ".join(child.cmdline()):
            child.kill()


def test_up_supervises_the_three_processes_restarts_a_killed_one_and_stops_them_all(
    configured: RunningDaemon, up: subprocess.Popen
) -> None:
    router_url = f"http://127.0.0.1:{configured.sections['router']['port']}"
    dashboard_url = f"http://127.0.0.1:{configured.sections['dashboard']['port']}"
    output = configured.directory / "up.out"
    wait_for(lambda: "dashboard up" in output.read_text(), timeout_s=240, poll_s=0.5)
    assert _healthy(f"{configured.api_url}/healthz") and _healthy(f"{router_url}/healthz")
    assert _healthy(f"{dashboard_url}/_stcore/health")
    printed = output.read_text()
    assert f"openai_api {router_url}/v1" in printed and f"api {configured.api_url}" in printed

    # The router dies hard: the supervisor starts it again, and the others never notice.
    children = _children(up)
    assert set(children) == {"daemon", "router", "dashboard"}
    daemon_pid = children["daemon"].pid
    children["router"].send_signal(signal.SIGKILL)
    wait_for(lambda: "router    exited with -9" in output.read_text(), timeout_s=30)
    wait_for(lambda: "router" in _children(up) and _children(up)["router"].pid != children["router"].pid, timeout_s=30)
    wait_for(lambda: _healthy(f"{router_url}/healthz"), timeout_s=120, poll_s=0.5)
    assert _children(up)["daemon"].pid == daemon_pid

    logs = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "logs", "router", "--config", str(configured.config_path), "-n", "400"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert logs.returncode == 0 and logs.stdout.count("tracefix up starts router") == 2, logs.stdout[-2000:]
    assert "tracefix router serving" in logs.stdout

    pids = [child.pid for child in _children(up).values()]
    up.send_signal(signal.SIGTERM)
    assert up.wait(60) == 0
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert "stopped" in output.read_text()


def test_a_taken_port_fails_the_start_with_the_childs_error_and_leaves_nothing_running(configured: RunningDaemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", configured.sections["api"]["port"]))
        taken.listen()
        process = _start(configured, "--without", "router", "--without", "dashboard")
        try:
            assert process.wait(90) == 1
        finally:
            if process.poll() is None:
                process.kill()
    printed = (configured.directory / "up.out").read_text()
    assert "tracefix up failed: daemon exited with" in printed and "address" in printed.lower(), printed[-2000:]
    def daemons() -> list[psutil.Process]:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if "daemon.app.cli daemon" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
            except psutil.NoSuchProcess:
                continue  # gone while looked at
        return found

    wait_for(lambda: not daemons(), timeout_s=10)  # the child daemon does not outlive `up`


# A stand-in for the vLLM server `tracefix up` starts from [router] vllm_command: a real process that
# answers /v1/models the way vLLM does (the router's vllm backend needs nothing more to be healthy).
STAND_IN = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, model = int(sys.argv[1]), sys.argv[2]
class Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": model, "root": model, "max_model_len": 2048}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", port), Models).serve_forever()
"""


def test_up_starts_the_configured_vllm_before_the_router_and_restarts_it_when_it_dies(tmp_path: Path, tiny_model: Path) -> None:
    vllm_port = free_port()
    script = tmp_path / "vllm_stand_in.py"
    script.write_text(STAND_IN)
    configured = make_daemon(
        tmp_path, model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        router={"port": free_port(), "backend": "vllm", "vllm_url": f"http://127.0.0.1:{vllm_port}", "export_spans": False,
                "vllm_command": [sys.executable, str(script), str(vllm_port), str(tiny_model)]},
    )  # fmt: skip
    process = _start(configured, "--without", "dashboard")
    output = configured.directory / "up.out"
    try:
        wait_for(lambda: "router    up" in output.read_text(), timeout_s=240, poll_s=0.5)
        printed = output.read_text()
        assert printed.index("vllm      up") < printed.index("router    up")  # vLLM first: the router fronts it
        assert f"vllm http://127.0.0.1:{vllm_port}" in printed
        engine = next(child for child in psutil.Process(process.pid).children() if str(script) in " ".join(child.cmdline()))
        engine.send_signal(signal.SIGKILL)
        wait_for(lambda: "vllm      exited with -9" in output.read_text(), timeout_s=30)
        wait_for(lambda: _healthy(f"http://127.0.0.1:{vllm_port}/v1/models"), timeout_s=60, poll_s=0.5)
        restarted = [child for child in psutil.Process(process.pid).children() if str(script) in " ".join(child.cmdline())]
        assert len(restarted) == 1 and restarted[0].pid != engine.pid
        router_url = f"http://127.0.0.1:{configured.sections['router']['port']}"
        wait_for(lambda: _healthy(f"{router_url}/healthz"), timeout_s=30, poll_s=0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert not restarted[0].is_running() or restarted[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
