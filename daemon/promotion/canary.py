"""Failure rates of routed traffic, per adapter version, and the comparison that judges them.

The router marks every request it serves with the capability whose traffic it was and the expert
that served it (``tracefix.router.capability``, ``tracefix.router.adapter``). An agent that passes
W3C trace context to the router gets those spans inside its own traces, so each of its
trajectories, with its outcome, is attributed to the versions that answered it.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from tracefix.daemon.core.intervals import difference, wilson
from tracefix.daemon.store import served
from tracefix.daemon.store.labels import LabelStore
from tracefix.daemon.store.store import Store



@dataclass(frozen=True, slots=True)
class Rate:
    """Failed trajectories out of those with a known outcome."""

    failures: int
    total: int

    @property
    def rate(self) -> float:
        return self.failures / self.total if self.total else 0.0

    def describe(self, z: float) -> dict[str, Any]:
        low, high = wilson(self.failures, self.total, z)
        return {"failures": self.failures, "total": self.total, "rate": round(self.rate, 4), "interval": [round(low, 4), round(high, 4)]}

    def text(self, z: float) -> str:
        low, high = wilson(self.failures, self.total, z)
        return f"{self.rate:.2f} [{low:.2f}, {high:.2f}] ({self.failures}/{self.total})"


@dataclass(frozen=True, slots=True)
class Verdict:
    worse: bool
    delta: float
    low: float
    high: float
    reason: str

    def describe(self) -> dict[str, Any]:
        return {"worse": self.worse, "delta": round(self.delta, 4), "interval": [round(self.low, 4), round(self.high, 4)], "reason": self.reason}


def z_of(confidence: float) -> float:
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def judge(candidate: Rate, reference: Rate, confidence: float, what: str, against: str) -> Verdict:
    """Worse only when the whole interval of the failure-rate difference lies above zero: an adapter
    is never rolled back on noise, and never kept when it clearly fails more."""
    z = z_of(confidence)
    if reference.total == 0:
        return Verdict(False, 0.0, -1.0, 1.0, f"{what} failure rate {candidate.text(z)}; no reference to compare with ({against})")
    delta, low, high = difference(candidate.failures, candidate.total, reference.failures, reference.total, z)
    worse = low > 0
    comparison = "worse than" if worse else "not worse than"
    return Verdict(
        worse, delta, low, high,
        f"{what} failure rate {candidate.text(z)} {comparison} {against} {reference.text(z)}: "
        f"difference {delta:+.2f} [{low:+.2f}, {high:+.2f}] at {confidence:.0%}",
    )  # fmt: skip


def routed_outcomes(store: Store, capability: str, since_ns: int, until_ns: int | None = None) -> dict[str, Rate]:
    """Per expert that served `capability`'s traffic since `since_ns` (before `until_ns` when given):
    its trajectories' outcomes."""
    rows = served.routed_outcomes(store, capability, since_ns, until_ns)
    return {row["expert"]: Rate(int(row["failures"]), int(row["total"])) for row in rows}


def capability_failure_rate(store: Store, track: str, window: str) -> Rate:
    """The track's failure rate in the latest analysis pass: its agent's failed runs among those that
    need the capability (every agent's, for a bare capability)."""
    counts = LabelStore(store).track_stats(track, window)
    if counts is None:
        return Rate(0, 0)
    return Rate(int(counts["needed_failure"]), int(counts["needed_failure"] + counts["needed_success"]))
