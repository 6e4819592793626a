"""Capability state moves are compare-and-set: a job working from a stale read cannot undo another
job's move (the trigger once overwrote the synthesizer's `environment` with `gap_detected`)."""

from __future__ import annotations

import threading
from pathlib import Path

from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import AnalysisStore, Store


def test_a_stale_move_is_refused_and_records_nothing(tmp_path: Path) -> None:
    store = Store(StoreSettings(path=tmp_path / "states.duckdb"))
    analysis = AnalysisStore(store)
    assert analysis.transition("error_recovery", "healthy", "gap_detected", "gap held", 2, 5)
    assert analysis.transition("error_recovery", "gap_detected", "environment", "environment 1 checked", 2, 5)
    # A pass that read `gap_detected` before the synthesizer's move must not write it back.
    assert not analysis.transition("error_recovery", "gap_detected", "gap_detected", "stale", 3, 6)
    state = analysis.states()["error_recovery"]
    assert (state["state"], state["consecutive"], state["last_pass_id"]) == ("environment", 2, 5)
    moves = [(row["from_state"], row["to_state"]) for row in analysis.transitions("error_recovery")]
    assert moves == [("gap_detected", "environment"), ("healthy", "gap_detected")]
    store.close()


def test_concurrent_movers_from_the_same_state_leave_exactly_one_winner(tmp_path: Path) -> None:
    store = Store(StoreSettings(path=tmp_path / "race.duckdb"))
    analysis = AnalysisStore(store)
    analysis.transition("tool_call_precision", "healthy", "gap_detected", "gap held", 2, 1)
    results: list[object] = []
    barrier = threading.Barrier(2)

    def move(to_state: str) -> None:
        barrier.wait()
        results.append(analysis.transition("tool_call_precision", "gap_detected", to_state, to_state, 2, 1))

    threads = [threading.Thread(target=move, args=(state,)) for state in ("environment", "cooldown")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # The loser is told it lost; it never sees DuckDB's write-write conflict.
    assert sorted(results, key=str) == [False, True], results
    final = analysis.states()["tool_call_precision"]["state"]
    assert final in {"environment", "cooldown"}
    moves = [row["to_state"] for row in analysis.transitions("tool_call_precision")]
    assert moves == [final, "gap_detected"]
    store.close()


def test_counter_updates_racing_a_move_never_conflict(tmp_path: Path) -> None:
    """The trigger refreshes a capability's counters every pass while the training job moves it;
    DuckDB fails one of two concurrent updates of a row, so moves must take turns."""
    store = Store(StoreSettings(path=tmp_path / "counters.duckdb"))
    analysis = AnalysisStore(store)
    analysis.transition("error_recovery", "healthy", "environment", "environment 1 checked", 0, 0)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def refresh(worker: int) -> None:
        barrier.wait()
        for pass_id in range(40):
            try:
                analysis.transition("error_recovery", "environment", "environment", "counters", worker, pass_id)
            except BaseException as error:  # noqa: BLE001 - any failure is the finding
                errors.append(error)

    def move() -> None:
        barrier.wait()
        try:
            while not analysis.transition("error_recovery", "environment", "training", "run 1 started", 0, 0):
                pass
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=refresh, args=(n,)) for n in range(3)] + [threading.Thread(target=move)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert analysis.states()["error_recovery"]["state"] == "training"
    store.close()
