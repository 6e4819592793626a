"""LLM judging beside the analysis: the capabilities whose labeler is ``deferred`` (the LLM labeler's),
judged concurrently, newest trajectories first, within ``[llm] concurrency`` and ``calls_per_minute``.

Rules this module keeps:

- The analysis pass never waits for a model: it labels the rule capabilities and computes the
  statistics, which count whatever judgements were written so far.
- A pair (trajectory, capability) is taken when it has no label of its labeler's version or was
  reassembled since, newest first, then when its ERROR label is older than ``[analysis] error_retry_s``.
- Worker threads only call the model. Each pair's runs are written as soon as they are all back, in
  one ``replace_labels`` from the pass's own thread, so a restart resumes where it stopped: nothing
  is judged twice for one labeler version.
- An endpoint that is unavailable ends the pass once the pairs in flight are back: theirs are ERROR
  labels (retried after ``error_retry_s``), the untried pairs wait for the next pass.
- ``stop`` takes no new work, cancels queued judgements and wakes calls waiting for the budget; the
  pass returns without waiting for a request in flight (whose answer is dropped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from tracefix.daemon.analysis.analyzer import Analyzer
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory
from tracefix.daemon.analysis.llm_client import CallsStopped, ChatClient
from tracefix.daemon.core import metrics
from tracefix.daemon.core.settings import LLMSettings

log = logging.getLogger(__name__)

# How often the pass looks up from its judgements in flight for a stop, and recounts what is pending.
POLL_S = 0.2
COUNT_S = 5.0


@dataclass(frozen=True, slots=True)
class Pair:
    """One trajectory to judge for one capability, with the assembly batch its labels record."""

    capability: Capability
    trajectory_id: str
    batch: int


class LLMJudging:
    """Judges the registry's deferred capabilities concurrently, beside the analysis pass."""

    def __init__(self, analyzer: Analyzer, settings: LLMSettings) -> None:
        self.analyzer = analyzer
        self.store = analyzer.store
        self.settings = settings
        self.capabilities = [c for c in analyzer.registry if getattr(c.labeler, "deferred", False)]
        self._turn = threading.Lock()  # one pass at a time; another returns at once
        self._stopping = threading.Event()
        self._executor: ThreadPoolExecutor | None = None
        # What /api/status shows; written by the pass's thread, read by the API's.
        self._counts = threading.Lock()
        self._judged_at: deque[float] = deque()  # monotonic times of the pairs judged in the last minute
        self.judged = 0  # pairs written with a verdict by this process
        self.errors = 0  # pairs written with no usable verdict (ERROR) by this process
        self.in_flight = 0
        self.pending: int | None = None  # pairs without a current judgement, as of the pass's last look
        self.errored: int | None = None  # pairs whose judgement is ERROR, waiting for their retry
        self.last_error: tuple[float, str] | None = None  # (unix time, reason)
        self._counted_at = 0.0
        self._waiting = False  # for the endpoint: logged once when it goes, once when it is back

    def _clients(self) -> list[ChatClient]:
        clients = {id(c.labeler.client): c.labeler.client for c in self.capabilities if hasattr(c.labeler, "client")}
        return [client for client in clients.values() if isinstance(client, ChatClient)]

    def run_pass(self) -> int:
        """Judge pending pairs until none is left, the endpoint is unavailable or ``stop`` is called;
        returns how many pairs were written."""
        if not self.capabilities or self._stopping.is_set() or not self._turn.acquire(blocking=False):
            return 0
        try:
            return self._judge_pending()
        finally:
            self._turn.release()

    def stop(self) -> None:
        """Take no new work, cancel queued judgements and wake calls waiting for the budget; returns at once."""
        self._stopping.set()
        for client in self._clients():
            client.budget.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _judge_pending(self) -> int:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="llm-judging")
        running: dict[Future[list[Judgement] | None], Pair] = {}
        taken: dict[str, set[str]] = {capability.name: set() for capability in self.capabilities}
        written = 0
        unavailable = False
        self._count()
        while not self._stopping.is_set():
            if time.monotonic() - self._counted_at > COUNT_S:  # while a slow model holds every slot
                self._count()
            free = self.settings.concurrency - len(running)
            if free > 0 and not unavailable:
                for pair, trajectory in self._next(free, taken):
                    taken[pair.capability.name].add(pair.trajectory_id)
                    try:
                        running[self._executor.submit(self._judge, pair.capability, trajectory)] = pair
                    except RuntimeError:  # stop() shut the pool down meanwhile
                        break
            self.in_flight = len(running)
            if not running:
                break
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                pair, judgements = running.pop(future), future.result()
                if judgements is not None and self._write(pair, judgements):
                    written += 1
                    unavailable = unavailable or self._endpoint_failing(judgements)
        for future, pair in running.items():  # stopping: keep what is back, drop the rest
            if future.cancel() or not future.done():
                continue
            judgements = future.result()
            if judgements is not None and self._write(pair, judgements):
                written += 1
        self.in_flight = 0
        if not self._stopping.is_set():
            self._count()
        if unavailable and not self._waiting and self.last_error:
            log.warning("LLM judging waits for its endpoint (tried again every pass): %s", self.last_error[1])
            self._waiting = True
        return written

    def _next(self, free: int, taken: dict[str, set[str]]) -> list[tuple[Pair, Trajectory]]:
        """Up to `free` pairs not taken in this pass, newest unjudged first, then ERRORs due a retry, loaded."""
        unjudged: list[tuple[int, str, Capability]] = []
        pending = 0
        for capability in self.capabilities:
            labeler = capability.labeler
            rows, total = self.store.unjudged(capability.name, labeler.name, labeler.version, free, sorted(taken[capability.name]))
            pending += total
            unjudged += [(batch, trajectory_id, capability) for trajectory_id, batch in rows]
        self.pending = pending  # in flight included
        unjudged.sort(key=lambda row: (-row[0], row[1], row[2].name))
        chosen = [(trajectory_id, capability) for _, trajectory_id, capability in unjudged[:free]]
        retry_s = self.analyzer.settings.error_retry_s
        if len(chosen) < free and retry_s:
            before = datetime.now(timezone.utc) - timedelta(seconds=retry_s)
            for capability in self.capabilities:
                labeler, seen = capability.labeler, taken[capability.name]
                ids = self.store.errored(capability.name, labeler.name, labeler.version, before, free + len(seen))
                chosen += [(trajectory_id, capability) for trajectory_id in ids if trajectory_id not in seen]
            chosen = chosen[:free]
        if not chosen:
            return []
        batches: dict[str, int] = {}
        loaded = {t.trajectory_id: t for t in self.analyzer.trajectories(sorted({trajectory_id for trajectory_id, _ in chosen}), batches)}
        for trajectory_id, capability in chosen:
            if trajectory_id not in loaded:  # gone meanwhile (retention): not taken again in this pass
                taken[capability.name].add(trajectory_id)
        return [
            (Pair(capability, trajectory_id, batches[trajectory_id]), loaded[trajectory_id])
            for trajectory_id, capability in chosen
            if trajectory_id in loaded
        ]

    def _judge(self, capability: Capability, trajectory: Trajectory) -> list[Judgement] | None:
        """On a worker thread: the labeler's runs on one trajectory; None when the daemon stopped meanwhile."""
        labeler = capability.labeler
        if self._stopping.is_set():
            return None
        try:
            if hasattr(labeler, "label_runs"):
                return labeler.label_runs(trajectory)
            return [labeler.label(trajectory)]
        except CallsStopped:
            return None
        except Exception as error:  # one broken labeler must not stop the others
            log.exception("labeler %s failed on %s", labeler.name, trajectory.trajectory_id)
            metrics.LABEL_ERRORS.labels(labeler.name).inc()
            return [Judgement(Label.ERROR, f"labeler error: {error}"[:200], (), 0.0)]

    def _write(self, pair: Pair, judgements: list[Judgement]) -> bool:
        """Swap in one pair's runs (from the pass's thread: DuckDB has one writer process, and the
        writes stay in order); False when the store refused them, and the pair stays pending."""
        capability, labeler = pair.capability, pair.capability.labeler
        now = datetime.now(timezone.utc)
        rows = [
            (
                pair.trajectory_id, capability.name, labeler.name, labeler.version, run, judgement.label.value,
                judgement.reason, list(judgement.span_ids), judgement.confidence, pair.batch, now,
            )  # fmt: skip
            for run, judgement in enumerate(judgements)
        ]
        try:
            self.store.replace_labels([pair.trajectory_id], [(capability.name, labeler.name)], rows)
        except Exception:  # e.g. a relabel deleting the same rows meanwhile: judged again later
            log.exception("could not write the judgements of %s on %s", capability.name, pair.trajectory_id)
            return False
        metrics.LABELS.inc(len(rows))
        failed = [judgement for judgement in judgements if judgement.label is Label.ERROR]
        with self._counts:
            if len(failed) == len(judgements):
                self.errors += 1
            else:
                self.judged += 1
                self._judged_at.append(time.monotonic())
                if self._waiting:
                    log.info("the LLM endpoint answers again; judging resumes")
                    self._waiting = False
            if failed:
                self.last_error = (time.time(), failed[0].reason)
        return True

    def _endpoint_failing(self, judgements: list[Judgement]) -> bool:
        """No usable verdict, and the endpoint's last call got no answer: stop taking work this pass."""
        if any(judgement.label is not Label.ERROR for judgement in judgements):
            return False
        return any(client.failed_at and (client.answered_at or 0) < client.failed_at for client in self._clients())

    def _count(self) -> None:
        """Refresh the pending and errored counts /api/status shows."""
        pending = errored = 0
        for capability in self.capabilities:
            labeler = capability.labeler
            pending += self.store.unjudged(capability.name, labeler.name, labeler.version, 0)[1]
            errored += self.store.errored_count(capability.name, labeler.name, labeler.version)
        self.pending, self.errored = pending, errored
        self._counted_at = time.monotonic()

    def status(self) -> dict[str, Any]:
        """Progress, budget and the endpoint's last error, for /api/status's `llm` block."""
        now = time.monotonic()
        with self._counts:
            while self._judged_at and self._judged_at[0] <= now - 60:
                self._judged_at.popleft()
            judged_last_minute = len(self._judged_at)
            last_error = self.last_error
        clients = self._clients()
        answered = max((client.answered_at for client in clients if client.answered_at), default=None)
        failed = max((client.failed_at for client in clients if client.failed_at), default=None)
        return {
            "capabilities": [capability.name for capability in self.capabilities],
            "pending": self.pending,
            "errored": self.errored,
            "in_flight": self.in_flight,
            "judged": self.judged,
            "errors": self.errors,
            "judged_last_minute": judged_last_minute,
            "calls": sum(client.budget.total for client in clients),
            "calls_last_minute": sum(client.budget.recent(60.0) for client in clients),
            "concurrency": self.settings.concurrency,
            "calls_per_minute": self.settings.calls_per_minute,
            "last_error": {"message": last_error[1], "at": round(last_error[0], 3)} if last_error else None,
            "last_answer_at": round(answered, 3) if answered else None,
            # The endpoint's last call got an answer (None: no call yet).
            "endpoint_answering": None if answered is None and failed is None else (answered or 0) >= (failed or 0),
        }
