"""Model work the daemon runs in a subprocess (validation, training): bounded in time, killable on
stop, its stderr kept for the reason of a failure. The model never loads into the daemon itself."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tracefix.daemon.core.threads import model_process_environment

STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL
ERROR_LINES = 5  # lines of stderr kept as the reason of a failed run


class Stopped(Exception):
    """The daemon is stopping; the work was interrupted and should be picked up after a restart."""


class TimedOut(Exception):
    pass


class ModelSubprocess:
    """Runs ``python -m MODULE ARGS`` one at a time; ``stop()`` from any thread kills the current one."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def run(
        self,
        module: str,
        arguments: Sequence[str],
        log_path: Path,
        timeout_s: float,
        on_poll: Callable[[], None] | None = None,
        poll_s: float = 2.0,
    ) -> int:
        """The exit code; raises Stopped when stopped, TimedOut after ``timeout_s``.
        ``on_poll`` (if given) is called every ``poll_s`` seconds while the process runs."""
        with log_path.open("wb") as stderr:
            with self._lock:
                if self.stopping.is_set():
                    raise Stopped
                # Its own session: a Ctrl-C at the terminal reaches the daemon, which stops it in order.
                process = self._process = subprocess.Popen(
                    [sys.executable, "-m", module, *arguments],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                    env=model_process_environment(),
                )  # fmt: skip
            try:
                returncode = self._wait(process, timeout_s, on_poll, poll_s)
            finally:
                with self._lock:
                    self._process = None
        if self.stopping.is_set():
            raise Stopped
        if returncode is None:
            raise TimedOut(f"timed out after {timeout_s:g} s")
        return returncode

    @staticmethod
    def _wait(
        process: subprocess.Popen, timeout_s: float, on_poll: Callable[[], None] | None, poll_s: float
    ) -> int | None:
        deadline = time.monotonic() + timeout_s
        while True:
            step = max(0.0, deadline - time.monotonic())
            if on_poll is not None:
                step = min(step, poll_s)
            try:
                return process.wait(step)
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    terminate(process)
                    return None
                if on_poll is not None:
                    on_poll()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            process = self._process
        if process is not None:
            terminate(process)


def error_tail(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").strip().splitlines()[-ERROR_LINES:] if log_path.exists() else []
    return "\n".join(lines) or "no output"


def terminate(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
