"""A labeler that gives no verdict (an LLM endpoint that is down) leaves ERROR labels; the analysis
labels those pairs again once `[analysis] error_retry_s` has passed, and only those (real DuckDB file,
trajectories assembled from real OTLP/JSON)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tracefix.collectors.trajectories import Assembler
from tracefix.daemon.analysis.analyzer import Analyzer
from tracefix.daemon.analysis.capabilities import Capability, CapabilityRegistry, Judgement, Label, Trajectory
from tracefix.daemon.core.settings import AnalysisSettings, AssemblerSettings, OutcomeSettings, StoreSettings, WriterSettings
from tracefix.daemon.store.store import Store
from tracefix.daemon.store.writer import BatchedWriter
from tests.otlp_builders import commit_json_spans, json_span, new_span_id, new_trace_id


@dataclass
class FlakyEndpoint:
    """Stands for an LLM labeler: ERROR while its endpoint is down, a verdict once it is up."""

    up: bool = False
    name: str = "llm.flaky"
    version: str = "1"
    seen: list[str] = field(default_factory=list)

    def label(self, trajectory: Trajectory) -> Judgement:
        self.seen.append(trajectory.trajectory_id)
        if not self.up:
            return Judgement(Label.ERROR, "llm unavailable: connection refused", (), 0.0)
        return Judgement(Label.PRESENT, "answered politely")


def test_error_labels_are_retried_after_the_interval_and_only_they(tmp_path: Path) -> None:
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    writer = BatchedWriter(store, WriterSettings())
    writer.start()
    traces = [new_trace_id() for _ in range(3)]
    for trace_id in traces:
        span = json_span(trace_id, new_span_id(), "invoke_agent", attributes={"tracefix.outcome": "failure"})
        commit_json_spans(writer, [span])
    writer.stop()
    Assembler(store, AssemblerSettings(), OutcomeSettings()).run_until_idle()
    endpoint = FlakyEndpoint()
    registry = CapabilityRegistry()
    registry.add(Capability("politeness", "Answers politely.", endpoint))
    settings = AnalysisSettings(error_retry_s=3600)
    analyzer = Analyzer(store, registry, settings)

    def labels() -> dict[str, str]:
        return {row["trajectory_id"]: row["label"] for row in store.query("SELECT trajectory_id, label FROM labels")}

    try:
        analyzer.run_pass()
        assert set(labels().values()) == {"ERROR"} and len(labels()) == 3
        endpoint.seen.clear()
        endpoint.up = True
        analyzer.run_pass()  # within the interval: not asked again
        assert endpoint.seen == [] and set(labels().values()) == {"ERROR"}
        settings.error_retry_s = 0.05
        time.sleep(0.1)
        assert analyzer.run_pass().labeled == 3
        assert sorted(endpoint.seen) == sorted(labels()) and set(labels().values()) == {"PRESENT"}
        endpoint.seen.clear()
        time.sleep(0.1)
        analyzer.run_pass()  # nothing left in error: nothing asked
        assert endpoint.seen == []
    finally:
        store.close()
