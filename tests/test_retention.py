"""Retention: old spans and log records go, trajectories, labels and statistics stay (real DuckDB file)."""

from __future__ import annotations

import time
from pathlib import Path

from tracefix.collectors.otlp import Limits, decode_spans, parse_traces_json
from tracefix.collectors.trajectories import Assembler
from tracefix.daemon.core.settings import AssemblerSettings, OutcomeSettings, StoreSettings, WriterSettings
from tracefix.daemon.store.store import AnalysisStore, Store
from tracefix.daemon.store.writer import BatchedWriter

DAY_NS = 86_400 * 10**9


def _request(trace_id: str, end_ns: int) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": "00000000000000a1",
                                "name": "invoke_agent",
                                "startTimeUnixNano": str(end_ns - 10**9),
                                "endTimeUnixNano": str(end_ns),
                                "attributes": [{"key": "tracefix.outcome", "value": {"stringValue": "failure"}}],
                            }
                        ]
                    }
                ],
            }
        ]
    }


def test_retention_deletes_old_spans_and_keeps_trajectories(tmp_path: Path) -> None:
    store = Store(StoreSettings(path=tmp_path / "retention.duckdb"))
    writer = BatchedWriter(store, WriterSettings())
    writer.start()
    now = time.time_ns()
    old, recent = "0" * 31 + "1", "0" * 31 + "2"
    for trace_id, end in ((old, now - 40 * DAY_NS), (recent, now - DAY_NS)):
        decoded = decode_spans(parse_traces_json(_request(trace_id, end)), Limits())
        writer.submit(spans=decoded.columns).result(timeout=10)
    writer.stop()
    Assembler(store, AssemblerSettings(), OutcomeSettings()).run_until_idle()
    analysis = AnalysisStore(store)
    assert analysis.delete_spans_before(now - 30 * DAY_NS) == (1, 0)
    remaining = [row["trace_id"] for row in store.query("SELECT trace_id FROM spans")]
    assert remaining == [recent]
    # The old trajectory and its outcome evidence stay for the statistics.
    assert analysis.trajectory(old)["outcome"] == "failure"
    store.close()


def test_retention_keeps_what_evaluation_labels_are_read_from(tmp_path: Path) -> None:
    """Old spans and log records carrying a gen_ai.evaluation.result stay: a relabel after the
    cutoff reads the same evaluations ([[capabilities.evaluations]]); the rest of the old ones go."""
    from tracefix.collectors.otlp import decode_logs, parse_logs_json
    from tracefix.daemon.core.semconv import EVALUATION_EVENT
    from tests.otlp_builders import json_log, json_logs

    store = Store(StoreSettings(path=tmp_path / "retention.duckdb"))
    writer = BatchedWriter(store, WriterSettings())
    writer.start()
    now = time.time_ns()
    judged, plain = "0" * 31 + "3", "0" * 31 + "4"
    for trace_id in (judged, plain):
        request = _request(trace_id, now - 40 * DAY_NS)
        if trace_id == judged:  # an evaluator's verdict as a span event
            request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"] = [
                {"timeUnixNano": str(now - 40 * DAY_NS), "name": EVALUATION_EVENT,
                 "attributes": [{"key": "gen_ai.evaluation.name", "value": {"stringValue": "policy_adherence"}}]}
            ]  # fmt: skip
        writer.submit(spans=decode_spans(parse_traces_json(request), Limits()).columns).result(timeout=10)
    records = [
        json_log(event_name=EVALUATION_EVENT, attributes={"gen_ai.evaluation.name": "policy_adherence"}, trace_id=plain, time_ns=now - 40 * DAY_NS),
        json_log(event_name="app.note", trace_id=plain, time_ns=now - 40 * DAY_NS),
    ]  # fmt: skip
    writer.submit(logs=decode_logs(parse_logs_json(json_logs(records)), Limits()).columns).result(timeout=10)
    writer.stop()
    analysis = AnalysisStore(store)
    assert analysis.delete_spans_before(now - 30 * DAY_NS) == (1, 1)
    assert [row["trace_id"] for row in store.query("SELECT trace_id FROM spans")] == [judged]
    assert [row["event_name"] for row in store.query("SELECT event_name FROM logs")] == [EVALUATION_EVENT]
    store.close()
