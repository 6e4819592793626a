"""The batched writer: one thread that commits what every receiver submitted, in group commits.

Receivers submit decoded rows and wait on the returned future; it resolves only after the
transaction holding those rows has committed (DuckDB syncs its WAL on commit), which is when
the receiver may acknowledge the request.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracefix.daemon.core import metrics
from tracefix.daemon.core.settings import WriterSettings
from tracefix.daemon.store.store import Store
from tracefix.daemon.store.traces import LOG_SCHEMA, SPAN_SCHEMA, AppendResult

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """Too many rows wait for a commit; the exporter should retry later."""


class WriterStopped(RuntimeError):
    """The writer is shutting down and takes no more rows."""


@dataclass(slots=True)
class Submission:
    spans: dict[str, list[Any]] | None
    logs: dict[str, list[Any]] | None
    size: int
    future: Future = field(default_factory=Future)


class BatchedWriter:
    """Groups concurrent submissions into one transaction each; a single thread owns all ingest writes."""

    def __init__(self, store: Store, settings: WriterSettings) -> None:
        self.store = store
        self.settings = settings
        self._queue: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._batch = store.last_ingest_batch()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tracefix-writer", daemon=True)
        self.committed_batch = self._batch
        self.last_commit_at = 0.0  # time.monotonic() of the latest commit

    def start(self) -> None:
        self._thread.start()

    def submit(self, spans: dict[str, list[Any]] | None = None, logs: dict[str, list[Any]] | None = None) -> Future:
        """Queue rows for the next commit; the future resolves to an AppendResult once durable."""
        size = (len(spans["trace_id"]) if spans else 0) + (len(logs["log_id"]) if logs else 0)
        submission = Submission(spans, logs, size)
        if size == 0:
            submission.future.set_result(AppendResult(0, 0))
            return submission.future
        with self._pending_lock:
            if self._stopping:
                raise WriterStopped("tracefix is shutting down")
            if self._pending + size > self.settings.queue_max_spans and self._pending:
                raise Overloaded(f"{self._pending} rows are waiting for a commit; retry later")
            self._pending += size
            metrics.WRITER_QUEUE.set(self._pending)
        self._queue.put(submission)
        return submission.future

    def stop(self, timeout: float = 30.0) -> None:
        """Commit what was submitted, then stop the thread."""
        with self._pending_lock:
            self._stopping = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    def busy(self, within_s: float) -> bool:
        """Whether rows are waiting or a commit happened in the last `within_s` seconds."""
        return self._pending > 0 or time.monotonic() - self.last_commit_at < within_s

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _gather(self, first: Submission) -> tuple[list[Submission], bool]:
        group, size = [first], first.size
        deadline = time.monotonic() + self.settings.max_wait_ms / 1000
        while size < self.settings.max_batch_spans:
            timeout = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return group, True
            group.append(item)
            size += item.size
        return group, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            group, stop = self._gather(first)
            self._commit(group)

    def _commit(self, group: list[Submission]) -> None:
        self._batch += 1
        size = sum(s.size for s in group)
        started = time.perf_counter()
        try:
            spans = _table([s.spans for s in group if s.spans], SPAN_SCHEMA)
            logs = _table([s.logs for s in group if s.logs], LOG_SCHEMA)
            result = self.store.append(spans, logs, self._batch)
        except Exception as error:  # nothing was stored: every waiting request fails, retryably
            log.exception("commit of %d rows failed", size)
            metrics.COMMIT_FAILURES.inc()
            for submission in group:
                submission.future.set_exception(error)
        else:
            metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
            metrics.COMMIT_ROWS.observe(size)
            self.committed_batch = self._batch
            self.last_commit_at = time.monotonic()
            span_rows = spans.num_rows if spans is not None else 0
            log_rows = logs.num_rows if logs is not None else 0
            metrics.SPANS_DUPLICATE.labels("traces").inc(span_rows - result.spans_inserted)
            metrics.SPANS_DUPLICATE.labels("logs").inc(log_rows - result.logs_inserted)
            for submission in group:  # the result is the whole group's: one commit, one count
                submission.future.set_result(result)
        finally:
            with self._pending_lock:
                self._pending -= size
                metrics.WRITER_QUEUE.set(self._pending)


def _table(parts: list[dict[str, list[Any]]], schema: pa.Schema) -> pa.Table | None:
    if not parts:
        return None
    return pa.concat_tables([pa.table(part, schema=schema) for part in parts])
