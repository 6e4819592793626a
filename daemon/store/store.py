"""The store: the only code that opens the DuckDB file and writes SQL against it.

Store owns the connection, the schema and the appends and assembly of traces; AnalysisStore is the
store as the daemon's jobs and API read and write it, composed of one class per table family
(traces, labels, environments). Runs and adapters (runs.py) and served traffic (served.py) sit
beside them. The names the rest of the daemon imports from here stay here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.environments import EnvironmentStore
from tracefix.daemon.store.labels import LabelStore
from tracefix.daemon.store.migrations import MIGRATIONS, Migration
from tracefix.daemon.store.sql import dicts
from tracefix.daemon.store.traces import LOG_SCHEMA, SPAN_SCHEMA, AppendResult, DerivedRows, SpanTables, TrajectoryStore

__all__ = [
    "LOG_SCHEMA",
    "SPAN_SCHEMA",
    "AnalysisStore",
    "AppendResult",
    "DerivedRows",
    "Store",
    "StoreError",
]

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """The database cannot be opened or written; the message says what to do."""


class Store(SpanTables):
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

    def memory_bytes(self) -> int:
        """What DuckDB's buffer manager holds in memory now (tables' blocks, hash tables, …): a cache
        bounded by [store] memory_limit, and most of what the daemon's resident memory adds as the
        data grows."""
        row = self.cursor.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()
        return int(row[0]) if row else 0

    def query(self, sql: str, parameters: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a read-only query as dicts."""
        return dicts(self.cursor.execute(sql, parameters or []))


class AnalysisStore(TrajectoryStore, LabelStore, EnvironmentStore):
    """The store as the analysis, the trigger, the pipeline and the API use it: trajectories, labels,
    statistics, capability states, training requests and environments, on one Store's connection."""
