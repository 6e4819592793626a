"""The demo's traffic: streams of the example agent's conversations, each started as soon as a worker
is free (no barrier between batches), seeded batches regenerated on every pass, a pace, and a hold
that lets the conversations under way finish and starts no new one. Scripted policies, no collector:
the example agent's real conversations, without a model."""

from __future__ import annotations

import threading
import time

from examples.demo.panel import PANEL_BATCH, Stream, Tally, Traffic
from tracefix.daemon.core.settings import Settings

SCRIPTED = {"policy": "scripted", "collector": None, "conversations": PANEL_BATCH, "concurrency": 2, "rate": 0.0}


def wait_for(condition, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_stream_takes_goals_batch_after_batch_with_a_fresh_database_each_pass() -> None:
    stream = Stream(SCRIPTED, lambda batch: batch % 2, counted=True, holds=False)
    stopping = threading.Event()
    taken = [stream.take(stopping) for _ in range(2 * PANEL_BATCH + 1)]
    assert all(item is not None for item in taken)
    assert [(batch.seed, index, number) for batch, index, number in taken] == [  # type: ignore[misc]
        *((0, index, index) for index in range(PANEL_BATCH)),
        *((1, index, PANEL_BATCH + index) for index in range(PANEL_BATCH)),
        (0, 0, 2 * PANEL_BATCH),
    ]
    first, again = taken[0][0], taken[-1][0]  # type: ignore[index]
    assert first is not again and first.tasks == again.tasks  # the same goals over a database generated again
    assert taken[1][0] is first  # one batch's conversations share its database
    outcome = stream.session().run(*taken[0])  # type: ignore[misc]
    assert outcome.conversation_id.endswith("-0000") and outcome.task_id == first.tasks[0].task_id
    stream.close()


def test_a_stream_keeps_its_pace_and_stops_waiting_when_told() -> None:
    stream = Stream({**SCRIPTED, "rate": 10.0}, lambda batch: batch, counted=True, holds=False)
    stopping = threading.Event()
    started = time.monotonic()
    for _ in range(5):
        assert stream.take(stopping) is not None
    assert time.monotonic() - started >= 0.4  # five starts at 10 a second: the last one 0.4 s after the first
    slow = Stream({**SCRIPTED, "rate": 0.01}, lambda batch: batch, counted=True, holds=False)
    assert slow.take(stopping) is not None  # the first starts at once
    stopping.set()
    started = time.monotonic()
    assert slow.take(stopping) is None  # the next one would wait 100 s: stopping ends the wait
    assert time.monotonic() - started < 5


def test_traffic_runs_its_streams_until_stopped_and_holds_only_the_streams_that_hold() -> None:
    tally = Tally()
    traffic = Traffic(Settings(), tally, "scripted", 0.0)
    held = Stream({**SCRIPTED, "service_name": "held"}, lambda batch: batch, counted=True, holds=True)
    free = Stream({**SCRIPTED, "service_name": "free"}, lambda batch: batch, counted=False, holds=False)
    traffic.streams = [held, free]
    traffic.hold.set()
    traffic.start()
    wait_for(lambda: free._number >= 12)  # the free stream runs while the other holds
    assert held._number == 0 and not tally.before
    traffic.hold.clear()
    wait_for(lambda: len(tally.before) >= 12)  # counted: only the held stream's outcomes
    traffic.stopping.set()
    traffic.join(60)
    assert not traffic.is_alive()
    ids = list(tally.before)
    assert len(set(ids)) == len(ids) and all(conversation.startswith("airline-") for conversation in ids)
    assert len(tally.before) <= held._number  # every tallied conversation was one the held stream took
