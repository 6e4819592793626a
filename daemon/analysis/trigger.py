"""The trigger policy: a state machine per track (one agent's capability, ``daemon.core.tracks``) that
turns a gap held in that agent's own runs into one training request.

healthy → watching → gap_detected (emits one training request) → … (environment, training and
candidate states belong to later stages) → cooldown → healthy. A gap must be selected in
`hold_passes` consecutive statistics passes before it fires; after a promotion or rejection the
capability rests in cooldown. Every transition is recorded with its reason and statistics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson

from tracefix.daemon.core import metrics, tracks
from tracefix.daemon.analysis.capabilities import CapabilityRegistry
from tracefix.daemon.core.settings import AnalysisSettings, CapabilitySettings, TriggerSettings
from tracefix.daemon.core.states import CAPABILITY_STATES, PIPELINE_STATES, CapabilityState
from tracefix.daemon.store.store import AnalysisStore, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Transition:
    capability: str
    from_state: str
    to_state: str
    reason: str


def _summary(stats: dict[str, Any]) -> str:
    def number(value: Any) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    return (
        f"Δ={number(stats['delta'])} (ER-={number(stats['er_minus'])}, ER+={number(stats['er_plus'])}), "
        f"coverage={number(stats['coverage'])}, {stats['needed_failure']} failed runs need it"
    )


def _stats_json(stats: dict[str, Any]) -> str:
    return orjson.dumps({key: value for key, value in stats.items() if key != "computed_at"}).decode()


class Trigger:
    """Consumes each new statistics pass exactly once and moves capability states."""

    def __init__(
        self,
        store: Store,
        registry: CapabilityRegistry,
        analysis: AnalysisSettings,
        settings: TriggerSettings,
        capabilities: CapabilitySettings | None = None,
    ) -> None:
        self.store = AnalysisStore(store)
        self.registry = registry
        self.analysis = analysis
        self.settings = settings
        self.capabilities = capabilities or CapabilitySettings()

    def _gap_signal(self, stats: dict[str, Any]) -> bool:
        delta, coverage = stats["delta"], stats["coverage"]
        return delta is not None and coverage is not None and delta >= self.analysis.min_delta and coverage >= self.analysis.min_coverage

    def run_pass(self, now: datetime | None = None) -> list[Transition]:
        """Step every agent's track of every capability (``daemon.core.tracks``) on the latest pass's
        statistics of that agent's own runs: each agent has its own selection and its own trigger."""
        now = now or datetime.now(timezone.utc)
        rows = [row for row in self.store.stats(agent=None) if row["window_name"] == self.analysis.selection_window]
        if not rows:
            return []
        pass_id = rows[0]["pass_id"]
        names = set(self.registry.names())
        by_track = {tracks.name(row["capability"], row["agent"]): row for row in rows if row["capability"] in names}
        states = self.store.states()
        stepped = set(by_track) | {track for track in states if tracks.capability_of(track) in names}
        transitions = []
        for track in sorted(stepped):
            state = states.get(track) or {"state": CapabilityState.HEALTHY, "consecutive": 0, "last_pass_id": 0, "cooldown_until": None}
            if state["last_pass_id"] >= pass_id:
                continue  # this pass was already consumed
            transition = self._step(track, state, by_track.get(track), pass_id, now)
            if transition:
                transitions.append(transition)
        for capability, state in self.store.states().items():
            for name in CAPABILITY_STATES:
                metrics.CAPABILITY_STATE.labels(capability, name).set(1 if state["state"] == name else 0)
        return transitions

    def _step(
        self, capability: str, state: dict[str, Any], stats: dict[str, Any] | None, pass_id: int, now: datetime
    ) -> Transition | None:
        current, consecutive = state["state"], state["consecutive"]
        stats_json = _stats_json(stats) if stats else None

        def move(to: str, reason: str, count: int = 0, cooldown_until: Any = None) -> Transition | None:
            if not self.store.transition(capability, current, to, reason, count, pass_id, stats_json, cooldown_until):
                log.info("capability %s moved on while the trigger ran; it is stepped in the next pass", capability)
                return None
            if to != current:
                log.info("capability %s: %s -> %s (%s)", capability, current, to, reason)
                return Transition(capability, current, to, reason)
            return None

        if current == CapabilityState.COOLDOWN:
            until = state["cooldown_until"]
            if until is not None and until.tzinfo is None:
                until = until.replace(tzinfo=timezone.utc)
            if until is None or now >= until:
                return move(CapabilityState.HEALTHY, "cool-down over")
            return move(CapabilityState.COOLDOWN, state.get("reason") or "cooling down", 0, until)
        if current in PIPELINE_STATES:
            return move(current, state.get("reason") or current, consecutive)
        if stats is None:
            return move(CapabilityState.HEALTHY, "no labeled trajectories in the window")
        agent = tracks.agent_of(capability)
        if stats["selected"] and agent is not None and not self.capabilities.trains(agent):
            return move(CapabilityState.WATCHING, f"selected, not trained: [[capabilities.agents]] train = false for {agent}: {_summary(stats)}", 0)
        if stats["selected"]:
            consecutive += 1
            if consecutive >= self.settings.hold_passes:
                if self.store.open_training_request(capability) is None:
                    reason = f"gap held {consecutive} passes: {_summary(stats)}"
                    self.store.create_training_request(capability, "trigger", reason, "trigger", stats_json)
                    metrics.TRAINING_REQUESTS.labels(capability, "trigger").inc()
                return move(CapabilityState.GAP_DETECTED, f"gap held {consecutive} passes: {_summary(stats)}", consecutive)
            return move(CapabilityState.WATCHING, f"selected {consecutive}/{self.settings.hold_passes} passes: {_summary(stats)}", consecutive)
        if self._gap_signal(stats):
            reason = f"gap without enough evidence (need {self.analysis.min_failures} failed runs): {_summary(stats)}"
            return move(CapabilityState.WATCHING, reason, 0)
        return move(CapabilityState.HEALTHY, f"no gap: {_summary(stats)}", 0)
