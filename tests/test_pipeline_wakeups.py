"""A pipeline stage that did something wakes the stages after it at once, instead of leaving them
to their next interval: the daemon's own job wrappers and wake-ups, in-process, with passes that
record when they run."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path

from tracefix.daemon.app.service import FOLLOWING, Daemon
from tracefix.daemon.core.settings import Settings


def test_a_stage_that_did_something_wakes_the_stages_after_it(tmp_path: Path) -> None:
    settings = Settings.model_validate({"store": {"path": str(tmp_path / "tracefix.duckdb")}, "analysis": {"interval_s": 3600}})
    daemon = Daemon(settings)
    ran: queue.Queue[str] = queue.Queue()

    def stage(name: str, *results: object) -> Callable[[], None]:
        """A pass that records itself and returns ``results`` in turn (then None: nothing to do)."""
        left = list(results)

        def run() -> object:
            ran.put(name)
            return left.pop(0) if left else None

        return daemon._job(name, run)

    def runs(expected: int = 0, settle_s: float = 0.3) -> list[str]:
        """The stages that ran since the last call: waits (up to 10 s) for `expected` of them, then
        `settle_s` more for any that should not have run (a run that never comes can only be waited
        for)."""
        names = []
        deadline = time.monotonic() + 10
        while len(names) < expected:
            try:
                names.append(ran.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{expected} stage runs wanted, {names} came") from None
        time.sleep(settle_s)
        while not ran.empty():
            names.append(ran.get())
        return sorted(names)

    try:
        daemon._schedule()
        assert set(FOLLOWING) <= set(daemon._runners)  # every stage that hands on is a scheduled job
        daemon._runners.update({"validate": stage("validate"), "train": stage("train", 3), "promote": stage("promote")})
        daemon._job("validate", lambda: None)()  # a pass that found nothing to do wakes nobody
        assert runs() == []
        daemon._job("validate", lambda: 7)()  # environment 7 validated: the next environment, and training
        # ... and training, which had a run to finish (3), hands on to itself and to promotion.
        assert runs(4) == ["promote", "train", "train", "validate"]
        daemon.wake("no such job")  # nothing to wake: no error
        daemon._draining.set()  # the daemon drains: nothing more is woken
        daemon._job("validate", lambda: 7)()
        assert runs() == []
    finally:
        daemon.store.close()
