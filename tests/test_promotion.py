"""The adapter lifecycle on a real DuckDB file: legal and illegal moves, required reasons and the
audit log. Going live, rollback and restarts against a real router are in tests/test_going_live.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tracefix.daemon.promotion.lifecycle import IllegalTransition, NotFound, Promotion
from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import AnalysisStore, Store
from tracefix.daemon.core.states import CapabilityState
from tests.lora_support import register_candidate


@pytest.fixture
def promotion(tmp_path: Path) -> Iterator[Promotion]:
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    for version in (1, 2):
        register_candidate(store, "error_recovery", version, f"/adapters/v{version}", version)
    yield Promotion(store)
    store.close()


def test_approval_and_rejection_are_audited_with_who_and_why(promotion: Promotion) -> None:
    promotion.approve(1, "alice", "looks good")
    promotion.reject(2, "bob", "regresses refunds")
    assert promotion.adapter(1)["state"] == "approved" and promotion.adapter(2)["state"] == "rejected"
    entries = [(row["actor"], row["action"], row["adapter_id"], row["from_state"], row["to_state"], row["reason"]) for row in promotion.audit()]
    assert entries == [
        ("bob", "reject", 2, "candidate", "rejected", "regresses refunds"),
        ("alice", "approve", 1, "candidate", "approved", "looks good"),
    ]


def test_a_rejection_cools_the_capability_down_so_it_can_trigger_again_later(promotion: Promotion) -> None:
    promotion.reject(1, "bob", "answers refunds wrongly")
    state = AnalysisStore(promotion.store).states()["error_recovery"]
    assert state["state"] == CapabilityState.COOLDOWN and state["cooldown_until"] is not None
    assert "error_recovery@v1 rejected by bob: answers refunds wrongly" in state["reason"]


def test_illegal_transitions_are_refused_and_change_nothing(promotion: Promotion) -> None:
    promotion.reject(1, "bob", "no")
    with pytest.raises(IllegalTransition, match="rejected; it cannot become approved"):
        promotion.approve(1, "alice")
    with pytest.raises(IllegalTransition, match="candidate; it cannot become live"):
        promotion.move(2, "live", "alice", "skip the queue")
    with pytest.raises(NotFound):
        promotion.approve(99, "alice")
    assert promotion.adapter(1)["state"] == "rejected" and promotion.adapter(2)["state"] == "candidate"
    assert len(promotion.audit()) == 1


def test_rejection_needs_a_reason(promotion: Promotion) -> None:
    with pytest.raises(ValueError, match="reason is required"):
        promotion.reject(1, "bob", "  ")
    assert promotion.adapter(1)["state"] == "candidate" and promotion.audit() == []
