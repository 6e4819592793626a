"""Schema migrations on a real DuckDB file: applied once, in order, each in its own transaction;
a file from a newer tracefix is refused without being touched."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracefix.daemon.store.migrations import MIGRATIONS, Migration
from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import Store, StoreError


def _open(path: Path) -> Store:
    return Store(StoreSettings(path=path))


def test_a_fresh_file_gets_every_migration_once_and_a_reopened_one_none(tmp_path: Path) -> None:
    path = tmp_path / "tracefix.duckdb"
    store = _open(path)
    assert store.schema_version() == max(migration.version for migration in MIGRATIONS)
    assert store.migrate() == []  # already applied: nothing runs twice
    store.close()
    store = _open(path)
    try:
        rows = store.query("SELECT version FROM schema_migrations ORDER BY version")
        assert [row["version"] for row in rows] == [migration.version for migration in MIGRATIONS]
        # A later release's migration is applied once, on the next start.
        later = Migration(max(row["version"] for row in rows) + 1, "a later table", "CREATE TABLE later (x INTEGER)")
        assert store.migrate([*MIGRATIONS, later]) == [later.version]
        assert store.migrate([*MIGRATIONS, later]) == []
        assert store.query("SELECT count(*) AS n FROM later") == [{"n": 0}]
    finally:
        store.close()


def test_a_failing_migration_changes_nothing_and_says_which(tmp_path: Path) -> None:
    store = _open(tmp_path / "tracefix.duckdb")
    try:
        version = store.schema_version()
        broken = Migration(version + 1, "half done", "CREATE TABLE half (x INTEGER); SELECT * FROM no_such_table")
        with pytest.raises(duckdb.Error, match="no_such_table"):
            store.migrate([*MIGRATIONS, broken])
        assert store.schema_version() == version
        assert not store.query("SELECT 1 FROM information_schema.tables WHERE table_name = 'half'")
    finally:
        store.close()


def test_a_file_from_a_newer_tracefix_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "tracefix.duckdb"
    _open(path).close()
    newest = max(migration.version for migration in MIGRATIONS)
    with duckdb.connect(str(path)) as connection:
        connection.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', now())", [newest + 5])
    with pytest.raises(StoreError, match=rf"schema version {newest + 5}, newer than this tracefix \({newest}\)"):
        _open(path)
    with duckdb.connect(str(path)) as connection:
        assert connection.execute("SELECT max(version) FROM schema_migrations").fetchone() == (newest + 5,)
