"""What the store's table families share: the base class they run their statements from, on a
Store's connection, and the two helpers most of them need (rows as dicts, bulk inserts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

if TYPE_CHECKING:
    from tracefix.daemon.store.store import Store


class Tables:
    """One family of tables' statements, run on a Store's per-thread cursor and its transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store


def dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def insert_rows(tx: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple]) -> None:
    """Insert `rows` in one statement. Rows of a NamedTuple name their columns (its fields, by the
    table's column names); plain tuples fill every column in the table's order."""
    if not rows:
        return
    fields = getattr(rows[0], "_fields", None)
    names = list(fields) if fields else [column[0] for column in tx.execute(f"SELECT * FROM {table} LIMIT 0").description]
    # Bulk path: one Arrow table per insert instead of a statement per row.
    incoming = pa.table({name: list(values) for name, values in zip(names, zip(*rows), strict=True)})
    columns = ", ".join(names)
    tx.register("incoming_rows", incoming)
    tx.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM incoming_rows")
    tx.unregister("incoming_rows")
