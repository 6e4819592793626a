"""The store: the only code that opens the DuckDB file and writes SQL against it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from daemon.store.migrations import MIGRATIONS, Migration
from daemon.core.semconv import EVALUATION_EVENT
from daemon.core.settings import StoreSettings

# The trigger's states of a capability, as capability_states stores them.
HEALTHY, WATCHING, GAP_DETECTED, COOLDOWN = "healthy", "watching", "gap_detected", "cooldown"

log = logging.getLogger(__name__)

# Capability state moves come from several daemon jobs (trigger, synthesis, validation, training,
# promotion); they are serialised in process, since the daemon is DuckDB's only writer.
_STATE_MOVES = threading.Lock()

SPAN_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("trace_state", pa.string()),
        ("name", pa.string()),
        ("kind", pa.uint8()),
        ("start_time_unix_nano", pa.uint64()),
        ("end_time_unix_nano", pa.uint64()),
        ("status_code", pa.uint8()),
        ("status_message", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("conversation_id", pa.string()),
        ("resource_attributes", pa.string()),
        ("attributes", pa.string()),
        ("events", pa.string()),
        ("links", pa.string()),
        ("truncated", pa.bool_()),
    ]
)
LOG_SCHEMA = pa.schema(
    [
        ("log_id", pa.string()),
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("time_unix_nano", pa.uint64()),
        ("observed_time_unix_nano", pa.uint64()),
        ("severity_number", pa.int32()),
        ("severity_text", pa.string()),
        ("event_name", pa.string()),
        ("body", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        ("conversation_id", pa.string()),
        ("resource_attributes", pa.string()),
        ("attributes", pa.string()),
        ("truncated", pa.bool_()),
    ]
)


class StoreError(RuntimeError):
    """The database cannot be opened or written; the message says what to do."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """How many rows of a commit were new (the rest were duplicates of earlier deliveries)."""

    spans_inserted: int
    logs_inserted: int


@dataclass(slots=True)
class DerivedRows:
    """Everything the assembler derives for a set of trajectories, replaced in one transaction."""

    trajectory_ids: list[str]
    trace_map: list[tuple[str, str]]
    trajectories: list[tuple]
    messages: list[tuple]
    tool_calls: list[tuple]
    trajectory_tools: list[tuple]
    tool_definitions: list[tuple]
    outcomes: list[tuple]


class Store:
    """A DuckDB database with tracefix's schema; thread-safe through one cursor per thread."""

    def __init__(self, settings: StoreSettings) -> None:
        self.path = Path(settings.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connection = duckdb.connect(
                str(self.path),
                config={
                    "memory_limit": settings.memory_limit,
                    "threads": settings.threads,
                    "checkpoint_threshold": settings.checkpoint_threshold,
                },
            )
        except duckdb.IOException as error:
            raise StoreError(
                f"cannot open {self.path}: {error}. Is another tracefix daemon using it? "
                "Only the daemon opens the database; stop the other one or set [store] path."
            ) from None
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursors_lock = threading.Lock()
        try:
            self.migrate()
        except BaseException:  # a refused or failed migration leaves the file closed for others
            self.close()
            raise

    # -- connection handling -------------------------------------------------------------------

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection to the database (DuckDB connections are not shareable across threads)."""
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._connection.cursor()
            self._local.cursor = cursor
            with self._cursors_lock:
                self._cursors.append(cursor)
        return cursor

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        cursor = self.cursor
        cursor.begin()
        try:
            yield cursor
        except BaseException:
            cursor.rollback()
            raise
        cursor.commit()

    def close(self) -> None:
        with self._cursors_lock:
            for cursor in self._cursors:
                try:
                    cursor.close()
                except duckdb.Error:
                    pass
            self._cursors.clear()
        self._connection.close()

    # -- schema --------------------------------------------------------------------------------

    def migrate(self, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
        """Apply the migrations this file has not seen yet; returns the versions applied."""
        cursor = self.cursor
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
        )
        applied = {row[0] for row in cursor.execute("SELECT version FROM schema_migrations").fetchall()}
        known = {migration.version for migration in migrations}
        if applied - known:
            raise StoreError(
                f"{self.path} has schema version {max(applied)}, newer than this tracefix "
                f"({max(known)}); upgrade tracefix or use another [store] path"
            )
        done = []
        for migration in migrations:
            if migration.version in applied:
                continue
            with self.transaction() as tx:
                tx.execute(migration.sql)
                tx.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, now())", [migration.version, migration.name]
                )
            log.info("applied migration %d: %s", migration.version, migration.name)
            done.append(migration.version)
        return done

    def schema_version(self) -> int:
        return self.cursor.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]

    # -- ingest --------------------------------------------------------------------------------

    def last_ingest_batch(self) -> int:
        return self.cursor.execute(
            "SELECT greatest((SELECT coalesce(max(ingest_batch), 0) FROM spans), "
            "(SELECT coalesce(max(ingest_batch), 0) FROM logs))"
        ).fetchall()[0][0]

    def append(self, spans: pa.Table | None, logs: pa.Table | None, batch: int) -> AppendResult:
        """Insert spans and logs in one durable transaction; rows already stored are skipped."""
        spans_inserted = logs_inserted = 0
        with self.transaction() as tx:
            if spans is not None and spans.num_rows:
                tx.register("incoming_spans", spans)
                spans_inserted = tx.execute(
                    "INSERT OR IGNORE INTO spans SELECT *, ? AS ingest_batch, now() AS received_at "
                    "FROM incoming_spans",
                    [batch],
                ).fetchall()[0][0]
                tx.unregister("incoming_spans")
            if logs is not None and logs.num_rows:
                tx.register("incoming_logs", logs)
                logs_inserted = tx.execute(
                    "INSERT OR IGNORE INTO logs SELECT *, ? AS ingest_batch, now() AS received_at "
                    "FROM incoming_logs",
                    [batch],
                ).fetchall()[0][0]
                tx.unregister("incoming_logs")
        return AppendResult(spans_inserted, logs_inserted)

    # -- assembly ------------------------------------------------------------------------------

    def assembler_position(self) -> tuple[int, int]:
        return self.cursor.execute(
            "SELECT last_span_batch, last_log_batch FROM assembler_state WHERE id = 1"
        ).fetchall()[0]

    def pending_traces(
        self, after_span_batch: int, after_log_batch: int, limit: int
    ) -> tuple[list[str], int, int, bool]:
        """Traces touched by spans or logs committed after the given batches, oldest batches first.

        Returns the trace ids, the batch positions the assembler reaches once they are done, and
        whether that is everything committed so far (False when `limit` cut the pass short).
        """
        cursor = self.cursor
        span_batches = cursor.execute(
            "SELECT ingest_batch, count(DISTINCT trace_id) FROM spans WHERE ingest_batch > ? "
            "GROUP BY ingest_batch ORDER BY ingest_batch",
            [after_span_batch],
        ).fetchall()
        reach_span = after_span_batch
        total = 0
        for batch, count in span_batches:
            if total and total + count > limit:
                break
            reach_span, total = batch, total + count
        complete = not span_batches or reach_span == span_batches[-1][0]
        reach_log = cursor.execute(
            "SELECT coalesce(max(ingest_batch), ?) FROM logs WHERE ingest_batch > ?",
            [after_log_batch, after_log_batch],
        ).fetchall()[0][0]
        rows = cursor.execute(
            """
            SELECT DISTINCT trace_id FROM spans WHERE ingest_batch > ? AND ingest_batch <= ?
            UNION
            SELECT DISTINCT trace_id FROM logs
            WHERE ingest_batch > ? AND ingest_batch <= ? AND trace_id IS NOT NULL
            UNION
            SELECT DISTINCT s.trace_id FROM logs l JOIN spans s ON s.conversation_id = l.conversation_id
            WHERE l.ingest_batch > ? AND l.ingest_batch <= ? AND l.trace_id IS NULL
            """,
            [after_span_batch, reach_span, after_log_batch, reach_log, after_log_batch, reach_log],
        ).fetchall()
        return [row[0] for row in rows], reach_span, reach_log, complete

    def trajectory_groups(self, trace_ids: list[str]) -> dict[str, list[str]]:
        """Map each trajectory touched by these traces to all of its traces.

        A trace joins the trajectory of its conversation id (the smallest, if it carries several);
        traces without one are a trajectory of their own.
        """
        rows = self.cursor.execute(
            """
            WITH touched AS (SELECT unnest(?::VARCHAR[]) AS trace_id),
            conversations AS (
                SELECT DISTINCT conversation_id FROM spans
                WHERE trace_id IN (SELECT trace_id FROM touched) AND conversation_id IS NOT NULL
            ),
            related AS (
                SELECT trace_id FROM touched
                UNION
                SELECT trace_id FROM spans WHERE conversation_id IN (SELECT conversation_id FROM conversations)
            )
            SELECT s.trace_id, coalesce(min(s.conversation_id), s.trace_id) AS trajectory_id
            FROM spans s WHERE s.trace_id IN (SELECT trace_id FROM related)
            GROUP BY s.trace_id
            """,
            [trace_ids],
        ).fetchall()
        groups: dict[str, list[str]] = {}
        for trace_id, trajectory_id in rows:
            groups.setdefault(trajectory_id, []).append(trace_id)
        return groups

    def spans_of_traces(self, trace_ids: list[str]) -> list[dict[str, Any]]:
        cursor = self.cursor.execute(
            "SELECT trace_id, span_id, parent_span_id, name, kind, start_time_unix_nano, end_time_unix_nano, "
            "status_code, status_message, service_name, conversation_id, attributes, events "
            "FROM spans WHERE trace_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY start_time_unix_nano, span_id",
            [trace_ids],
        )
        return _dicts(cursor)

    def logs_of_traces(self, trace_ids: list[str], conversation_ids: list[str]) -> list[dict[str, Any]]:
        cursor = self.cursor.execute(
            "SELECT log_id, trace_id, span_id, time_unix_nano, event_name, body, attributes, conversation_id "
            "FROM logs WHERE trace_id IN (SELECT unnest(?::VARCHAR[])) "
            "OR (trace_id IS NULL AND conversation_id IN (SELECT unnest(?::VARCHAR[]))) "
            "ORDER BY time_unix_nano",
            [trace_ids, conversation_ids],
        )
        return _dicts(cursor)

    def replace_derived(self, rows: DerivedRows, span_batch: int, log_batch: int) -> None:
        """Swap in freshly assembled trajectories and advance the assembler, atomically."""
        with self.transaction() as tx:
            trace_ids = [trace_id for trace_id, _ in rows.trace_map]
            # Trajectories whose traces moved elsewhere (a conversation id arrived late) go too.
            stale = tx.execute(
                "SELECT DISTINCT trajectory_id FROM trace_trajectories WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))",
                [trace_ids],
            ).fetchall()
            ids = sorted(set(rows.trajectory_ids) | {row[0] for row in stale})
            for table in ("trajectories", "messages", "tool_calls", "trajectory_tools", "outcomes"):
                tx.execute(f"DELETE FROM {table} WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[]))", [ids])
            tx.execute("DELETE FROM trace_trajectories WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))", [trace_ids])
            _insert(tx, "trace_trajectories", rows.trace_map)
            _insert(tx, "trajectories", rows.trajectories)
            _insert(tx, "messages", rows.messages)
            _insert(tx, "tool_calls", rows.tool_calls)
            _insert(tx, "trajectory_tools", rows.trajectory_tools)
            _insert(tx, "outcomes", rows.outcomes)
            if rows.tool_definitions:
                tx.executemany(
                    "INSERT INTO tool_definitions VALUES (?, ?, ?, ?, now(), now()) "
                    "ON CONFLICT (service_name, tool_name) DO UPDATE SET "
                    "description = excluded.description, parameters = excluded.parameters, last_seen = now()",
                    rows.tool_definitions,
                )
            tx.execute(
                "UPDATE assembler_state SET last_span_batch = ?, last_log_batch = ? WHERE id = 1",
                [span_batch, log_batch],
            )

    # -- reading -------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        cursor = self.cursor
        counts = {}
        for table in ("spans", "logs", "trajectories", "messages", "tool_calls", "tool_definitions"):
            counts[table] = cursor.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        counts.update(
            dict(cursor.execute("SELECT outcome, count(*) FROM trajectory_outcomes GROUP BY outcome").fetchall())
        )
        return counts

    def database_bytes(self) -> int:
        wal = self.path.with_name(self.path.name + ".wal")
        return self.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    def query(self, sql: str, parameters: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a read-only query as dicts."""
        return _dicts(self.cursor.execute(sql, parameters or []))


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _insert(tx: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    if not rows:
        return
    # Bulk path: one Arrow table per insert instead of a statement per row.
    names = [column[0] for column in tx.execute(f"SELECT * FROM {table} LIMIT 0").description]
    incoming = pa.table({name: list(values) for name, values in zip(names, zip(*rows))})
    tx.register("incoming_rows", incoming)
    tx.execute(f"INSERT INTO {table} SELECT * FROM incoming_rows")
    tx.unregister("incoming_rows")


# -- capability analysis ------------------------------------------------------------------------
# `current` is the registry's (capability, labeler, labeler_version) triples: statistics and
# staleness only ever consider the labels of the labeler a capability has now.

_CURRENT = "current_labelers"


def _with_current(cursor: duckdb.DuckDBPyConnection, current: Sequence[tuple[str, str, str]]) -> None:
    table = pa.table(
        {
            "capability": [row[0] for row in current],
            "labeler": [row[1] for row in current],
            "labeler_version": [row[2] for row in current],
        },
        schema=pa.schema([("capability", pa.string()), ("labeler", pa.string()), ("labeler_version", pa.string())]),
    )
    cursor.register(_CURRENT, table)


def _wilson(successes: str, total: str, prefix: str) -> str:
    """SQL for a Wilson 95 % interval of successes/total, as columns <prefix>_low and <prefix>_high."""
    z2 = "3.8414588206941254"  # 1.959963984540054 squared
    p = f"({successes}::DOUBLE / {total})"
    center = f"(({p} + {z2} / (2 * {total})) / (1 + {z2} / {total}))"
    half = f"(sqrt({z2}) * sqrt({p} * (1 - {p}) / {total} + {z2} / (4 * {total} * {total})) / (1 + {z2} / {total}))"
    return (
        f"CASE WHEN {total} > 0 THEN greatest(0, {center} - {half}) END AS {prefix}_low, "
        f"CASE WHEN {total} > 0 THEN least(1, {center} + {half}) END AS {prefix}_high"
    )


class AnalysisStore:
    """The SQL of labeling, statistics and the trigger, on a Store's connection."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def trajectories_to_label(
        self, current: Sequence[tuple[str, str, str]], limit: int, after_batch: int = -1
    ) -> list[str]:
        """Trajectories missing a current label for some capability, or reassembled since labeling.

        With `after_batch`, only trajectories assembled after that batch are considered (the
        caller knows everything older is labeled), which keeps incremental passes cheap.
        """
        cursor = self.store.cursor
        _with_current(cursor, current)
        rows = cursor.execute(
            f"""
            WITH candidates AS (SELECT trajectory_id, updated_batch FROM trajectories WHERE updated_batch > ?),
            fresh AS (
                SELECT l.trajectory_id, count(DISTINCT l.capability) AS labeled
                FROM labels l
                JOIN {_CURRENT} c USING (capability, labeler, labeler_version)
                JOIN candidates t USING (trajectory_id)
                WHERE l.labeled_batch >= t.updated_batch
                GROUP BY l.trajectory_id
            )
            SELECT t.trajectory_id FROM candidates t LEFT JOIN fresh f USING (trajectory_id)
            WHERE coalesce(f.labeled, 0) < (SELECT count(*) FROM {_CURRENT})
            ORDER BY t.updated_batch, t.trajectory_id
            LIMIT ?
            """,
            [after_batch, limit],
        ).fetchall()
        cursor.unregister(_CURRENT)
        return [row[0] for row in rows]

    def errored(self, capability: str, labeler: str, version: str, before: Any, limit: int) -> list[str]:
        """Trajectories with an ERROR label from this labeler version, labeled before `before`."""
        rows = self.store.cursor.execute(
            "SELECT DISTINCT trajectory_id FROM labels WHERE capability = ? AND labeler = ? AND labeler_version = ? "
            "AND label = 'ERROR' AND labeled_at < ? ORDER BY trajectory_id LIMIT ?",
            [capability, labeler, version, before, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def last_assembled_batch(self) -> int:
        return self.store.cursor.execute("SELECT coalesce(max(updated_batch), 0) FROM trajectories").fetchall()[0][0]

    def labeling_inputs(self, trajectory_ids: list[str], evaluations: bool = False) -> dict[str, Any]:
        """Everything labelers read for these trajectories, fetched in a handful of bulk queries.

        With `evaluations`, also their gen_ai.evaluation.result span events and log records
        ("evaluation_spans", "evaluation_logs"), for the labelers of [[capabilities.evaluations]].
        """
        cursor = self.store.cursor
        trajectories = _dicts(
            cursor.execute(
                "SELECT t.trajectory_id, t.service_name, t.updated_batch, t.start_time_unix_nano, "
                "t.end_time_unix_nano, o.outcome FROM trajectories t "
                "JOIN trajectory_outcomes o USING (trajectory_id) "
                "WHERE t.trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                [trajectory_ids],
            )
        )
        # Rows carry their trajectory's batch: the filter lets DuckDB skip older row groups.
        oldest = min((row["updated_batch"] for row in trajectories), default=0)
        ids = [oldest, trajectory_ids]
        found = self._evaluation_events(trajectories) if evaluations else {"evaluation_spans": [], "evaluation_logs": []}
        return {
            **found,
            "trajectories": trajectories,
            "messages": cursor.execute(
                "SELECT trajectory_id, position, role, content, tool_calls, tool_call_id, span_id FROM messages "
                "WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "ORDER BY trajectory_id, position",
                ids,
            ).fetchall(),
            "tool_calls": cursor.execute(
                "SELECT trajectory_id, position, tool_name, call_id, arguments, result, error, message_position, span_id "
                "FROM tool_calls WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "ORDER BY trajectory_id, position",
                ids,
            ).fetchall(),
            "trajectory_tools": cursor.execute(
                "SELECT trajectory_id, tool_name, description, parameters FROM trajectory_tools "
                "WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                ids,
            ).fetchall(),
            "agent_tools": cursor.execute(
                "SELECT service_name, tool_name, description, parameters FROM tool_definitions "
                "WHERE service_name IN (SELECT unnest(?::VARCHAR[]))",
                [sorted({row["service_name"] for row in trajectories})],
            ).fetchall(),
        }

    def _evaluation_events(self, trajectories: list[dict[str, Any]]) -> dict[str, list[tuple]]:
        """The gen_ai.evaluation.result span events and log records of these trajectories, as stored.

        Spans: (trajectory_id, span_id, end_time_unix_nano, events); the time range of the
        trajectories lets DuckDB skip row groups of older spans. Log records, which may come at any
        time after the run: (trajectory_id, span_id, time_unix_nano, attributes, body), joined by
        trace, or by conversation when they carry no trace (as assembly joins them).
        """
        if not trajectories:
            return {"evaluation_spans": [], "evaluation_logs": []}
        cursor = self.store.cursor
        ids = [row["trajectory_id"] for row in trajectories]
        first = min(row["start_time_unix_nano"] for row in trajectories)
        last = max(row["end_time_unix_nano"] for row in trajectories)
        spans = cursor.execute(
            "SELECT m.trajectory_id, s.span_id, s.end_time_unix_nano, s.events FROM spans s "
            "JOIN trace_trajectories m USING (trace_id) "
            "WHERE s.start_time_unix_nano BETWEEN ? AND ? AND contains(s.events, ?) "
            "AND m.trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
            "ORDER BY m.trajectory_id, s.start_time_unix_nano, s.span_id",
            [first, last, EVALUATION_EVENT, ids],
        ).fetchall()
        logs = cursor.execute(
            "SELECT coalesce(m.trajectory_id, l.conversation_id) AS trajectory_id, l.span_id, l.time_unix_nano, "
            "l.attributes, l.body FROM logs l LEFT JOIN trace_trajectories m USING (trace_id) "
            "WHERE l.event_name = ? AND (m.trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
            "OR (l.trace_id IS NULL AND l.conversation_id IN (SELECT unnest(?::VARCHAR[])))) "
            "ORDER BY trajectory_id, l.time_unix_nano, l.log_id",
            [EVALUATION_EVENT, ids, ids],
        ).fetchall()
        return {"evaluation_spans": spans, "evaluation_logs": logs}

    def replace_labels(self, trajectory_ids: list[str], labelers: Sequence[tuple[str, str]], rows: list[tuple]) -> None:
        """Swap in new labels for these trajectories (for the given capability/labeler pairs) atomically."""
        with self.store.transaction() as tx:
            pairs = pa.table({"capability": [p[0] for p in labelers], "labeler": [p[1] for p in labelers]})
            tx.register("relabeled", pairs)
            tx.execute(
                "DELETE FROM labels WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND (capability, labeler) IN (SELECT (capability, labeler) FROM relabeled)",
                [trajectory_ids],
            )
            tx.unregister("relabeled")
            _insert(tx, "labels", rows)

    def forget_labels(self, capability: str | None = None) -> int:
        """Delete labels (of one capability, or all) so the next pass relabels without re-ingesting."""
        with self.store.transaction() as tx:
            if capability is None:
                return tx.execute("DELETE FROM labels").fetchall()[0][0]
            return tx.execute("DELETE FROM labels WHERE capability = ?", [capability]).fetchall()[0][0]

    def compute_stats(
        self,
        current: Sequence[tuple[str, str, str]],
        windows: Sequence[tuple[str, int | None]],
        min_delta: float,
        min_coverage: float,
        min_failures: int,
        consistency: float,
    ) -> int:
        """Recompute every capability's statistics for each (window name, start ns) and store them as one pass.

        Returns the pass id. Per run (LLM labelers repeat labeling), the paper's selection rule is
        evaluated; a capability is selected when the majority-vote labels pass it and at least
        `consistency` of the runs pass it too.
        """
        cursor = self.store.cursor
        pass_id = cursor.execute("SELECT coalesce(max(pass_id), 0) + 1 FROM capability_stats").fetchall()[0][0]
        with self.store.transaction() as tx:
            _with_current(tx, current)
            # Outcomes and current labels once per pass.
            tx.execute(
                "CREATE OR REPLACE TEMP TABLE pass_trajectories AS "
                "SELECT trajectory_id, outcome, end_time_unix_nano AS ended FROM trajectory_outcomes"
            )
            # `multi`: the capability's labeler repeats runs (LLM); single-run labels need no vote.
            tx.execute(
                f"CREATE OR REPLACE TEMP TABLE pass_labels AS "
                f"SELECT l.capability, l.run, l.trajectory_id, l.label, max(l.run) OVER (PARTITION BY l.capability) > 0 AS multi "
                f"FROM labels l JOIN {_CURRENT} c USING (capability, labeler, labeler_version) WHERE l.label <> 'ERROR'"
            )
            tx.register(
                "pass_windows",
                pa.table(
                    {"window_name": [w[0] for w in windows], "start_ns": [w[1] or 0 for w in windows]},
                    schema=pa.schema([("window_name", pa.string()), ("start_ns", pa.int64())]),
                ),
            )
            # All windows in one query: each trajectory appears once per window it falls in.
            tx.execute(
                f"""
                INSERT INTO capability_stats
                WITH traj AS (
                    SELECT w.window_name, t.trajectory_id, t.outcome
                    FROM pass_trajectories t JOIN pass_windows w ON t.ended >= w.start_ns
                ),
                totals AS (
                    SELECT window_name, count(*) FILTER (WHERE outcome = 'failure') AS failed
                    FROM traj GROUP BY window_name
                ),
                per_run AS (
                    SELECT traj.window_name, l.capability, l.run, l.trajectory_id, l.label, l.multi, traj.outcome
                    FROM pass_labels l JOIN traj USING (trajectory_id)
                ),
                voted AS (
                    SELECT window_name, capability, trajectory_id, outcome, label FROM per_run WHERE NOT multi
                    UNION ALL
                    SELECT window_name, capability, trajectory_id, any_value(outcome), mode(label)
                    FROM per_run WHERE multi GROUP BY window_name, capability, trajectory_id
                ),
                counts AS (
                    SELECT window_name, capability,
                        count(*) FILTER (WHERE outcome = 'success') AS n_success,
                        count(*) FILTER (WHERE outcome = 'failure') AS n_failure,
                        count(*) FILTER (WHERE outcome = 'unknown') AS n_unknown,
                        count(*) FILTER (WHERE outcome = 'success' AND label <> 'NA') AS needed_success,
                        count(*) FILTER (WHERE outcome = 'failure' AND label <> 'NA') AS needed_failure,
                        count(*) FILTER (WHERE outcome = 'success' AND label = 'LACKING') AS lacking_success,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING') AS lacking_failure
                    FROM voted GROUP BY window_name, capability
                ),
                run_selection AS (
                    SELECT window_name, capability, run,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING')::DOUBLE
                            / nullif(count(*) FILTER (WHERE outcome = 'failure' AND label <> 'NA'), 0)
                        - coalesce(count(*) FILTER (WHERE outcome = 'success' AND label = 'LACKING')::DOUBLE
                            / nullif(count(*) FILTER (WHERE outcome = 'success' AND label <> 'NA'), 0), 0)
                            AS delta,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING') AS lacking_failure
                    FROM per_run WHERE multi GROUP BY window_name, capability, run
                ),
                runs AS (
                    SELECT r.window_name, r.capability, count(*) AS runs,
                        count(*) FILTER (
                            WHERE r.delta >= $min_delta AND r.lacking_failure::DOUBLE / nullif(t.failed, 0) >= $min_coverage
                        ) AS runs_selected
                    FROM run_selection r JOIN totals t USING (window_name) GROUP BY r.window_name, r.capability
                ),
                rates AS (
                    SELECT c.*, r.runs AS multi_runs, r.runs_selected AS multi_selected,
                        lacking_success::DOUBLE / nullif(needed_success, 0) AS er_plus,
                        lacking_failure::DOUBLE / nullif(needed_failure, 0) AS er_minus,
                        lacking_failure::DOUBLE / nullif(t.failed, 0) AS coverage,
                        needed_failure::DOUBLE / nullif(needed_success + needed_failure, 0) AS failure_rate
                    FROM counts c JOIN totals t USING (window_name) LEFT JOIN runs r USING (window_name, capability)
                ),
                gaps AS (
                    SELECT *, er_minus - coalesce(er_plus, 0) AS delta,
                        coalesce(er_minus - coalesce(er_plus, 0) >= $min_delta AND coverage >= $min_coverage, false)
                            AS gap
                    FROM rates
                ),
                voted_runs AS (
                    -- A single-run labeler is one run that selects when its labels show the gap.
                    SELECT *, coalesce(multi_runs, 1) AS runs,
                        coalesce(multi_selected, CASE WHEN gap THEN 1 ELSE 0 END) AS runs_selected
                    FROM gaps
                ),
                decided AS (
                    SELECT *,
                        gap AND needed_failure >= $min_failures AND runs_selected >= ceil($consistency * runs)
                            AS selected
                    FROM voted_runs
                )
                SELECT $pass_id, now(), window_name, capability,
                    n_success, n_failure, n_unknown, needed_success, needed_failure, lacking_success, lacking_failure,
                    er_plus, {_wilson("lacking_success", "needed_success", "er_plus")},
                    er_minus, {_wilson("lacking_failure", "needed_failure", "er_minus")},
                    delta, coverage,
                    failure_rate, {_wilson("needed_failure", "(needed_success + needed_failure)", "failure_rate")},
                    runs, runs_selected, selected,
                    CASE WHEN selected
                        THEN row_number() OVER (PARTITION BY window_name, selected ORDER BY coverage DESC, capability)
                    END
                FROM decided
                """,
                {
                    "min_delta": min_delta,
                    "min_coverage": min_coverage,
                    "min_failures": min_failures,
                    "consistency": consistency,
                    "pass_id": pass_id,
                },
            )
            tx.unregister("pass_windows")
            tx.execute("DROP TABLE pass_trajectories")
            tx.execute("DROP TABLE pass_labels")
            tx.unregister(_CURRENT)
        return pass_id

    def stats(self, pass_id: int | None = None) -> list[dict[str, Any]]:
        """The statistics of one pass (the latest by default)."""
        return self.store.query(
            "SELECT * FROM capability_stats WHERE pass_id = coalesce(?, (SELECT max(pass_id) FROM capability_stats)) "
            "ORDER BY window_name, capability",
            [pass_id],
        )

    def stats_history(self, capability: str, window_name: str, limit: int = 200) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM (SELECT * FROM capability_stats WHERE capability = ? AND window_name = ? "
            "ORDER BY pass_id DESC LIMIT ?) ORDER BY pass_id",
            [capability, window_name, limit],
        )

    # -- inferred tool schemas -----------------------------------------------------------------

    def observed_arguments(self, service_name: str, limit_per_tool: int = 500) -> list[tuple[str, str]]:
        """Recent (tool, arguments) pairs of one agent, to infer schemas when it declares none."""
        return self.store.cursor.execute(
            """
            SELECT tool_name, arguments FROM (
                SELECT c.tool_name, c.arguments,
                       row_number() OVER (PARTITION BY c.tool_name ORDER BY t.updated_batch DESC) AS n
                FROM tool_calls c JOIN trajectories t USING (trajectory_id)
                WHERE t.service_name = ? AND c.arguments IS NOT NULL
            ) WHERE n <= ?
            """,
            [service_name, limit_per_tool],
        ).fetchall()

    # -- trigger -------------------------------------------------------------------------------

    def states(self) -> dict[str, dict[str, Any]]:
        return {row["capability"]: row for row in self.store.query("SELECT * FROM capability_states")}

    def transition(
        self,
        capability: str,
        from_state: str,
        to_state: str,
        reason: str,
        consecutive: int,
        pass_id: int,
        stats: str | None = None,
        cooldown_until: Any = None,
    ) -> bool:
        """Move a capability from `from_state` to a state, recording the transition (a no-op move only
        updates counters). Compare-and-set: when another job has moved the capability since the caller
        read `from_state`, nothing is written and False is returned. Moves take turns: two
        concurrent DuckDB transactions updating the same row would fail with a write conflict."""
        with _STATE_MOVES, self.store.transaction() as tx:
            current = tx.execute("SELECT state FROM capability_states WHERE capability = ?", [capability]).fetchall()
            if current and current[0][0] != from_state:
                return False
            tx.execute(
                "INSERT INTO capability_states VALUES (?, ?, now(), ?, ?, ?, ?) ON CONFLICT (capability) DO UPDATE SET "
                "state = excluded.state, since = CASE WHEN capability_states.state = excluded.state "
                "THEN capability_states.since ELSE excluded.since END, consecutive = excluded.consecutive, "
                "reason = excluded.reason, cooldown_until = excluded.cooldown_until, last_pass_id = excluded.last_pass_id",
                [capability, to_state, consecutive, reason, cooldown_until, pass_id],
            )
            if from_state != to_state:
                tx.execute(
                    "INSERT INTO capability_transitions (transitioned_at, capability, from_state, to_state, reason, stats) "
                    "VALUES (now(), ?, ?, ?, ?, ?)",
                    [capability, from_state, to_state, reason, stats],
                )
        return True

    def start_cooldown(self, capability: str, reason: str, hours: float, now: datetime | None = None) -> None:
        """Rest a capability after a promotion, a rejection or a rollback: no new trigger for `hours`."""
        now = now or datetime.now(timezone.utc)
        state = self.states().get(capability, {"state": HEALTHY, "last_pass_id": 0})
        self.transition(capability, state["state"], COOLDOWN, reason, 0, state["last_pass_id"], None, now + timedelta(hours=hours))

    def transitions(self, capability: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM capability_transitions WHERE ? IS NULL OR capability = ? ORDER BY transition_id DESC LIMIT ?",
            [capability, capability, limit],
        )

    def open_training_request(self, capability: str) -> dict[str, Any] | None:
        rows = self.store.query(
            "SELECT * FROM training_requests WHERE capability = ? AND status IN ('open', 'taken') "
            "ORDER BY request_id DESC LIMIT 1",
            [capability],
        )
        return rows[0] if rows else None

    def create_training_request(
        self, capability: str, source: str, reason: str, requested_by: str | None, stats: str | None
    ) -> dict[str, Any]:
        with self.store.transaction() as tx:
            request_id = tx.execute(
                "INSERT INTO training_requests (capability, created_at, source, status, reason, requested_by, stats) "
                "VALUES (?, now(), ?, 'open', ?, ?, ?) RETURNING request_id",
                [capability, source, reason, requested_by, stats],
            ).fetchall()[0][0]
        return self.store.query("SELECT * FROM training_requests WHERE request_id = ?", [request_id])[0]

    def training_requests(self, status: str | None = None) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM training_requests WHERE ? IS NULL OR status = ? ORDER BY request_id DESC", [status, status]
        )

    # -- API reads and feedback ------------------------------------------------------------------

    def list_trajectories(
        self,
        capability: str | None,
        label: str | None,
        outcome: str | None,
        service: str | None,
        limit: int,
        offset: int,
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of trajectories, newest first, optionally with one capability's label and evidence."""
        filters = ["(? IS NULL OR o.outcome = ?)", "(? IS NULL OR t.service_name = ?)"]
        parameters: list[Any] = [outcome, outcome, service, service]
        label_join = ""
        label_columns = ", NULL AS label, NULL AS reason, NULL AS span_ids"
        if capability is not None:
            label_join = (
                "JOIN (SELECT trajectory_id, mode(label) AS label, any_value(reason ORDER BY run) AS reason, "
                "any_value(span_ids ORDER BY run) AS span_ids FROM labels WHERE capability = ? "
                "GROUP BY trajectory_id) l USING (trajectory_id)"
            )
            label_columns = ", l.label, l.reason, l.span_ids"
            parameters = [capability, *parameters]
            filters.append("(? IS NULL OR l.label = ?)")
            parameters += [label, label]
        where = " AND ".join(filters)
        base = (
            f"FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) {label_join} WHERE {where}"
        )
        total = self.store.cursor.execute(f"SELECT count(*) {base}", parameters).fetchall()[0][0]
        items = self.store.query(
            "SELECT t.trajectory_id, t.service_name, t.agent_name, t.conversation_id, t.root_name, "
            "t.start_time_unix_nano, t.end_time_unix_nano, t.n_spans, t.n_llm_calls, t.n_tool_calls, "
            f"t.n_tool_errors, o.outcome, o.outcome_source{label_columns} {base} "
            "ORDER BY t.end_time_unix_nano DESC, t.trajectory_id LIMIT ? OFFSET ?",
            [*parameters, limit, offset],
        )
        return items, total

    def trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        """One trajectory with its conversation, tool calls, tools, labels and outcome evidence."""
        rows = self.store.query(
            "SELECT t.*, o.outcome, o.reward, o.outcome_source, o.outcome_detail FROM trajectories t "
            "JOIN trajectory_outcomes o USING (trajectory_id) WHERE trajectory_id = ?",
            [trajectory_id],
        )
        if not rows:
            return None
        trajectory = rows[0]
        trajectory.pop("updated_at", None)
        for key, sql in {
            "messages": "SELECT position, role, content, tool_calls, tool_call_id, name, trace_id, span_id "
            "FROM messages WHERE trajectory_id = ? ORDER BY position",
            "tool_calls": "SELECT position, tool_name, call_id, arguments, result, error, source, message_position, "
            "trace_id, span_id FROM tool_calls WHERE trajectory_id = ? ORDER BY position",
            "tools": "SELECT tool_name, description, parameters FROM trajectory_tools WHERE trajectory_id = ? "
            "ORDER BY tool_name",
            "labels": "SELECT capability, labeler, labeler_version, run, label, reason, span_ids, confidence, labeled_at "
            "FROM labels WHERE trajectory_id = ? ORDER BY capability, run",
            "outcome_evidence": "SELECT source, outcome, reward, detail, evidence_id, observed_time_unix_nano FROM outcomes "
            "WHERE trajectory_id = ? UNION ALL SELECT 'feedback', outcome, reward, comment, feedback_id, "
            "epoch_ns(recorded_at) FROM feedback WHERE trajectory_id = ? ORDER BY observed_time_unix_nano",
        }.items():
            trajectory[key] = self.store.query(sql, [trajectory_id] * sql.count("?"))
        return trajectory

    def add_feedback(
        self, feedback_id: str, trajectory_id: str, outcome: str, reward: float | None, comment: str | None, author: str
    ) -> bool:
        """Record feedback; False when the trajectory does not exist. Re-sending the same id is idempotent."""
        with self.store.transaction() as tx:
            exists = tx.execute("SELECT count(*) FROM trajectories WHERE trajectory_id = ?", [trajectory_id]).fetchall()[0][0]
            if not exists:
                return False
            tx.execute(
                "INSERT INTO feedback VALUES (?, ?, ?, ?, ?, ?, now()) ON CONFLICT (feedback_id) DO UPDATE SET "
                "outcome = excluded.outcome, reward = excluded.reward, comment = excluded.comment, "
                "author = excluded.author, recorded_at = excluded.recorded_at",
                [feedback_id, trajectory_id, outcome, reward, comment, author],
            )
        return True

    def lacking_service(self, capability: str) -> str | None:
        """The agent whose failed runs lack this capability most often."""
        rows = self.store.query(
            "SELECT t.service_name FROM labels l JOIN trajectories t USING (trajectory_id) "
            "JOIN trajectory_outcomes o USING (trajectory_id) "
            "WHERE l.capability = ? AND l.label = 'LACKING' AND o.outcome = 'failure' "
            "GROUP BY t.service_name ORDER BY count(*) DESC, t.service_name LIMIT 1",
            [capability],
        )
        return rows[0]["service_name"] if rows else None

    def requests_without_environment(self) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT r.* FROM training_requests r WHERE r.status = 'open' AND NOT EXISTS "
            "(SELECT 1 FROM environments e WHERE e.request_id = r.request_id) ORDER BY r.request_id"
        )

    def add_environment(
        self,
        capability: str,
        spec: dict[str, Any],
        service: str | None,
        tools: list[dict[str, Any]],
        request_id: int | None,
        status: str,
        checks: dict[str, Any],
    ) -> int:
        with self.store.transaction() as tx:
            return tx.execute(
                "INSERT INTO environments (capability, family, family_version, difficulty, service_name, tools_hash, "
                "tools, request_id, status, checks, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now()) "
                "RETURNING environment_id",
                [
                    capability, spec["family"], spec["version"], spec["difficulty"], service, spec["tools_hash"],
                    orjson.dumps(tools).decode(), request_id, status, orjson.dumps(checks).decode(),
                ],
            ).fetchall()[0][0]

    def environments(self, capability: str | None = None) -> list[dict[str, Any]]:
        items = self.store.query(
            "SELECT * FROM environments WHERE ? IS NULL OR capability = ? ORDER BY environment_id DESC",
            [capability, capability],
        )
        for item in items:
            item["tools"] = orjson.loads(item["tools"])
            item["checks"] = orjson.loads(item["checks"])
            if item.get("validation"):
                item["validation"] = orjson.loads(item["validation"])
        return items

    def environment_to_validate(self) -> dict[str, Any] | None:
        """The oldest environment that passed its checks and waits for the validation gate."""
        rows = self.store.query("SELECT * FROM environments WHERE status = 'checked' ORDER BY environment_id LIMIT 1")
        if not rows:
            return None
        rows[0]["tools"] = orjson.loads(rows[0]["tools"])
        return rows[0]

    def set_environment_status(
        self, environment_id: int, from_status: str, status: str, validation: dict[str, Any] | None = None
    ) -> bool:
        """Move an environment from `from_status` to `status`, with the gate's report when one is given.
        Compare-and-set: False (and nothing written) when it is no longer in `from_status`."""
        report = None if validation is None else orjson.dumps(validation).decode()
        with self.store.transaction() as tx:
            return bool(
                tx.execute(
                    "UPDATE environments SET status = ?, validation = coalesce(?, validation), "
                    "validated_at = CASE WHEN ? IS NULL THEN validated_at ELSE now() END "
                    "WHERE environment_id = ? AND status = ? RETURNING environment_id",
                    [status, report, report, environment_id, from_status],
                ).fetchall()
            )

    def requeue_validating(self) -> int:
        """Environments a stopped or killed daemon left `validating` wait for the gate again."""
        with self.store.transaction() as tx:
            return len(tx.execute(
                "UPDATE environments SET status = 'checked' WHERE status = 'validating' RETURNING environment_id"
            ).fetchall())  # fmt: skip

    def tool_definitions(self, service: str | None = None) -> list[dict[str, Any]]:
        """Declared tools per agent; without a service, those of the agent seen with the most tools."""
        if service is None:
            rows = self.store.query(
                "SELECT service_name FROM tool_definitions GROUP BY service_name ORDER BY count(*) DESC, service_name LIMIT 1"
            )
            if not rows:
                return []
            service = rows[0]["service_name"]
        items = self.store.query(
            "SELECT service_name, tool_name, description, parameters, first_seen, last_seen FROM tool_definitions "
            "WHERE service_name = ? ORDER BY tool_name",
            [service],
        )
        for item in items:
            item["parameters"] = orjson.loads(item["parameters"]) if item["parameters"] else None
        return items

    def sample_trajectories(self, outcome: str, count: int, seed: float = 0.5) -> list[str]:
        """A reproducible random sample of trajectory ids with this outcome."""
        cursor = self.store.cursor
        cursor.execute("SELECT setseed(?)", [seed])
        rows = cursor.execute(
            "SELECT trajectory_id FROM trajectory_outcomes WHERE outcome = ? ORDER BY random() LIMIT ?", [outcome, count]
        ).fetchall()
        return [row[0] for row in rows]

    def delete_spans_before(self, cutoff_ns: int) -> tuple[int, int]:
        """Retention: drop spans and logs that ended before the cutoff; derived tables and labels stay."""
        with self.store.transaction() as tx:
            spans = tx.execute("DELETE FROM spans WHERE end_time_unix_nano < ?", [cutoff_ns]).fetchall()[0][0]
            logs = tx.execute("DELETE FROM logs WHERE time_unix_nano < ?", [cutoff_ns]).fetchall()[0][0]
        return spans, logs
