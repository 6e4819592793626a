"""Promotion: the adapter lifecycle after training, with a person in control and an audit log.

    candidate ──approve──▶ approved ──router loaded──▶ canary ──not worse──▶ live ──newer live──▶ retired
        │                     │                          │                    │
        └──reject──▶ rejected ◀┘                         └──worse──▶ rolled_back ◀──worse / rollback
                                                          (the version it replaced serves again)

Approval only records the decision; the promote job loads the adapter into the router under
``<capability>@v<N>`` and moves it on only once the router has it, so nothing is half-live: a
router that is down or refuses leaves the adapter where it was with the error shown, and the next
pass retries. With a canary (the default) the new version first takes a share of its capability's
traffic; once enough of the trajectories it served have outcomes, its failure rate is compared with
the rest of that traffic (the previous version, or the base model) and it is promoted to all of it
or rolled back. A live adapter is watched after that too: when its failure rate gets worse than the
rate before promotion beyond the interval, it is rolled back and its capability cools down. Every
human and automatic decision is written to the audit log (who, when, what, why) and automatic
rollbacks are counted in ``tracefix_adapter_rollbacks_total``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from tracefix.daemon.core import generalist, metrics
from tracefix.daemon.promotion.canary import Rate, Verdict, capability_failure_rate, judge, routed_outcomes, z_of
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.promotion.router_client import RouterError
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.states import ADAPTER_TRANSITIONS, NEEDS_REASON, SERVING_STATES, AdapterState, ServingRole
from tracefix.daemon.store.store import AnalysisStore, Store

log = logging.getLogger(__name__)

AUTOMATIC = "promotion"  # the audit log's actor for decisions the daemon takes itself


class IllegalTransition(ValueError):
    """The adapter is not in a state this move starts from; the message says which moves are legal."""


class NotFound(LookupError):
    pass


class RouterClient(Protocol):
    """What promotion needs from the router's admin API."""

    def load(
        self, name: str, capability: str, version: int, path: str, description: str, canary: float | None = None,
        instructions: Sequence[str] = (),
    ) -> None: ...

    def promote(self, name: str) -> None: ...

    def unload(self, name: str) -> None: ...

    def serving(self) -> dict[str, str]: ...


def served_name(adapter: dict[str, Any]) -> str:
    return f"{adapter['capability']}@v{adapter['version']}"


@dataclass(slots=True)
class Decision:
    adapter_id: int
    from_state: str
    to_state: str
    actor: str
    reason: str


class Promotion:
    def __init__(
        self,
        store: Store,
        settings: Settings | None = None,
        describe: Callable[[str], str] | None = None,
        instructions: Callable[[str], list[str]] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or Settings()
        # What the router's classifier reads about a capability: its description (default: its name).
        self.describe = describe or (lambda capability: capability)
        # The digests of a track's agent's system instructions, by which the router recognises it.
        self.instructions = instructions or (lambda capability: [])
        self.runs = RunStore(store)
        # Decisions take turns: a rollback by hand must not land between the promote job reading
        # what the router serves and loading what the registry wants (it would load it again).
        self.turn = threading.RLock()
        # Whether the router could not be reconciled on the last pass: an outage is logged when it
        # starts and when it ends, not on every pass.
        self._router_down = False

    # -- reads ---------------------------------------------------------------------------------

    def adapter(self, adapter_id: int) -> dict[str, Any]:
        found = self.runs.adapter(adapter_id)
        if found is None:
            raise NotFound(f"no adapter {adapter_id}")
        return found

    def audit(self, adapter_id: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
        return self.runs.audit(adapter_id, limit)

    def in_state(self, state: str) -> list[dict[str, Any]]:
        return self.runs.adapters(state=state, limit=1_000_000)[::-1]

    def _live_of(self, capability: str, other_than: int) -> dict[str, Any] | None:
        return self.runs.live_adapter(capability, other_than)

    def routing(self, adapter: dict[str, Any]) -> dict[str, Any] | None:
        """For a canary or live adapter: its routed failure rate, what it is compared with, and the
        verdict so far (what the dashboard shows next to it)."""
        if adapter["state"] not in SERVING_STATES or adapter.get("routed_since_ns") is None:
            return None
        z_rate = z_of(self.settings.promotion.confidence)
        name = served_name(adapter)
        arms = routed_outcomes(self.store, adapter["capability"], adapter["routed_since_ns"])
        own = arms.get(name, Rate(0, 0))
        if adapter["state"] == AdapterState.CANARY:
            reference, against = self._canary_reference(adapter, arms)
            needed = self.settings.promotion.canary_min_trajectories
        else:
            baseline = adapter.get("baseline") or {}
            reference, against, needed = Rate(baseline.get("failures", 0), baseline.get("total", 0)), "before promotion", self.settings.promotion.watch_min_trajectories
        verdict = judge(own, reference, self.settings.promotion.confidence, name, against)
        return {
            "adapter": own.describe(z_rate), "reference": {"name": against, **reference.describe(z_rate)},
            "needed": needed, "verdict": verdict.describe(), "since_ns": adapter["routed_since_ns"],
        }  # fmt: skip

    # -- moves ---------------------------------------------------------------------------------

    def move(
        self, adapter_id: int, to_state: str, actor: str, reason: str, action: str | None = None, **columns: Any
    ) -> Decision:
        """One legal transition, recorded in the audit log in the same transaction; `columns` are
        set on the adapter row with it."""
        if to_state in NEEDS_REASON and not reason.strip():
            raise ValueError(f"a reason is required to move an adapter to {to_state}")

        def legal(from_state: str) -> None:
            if to_state not in ADAPTER_TRANSITIONS.get(from_state, frozenset()):
                allowed = ", ".join(sorted(ADAPTER_TRANSITIONS.get(from_state, frozenset()))) or "none (final state)"
                raise IllegalTransition(f"adapter {adapter_id} is {from_state}; it cannot become {to_state} (legal: {allowed})")

        moved = self.runs.transition(adapter_id, to_state, reason, actor, action or to_state, legal, columns)
        if moved is None:
            raise NotFound(f"no adapter {adapter_id}")
        from_state, capability = moved
        log.info("adapter %d (%s): %s -> %s by %s: %s", adapter_id, capability, from_state, to_state, actor, reason)
        return Decision(adapter_id, from_state, to_state, actor, reason)

    def approve(self, adapter_id: int, actor: str, reason: str = "") -> Decision:
        with self.turn:
            return self.move(adapter_id, AdapterState.APPROVED, actor, reason or "approved", "approve")

    def reject(self, adapter_id: int, actor: str, reason: str) -> Decision:
        """A person turns the candidate down: the capability cools down, then may trigger again."""
        with self.turn:
            decision = self.move(adapter_id, AdapterState.REJECTED, actor, reason, "reject")
            adapter = self.adapter(adapter_id)
            cool = f"{served_name(adapter)} rejected by {actor}: {reason}"
            AnalysisStore(self.store).start_cooldown(adapter["capability"], cool, self.settings.trigger.cooldown_hours)
            return decision

    def record_error(self, adapter_id: int, error: str) -> None:
        self.runs.record_error(adapter_id, error)

    # -- going live ----------------------------------------------------------------------------

    def run_pass(self, router: RouterClient) -> list[Decision]:
        """One pass of the promote job: the router first serves exactly the registry's live and
        canary set, then approved adapters go to it and canaries and live adapters are judged."""
        with self.turn:
            try:
                if self.has_served():  # else the router holds nothing of ours: nothing to reconcile
                    self.reconcile(router)
            except RouterError as error:  # down or restarting: approvals still record why they wait
                self._router_failed(error)
            else:
                self._router_answered()
            return self.promote_pass(router)

    def _router_failed(self, error: RouterError) -> None:
        metrics.ROUTER_RECONCILED.set(0)
        if not self._router_down:
            log.warning("router not reconciled: %s (retried every %g s; logged again when it is)", error, self.settings.promotion.interval_s)
        self._router_down = True

    def _router_answered(self) -> None:
        metrics.ROUTER_RECONCILED.set(1)
        if self._router_down:
            log.info("router reconciled again: it serves the registry's live and canary versions")
        self._router_down = False

    def has_served(self) -> bool:
        """Whether any version was ever handed to the router (so the router may hold adapters)."""
        return self.runs.has_served()

    def promote_pass(self, router: RouterClient) -> list[Decision]:
        """Load each approved adapter into the router (as a canary, or straight to all of its
        capability's traffic), then judge canaries and watch live adapters."""
        decisions = []
        settings = self.settings.promotion
        for adapter in self.in_state(AdapterState.APPROVED):
            name = served_name(adapter)
            fraction = settings.canary_fraction if settings.canary else None
            if not self._router_call(adapter, f"router did not load {name}", router.load, *self._loading(adapter, fraction)):
                continue
            if fraction is None:
                decisions += self._go_live(adapter, self._pre_promotion_rate(adapter), f"loaded into the router as {name}")
            else:
                control = self._control_name(adapter)
                reason = f"canary: {fraction:.0%} of {adapter['capability']} traffic, the rest on {control}"
                decisions.append(self.move(adapter["adapter_id"], AdapterState.CANARY, AUTOMATIC, reason, "canary", routed_since_ns=time.time_ns()))
        for adapter in self.in_state(AdapterState.CANARY):
            decisions += self._judge_canary(adapter, router)
        if settings.watch:
            for adapter in self.in_state(AdapterState.LIVE):
                decisions += self._watch(adapter, router)
        return decisions

    def _judge_canary(self, adapter: dict[str, Any], router: RouterClient) -> list[Decision]:
        name = served_name(adapter)
        arms = routed_outcomes(self.store, adapter["capability"], adapter["routed_since_ns"] or 0)
        canary = arms.get(name, Rate(0, 0))
        reference, against = self._canary_reference(adapter, arms)
        if canary.total < self.settings.promotion.canary_min_trajectories or reference.total == 0:
            return []  # a verdict needs the canary's outcomes and a reference: never passed on nothing
        verdict = judge(canary, reference, self.settings.promotion.confidence, f"canary {name}", against)
        if verdict.worse:
            if not self._router_call(adapter, f"router did not unload {name}", router.unload, name):
                return []
            return self._rolled_back(adapter, AdapterState.CANARY, verdict)
        if not self._router_call(adapter, f"router did not promote {name}", router.promote, name):
            return []
        return self._go_live(adapter, reference, verdict.reason)

    def _watch(self, adapter: dict[str, Any], router: RouterClient) -> list[Decision]:
        baseline = adapter.get("baseline")
        if not baseline or adapter.get("routed_since_ns") is None:
            return []
        name = served_name(adapter)
        live = routed_outcomes(self.store, adapter["capability"], adapter["routed_since_ns"]).get(name, Rate(0, 0))
        if live.total < self.settings.promotion.watch_min_trajectories:
            return []
        before = Rate(baseline["failures"], baseline["total"])
        verdict = judge(live, before, self.settings.promotion.confidence, f"live {name}", "before promotion")
        if not verdict.worse:
            return []
        try:
            decisions = self.rollback(adapter["adapter_id"], AUTOMATIC, verdict.reason, router, watched=True)
        except Exception as error:  # the router is down: stays live, retried next pass
            self.record_error(adapter["adapter_id"], f"automatic rollback of {name} failed: {error}")
            return []
        self._after_rollback(adapter, AdapterState.LIVE, verdict)
        return decisions

    def _go_live(self, adapter: dict[str, Any], baseline: Rate, reason: str) -> list[Decision]:
        """Mark `adapter` live with the failure rate it will be watched against; the version it
        replaces retires (the router unloads that one once its in-flight requests finish)."""
        name = served_name(adapter)
        decisions = []
        previous = self._live_of(adapter["capability"], adapter["adapter_id"])
        if previous is not None:
            decisions.append(self.move(previous["adapter_id"], AdapterState.RETIRED, AUTOMATIC, f"replaced by {name}", "retire"))
        decisions.append(
            self.move(
                adapter["adapter_id"], AdapterState.LIVE, AUTOMATIC, reason, "go_live",
                routed_since_ns=time.time_ns(), baseline=orjson.dumps({"failures": baseline.failures, "total": baseline.total}).decode(),
            )  # fmt: skip
        )
        AnalysisStore(self.store).start_cooldown(adapter["capability"], f"{name} went live", self.settings.trigger.cooldown_hours)
        return decisions

    def _rolled_back(self, adapter: dict[str, Any], stage: str, verdict: Verdict) -> list[Decision]:
        decision = self.move(adapter["adapter_id"], AdapterState.ROLLED_BACK, AUTOMATIC, verdict.reason, "rollback")
        self._after_rollback(adapter, stage, verdict)
        return [decision]

    def _after_rollback(self, adapter: dict[str, Any], stage: str, verdict: Verdict) -> None:
        metrics.ADAPTER_ROLLBACKS.labels(adapter["capability"], stage).inc()
        reason = f"{served_name(adapter)} rolled back: {verdict.reason}"
        AnalysisStore(self.store).start_cooldown(adapter["capability"], reason, self.settings.trigger.cooldown_hours)
        log.warning("%s rolled back automatically (%s): %s", served_name(adapter), stage, verdict.reason)

    def _control_name(self, adapter: dict[str, Any]) -> str:
        """What serves the capability's traffic outside the canary: its live version; else, for a
        targeted adapter, its agent's live generalist (the router's fallback); else the base model."""
        previous = self._live_of(adapter["capability"], adapter["adapter_id"])
        if previous is not None:
            return served_name(previous)
        environment = self.runs.environment(adapter["environment_id"]) if adapter.get("environment_id") is not None else None
        service = (environment or {}).get("service_name")
        if service and not generalist.is_generalist(adapter["capability"]):
            live = self.runs.live_adapter(generalist.capability(service), -1)
            if live is not None:
                return served_name(live)
        return self.settings.router.model_name

    def _canary_reference(self, adapter: dict[str, Any], arms: dict[str, Rate]) -> tuple[Rate, str]:
        """What a canary is judged against, and its name: the control's outcomes in the canary window
        when there are enough (the same traffic at the same time); else the control's routed
        outcomes on the capability before the canary began (the failure rate it had before
        promotion); else no reference yet (an empty rate: the verdict waits)."""
        control = self._control_name(adapter)
        needed = self.settings.promotion.reference_min_trajectories
        during = arms.get(control, Rate(0, 0))
        if during.total >= needed:
            return during, control
        before = routed_outcomes(self.store, adapter["capability"], 0, adapter["routed_since_ns"] or 0).get(control, Rate(0, 0))
        if before.total >= needed:
            return before, f"{control} before the canary"
        return Rate(0, 0), f"{control}: fewer than {needed} outcomes in the canary window ({during.total}) and before it ({before.total})"

    def _pre_promotion_rate(self, adapter: dict[str, Any]) -> Rate:
        """Without a canary: the capability's failure rate in the latest analysis pass; for a
        generalist, its agent's over the runs that decided it was wanted."""
        if generalist.is_generalist(adapter["capability"]):
            run = self.runs.run(adapter["run_id"]) or {}
            return Rate(*self.runs.agent_outcomes(run.get("agent") or "", self.settings.generalist.min_trajectories))
        return capability_failure_rate(self.store, adapter["capability"], self.settings.analysis.selection_window)

    def _router_call(self, adapter: dict[str, Any], failure: str, call: Any, *arguments: Any) -> bool:
        try:
            call(*arguments)
            return True
        except Exception as error:  # the router is down or refused: nothing moves, the next pass retries
            message = f"{failure}: {error}"
            if message != adapter.get("last_error"):  # logged when it starts or changes, not every pass
                log.warning("%s", message)
            self.record_error(adapter["adapter_id"], message)
            return False

    def rollback(
        self, adapter_id: int, actor: str, reason: str, router: RouterClient, watched: bool = False
    ) -> list[Decision]:
        """Take a canary or live version out of service; the version it replaced (if any) serves again
        and the capability cools down (`watched`: the watch that called it records its own why)."""
        with self.turn:
            adapter = self.adapter(adapter_id)
            if adapter["state"] not in SERVING_STATES:
                raise IllegalTransition(f"adapter {adapter_id} is {adapter['state']}; only a canary or live adapter can be rolled back")
            if not reason.strip():
                raise ValueError("a reason is required to roll back an adapter")
            if not watched:
                cool = f"{served_name(adapter)} rolled back by {actor}: {reason}"
                AnalysisStore(self.store).start_cooldown(adapter["capability"], cool, self.settings.trigger.cooldown_hours)
            if adapter["state"] == AdapterState.CANARY:  # the previous version never stopped serving
                router.unload(served_name(adapter))
                return [self.move(adapter_id, AdapterState.ROLLED_BACK, actor, reason, "rollback")]
            restored = self.runs.retired_before(adapter["capability"], adapter["version"])
            previous = [restored] if restored else []
            if previous:
                router.load(*self._loading(previous[0]))
            router.unload(served_name(adapter))
            decisions = [self.move(adapter_id, AdapterState.ROLLED_BACK, actor, reason, "rollback")]
            if previous:
                decisions.append(
                    self.move(previous[0]["adapter_id"], AdapterState.LIVE, actor, f"restored: {served_name(adapter)} rolled back", "restore",
                              routed_since_ns=time.time_ns())  # fmt: skip
                )
            return decisions

    def _loading(self, adapter: dict[str, Any], fraction: float | None = None) -> tuple[Any, ...]:
        """What ``RouterClient.load`` takes for this adapter: its served name, capability, version,
        path and description, the canary share, and its agent's instructions digests."""
        capability = adapter["capability"]
        return (
            served_name(adapter), capability, adapter["version"], adapter["path"], self.describe(capability), fraction,
            self.instructions(capability),
        )  # fmt: skip

    def reconcile(self, router: RouterClient) -> tuple[list[str], list[str]]:
        """Bring the router to exactly the registry's live and canary set (after either restarts):
        live versions first, so a canary's control is in place before it takes its share."""
        settings = self.settings.promotion
        wanted = {served_name(adapter): (adapter, None) for adapter in self.in_state(AdapterState.LIVE)}
        wanted |= {served_name(adapter): (adapter, settings.canary_fraction) for adapter in self.in_state(AdapterState.CANARY)}
        serving = router.serving()
        loaded, unloaded = [], []
        for name, (adapter, fraction) in wanted.items():
            role = ServingRole.CANARY if fraction is not None else ServingRole.LIVE
            if serving.get(name) == role:
                continue
            if name in serving:  # loaded in the wrong role: a canary the router took for the version
                router.unload(name)
            router.load(*self._loading(adapter, fraction))
            loaded.append(name)
        for name in set(serving) - set(wanted):
            router.unload(name)
            unloaded.append(name)
        return loaded, unloaded
