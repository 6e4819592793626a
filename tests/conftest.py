"""Shared fixtures: a real `tracefix daemon` process on free loopback ports with its own DuckDB file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + " }"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class RunningDaemon:
    """A daemon subprocess and the addresses it serves."""

    directory: Path
    sections: dict[str, dict[str, Any]]
    process: subprocess.Popen | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.directory / "daemon.log"
        self.config_path = self.directory / "tracefix.toml"
        self.write_config()

    def write_config(self) -> None:
        """Write `sections` as the config file (again, after a test changed them for a restart)."""
        lines = []
        for section, values in self.sections.items():
            lines.append(f"[{section}]")
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        self.config_path.write_text("\n".join(lines) + "\n")

    @property
    def db_path(self) -> Path:
        return Path(self.sections["store"]["path"])

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.sections['collector']['http_port']}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.sections['collector']['grpc_port']}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.sections['api']['port']}"

    def start(self, timeout_s: float = 30.0) -> RunningDaemon:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "daemon", "--config", str(self.config_path)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.api_url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"daemon did not become healthy:\n{self.log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.api_url}{path}", params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def status(self) -> dict[str, Any]:
        return self.get("/api/status")

    def wait_assembled(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """Wait until every committed batch has been assembled into trajectories."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            ingest = status["ingest"]
            if ingest["assembled_batch"] >= ingest["committed_batch"] and ingest["writer_queue_rows"] == 0:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"assembly did not catch up: {ingest}")
            time.sleep(0.1)

    def wait_analyzed(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait for an analysis pass that started after everything sent so far was assembled."""
        self.wait_assembled(timeout_s)
        analysis = self.status()["analysis"]
        target = (analysis["pass_id"] if analysis else 0) + 2
        deadline = time.monotonic() + timeout_s
        while True:
            analysis = self.status()["analysis"]
            if analysis and analysis["pass_id"] >= target:
                return analysis
            if time.monotonic() > deadline:
                raise TimeoutError(f"no analysis pass after assembly: {analysis}")
            time.sleep(0.1)

    def query(self, sql: str) -> list[tuple]:
        """Read the database directly; only valid while the daemon is stopped (DuckDB allows one writer)."""
        import duckdb

        assert self.process is None or self.process.poll() is not None, "stop the daemon before reading its file"
        with duckdb.connect(str(self.db_path), read_only=True) as connection:
            return connection.execute(sql).fetchall()


def make_daemon(directory: Path, **overrides: dict[str, Any]) -> RunningDaemon:
    """A daemon configuration on free ports in `directory`; sections in `overrides` are merged in."""
    sections: dict[str, dict[str, Any]] = {
        "store": {"path": str(directory / "tracefix.duckdb")},
        "collector": {"http_port": free_port(), "grpc_port": free_port()},
        "api": {"port": free_port()},
        "assembler": {"interval_s": 0.2},
    }
    # No model subprocesses unless a test asks for the gate or for training.
    if "validation" not in overrides:
        sections["validation"] = {"enabled": False}
    if "training" not in overrides:
        sections["training"] = {"enabled": False}
    if "generalist" not in overrides:  # a test of targeted training gets no generalist run first
        sections["generalist"] = {"enabled": False}
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return RunningDaemon(directory, sections)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path).start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    """SmolLM2's real tokenizer, read from the embedded GGUF file (no hub)."""
    import transformers  # noqa: F401  (installed by make test: never skipped)
    from transformers import AutoTokenizer

    from tracefix.trainer.model import embedded_gguf

    gguf = embedded_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: Any) -> Path:
    """A 2-layer random Llama directory with SmolLM2's tokenizer: real model code paths in seconds.
    Shared by the whole session, so tests only read it."""
    from tracefix.trainer.model import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny"), smollm2_tokenizer)


@pytest.fixture(scope="session")
def wide_tiny_model(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: Any) -> Path:
    """``tiny_model`` with a wide initializer: logits with range, so greedy choices are not ties
    and generated text tells models apart. Shared by the whole session, so tests only read it."""
    from tracefix.trainer.model import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("wide-tiny"), smollm2_tokenizer, initializer_range=0.2)


def ending_model(model: Any, eos: int, bias: float) -> Any:
    """A copy of ``model`` with its end-of-turn token's logit raised by ``bias``: turns of a tiny
    random model that end part-way, at different lengths."""
    import copy

    import torch

    ending = copy.deepcopy(model)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[eos] = bias
    ending.lm_head = head
    return ending


def wait_for(condition: Any, timeout_s: float = 30.0, poll_s: float = 0.2) -> Any:
    """The first truthy value of ``condition()`` within ``timeout_s``; TimeoutError after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"condition not reached in {timeout_s:g} s: {condition}")



@contextmanager
def serving_router(config: Path) -> Iterator[tuple[str, Any, Any]]:
    """An in-process `tracefix router` (the app, its embedded backend) on a free loopback port for
    the config file at `config`: (its URL, the app, the backend), stopped on exit."""
    import threading

    import uvicorn

    from tracefix.daemon.core.settings import load_settings
    from tracefix.router.embedded import EmbeddedBackend
    from tracefix.router.server import create_app

    settings = load_settings(config)
    backend = EmbeddedBackend.from_settings(settings)
    app = create_app(settings, backend)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process router did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app, backend
    finally:
        server.should_exit = True
        thread.join(10)
        app.state.table.close()
        backend.stop()
        app.state.telemetry.shutdown()
