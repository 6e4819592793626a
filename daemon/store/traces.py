"""Traces as stored: spans and logs appended, trajectories assembled from them, and the assembled
trajectories read back (listing, detail, feedback, sampling), with the retention of raw spans and logs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import pyarrow as pa

from tracefix.daemon.core.semconv import EVALUATION_EVENT
from tracefix.daemon.store.sql import Tables, dicts, insert_rows

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


@dataclass(frozen=True, slots=True)
class AppendResult:
    """How many rows of a commit were new (the rest were duplicates of earlier deliveries)."""

    spans_inserted: int
    logs_inserted: int


# The rows the assembler derives, one type per table, each field named after its column: inserts
# name the columns (sql.insert_rows), so a row never depends on the order a migration made them in.


class TrajectoryRow(NamedTuple):
    trajectory_id: str
    conversation_id: str | None
    service_name: str
    agent_name: str | None
    trace_ids: list[str]
    root_name: str | None
    start_time_unix_nano: int
    end_time_unix_nano: int
    n_spans: int
    n_llm_calls: int
    n_tool_calls: int
    n_tool_errors: int
    dialects: list[str]
    tool_names: list[str]
    updated_batch: int
    updated_at: datetime


class MessageRow(NamedTuple):
    trajectory_id: str
    position: int
    role: str
    content: str
    tool_calls: str  # JSON: [{"id", "name", "arguments"}]
    tool_call_id: str | None
    name: str | None
    trace_id: str
    span_id: str
    updated_batch: int


class ToolCallRow(NamedTuple):
    trajectory_id: str
    position: int
    tool_name: str
    call_id: str | None
    arguments: str | None
    result: str | None
    error: str | None
    source: str  # "tool_span" (an executed tool) or "message" (requested, no span of its own)
    message_position: int | None
    trace_id: str
    span_id: str
    start_time_unix_nano: int
    updated_batch: int


class TrajectoryToolRow(NamedTuple):
    trajectory_id: str
    tool_name: str
    description: str
    parameters: str | None
    updated_batch: int


class ToolDefinitionRow(NamedTuple):
    """A tool an agent declared (first and last seen are set by the upsert)."""

    service_name: str
    tool_name: str
    description: str
    parameters: str | None


class OutcomeRow(NamedTuple):
    trajectory_id: str
    source: str
    outcome: str
    reward: float | None
    detail: str | None
    evidence_id: str
    observed_time_unix_nano: int
    recorded_at: datetime


class TraceMapRow(NamedTuple):
    trace_id: str
    trajectory_id: str


@dataclass(slots=True)
class DerivedRows:
    """Everything the assembler derives for a set of trajectories, replaced in one transaction."""

    trajectory_ids: list[str]
    trace_map: list[TraceMapRow]
    trajectories: list[TrajectoryRow]
    messages: list[MessageRow]
    tool_calls: list[ToolCallRow]
    trajectory_tools: list[TrajectoryToolRow]
    tool_definitions: list[ToolDefinitionRow]
    outcomes: list[OutcomeRow]


class SpanTables:
    """Appends and trajectory assembly, mixed into Store: the writer appends spans and logs, the
    assembler reads them back and swaps in what it derives. Runs on the Store's own cursor."""

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
        return dicts(cursor)

    def logs_of_traces(self, trace_ids: list[str], conversation_ids: list[str]) -> list[dict[str, Any]]:
        cursor = self.cursor.execute(
            "SELECT log_id, trace_id, span_id, time_unix_nano, event_name, body, attributes, conversation_id "
            "FROM logs WHERE trace_id IN (SELECT unnest(?::VARCHAR[])) "
            "OR (trace_id IS NULL AND conversation_id IN (SELECT unnest(?::VARCHAR[]))) "
            "ORDER BY time_unix_nano",
            [trace_ids, conversation_ids],
        )
        return dicts(cursor)

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
            insert_rows(tx, "trace_trajectories", rows.trace_map)
            insert_rows(tx, "trajectories", rows.trajectories)
            insert_rows(tx, "messages", rows.messages)
            insert_rows(tx, "tool_calls", rows.tool_calls)
            insert_rows(tx, "trajectory_tools", rows.trajectory_tools)
            insert_rows(tx, "outcomes", rows.outcomes)
            if rows.tool_definitions:
                tx.executemany(
                    "INSERT INTO tool_definitions (service_name, tool_name, description, parameters, first_seen, last_seen) "
                    "VALUES (?, ?, ?, ?, now(), now()) "
                    "ON CONFLICT (service_name, tool_name) DO UPDATE SET "
                    "description = excluded.description, parameters = excluded.parameters, last_seen = now()",
                    rows.tool_definitions,
                )
            tx.execute(
                "UPDATE assembler_state SET last_span_batch = ?, last_log_batch = ? WHERE id = 1",
                [span_batch, log_batch],
            )


class TrajectoryStore(Tables):
    """The assembled trajectories as the API and the jobs read them, feedback on them, and the
    retention of the raw spans and logs they were assembled from."""

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

    def agents(self) -> list[dict[str, Any]]:
        """Each agent that sent trajectories (its service.name, and gen_ai.agent.name where given):
        how many, with which outcomes, and when the last one ended."""
        return self.store.query(
            "SELECT t.service_name, t.agent_name, count(*) AS trajectories, "
            "count(*) FILTER (WHERE o.outcome = 'success') AS success, count(*) FILTER (WHERE o.outcome = 'failure') AS failure, "
            "count(*) FILTER (WHERE o.outcome = 'unknown') AS unknown, max(t.end_time_unix_nano) AS last_end_time_unix_nano "
            "FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) "
            "GROUP BY t.service_name, t.agent_name ORDER BY trajectories DESC, t.service_name, t.agent_name"
        )

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

    def sample_trajectories(self, outcome: str, count: int, seed: float = 0.5) -> list[str]:
        """A reproducible random sample of trajectory ids with this outcome."""
        cursor = self.store.cursor
        cursor.execute("SELECT setseed(?)", [seed])
        rows = cursor.execute(
            "SELECT trajectory_id FROM trajectory_outcomes WHERE outcome = ? ORDER BY random() LIMIT ?", [outcome, count]
        ).fetchall()
        return [row[0] for row in rows]

    def delete_spans_before(self, cutoff_ns: int) -> tuple[int, int]:
        """Retention: drop spans and logs that ended before the cutoff; derived tables and labels stay.

        Spans and log records that carry a gen_ai.evaluation.result stay too: they are what the
        labels of [[capabilities.evaluations]] are read from, so a relabel after the cutoff (a new
        labeler version, a changed mapping) finds the same evaluations. They are few."""
        with self.store.transaction() as tx:
            spans = tx.execute(
                "DELETE FROM spans WHERE end_time_unix_nano < ? AND NOT coalesce(contains(events, ?), false)", [cutoff_ns, EVALUATION_EVENT]
            ).fetchall()[0][0]
            logs = tx.execute(
                "DELETE FROM logs WHERE time_unix_nano < ? AND coalesce(event_name, '') <> ?", [cutoff_ns, EVALUATION_EVENT]
            ).fetchall()[0][0]
        return spans, logs
