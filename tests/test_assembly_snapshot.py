"""An assembly pass reads one snapshot of the store. Agents export a trace's spans as they end, the
model calls before the root span that carries the conversation id and the outcome; the writer keeps
committing while a pass runs. A root committed between the pass's grouping and its reading of the
spans must not produce a trajectory under the trace id with the conversation's outcome: the jobs
would pick it (a generalist learns from successes) and the next pass removes it."""

from __future__ import annotations

from pathlib import Path

from tracefix.collectors.trajectories import Assembler
from tracefix.daemon.core.settings import AssemblerSettings, OutcomeSettings, StoreSettings, WriterSettings
from tracefix.daemon.store.store import Store
from tracefix.daemon.store.writer import BatchedWriter
from tests.otlp_builders import commit_json_spans, json_span, new_span_id, new_trace_id


class RootCommittedMidPass(Store):
    """The real store, with the root span committed by the real writer (on its own thread and
    connection) right after the pass has grouped the traces: the race, made to happen every time."""

    writer: BatchedWriter
    root: list[dict] = []

    def trajectory_groups(self, trace_ids: list[str]) -> dict[str, list[str]]:
        groups = super().trajectory_groups(trace_ids)
        if self.root:
            commit_json_spans(self.writer, self.root)
            self.root = []
        return groups


def test_a_root_span_committed_during_a_pass_waits_for_the_next_pass_and_its_conversation(tmp_path: Path) -> None:
    store = RootCommittedMidPass(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    writer = BatchedWriter(store, WriterSettings())
    writer.start()
    store.writer = writer
    trace_id, root_id = new_trace_id(), new_span_id()
    chat = json_span(trace_id, new_span_id(), "chat model", parent_span_id=root_id, attributes={"gen_ai.operation.name": "chat"})
    root = json_span(trace_id, root_id, "invoke_agent", attributes={"gen_ai.conversation.id": "conv-1", "tracefix.outcome": "success"})
    assembler = Assembler(store, AssemblerSettings(), OutcomeSettings(), lambda: writer.committed_batch)
    try:
        commit_json_spans(writer, [chat])
        store.root = [root]
        assert assembler.run_pass() == 1
        # The pass saw the trace as it was when it grouped it: the model call alone, no outcome yet.
        first = store.query("SELECT t.trajectory_id, o.outcome FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id)")
        assert first == [{"trajectory_id": trace_id, "outcome": "unknown"}]
        assert assembler.run_pass() == 1  # the root's batch: the conversation takes the trace over
        after = store.query("SELECT t.trajectory_id, o.outcome FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id)")
        assert after == [{"trajectory_id": "conv-1", "outcome": "success"}]
        assert assembler.run_pass() == 0 and assembler.assembled_batch == writer.committed_batch
    finally:
        writer.stop()
        store.close()
