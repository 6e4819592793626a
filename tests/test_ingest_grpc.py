"""OTLP/gRPC ingest with the SDK's gRPC exporters, and duplicate delivery across transports."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import RunningDaemon, make_daemon

from otlp_builders import (
    PROTOBUF,
    AgentRecorder,
    SpanExportResult,
    SpanKind,
    export_grpc,
    export_http,
    export_logs_grpc,
    export_logs_http,
    hex_trace_id,
    log_count,
    metric,
    new_span_id,
    new_trace_id,
    offline,
    post,
    protobuf_logs_request,
    protobuf_request,
    record_logs,
    span_count,
)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("grpc")).start()
    yield running
    running.stop()


def _agent_trace(service: str, n_children: int = 3) -> list:
    recorder = AgentRecorder(service)
    root = recorder.start("invoke_agent planner", {"gen_ai.operation.name": "invoke_agent"}, kind=SpanKind.SERVER)
    for index in range(n_children):
        recorder.one(f"step {index}", {"step": index, "ok": index % 2 == 0}, parent=root)
    recorder.end(root)
    return recorder.take()


def test_sdk_grpc_export_stores_every_span_with_its_fields(collector: RunningDaemon) -> None:
    spans = _agent_trace("grpc-agent", n_children=4)
    before = span_count(collector)

    assert export_grpc(collector, spans) is SpanExportResult.SUCCESS
    assert span_count(collector) == before + 5

    trace_id = hex_trace_id(spans[0])
    root = next(span for span in spans if span.parent is None)
    root_id = format(root.context.span_id, "016x")
    with offline(collector) as query:
        rows = query(
            "SELECT span_id, parent_span_id, name, kind, service_name, scope_name, attributes, start_time_unix_nano "
            f"FROM spans WHERE trace_id = '{trace_id}' ORDER BY start_time_unix_nano"
        )
    assert [row[0] for row in rows] == [
        format(span.context.span_id, "016x") for span in sorted(spans, key=lambda span: span.start_time)
    ]
    assert rows[0][0] == root_id and rows[0][1] is None
    assert rows[0][2:6] == ("invoke_agent planner", 2, "grpc-agent", "agent-under-test")
    assert all(row[1] == root_id for row in rows[1:])
    assert [json.loads(row[6]) for row in rows[1:]] == [{"step": index, "ok": index % 2 == 0} for index in range(4)]
    assert [row[7] for row in rows] == sorted(span.start_time for span in spans)


def test_sdk_grpc_export_with_gzip_compression_is_accepted(collector: RunningDaemon) -> None:
    import grpc

    spans = _agent_trace("grpc-gzip-agent", n_children=20)
    before = span_count(collector)

    assert export_grpc(collector, spans, compression=grpc.Compression.Gzip) is SpanExportResult.SUCCESS
    assert span_count(collector) == before + 21


def test_sdk_grpc_log_exporter_stores_log_records_with_their_trace_context(collector: RunningDaemon) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    records = record_logs(
        "grpc-log-agent",
        [
            {"event_name": "agent.step", "attributes": {"tool": tool}, "trace_id": trace_id, "span_id": span_id, "body": body}
            for tool, body in (("search", "searched"), ("answer", "answered"))
        ],
    )
    before = log_count(collector)

    assert export_logs_grpc(collector, records).name == "SUCCESS"
    assert log_count(collector) == before + 2
    with offline(collector) as query:
        rows = query(
            "SELECT event_name, trace_id, span_id, body, attributes FROM logs "
            "WHERE service_name = 'grpc-log-agent' ORDER BY time_unix_nano"
        )
    assert [(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4])) for row in rows] == [
        ("agent.step", trace_id, span_id, "searched", {"tool": "search"}),
        ("agent.step", trace_id, span_id, "answered", {"tool": "answer"}),
    ]


def test_same_spans_over_http_then_grpc_are_stored_once_and_counted_as_duplicates(collector: RunningDaemon) -> None:
    spans = _agent_trace("retrying-agent", n_children=5)
    body = protobuf_request(spans).SerializeToString()
    spans_before = span_count(collector)
    duplicates_before = metric(collector, "tracefix_spans_duplicate_total", signal="traces")

    first = post(f"{collector.http_url}/v1/traces", body, PROTOBUF)
    assert first.status_code == 200
    assert span_count(collector) == spans_before + 6

    again_over_http = post(f"{collector.http_url}/v1/traces", body, PROTOBUF)
    assert again_over_http.status_code == 200
    assert export_grpc(collector, spans) is SpanExportResult.SUCCESS

    assert span_count(collector) == spans_before + 6
    assert metric(collector, "tracefix_spans_duplicate_total", signal="traces") == duplicates_before + 12


def test_a_retry_holding_old_and_new_spans_stores_only_the_new_ones(collector: RunningDaemon) -> None:
    spans = _agent_trace("partial-retry-agent", n_children=3)
    spans_before = span_count(collector)
    duplicates_before = metric(collector, "tracefix_spans_duplicate_total", signal="traces")
    assert export_grpc(collector, spans[:2]) is SpanExportResult.SUCCESS

    assert export_http(collector, spans) is SpanExportResult.SUCCESS

    assert span_count(collector) == spans_before + 4
    assert metric(collector, "tracefix_spans_duplicate_total", signal="traces") == duplicates_before + 2


def test_same_log_records_over_http_then_grpc_are_stored_once(collector: RunningDaemon) -> None:
    records = record_logs(
        "retrying-log-agent",
        [{"event_name": "agent.step", "body": f"step {index}", "trace_id": new_trace_id()} for index in range(3)],
    )
    logs_before = log_count(collector)
    duplicates_before = metric(collector, "tracefix_spans_duplicate_total", signal="logs")

    response = post(f"{collector.http_url}/v1/logs", protobuf_logs_request(records).SerializeToString(), PROTOBUF)
    assert response.status_code == 200
    assert export_logs_grpc(collector, records).name == "SUCCESS"
    assert export_logs_http(collector, records).name == "SUCCESS"

    assert log_count(collector) == logs_before + 3
    assert metric(collector, "tracefix_spans_duplicate_total", signal="logs") == duplicates_before + 6


def test_grpc_requests_are_counted_by_transport_in_metrics(collector: RunningDaemon) -> None:
    spans = _agent_trace("metered-agent", n_children=2)
    received_before = metric(collector, "tracefix_spans_received_total", transport="grpc", signal="traces")
    requests_before = metric(collector, "tracefix_ingest_requests_total", transport="grpc", signal="traces", status="OK")

    assert export_grpc(collector, spans) is SpanExportResult.SUCCESS

    assert metric(collector, "tracefix_spans_received_total", transport="grpc", signal="traces") == received_before + 3
    assert metric(collector, "tracefix_ingest_requests_total", transport="grpc", signal="traces", status="OK") == requests_before + 1
    assert metric(collector, "tracefix_ingest_request_seconds_count", transport="grpc", signal="traces") >= 1
