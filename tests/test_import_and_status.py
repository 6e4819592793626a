"""`tracefix import`, `tracefix status` and the daemon's /metrics, run as a user would run them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import REPO, RunningDaemon, free_port, make_daemon

from otlp_builders import (
    JSON,
    PROTOBUF,
    AgentRecorder,
    SpanExportResult,
    export_http,
    json_bytes,
    json_log,
    json_logs,
    json_span,
    json_traces,
    log_count,
    metric,
    metric_names,
    new_span_id,
    new_trace_id,
    post,
    protobuf_request,
    simple_json_trace,
    span_count,
)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("cli")).start()
    yield running
    running.stop()


def _cli(*arguments: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _import(daemon: RunningDaemon, path: Path) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    completed = _cli("import", str(path), "--config", str(daemon.config_path), "--json")
    try:
        summary = json.loads(completed.stdout)
    except json.JSONDecodeError:
        summary = {}
    return completed, summary


# --- tracefix import ------------------------------------------------------------------------------------


def test_import_of_a_one_request_per_line_file_stores_every_request(collector: RunningDaemon, tmp_path: Path) -> None:
    _, _, first = simple_json_trace(3, service_name="imported")
    _, _, second = simple_json_trace(2, service_name="imported")
    logs = json_logs([json_log(event_name="imported.event", body=f"line {index}") for index in range(4)])
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"\n".join(json_bytes(document) for document in (first, logs, second)) + b"\n")
    spans_before, logs_before = span_count(collector), log_count(collector)

    completed, summary = _import(collector, path)

    assert completed.returncode == 0, completed.stderr
    assert summary == {"requests": 3, "spans": 5, "logs": 4, "rejected": 0, "errors": []}
    assert span_count(collector) == spans_before + 5
    assert log_count(collector) == logs_before + 4


def test_import_of_a_single_pretty_printed_document_stores_it(collector: RunningDaemon, tmp_path: Path) -> None:
    _, _, document = simple_json_trace(4, service_name="imported-document")
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(document, indent=2))
    assert path.read_text().count("\n") > 10
    before = span_count(collector)

    completed, summary = _import(collector, path)

    assert completed.returncode == 0, completed.stderr
    assert (summary["requests"], summary["spans"], summary["errors"]) == (1, 4, [])
    assert span_count(collector) == before + 4


def test_import_reports_bad_lines_and_keeps_the_good_ones(collector: RunningDaemon, tmp_path: Path) -> None:
    _, _, good_one = simple_json_trace(2, service_name="imported-mixed")
    _, _, good_two = simple_json_trace(3, service_name="imported-mixed")
    trace_id = new_trace_id()
    partly_bad = json_traces(
        [json_span(trace_id, new_span_id(), "kept"), json_span(trace_id[:30], new_span_id(), "short trace id")]
    )
    lines = [
        json_bytes(good_one),
        b'{"resourceSpans": [ this is not json',
        b"[1, 2, 3]",
        json_bytes(partly_bad),
        b'{"metrics": []}',
        json_bytes(good_two),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    before = span_count(collector)

    completed, summary = _import(collector, path)

    assert completed.returncode == 0, completed.stderr
    assert span_count(collector) == before + 2 + 1 + 3
    assert summary["requests"] == 3
    assert summary["rejected"] == 1
    errors = summary["errors"]
    assert [error.split(":")[0] for error in errors] == ["line 2", "line 3", "line 4", "line 5"]
    assert "invalid trace_id" in errors[2]


def test_import_summary_counts_only_spans_the_collector_stored(collector: RunningDaemon, tmp_path: Path) -> None:
    # A line the collector refuses as a whole (400): a timestamp that is not a number.
    trace_id = new_trace_id()
    refused = json_traces([json_span(trace_id, new_span_id(), "refused"), json_span(trace_id, new_span_id(), "refused too")])
    refused["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = "yesterday"
    _, _, good = simple_json_trace(2, service_name="imported-summary")
    path = tmp_path / "refused.jsonl"
    path.write_bytes(json_bytes(good) + b"\n" + json_bytes(refused) + b"\n")
    before = span_count(collector)

    completed, summary = _import(collector, path)

    assert completed.returncode == 0, completed.stderr
    assert span_count(collector) == before + 2
    assert summary["errors"] and summary["errors"][0].startswith("line 2: 400")
    # "imported N requests: M spans" must not count the spans of the refused request.
    assert summary["spans"] - summary["rejected"] == 2


def test_import_of_a_missing_file_or_without_a_collector_fails_with_a_message(tmp_path: Path) -> None:
    offline_daemon = make_daemon(tmp_path)  # configured, never started
    _, _, document = simple_json_trace(1)
    path = tmp_path / "trace.json"
    path.write_bytes(json_bytes(document))

    unreachable = _cli("import", str(path), "--config", str(offline_daemon.config_path))
    missing = _cli("import", str(tmp_path / "nope.jsonl"), "--config", str(offline_daemon.config_path))

    assert unreachable.returncode != 0
    assert "not reachable" in unreachable.stderr and "tracefix up" in unreachable.stderr
    assert missing.returncode != 0
    for completed in (unreachable, missing):
        assert "Traceback" not in completed.stderr + completed.stdout


# --- tracefix status ------------------------------------------------------------------------------------


def test_status_json_prints_the_counts_of_the_running_daemon(collector: RunningDaemon) -> None:
    _, _, document = simple_json_trace(2)
    assert post(f"{collector.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
    collector.wait_assembled()

    completed = _cli("status", "--config", str(collector.config_path), "--json")

    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    api = collector.status()
    assert printed["counts"] == api["counts"]
    assert printed["counts"]["spans"] >= 2
    assert printed["outcomes"] == api["outcomes"]
    assert printed["database"]["path"] == str(collector.db_path)
    assert printed["healthy"] is True


def test_status_table_names_the_counts(collector: RunningDaemon) -> None:
    completed = _cli("status", "--config", str(collector.config_path))

    assert completed.returncode == 0, completed.stderr
    assert "spans" in completed.stdout and "trajectories" in completed.stdout
    assert str(span_count(collector)) in completed.stdout


def test_status_without_a_running_daemon_exits_nonzero_and_says_to_start_it(tmp_path: Path) -> None:
    config = tmp_path / "tracefix.toml"
    config.write_text(f"[api]\nport = {free_port()}\n")

    for arguments in (("status",), ("status", "--json")):
        completed = _cli(*arguments, "--config", str(config))

        assert completed.returncode != 0
        assert "not reachable" in completed.stderr
        assert "start it with `tracefix up`" in completed.stderr
        assert "Traceback" not in completed.stderr + completed.stdout
        assert completed.stdout == ""


def test_status_reports_assembly_caught_up_after_a_commit_that_holds_only_logs(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path).start()
    try:
        trace_id, _, document = simple_json_trace(2)
        assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
        daemon.wait_assembled()
        evaluation = json_log(
            event_name="gen_ai.evaluation.result",
            attributes={"gen_ai.evaluation.score.label": "pass"},
            trace_id=trace_id,
        )
        assert post(f"{daemon.http_url}/v1/logs", json_bytes(json_logs([evaluation])), JSON).status_code == 200

        # The log is assembled (the trajectory's outcome changes) ...
        deadline = time.monotonic() + 10
        while daemon.status()["outcomes"]["success"] != 1:
            assert time.monotonic() < deadline, "the evaluation log was never assembled"
            time.sleep(0.1)
        # ... so the status must say that assembly has caught up with every committed batch.
        status = daemon.wait_assembled(timeout_s=2)
        assert status["ingest"]["assembled_batch"] >= status["ingest"]["committed_batch"]
    finally:
        daemon.stop()


# --- /metrics -------------------------------------------------------------------------------------------


def test_metrics_expose_received_rejected_latency_commit_time_and_database_size(collector: RunningDaemon) -> None:
    recorder = AgentRecorder("metered")
    root = recorder.start("root")
    recorder.one("child", parent=root)
    recorder.end(root)
    request = protobuf_request(recorder.take())
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01\x02"  # rejected: invalid span_id
    received_before = metric(collector, "tracefix_spans_received_total", transport="http/protobuf", signal="traces")
    rejected_before = metric(collector, "tracefix_spans_rejected_total", reason="invalid span_id")
    latency_before = metric(collector, "tracefix_ingest_request_seconds_count", transport="http/protobuf", signal="traces")
    commits_before = metric(collector, "tracefix_commit_seconds_count")

    response = post(f"{collector.http_url}/v1/traces", request.SerializeToString(), PROTOBUF)

    assert response.status_code == 200
    assert metric(collector, "tracefix_spans_received_total", transport="http/protobuf", signal="traces") == received_before + 2
    assert metric(collector, "tracefix_spans_rejected_total", reason="invalid span_id") == rejected_before + 1
    rejected_labels = metric_names(collector)["tracefix_spans_rejected_total"]
    assert {"transport": "http/protobuf", "signal": "traces", "reason": "invalid span_id"} in rejected_labels
    assert metric(collector, "tracefix_ingest_request_seconds_count", transport="http/protobuf", signal="traces") == latency_before + 1
    buckets = metric_names(collector)["tracefix_ingest_request_seconds_bucket"]
    assert any(labels.get("le") == "+Inf" for labels in buckets)
    assert metric(collector, "tracefix_commit_seconds_count") == commits_before + 1
    assert metric(collector, "tracefix_commit_seconds_sum") > 0
    database_bytes = metric(collector, "tracefix_database_bytes")
    status_bytes = collector.status()["database"]["bytes"]
    assert database_bytes > 0
    assert abs(database_bytes - status_bytes) <= max(status_bytes // 10, 65536)
    # What DuckDB's buffer manager holds: the stored tables' blocks, at most the connection's memory_limit.
    assert 0 < metric(collector, "tracefix_database_memory_bytes") <= 2 * 2**30


def test_metrics_count_refused_requests_by_status(collector: RunningDaemon) -> None:
    before = metric(collector, "tracefix_ingest_requests_total", transport="http/json", signal="traces", status="400")

    response = post(f"{collector.http_url}/v1/traces", b"{not json", JSON)

    assert response.status_code == 400
    assert metric(collector, "tracefix_ingest_requests_total", transport="http/json", signal="traces", status="400") == before + 1


def test_sdk_export_shows_up_in_status_and_metrics_alike(collector: RunningDaemon) -> None:
    recorder = AgentRecorder("status-agent")
    recorder.one("single span")
    spans = recorder.take()
    status_before = span_count(collector)
    accepted_before = metric(collector, "tracefix_spans_accepted_total", transport="http/protobuf", signal="traces")

    assert export_http(collector, spans) is SpanExportResult.SUCCESS

    assert span_count(collector) == status_before + 1
    assert metric(collector, "tracefix_spans_accepted_total", transport="http/protobuf", signal="traces") == accepted_before + 1
    assert httpx.get(f"{collector.api_url}/healthz", timeout=5).json()["status"] == "ok"
