"""Retention: old spans and log records go, trajectories, labels and statistics stay (real DuckDB file)."""

from __future__ import annotations

import time
from pathlib import Path

from collectors.otlp import Limits, decode_spans, parse_traces_json
from collectors.trajectories import Assembler
from daemon.core.settings import AssemblerSettings, OutcomeSettings, StoreSettings, WriterSettings
from daemon.store.store import AnalysisStore, Store
from daemon.store.writer import BatchedWriter

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
