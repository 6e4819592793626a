"""`tracefix demo`: the whole improvement loop on one machine, narrated.

It starts the stack (`tracefix up`: daemon, router, dashboard), runs the example airline agent
(`examples/airline`) against the router at a steady rate, with its traces going to the collector,
and follows the daemon's API: trajectories collected, capabilities selected (Δ, coverage), the
environment and its validation, training progress, the candidate with its evaluation, the approval
(yours in the dashboard, or `--auto-approve`), the canary, and the live failure rate before and
after, with intervals. One status table redrawn in place, one line per event; the processes' own
logs stay in `<data dir>/logs` (`tracefix logs NAME`).

The demo's settings are defaults layered under yours: a key set in `--config` or in a
TRACEFIX_<SECTION>_<KEY> variable wins. `--fast` uses smaller settings for a quick look.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.app.client import ApiError, DaemonClient, DaemonUnavailable
from daemon.core import generalist, tracks
from daemon.core.intervals import mcnemar_p, paired_difference, wilson
from daemon.core.progress import grpo_added_text, progress_text, reference_name, retention_text
from daemon.core.settings import ENV_PREFIX, Settings, load_settings
from daemon.app.supervisor import loopback
from examples.airline.instructions import SERVICE_NAME

if TYPE_CHECKING:  # the runner imports the OpenTelemetry SDK and Faker; the CLI loads this module
    from examples.airline.runner import Batch, Session

# Demo defaults: analysis often enough to watch, a gate and training sized for the CPU, a canary
# that decides on a few dozen conversations.
SCRIPTED_FLOWS = "airline-scripted-flows"  # service.name of the scripted flows beside the model-driven agent
DEMO: dict[str, dict[str, Any]] = {
    "analysis": {"interval_s": 10.0, "min_failures": 12},
    # The gate runs (and on SmolLM2-135M finds the base too weak for the airline tools, which the
    # warm start remedies); a small one, since its verdict does not change what happens next.
    "validation": {"seeds": 2, "group_size": 4, "hint_shares": [], "timeout_s": 1800},
    # The warm start teaches what the 135M model lacks; a few GRPO steps follow it (with dynamic
    # sampling, the default), and the run's report measures what they added on the same held-out
    # seeds. One pass over the demonstrations with more GRPO steps made a weaker adapter and no gain
    # from GRPO (docs/history/performance-log-2026.md, Run 12); more steps or rollouts per step did
    # not add more either (bench/grpo_settings.py). The adapter is the last step's (keep_best off):
    # the report shows what those steps added, where keep_best could hand back the warm start
    # unchanged. 48 held-out seeds: with the opening shared across rows the evaluation plays them in
    # the time 24 took before (docs/history/performance-log-2026.md), and the paired comparison sees
    # twice the seeds. The warm start's gradient is the exact one (the default): stopped at the
    # agent's opening, an update is 1.46x faster on two cores, but GRPO from that warm start added
    # less on validation seeds (median -0.06 over three draws against +0.04;
    # docs/history/performance-log-2026.md, "The gradient stopped at the opening"), and with a
    # batch's cache carried from turn to turn the evaluation and the rollouts give back most of the
    # time the exact gradient takes.
    "training": {
        "recipe": "sft+grpo", "steps": 3, "group_size": 4, "groups_per_step": 2, "micro_batch": 2, "num_iterations": 2,
        "learning_rate": 2e-4, "warm_start_examples": 96, "warm_start_epochs": 2,
        "eval_seeds": 48, "eval_interference": False, "save_steps": 2, "keep_best": False, "threads": 2,
    },  # fmt: skip
    # The router gets one thread; the trainer both, since the model-driven traffic holds while it trains.
    "model": {"max_new_tokens": 96, "threads": 1},
    "promotion": {"interval_s": 5.0, "canary_fraction": 0.5, "canary_min_trajectories": 10, "watch_min_trajectories": 30},
    # The generalist learns from the scripted flows' successful conversations (the same tools: a
    # stronger policy serving part of the traffic), never from the panel's own conversations, and is
    # scored on 16 of them held out.
    "generalist": {
        "min_trajectories": 12, "min_failure_rate": 0.5, "min_successes": 48, "max_conversations": 48, "held_out": 16, "epochs": 2,
        "exclude_conversations": ["airline-panel-"],
    },  # fmt: skip
    # Each agent is its own loop (daemon/core/tracks.py). The scripted flows are a policy the router
    # does not serve: their runs are evidence and successes to learn from, never trained for.
    "capabilities": {"agents": [{"name": SCRIPTED_FLOWS, "train": False}]},
}
FAST: dict[str, dict[str, Any]] = {
    "analysis": {"interval_s": 5.0, "min_failures": 10},
    "validation": {"enabled": False},
    "training": {"warm_start_examples": 16, "eval_seeds": 8, "eval_margin": 0.1},
    "model": {"max_new_tokens": 64},
    "promotion": {"canary_min_trajectories": 8, "watch_min_trajectories": 16},
    "generalist": {"min_successes": 16, "max_conversations": 16, "held_out": 4, "epochs": 1},
}


def layered_settings(config_path: Path | None, fast: bool, environ: dict[str, str] | None = None) -> tuple[Settings, dict[str, str]]:
    """The demo's settings and the TRACEFIX_* variables that carry them to the child processes:
    a demo default is used only where neither the config file nor the environment sets the key."""
    environ = dict(os.environ if environ is None else environ)
    configured = tomllib.loads(Path(config_path).read_text()) if config_path else {}
    layers = [DEMO, FAST] if fast else [DEMO]
    added: dict[str, str] = {}
    for layer in layers:
        for section, values in layer.items():
            for key, value in values.items():
                variable = f"{ENV_PREFIX}{section}_{key}".upper()
                if key in configured.get(section, {}) or variable in environ:
                    continue
                added[variable] = json.dumps(value) if isinstance(value, (list, dict)) else str(value).lower() if isinstance(value, bool) else str(value)
    environ.update(added)
    return load_settings(config_path, environ), added


@dataclass(slots=True)
class Tally:
    """The model-driven conversations the example agent finished (the ones an adapter can change),
    conversation id -> success, per period in the order they happened: ``before`` any adapter
    served them (the base alone), during the first adapter's ``canary`` (a share routed to it) and
    ``after`` it went live. With more adapters wanted, each one's periods are numbered ("canary 1",
    "after 1", "canary 2", ...) and ``after`` is the period once all of them are live."""

    outcomes: dict[str, dict[str, bool]] = field(default_factory=lambda: {"before": {}})
    # Per period, conversation id -> how far its goal got (examples.airline.progress.Progress).
    progress: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"before": {}})
    goals: dict[str, str] = field(default_factory=dict)  # conversation id -> its panel goal (task id)
    period: str = "before"  # where a conversation finishing now counts
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, conversation_id: str, success: bool, progress: dict[str, Any] | None = None, goal: str | None = None) -> None:
        with self.lock:
            self.outcomes.setdefault(self.period, {})[conversation_id] = success
            if progress:
                self.progress.setdefault(self.period, {})[conversation_id] = progress
            if goal:
                self.goals[conversation_id] = goal

    def enter(self, period: str) -> None:
        with self.lock:
            self.period = period
            self.outcomes.setdefault(period, {})
            self.progress.setdefault(period, {})

    @property
    def before(self) -> dict[str, bool]:
        return self.outcomes["before"]

    @property
    def canary(self) -> dict[str, bool]:
        return self.outcomes.get("canary", {})

    @property
    def after(self) -> dict[str, bool]:
        return self.outcomes.get("after", {})

    @staticmethod
    def failures(outcomes: dict[str, bool]) -> tuple[int, int]:
        """(failed, finished) of `outcomes`."""
        return sum(not success for success in outcomes.values()), len(outcomes)

    @staticmethod
    def failure_rate(outcomes: dict[str, bool]) -> str:
        return rate_text(*Tally.failures(outcomes))

    @staticmethod
    def success_rate(outcomes: dict[str, bool]) -> str:
        failed, finished = Tally.failures(outcomes)
        return rate_text(finished - failed, finished)

    def paired(self, first: str, second: str) -> dict[str, Any] | None:
        """Task success in period `second` against `first` on the same panel goals (each goal's first
        conversation in each period): the paired difference with its 95 % interval and McNemar's
        exact p. None when the periods share no goal."""
        with self.lock:
            firsts = [_first_per_goal(self.outcomes.get(period, {}), self.goals) for period in (first, second)]
        goals = sorted(set(firsts[0]) & set(firsts[1]))
        if not goals:
            return None
        pairs = [(firsts[0][goal], firsts[1][goal]) for goal in goals]
        after_only = sum(after and not before for before, after in pairs)
        before_only = sum(before and not after for before, after in pairs)
        both = sum(before and after for before, after in pairs)
        delta, low, high = paired_difference(after_only, before_only, both, len(pairs) - after_only - before_only - both)
        return {
            "from": first, "to": second, "goals": len(goals), "before": sum(before for before, _ in pairs), "after": sum(after for _, after in pairs),
            "difference": round(delta, 4), "interval": [round(low, 4), round(high, 4)], "mcnemar_p": round(mcnemar_p(after_only, before_only), 4),
            "after_only": after_only, "before_only": before_only,
        }  # fmt: skip


def _first_per_goal(outcomes: dict[str, bool], goals: dict[str, str]) -> dict[str, bool]:
    """Per goal, the outcome of its first conversation in `outcomes` (in the order they finished)."""
    first: dict[str, bool] = {}
    for conversation, success in outcomes.items():
        goal = goals.get(conversation)
        if goal is not None:
            first.setdefault(goal, success)
    return first


def rate_text(count: int, total: int) -> str:
    """`count` of `total` as a rate with its 95 % interval ("–" for none)."""
    if not total:
        return "–"
    low, high = wilson(count, total)
    return f"{count / total:.2f} [{low:.2f}, {high:.2f}] on {total}"


def rate_record(count: int, total: int) -> dict[str, Any]:
    low, high = wilson(count, total) if total else (0.0, 1.0)
    return {"count": count, "total": total, "rate": round(count / total, 4) if total else None, "interval": [round(low, 4), round(high, 4)]}


GENERALIST = "generalist"  # the period while the agent's generalist serves alone

MODEL_DRIVEN = SERVICE_NAME  # service.name of the model-driven agent's traces (the example agent's own)
PANEL_BATCHES = 12  # the model-driven agent's goals: 12 seeded batches of 4 conversations (48 goals), over and over
PANEL_BATCH = 4
PANEL_RUN = "panel-"  # the panel's conversation ids start "airline-panel-…": no adapter learns from them
FLOW_SEEDS = 10_000  # the scripted flows' batches are seeded from here on: none of the panel's goals
# Model calls a panel conversation may make: the longest goal's reference takes six (identify, read,
# search, confirm, change, answer), and two more leave room for one misstep. With four (until Run
# 27) most goals could not be met at all: the generalist reached the confirmation in 18 of 20
# cancellations and ran out of calls before the change.
PANEL_TURNS = 8


def model_driven(router_url: str, collector_url: str | None, max_tokens: int) -> dict[str, Any]:
    """The model-driven agent's run settings (examples.airline.runner.RunConfig fields) for one
    batch of the panel; the seed (0 … PANEL_BATCHES - 1) picks the batch's goals. Four
    conversations are in flight at once: the router's continuous batching serves 12.3 of them a
    minute four at a time against 9.0 two at a time (docs/performance.md, "Continuous
    batching"), and the canary's verdict waits for their outcomes."""
    return {
        "policy": "llm", "router": router_url, "collector": collector_url, "conversations": PANEL_BATCH, "concurrency": PANEL_BATCH,
        "max_tokens": max_tokens, "max_turns": PANEL_TURNS, "temperature": 0.3, "service_name": MODEL_DRIVEN,
        "run_id": f"{PANEL_RUN}{uuid.uuid4().hex[:8]}",
    }  # fmt: skip


class Stream:
    """One policy's conversations, `concurrency` in flight, the next one started as soon as one
    ends (at most `rate` a second): seeded batches of `conversations` goals, batch after batch,
    the seed of each from `seed_of(batch number)`. Without a barrier between batches a slow
    conversation holds up only its own worker: waiting for a whole batch to end before the next
    began left the router serving fewer than four conversations most of the time (6.5 finished a
    minute during Run 23's canary, against 12.3 four at a time)."""

    def __init__(self, settings: dict[str, Any], seed_of: Callable[[int], int], counted: bool, holds: bool) -> None:
        from examples.airline.runner import configure

        self.config = configure(**settings)
        self.seed_of = seed_of
        self.counted = counted  # its outcomes go to the tally
        self.holds = holds  # it waits while the traffic holds
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._number = 0
        self._batch: Batch | None = None
        self._next_start = 0.0

    def session(self) -> Session:
        """The stream's session, opened once (RouterUnavailable while its endpoint does not answer)."""
        from examples.airline.runner import Session

        with self._lock:
            if self._session is None:
                self._session = Session(self.config)
            return self._session

    def take(self, stopping: threading.Event) -> tuple[Batch, int, int] | None:
        """The next conversation (its batch, index in the batch and number in the stream) once the
        pace allows it; None when stopping meanwhile."""
        session = self.session()
        with self._lock:
            number, self._number = self._number, self._number + 1
            batch_number, index = divmod(number, self.config.conversations)
            if index == 0:
                self._batch = session.batch(self.seed_of(batch_number))
            batch, now = self._batch, time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + (1 / self.config.rate if self.config.rate > 0 else 0)
        if stopping.wait(start - now):
            return None
        return batch, index, number

    def close(self) -> None:
        """Send the spans still held (after the workers have ended)."""
        if self._session is not None:
            self._session.close()


class Traffic(threading.Thread):
    """The example deployment until stopped: conversations of the model-driven agent (the base model
    or an adapter behind the router) and, with policy "mixed", of the scripted flows that run next
    to it, whose successes give the analysis its contrast. Each is a `Stream`; model-driven outcomes
    are tallied.

    While ``hold`` is set (a gate or a training run has the cores), the model-driven conversations
    under way finish and no new one starts; the scripted flows go on: on two cores the router's
    generation and the trainer would halve each other."""

    def __init__(self, settings: Settings, tally: Tally, policy: str, rate: float) -> None:
        super().__init__(name="demo-traffic", daemon=True)
        router, collector = settings.router, settings.collector
        router_url = f"http://{loopback(router.host)}:{router.port}/v1"
        collector_url = f"http://{loopback(collector.host)}:{collector.http_port}"
        model = {**model_driven(router_url, collector_url, settings.model.max_new_tokens), "rate": rate}
        common = {"router": router_url, "collector": collector_url, "rate": rate, "conversations": PANEL_BATCH, "concurrency": 2}
        # The scripted flows are another policy: their own service.name, so the model-driven agent's
        # own statistics (GET /api/agents/{name}/capabilities) leave them out.
        flows = {**common, "policy": "scripted", "skip_confirmation": 0.0, "skip_read": 0.0, "service_name": SCRIPTED_FLOWS}
        planted = {**common, "policy": "scripted", "skip_confirmation": 0.5, "skip_read": 0.3}
        # The model-driven agent cycles through one panel of seeded goals, so "before" and "after"
        # the adapter are measured on the same customers and requests.
        panel = Stream(model, lambda batch: batch % PANEL_BATCHES, counted=True, holds=True)
        self.streams = {
            "llm": [panel],
            "mixed": [panel, Stream(flows, lambda batch: FLOW_SEEDS + batch, counted=False, holds=False)],
            "scripted": [Stream(planted, lambda batch: batch, counted=True, holds=False)],
        }[policy]
        self.tally = tally
        self.stopping = threading.Event()
        self.hold = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        workers = [
            threading.Thread(target=self._work, args=(stream,), name=f"demo-{stream.config.policy}-{slot}", daemon=True)
            for stream in self.streams for slot in range(max(1, stream.config.concurrency))
        ]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for stream in self.streams:
            stream.close()

    def _work(self, stream: Stream) -> None:
        """One of a stream's workers: a conversation at a time until stopped."""
        from examples.airline.runner import RouterUnavailable

        while not self.stopping.is_set():
            if stream.holds and self.hold.is_set():
                self.stopping.wait(2)
                continue
            try:
                taken = stream.take(self.stopping)
            except RouterUnavailable as error:  # the router (re)starts: wait, then go on
                self.error = str(error)
                self.stopping.wait(5)
                continue
            if taken is None:
                return
            batch, index, number = taken
            outcome = stream.session().run(batch, index, number)
            self.error = None
            if stream.counted:
                self.tally.add(outcome.conversation_id, outcome.success, outcome.progress, outcome.task_id)
            if outcome.ended == "model_error":  # back off while the router is away
                self.stopping.wait(5)


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
    if item["status"] not in ("validated", "rejected") or not attempts:
        return item["status"]
    passed = [attempt for attempt in attempts if attempt.get("verdict") == "ok"]
    best = passed[0] if passed else max(attempts, key=lambda attempt: attempt.get("mean") or 0.0)
    measured = f"base mean reward {number_text(best.get('mean'))} on {validation.get('rollouts', '?')} rollouts"
    if item["status"] == "validated":
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
        self._hold_traffic(environments, runs, measuring=any(item["state"] == "canary" for item in adapters) or self.tally.period == "after" or alone)
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
        moving = [f"{item['name']}: {item['state']}" for item in capabilities if item["state"] not in ("healthy",)]
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
        waiting = ("validated", "rejected") if self.warm_start else ("validated",)
        busy = [] if measuring else [
            *(f"run {run['run_id']} trains" for run in runs if run["status"] in ("queued", "running")),
            *(f"environment {item['environment_id']}'s gate runs" for item in environments if item["status"] == "validating"),
            # Once the generalist is live, a ready environment may wait for its own traffic to select
            # the capability again: holding that traffic would keep it waiting.
            *(f"environment {item['environment_id']} waits to be trained" for item in environments
              if item["status"] in ("checked", *waiting) and item["environment_id"] not in trained and self.generalist is None),
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
        if run["status"] == "running":
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
            if state == "candidate":
                self.candidates.setdefault(name, adapter["evaluation"])
                self.event(f"candidate:{adapter['adapter_id']}", f"candidate ready: {name}, {candidate_text(adapter['evaluation'])} — open {self.dashboard_url} to approve")
                if self.auto_approve:
                    self.client.post(f"/api/adapters/{adapter['adapter_id']}/approve", {"reason": "tracefix demo --auto-approve"})
            if state in ("canary", "live") and adapter["adapter_id"] in judged:
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
            if state == "canary" and not self.tally.period.startswith("canary") and self.tally.period != "after":
                self.tally.enter("canary" if self.adapters == 1 else f"canary {len(self.lives) + 1}")
                self.say(f"{name} is in canary: the conversations until it goes live are counted apart, as '{self.tally.period}'")
            if state == "live" and adapter["capability"] not in self.lives and self.tally.period != "after":
                self.lives.append(adapter["capability"])
                self.tally.enter("after" if len(self.lives) >= self.adapters else f"after {len(self.lives)}")
                self.say(f"{name} is live: the agent's conversations from now on count as '{self.tally.period}'")

        if self.tally.period.endswith("canary") or self.tally.period.startswith("canary"):
            if not any(adapter["state"] == "canary" for adapter in adapters):
                # The canary ended without going live: what served before it serves again.
                self.tally.enter(f"after {len(self.lives)}" if self.lives else GENERALIST if self.generalist else "before")

    def _generalist_period(self, name: str, state: str) -> None:
        """The generalist's canary and then its time live alone are periods of their own, before any
        targeted adapter's."""
        if state == "canary" and self.tally.period == "before":
            self.tally.enter(f"{GENERALIST} canary")
            self.say(f"{name}, the agent's generalist, is in canary: the conversations until it goes live count as '{self.tally.period}'")
        if state == "live" and self.generalist is None and not self.lives:
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


def run(
    config_path: Path | None, fast: bool, auto_approve: bool, minutes: float | None, policy: str, rate: float,
    say: Callable[[str], None], after: int = 0, report: Path | None = None, hold_while_training: bool = True, adapters: int = 1,
) -> int:  # fmt: skip
    """`tracefix demo`: returns the exit status. With `after`, it ends once that many model-driven
    conversations have finished after `adapters` adapters went live (each selected capability's in
    turn, routed together); with `report`, what the run measured
    (events with their times, the gap, the candidate's evaluation, before vs after) is written
    there as JSON. With `hold_while_training`, the model-driven conversations wait while a
    training run runs."""
    import signal

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from daemon.app import supervisor

    started = time.monotonic()  # the demo's clock: its timeline counts from the command, processes' start included
    settings, variables = layered_settings(config_path, fast)
    os.environ.update(variables)  # the children read the demo's settings from the environment
    names = [name for name in supervisor.NAMES if name != "dashboard" or _has_streamlit()]
    stack = supervisor.Supervisor(supervisor.children(settings, config_path, names), say)

    def on_signal(signum: int, _frame: object) -> None:
        stack.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    say("starting daemon, router and dashboard (the first start converts the embedded model) …")
    try:
        stack.start()
    except supervisor.StartFailed as error:
        say(f"tracefix demo failed: {error}")
        return 1
    dashboard = settings.dashboard
    dashboard_url = f"http://{loopback(dashboard.host)}:{dashboard.port}"
    tally = Tally()
    traffic = Traffic(settings, tally, policy, rate)
    client = DaemonClient(settings)
    narrator = Narrator(
        client, tally, auto_approve, dashboard_url, say, traffic.hold if hold_while_training else None,
        settings.training.warm_start_examples > 0, adapters, started,
    )  # fmt: skip
    deadline = time.monotonic() + minutes * 60 if minutes else None
    console = Console(stderr=True)
    if not stack.stopping.is_set():
        traffic.start()
        narrator.event("started", f"the example airline deployment is running ({policy}); watch it all at {dashboard_url}")

    def table() -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column()
        for key, value in narrator.rows.items():
            grid.add_row(key, value)
        if traffic.error:
            grid.add_row("agent", f"[yellow]{traffic.error}[/yellow]")
        if deadline is not None:
            grid.add_row("time left", f"{max(0, deadline - time.monotonic()) / 60:.1f} min")
        return grid

    watcher = threading.Thread(target=stack.watch, name="demo-supervisor", daemon=True)
    watcher.start()
    with Live(table(), console=console, refresh_per_second=2, transient=False) as live:
        narrator.say = lambda line: live.console.print(line, soft_wrap=True)  # whole lines, also in a log file
        failed_polls: set[str] = set()
        while not stack.stopping.wait(2):
            try:
                narrator.poll()
            except Exception as error:  # a narration bug must not stop the deployment it narrates
                if repr(error) not in failed_polls:
                    failed_polls.add(repr(error))
                    live.console.print(f"narration skipped a poll: {error!r}", soft_wrap=True)
            live.update(table())
            if deadline is not None and time.monotonic() > deadline:
                break
            if after and len(tally.after) >= after:
                what = "the adapter" if adapters == 1 else f"{adapters} adapters"
                live.console.print(f"{len(tally.after)} model-driven conversations since {what} went live: done", soft_wrap=True)
                break
    traffic.stopping.set()
    say("stopping …")
    traffic.join(120)  # its conversations in flight finish and their spans go out before the collector stops
    numbered = " · ".join(f"{period} {tally.failure_rate(outcomes)}" for period, outcomes in tally.outcomes.items() if period not in ("before", "canary", "after"))
    say(
        f"model-driven failure rate before the adapter: {tally.failure_rate(tally.before)}; after: {tally.failure_rate(tally.after)}"
        f" (during the canary: {tally.failure_rate(tally.canary)})" + (f"; one adapter after another: {numbered}" if numbered else "")
    )
    if not stack.stopping.is_set():  # the daemon is still up: read its labels of the same conversations
        measured = narrator.measured()
        say(success_text(measured))
        if line := lacking_text(measured):
            say(line)
        if report is not None:
            document = {
                "settings": {
                    "fast": fast, "policy": policy, "rate": rate, "hold_while_training": hold_while_training,
                    "minutes": minutes, "after": after, "adapters": adapters, "training": settings.training.model_dump(mode="json"),
                },
                "seconds": round(time.monotonic() - narrator.started, 1), "timeline": narrator.timeline,
                "selected": narrator.selected, "candidates": narrator.candidates, "live": narrator.live, "lives": narrator.lives,
                "panel": {"batches": PANEL_BATCHES, "goals": PANEL_BATCHES * PANEL_BATCH},
                **measured,
            }  # fmt: skip
            Path(report).write_text(json.dumps(document, indent=2))
            say(f"report written to {report}")
    stack.stop()
    client.close()
    return 0


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


def _has_streamlit() -> bool:
    import importlib.util

    return importlib.util.find_spec("streamlit") is not None
