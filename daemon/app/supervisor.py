"""`tracefix up`: the daemon, the router and the dashboard as supervised child processes — and the
vLLM server the router fronts, when `[router] vllm_command` says how to start it.

Each child is the same `tracefix <name> --config …` a person could start by hand, with its output
in ``<data dir>/logs/<name>.log`` (read it with `tracefix logs NAME`). Children start in order and
each must answer its health check before the next starts (the router's promotion calls need the
daemon's registry; the dashboard reads the daemon's API). A child that exits on its own is
restarted after a backoff that doubles on each crash and resets once it has stayed up a while.
Ctrl-C or SIGTERM stops them all, in reverse order: SIGTERM first, SIGKILL after a grace period.
Children are also told by the kernel to stop when the supervisor itself dies (PR_SET_PDEATHSIG),
so a supervisor killed with SIGKILL leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tracefix.daemon.core.settings import Settings

log = logging.getLogger(__name__)

NAMES = ("daemon", "router", "dashboard")
VLLM = "vllm"  # started before the router when [router] backend = "vllm" and vllm_command is set
LOG_DIRECTORY = "logs"
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # up this long after a restart: the next crash starts the backoff over
GRACE_S = 20.0


def loopback(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def log_directory(settings: Settings) -> Path:
    return settings.data_dir / LOG_DIRECTORY


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    health_url: str
    listens: dict[str, str]
    start_timeout_s: float
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = FIRST_BACKOFF_S
    restart_at: float | None = None
    history: list[int] = field(default_factory=list)  # exit codes of crashes

    def healthy(self) -> bool:
        try:
            return httpx.get(self.health_url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def children(settings: Settings, config_path: Path | None, names: Sequence[str] = NAMES) -> list[Child]:
    """The child processes for `names`, in start order, with where each listens."""
    config = ["--config", str(Path(config_path).resolve())] if config_path else []
    logs = log_directory(settings)
    api, router, dashboard, collector = settings.api, settings.router, settings.dashboard, settings.collector
    api_url = f"http://{loopback(api.host)}:{api.port}"
    specs = {
        "daemon": (
            f"{api_url}/healthz",
            {
                "api": api_url,
                "otlp_http": f"http://{loopback(collector.host)}:{collector.http_port}",
                "otlp_grpc": f"{loopback(collector.host)}:{collector.grpc_port}",
            },
            60.0,
        ),
        "router": (
            f"http://{loopback(router.host)}:{router.port}/healthz",
            {"openai_api": f"http://{loopback(router.host)}:{router.port}/v1"},
            600.0,  # the first start converts the embedded model
        ),
        "dashboard": (
            f"http://{loopback(dashboard.host)}:{dashboard.port}/_stcore/health",
            {"dashboard": f"http://{loopback(dashboard.host)}:{dashboard.port}"},
            120.0,
        ),
    }
    started = [
        Child(name, [sys.executable, "-m", "tracefix.daemon.app.cli", name, *config], health, listens, timeout, logs / f"{name}.log")
        for name in names
        for health, listens, timeout in [specs[name]]
    ]
    if "router" in names and router.backend == "vllm" and router.vllm_command:
        url = router.vllm_url.rstrip("/")
        engine = Child(VLLM, list(router.vllm_command), f"{url}/v1/models", {"vllm": url}, 900.0, logs / f"{VLLM}.log")
        started.insert(next(index for index, child in enumerate(started) if child.name == "router"), engine)
    return started


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies, however it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class StartFailed(RuntimeError):
    pass


class Supervisor:
    def __init__(self, children: list[Child], say: Callable[[str], None] = print) -> None:
        self.children = children
        self.say = say
        self.stopping = threading.Event()

    # -- one child -----------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with child.log_path.open("ab") as output:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            output.write(f"\n---- {stamp} tracefix up starts {child.name} (start {child.restarts + 1}) ----\n".encode())
            output.flush()
            child.process = subprocess.Popen(
                child.argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        child.started_at = time.monotonic()
        child.restart_at = None

    def _wait_healthy(self, child: Child) -> None:
        deadline = time.monotonic() + child.start_timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set():
            assert child.process is not None
            if child.process.poll() is not None:
                raise StartFailed(f"{child.name} exited with {child.process.returncode} while starting:\n{tail(child.log_path, 15)}")
            if child.healthy():
                return
            time.sleep(0.25)
        if not self.stopping.is_set():
            raise StartFailed(f"{child.name} was not healthy within {child.start_timeout_s:g} s:\n{tail(child.log_path, 15)}")

    # -- all of them ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the children in order, each healthy before the next; on failure stop what started."""
        for child in self.children:
            if self.stopping.is_set():
                return
            self._spawn(child)
            try:
                self._wait_healthy(child)
            except StartFailed:
                self.stop()
                raise
            where = ", ".join(f"{key} {value}" for key, value in child.listens.items())
            self.say(f"{child.name:<9} up (pid {child.process.pid}): {where}")  # type: ignore[union-attr]

    def watch(self, poll_s: float = 0.5) -> None:
        """Restart crashed children with backoff until `stop`."""
        while not self.stopping.wait(poll_s):
            now = time.monotonic()
            for child in self.children:
                self._check(child, now)

    def _check(self, child: Child, now: float) -> None:
        process = child.process
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts += 1
                self._spawn(child)
                self.say(f"{child.name:<9} restarted (pid {child.process.pid}, restart {child.restarts})")  # type: ignore[union-attr]
            return
        if process is None or process.poll() is None:
            if process is not None and now - child.started_at > STABLE_S:
                child.backoff_s = FIRST_BACKOFF_S
            return
        child.history.append(process.returncode)
        child.restart_at = now + child.backoff_s
        self.say(
            f"{child.name:<9} exited with {process.returncode}; restarting in {child.backoff_s:g} s "
            f"(tracefix logs {child.name})"
        )
        child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)

    def stop(self) -> None:
        """SIGTERM every running child, newest first; SIGKILL what is still there after the grace period."""
        self.stopping.set()
        running = [child.process for child in reversed(self.children) if child.process and child.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024 * max(1, lines // 100 + 1)))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run(settings: Settings, config_path: Path | None, names: Sequence[str], say: Callable[[str], None]) -> int:
    """`tracefix up`: start, supervise, stop on SIGINT/SIGTERM. Returns the exit status."""
    supervisor = Supervisor(children(settings, config_path, names), say)

    def on_signal(signum: int, _frame: object) -> None:
        supervisor.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        supervisor.start()
    except StartFailed as error:
        say(f"tracefix up failed: {error}")
        return 1
    if not supervisor.stopping.is_set():
        say(f"logs in {log_directory(settings)} (tracefix logs NAME); Ctrl-C stops everything")
        supervisor.watch()
    say("stopping …")
    supervisor.stop()
    say("stopped")
    return 0
