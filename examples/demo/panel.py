"""The example deployment's traffic while the demo runs: the model-driven agent cycling through its
panel of seeded goals, the scripted flows beside it, and the tally of the panel's outcomes per period."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from examples.airline.instructions import SERVICE_NAME
from examples.demo.settings import SCRIPTED_FLOWS
from tracefix.daemon.app.supervisor import loopback
from tracefix.daemon.core.intervals import mcnemar_p, paired_difference, wilson
from tracefix.daemon.core.settings import Settings

if TYPE_CHECKING:  # the runner imports the OpenTelemetry SDK and Faker; the CLI loads this module
    from examples.airline.runner import Batch, Session


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

