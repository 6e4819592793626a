"""The store: the only code that opens the DuckDB file and writes SQL against it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from daemon.migrations import MIGRATIONS, Migration
from daemon.settings import StoreSettings

log = logging.getLogger(__name__)

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
                config={"memory_limit": settings.memory_limit, "threads": settings.threads},
            )
        except duckdb.IOException as error:
            raise StoreError(
                f"cannot open {self.path}: {error}. Is another tracefix daemon using it? "
                "Only the daemon opens the database; stop the other one or set [store] path."
            ) from None
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursors_lock = threading.Lock()
        self.migrate()

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
        return self.cursor.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]

    # -- ingest --------------------------------------------------------------------------------

    def last_ingest_batch(self) -> int:
        return self.cursor.execute(
            "SELECT greatest((SELECT coalesce(max(ingest_batch), 0) FROM spans), "
            "(SELECT coalesce(max(ingest_batch), 0) FROM logs))"
        ).fetchone()[0]

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
                ).fetchone()[0]
                tx.unregister("incoming_spans")
            if logs is not None and logs.num_rows:
                tx.register("incoming_logs", logs)
                logs_inserted = tx.execute(
                    "INSERT OR IGNORE INTO logs SELECT *, ? AS ingest_batch, now() AS received_at "
                    "FROM incoming_logs",
                    [batch],
                ).fetchone()[0]
                tx.unregister("incoming_logs")
        return AppendResult(spans_inserted, logs_inserted)

    # -- assembly ------------------------------------------------------------------------------

    def assembler_position(self) -> tuple[int, int]:
        return self.cursor.execute(
            "SELECT last_span_batch, last_log_batch FROM assembler_state WHERE id = 1"
        ).fetchone()

    def pending_traces(self, after_span_batch: int, after_log_batch: int, limit: int) -> tuple[list[str], int, int]:
        """Traces touched by spans or logs committed after the given batches, oldest batches first.

        Returns the trace ids and the batch positions the assembler reaches once they are done.
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
        reach_log = cursor.execute(
            "SELECT coalesce(max(ingest_batch), ?) FROM logs WHERE ingest_batch > ?",
            [after_log_batch, after_log_batch],
        ).fetchone()[0]
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
        return [row[0] for row in rows], reach_span, reach_log

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
            counts[table] = cursor.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
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
