"""The narration: the daemon API read as the loop goes, one line per event, a status table, and
the closing lines."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from examples.demo.panel import FLOW_SEEDS, GENERALIST, MODEL_DRIVEN, PANEL_BATCH, PANEL_BATCHES, PANEL_RUN, Tally, rate_record, rate_text
from tracefix.daemon.app.client import ApiError, DaemonClient, DaemonUnavailable
from tracefix.daemon.core import generalist, tracks
from tracefix.daemon.core.progress import grpo_added_text, progress_text, reference_name, retention_text
from tracefix.daemon.core.states import SERVING_STATES, AdapterState, CapabilityState, EnvironmentStatus, RunStatus


def number_text(value: float | None) -> str:
    """A statistic as the narration prints it; None (no run to compute it from) as n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def share_text(value: float | None) -> str:
    """A rate as a percentage; None as n/a."""
    return "n/a" if value is None else f"{value:.0%}"


def environment_text(item: dict[str, Any], warm_start: bool = True) -> str:
    """An environment's status, with what the validation gate measured once it decided; with
    `warm_start` ([training] warm_start_examples > 0), an environment too hard for the base is
    trained anyway, starting from its own solutions."""
    validation = item.get("validation") if isinstance(item.get("validation"), dict) else {}
    attempts = [attempt for attempt in validation.get("attempts") or [] if isinstance(attempt, dict)]
    if item["status"] not in (EnvironmentStatus.VALIDATED, EnvironmentStatus.REJECTED) or not attempts:
        return item["status"]
    passed = [attempt for attempt in attempts if attempt.get("verdict") == "ok"]
    best = passed[0] if passed else max(attempts, key=lambda attempt: attempt.get("mean") or 0.0)
    measured = f"base mean reward {number_text(best.get('mean'))} on {validation.get('rollouts', '?')} rollouts"
    if item["status"] == EnvironmentStatus.VALIDATED:
        return f"validated ({measured}, hint share {number_text(validation.get('hint_share'))})"
    verdicts = sorted({str(attempt.get("verdict")) for attempt in attempts})
    if verdicts == ["too_weak"] and warm_start:
        return f"too hard for the base model ({measured}): training starts with a warm start on its solutions"
    return f"rejected by the validation gate: {', '.join(verdicts)} ({measured})"


class Narrator:
    """Reads the daemon API, prints one line per new event and keeps a status table current."""

    def __init__(
        self, client: DaemonClient, tally: Tally, auto_approve: bool, dashboard_url: str, say: Callable[[str], None],
        hold: threading.Event | None = None, warm_start: bool = True, adapters: int = 1, started: float | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.adapters = adapters  # live adapters wanted before the 'after' period
        self.warm_start = warm_start  # an environment too hard for the base still trains (from its solutions)
        self.hold = hold  # when given: set from a gate to its run's end before any adapter serves (the model-driven traffic waits)
        self.tally = tally
        self.auto_approve = auto_approve
        self.dashboard_url = dashboard_url
        self.say = say
        self.seen: set[str] = set()
        self.rows: dict[str, str] = {}
        self.started = time.monotonic() if started is None else started  # the timeline's zero
        self.timeline: list[dict[str, Any]] = []  # every narrated event, with when it was seen
        self.selected: dict[str, dict[str, Any]] = {}  # capability -> its statistics when selected
        self.candidates: dict[str, dict[str, Any]] = {}  # adapter name -> its evaluation
        self.lives: list[str] = []  # the capabilities whose adapters went live, in order
        self.generalist: str | None = None  # the agent's generalist, once live (it is not one of `lives`)
        self.holds = 0  # times the model-driven traffic was held: each hold and resume is narrated

    def event(self, key: str, line: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            self.timeline.append({"seconds": round(time.monotonic() - self.started, 1), "event": key, "line": line})
            self.say(line)

    def poll(self) -> None:
        try:
            status = self.client.get("/api/status")
            capabilities = self.client.get("/api/capabilities")["items"]
            environments = self.client.get("/api/environments")["items"]
            # Adapters before runs: a run's adapter appears in the same transaction that finishes the
            # run, so reading in this order never shows an adapter whose run still looks running.
            adapters = self.client.get("/api/adapters")["items"]
            runs = self.client.get("/api/runs")["items"]
            routing = self.client.get("/api/routing")
            audit = self.client.get("/api/audit")["items"]
        except (DaemonUnavailable, ApiError) as error:
            self.rows["daemon"] = f"[red]{error}[/red]"
            return
        self.rows.pop("daemon", None)
        outcomes = status["outcomes"]
        self.rows["trajectories"] = (
            f"{status['counts']['trajectories']} collected: {outcomes['success']} succeeded, {outcomes['failure']} failed"
        )
        self._capabilities(capabilities)
        self._environments(environments)
        # The canary and the 'after' period need the model-driven traffic; otherwise it holds while a
        # model job has the cores.
        # The generalist's period measures a whole pass over the panel before a targeted run holds it.
        # (A canary's period too: this poll may see it live before `_adapters` enters the next period.)
        alone = self.tally.period.endswith("canary") or self.tally.period.startswith("canary") or (
            self.tally.period == GENERALIST and len(self.tally.outcomes.get(GENERALIST, {})) < PANEL_BATCHES * PANEL_BATCH
        )
        self._hold_traffic(environments, runs, measuring=any(item["state"] == AdapterState.CANARY for item in adapters) or self.tally.period == "after" or alone)
        self._runs(runs)
        self._adapters(adapters, routing)
        self._decisions(audit, {item["adapter_id"]: f"{item['capability']}@v{item['version']}" for item in adapters})
        self.rows["model-driven task success"] = " · ".join(
            f"{'before any adapter' if period == 'before' else period} {self.tally.success_rate(outcomes)}"
            for period, outcomes in self.tally.outcomes.items()
        )

    def _capabilities(self, capabilities: list[dict[str, Any]]) -> None:
        selected = [item for item in capabilities if item["selected"]]
        for item in selected:
            stats = next(iter(item["windows"].values()), {}) if item["windows"] else {}
            self.selected.setdefault(item["name"], stats)
            self.event(
                f"selected:{item['name']}",
                f"capability selected: {item['name']} — Δ {number_text(stats.get('delta'))}, coverage {number_text(stats.get('coverage'))} "
                f"(lacking in {share_text(stats.get('er_minus'))} of failed runs that need it vs {share_text(stats.get('er_plus'))} of successful ones)",
            )  # fmt: skip
        moving = [f"{item['name']}: {item['state']}" for item in capabilities if item["state"] != CapabilityState.HEALTHY]
        self.rows["capabilities"] = ", ".join(moving) or "all healthy so far"

    def _environments(self, environments: list[dict[str, Any]]) -> None:
        for item in environments:
            self.event(
                f"environment:{item['environment_id']}:{item['status']}",
                f"environment {item['environment_id']} ({item['family']}): {environment_text(item, self.warm_start)}",
            )
        if environments:
            latest = environments[0]
            self.rows["environment"] = f"{latest['family']}: {latest['status']}"

    def _hold_traffic(self, environments: list[dict[str, Any]], runs: list[dict[str, Any]], measuring: bool) -> None:
        """Hold the model-driven traffic from an environment's gate to the end of its training run,
        unless an adapter is in canary or live (the canary and the after-measurement need that
        traffic). The conversations under way when the hold begins finish during the gate, which
        runs on one core beside the router's, so the trainer starts on idle cores."""
        if self.hold is None:
            return
        trained = {run["environment_id"] for run in runs}
        waiting = (EnvironmentStatus.VALIDATED, EnvironmentStatus.REJECTED) if self.warm_start else (EnvironmentStatus.VALIDATED,)
        busy = [] if measuring else [
            *(f"run {run['run_id']} trains" for run in runs if run["status"] in (RunStatus.QUEUED, RunStatus.RUNNING)),
            *(f"environment {item['environment_id']}'s gate runs" for item in environments if item["status"] == EnvironmentStatus.VALIDATING),
            # Once the generalist is live, a ready environment may wait for its own traffic to select
            # the capability again: holding that traffic would keep it waiting.
            *(f"environment {item['environment_id']} waits to be trained" for item in environments
              if item["status"] in (EnvironmentStatus.CHECKED, *waiting) and item["environment_id"] not in trained and self.generalist is None),
        ]  # fmt: skip
        if bool(busy) == self.hold.is_set():
            return
        if busy:
            self.hold.set()
            self.holds += 1
            self.event(f"hold:{self.holds}", f"model-driven traffic holds while {busy[0]} (the model jobs get the cores)")
        else:
            self.hold.clear()
            self.event(f"resume:{self.holds}", "model-driven traffic resumes")

    def _runs(self, runs: list[dict[str, Any]]) -> None:
        """Narrate each run's state as it changes (oldest first: a run that ended between two polls is
        told before the next one starts) and the latest run's progress."""
        if not runs:
            return
        for run in reversed(runs):
            self.event(f"run:{run['run_id']}:{run['status']}", f"training run {run['run_id']} ({run['capability']} v{run['version']}): {run['status']}")
        run = runs[0]
        if run["status"] == RunStatus.RUNNING:
            detail = self.client.get(f"/api/runs/{run['run_id']}")
            progress = detail.get("progress") or []
            where = progress_text(progress[-1], run["config"].get("steps")) if progress else "loading the model"
            self.rows["training"] = f"run {run['run_id']}: {where}"
        else:
            self.rows["training"] = f"run {run['run_id']}: {run['status']}"

    def _adapters(self, adapters: list[dict[str, Any]], routing: dict[str, Any]) -> None:
        judged = {item["adapter_id"]: item for item in routing.get("adapters", [])}
        for adapter in adapters:
            name = f"{adapter['capability']}@v{adapter['version']}"
            state = adapter["state"]
            if state == AdapterState.CANDIDATE:
                self.candidates.setdefault(name, adapter["evaluation"])
                self.event(f"candidate:{adapter['adapter_id']}", f"candidate ready: {name}, {candidate_text(adapter['evaluation'])} — open {self.dashboard_url} to approve")
                if self.auto_approve:
                    self.client.post(f"/api/adapters/{adapter['adapter_id']}/approve", {"reason": "tracefix demo --auto-approve"})
            if state in SERVING_STATES and adapter["adapter_id"] in judged:
                report = judged[adapter["adapter_id"]]
                own, reference = report.get("adapter", {}), report.get("reference", {})
                self.rows[f"{name} ({state})"] = (
                    f"failure {number_text(own.get('rate'))} {own.get('interval')} on {own.get('total', 0)} routed vs "
                    f"{reference.get('name')} {number_text(reference.get('rate'))} {reference.get('interval')} on {reference.get('total', 0)}"
                    f" (verdict after {report.get('needed')})"
                )
            if generalist.is_generalist(adapter["capability"]):
                self._generalist_period(name, state)
                continue
            if state == AdapterState.CANARY and not self.tally.period.startswith("canary") and self.tally.period != "after":
                self.tally.enter("canary" if self.adapters == 1 else f"canary {len(self.lives) + 1}")
                self.say(f"{name} is in canary: the conversations until it goes live are counted apart, as '{self.tally.period}'")
            if state == AdapterState.LIVE and adapter["capability"] not in self.lives and self.tally.period != "after":
                self.lives.append(adapter["capability"])
                self.tally.enter("after" if len(self.lives) >= self.adapters else f"after {len(self.lives)}")
                self.say(f"{name} is live: the agent's conversations from now on count as '{self.tally.period}'")

        if self.tally.period.endswith("canary") or self.tally.period.startswith("canary"):
            if not any(adapter["state"] == AdapterState.CANARY for adapter in adapters):
                # The canary ended without going live: what served before it serves again.
                self.tally.enter(f"after {len(self.lives)}" if self.lives else GENERALIST if self.generalist else "before")

    def _generalist_period(self, name: str, state: str) -> None:
        """The generalist's canary and then its time live alone are periods of their own, before any
        targeted adapter's."""
        if state == AdapterState.CANARY and self.tally.period == "before":
            self.tally.enter(f"{GENERALIST} canary")
            self.say(f"{name}, the agent's generalist, is in canary: the conversations until it goes live count as '{self.tally.period}'")
        if state == AdapterState.LIVE and self.generalist is None and not self.lives:
            self.generalist = name
            self.tally.enter(GENERALIST)
            self.say(f"{name}, the agent's generalist, is live: the agent's conversations from now on count as '{GENERALIST}'")

    def _decisions(self, audit: list[dict[str, Any]], names: dict[int, str]) -> None:
        """Every human and automatic decision, oldest first, as the audit log records it."""
        for entry in sorted(audit, key=lambda row: row["audit_id"]):
            name = names.get(entry["adapter_id"], f"adapter {entry['adapter_id']}")
            self.event(
                f"audit:{entry['audit_id']}",
                f"{name}: {entry['from_state']} → {entry['to_state']} by {entry['actor']}: {entry['reason']}",
            )

    def lacking(self, capability: str, conversations: dict[str, bool], wait_s: float = 120.0) -> tuple[int, int]:
        """How many of `conversations` the daemon labels LACKING `capability`, of those it labelled
        (waiting up to `wait_s` for the analysis to reach the last ones)."""
        deadline = time.monotonic() + wait_s
        while True:
            labels: dict[str, str] = {}
            page, offset = 500, 0
            while True:
                found = self.client.get("/api/trajectories", capability=tracks.capability_of(capability), limit=page, offset=offset)
                labels.update({item["conversation_id"]: item["label"] for item in found["items"] if item["conversation_id"] in conversations})
                offset += page
                if offset >= found["total"]:
                    break
            labelled = [labels[conversation] for conversation in conversations if conversation in labels]
            if len(labelled) >= len(conversations) or time.monotonic() > deadline:
                return sum(label == "LACKING" for label in labelled), sum(label != "NA" for label in labelled)
            time.sleep(5)

    def learned_from(self) -> list[dict[str, Any]]:
        """For each adapter the demo trained from stored conversations (the generalist): how many it
        learned from, and whether any of them is a panel conversation or names a panel goal's customer
        or reservation. A generalist that saw the panel would measure memory, not competence."""
        from examples.airline.runner import Session, configure

        session = Session(configure(policy="scripted", collector=None, conversations=PANEL_BATCH))
        tasks = [task for seed in range(PANEL_BATCHES) for task in session.batch(seed).tasks]
        checks = []
        for adapter in self.client.get("/api/adapters")["items"]:
            if not generalist.is_generalist(adapter["capability"]):
                continue
            ids = self.client.get(f"/api/adapters/{adapter['adapter_id']}/trajectories")
            texts, panel = [], 0
            for trajectory_id in ids["train"]:
                record = self.client.get(f"/api/trajectories/{trajectory_id}")
                panel += (record.get("conversation_id") or "").startswith(f"airline-{PANEL_RUN}")
                texts.append(json.dumps(record.get("messages") or []))
            customers = sum(any(task.user_id in text and task.customer_name in text for task in tasks) for text in texts)
            reservations = sum(any(task.reservation_id in text for task in tasks) for text in texts)
            checks.append({
                "adapter": f"{adapter['capability']}@v{adapter['version']}", "learned_from": len(ids["train"]), "held_out": len(ids["held_out"]),
                "panel_conversations": panel, "panel_customers": customers, "panel_reservations": reservations,
                "panel_seeds": list(range(PANEL_BATCHES)), "flow_seeds_from": FLOW_SEEDS,
            })  # fmt: skip
        return checks

    @property
    def live(self) -> str | None:
        """The capability whose adapter went live first."""
        return self.lives[0] if self.lives else None

    def measured(self) -> dict[str, Any]:
        """Per period on the panel's conversations (before the adapters, during each canary, after
        each went live): task failure, how far each goal got, and, for each capability that went live
        (else the first selected), the lacking rate. ``capability`` and ``lacking`` are the first's."""
        from examples.airline.progress import step_table

        periods = {period: dict(outcomes) for period, outcomes in self.tally.outcomes.items()}
        result: dict[str, Any] = {"failure": {period: rate_record(*Tally.failures(outcomes)) for period, outcomes in periods.items()}}
        result["success"] = {period: rate_record(sum(outcomes.values()), len(outcomes)) for period, outcomes in periods.items()}
        measuring = [period for period in ("before", GENERALIST, "after") if periods.get(period)]
        pairs = [(first, second) for index, first in enumerate(measuring) for second in measuring[index + 1 :]]
        result["paired"] = [pair for first, second in pairs if (pair := self.tally.paired(first, second))]
        result["generalist"] = self.generalist
        try:
            result["learned_from"] = self.learned_from()
        except (DaemonUnavailable, ApiError) as error:
            result["learned_from_error"] = str(error)
        # Where each goal broke, per period: the share of conversations reaching each reference step.
        result["goal_steps"] = {period: step_table(list(self.tally.progress.get(period, {}).values())) for period in periods}
        capabilities = self.lives or list(self.selected)[:1]
        if capabilities:
            try:
                lacking = {
                    capability: {period: rate_record(*self.lacking(capability, outcomes)) for period, outcomes in periods.items()}
                    for capability in capabilities
                }  # fmt: skip
            except (DaemonUnavailable, ApiError) as error:
                result["capability"] = capabilities[0]
                result["lacking_error"] = str(error)
            else:
                result["capability"], result["lacking"] = capabilities[0], lacking[capabilities[0]]
                result["lacking_by_capability"] = lacking
        try:  # the gap as the model-driven agent's own runs show it, without the scripted flows' successes
            own = self.client.get(f"/api/agents/{MODEL_DRIVEN}/capabilities")["items"]
            result["agent_stats"] = {"agent": MODEL_DRIVEN, "items": {row["capability"]: row for row in own}}
        except (DaemonUnavailable, ApiError) as error:
            result["agent_stats_error"] = str(error)
        return result



def candidate_text(evaluation: dict[str, Any]) -> str:
    """What a candidate's evaluation measured, in a line: a targeted adapter's held-out success on its
    environment, or a generalist's next actions on held-out successful conversations."""
    if evaluation.get("kind") == "next_action":
        adapter, base = evaluation["adapter"]["matched"], evaluation["base"]["matched"]
        return (
            f"the agent's generalist, learned from {evaluation['learned_from']} successful conversations: next action right on "
            f"{adapter['rate']:.2f} {adapter['interval']} of {evaluation['turns']} held-out turns vs base {base['rate']:.2f}"
        )
    target = evaluation["target"]
    notes = [text for text in (grpo_added_text(evaluation.get("grpo_added")), retention_text(evaluation)) if text]
    measured = f"held-out success {target['adapter']['success_rate']:.2f} vs {reference_name(evaluation)} {target['base']['success_rate']:.2f}"
    return "; ".join([measured, *notes])


def success_text(measured: dict[str, Any]) -> str:
    """The closing line: task success on the panel per period, with intervals, and the paired
    differences between the periods on the same goals."""
    periods = " · ".join(
        f"{period}: {rate_text(record['count'], record['total'])}" for period, record in measured["success"].items() if record["total"]
    )
    pairs = "; ".join(
        f"{pair['to']} vs {pair['from']} on {pair['goals']} goals {pair['difference']:+.2f} [{pair['interval'][0]:+.2f}, "
        f"{pair['interval'][1]:+.2f}], McNemar p {pair['mcnemar_p']:.2f}"
        for pair in measured.get("paired", [])
    )
    return f"task success on the panel — {periods}" + (f"; paired: {pairs}" if pairs else "")


def lacking_text(measured: dict[str, Any]) -> str | None:
    """The closing line on the capability's lacking rate per period; a period the run did not reach
    (its time ran out before an adapter went live) reads "not reached"."""
    if "lacking" not in measured:
        return None
    lacking = {side: rate_text(value["count"], value["total"]) for side, value in measured["lacking"].items()}
    return (
        f"{measured['capability']} lacking before the adapter: {lacking.get('before', 'not reached')}; "
        f"after: {lacking.get('after', 'not reached')} (during the canary: {lacking.get('canary', 'not reached')})"
    )


