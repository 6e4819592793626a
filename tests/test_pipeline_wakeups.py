"""A pipeline stage that did something wakes the stages after it at once, instead of leaving them
to their next interval: the daemon's real scheduler and jobs, in-process, nothing started."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from daemon.app.service import FOLLOWING, Daemon
from daemon.core.settings import Settings


def test_a_stage_that_did_something_wakes_the_stages_after_it(tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "store": {"path": str(tmp_path / "tracefix.duckdb")},
        "analysis": {"interval_s": 3600},
        "promotion": {"interval_s": 3600},
    })  # fmt: skip
    daemon = Daemon(settings)
    try:
        daemon._schedule()
        daemon.scheduler.start(paused=True)  # next run times set, nothing runs

        def due(job: str) -> datetime:
            return daemon.scheduler.get_job(job).next_run_time

        later = datetime.now(timezone.utc) + timedelta(minutes=30)
        stages = ("synthesize", "validate", "train", "promote")
        assert all(due(job) > later for job in stages)
        daemon._job("validate", lambda: None)()  # a pass that found nothing to do
        assert all(due(job) > later for job in stages)
        daemon._job("validate", lambda: 7)()  # environment 7 validated
        soon = datetime.now(timezone.utc) + timedelta(seconds=5)
        assert due("validate") <= soon and due("train") <= soon  # the next environment, and training
        assert due("synthesize") > later and due("promote") > later
        daemon._job("train", lambda: 3)()  # run 3 has its verdict
        assert due("promote") <= soon
        daemon.wake("no such job")  # nothing to wake: no error
        assert set(FOLLOWING) <= {job.id for job in daemon.scheduler.get_jobs()}
    finally:
        daemon.scheduler.shutdown(wait=False)
        daemon.store.close()
