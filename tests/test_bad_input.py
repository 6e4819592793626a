"""Requests the receivers must refuse (with the exact OTLP status) or repair, and what they leave behind:
nothing stored from a refused request, and the next good request accepted as usual."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import grpc
import httpx
import pytest
from conftest import RunningDaemon, make_daemon
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otlp_builders import (
    JSON,
    PROTOBUF,
    AgentRecorder,
    SpanExportResult,
    export_grpc,
    export_http,
    export_logs_grpc,
    export_logs_http,
    gzipped,
    hex_span_id,
    json_bytes,
    json_log,
    json_logs,
    json_span,
    json_traces,
    log_count,
    new_span_id,
    new_trace_id,
    offline,
    post,
    protobuf_request,
    record_logs,
    simple_json_trace,
    span_count,
)

MAX_BODY = 65536
MAX_VALUE = 1024
TOKEN = "s3cret"
TRACE_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LOGS_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(
        tmp_path_factory.mktemp("guarded"),
        collector={"max_body_bytes": MAX_BODY, "max_attribute_value_bytes": MAX_VALUE},
    ).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("locked"), collector={"token": TOKEN}).start()
    yield running
    running.stop()


def _valid_protobuf(n_spans: int = 2, name: str = "agent step") -> bytes:
    recorder = AgentRecorder("bad-input-agent")
    root = recorder.start(name)
    for index in range(n_spans - 1):
        recorder.one(f"{name} {index}", parent=root)
    recorder.end(root)
    return protobuf_request(recorder.take()).SerializeToString()


def _still_accepting(daemon: RunningDaemon, spans_before: int, **headers: str) -> None:
    """Nothing of the refused request was stored, and a good request right after it is stored."""
    assert span_count(daemon) == spans_before
    _, _, document = simple_json_trace(1)
    response = post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON, **headers)
    assert response.status_code == 200, response.text
    assert span_count(daemon) == spans_before + 1


def _status_message(response: httpx.Response) -> tuple[int, str]:
    """The google.rpc.Status of an error response, in the response's own media type."""
    if response.headers["content-type"].startswith("application/json"):
        body = response.json()
        return body.get("code", 0), body.get("message", "")
    status = status_pb2.Status()
    status.ParseFromString(response.content)
    return status.code, status.message


# --- undecodable bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x0a\x05abc", id="truncated-field"),
        pytest.param(_valid_protobuf(3)[:-5], id="truncated-request"),
        pytest.param(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", id="bad-varint"),
    ],
)
def test_malformed_protobuf_is_refused_with_400_and_stores_nothing(guarded: RunningDaemon, body: bytes) -> None:
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", body, PROTOBUF)

    assert response.status_code == 400
    code, message = _status_message(response)
    assert code == 3  # INVALID_ARGUMENT
    assert "protobuf" in message
    _still_accepting(guarded, before)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"resourceSpans": [{"scopeSpans": [', id="truncated"),
        pytest.param(b"{'resourceSpans': []}", id="single-quotes"),
        pytest.param(b'{"resourceSpans": "not a list"}', id="wrong-shape"),
        pytest.param(b'["resourceSpans"]', id="not-an-object"),
        pytest.param(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}', id="bad-integer"),
    ],
)
def test_malformed_json_is_refused_with_400_and_stores_nothing(guarded: RunningDaemon, body: bytes) -> None:
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", body, JSON)

    assert response.status_code == 400
    code, message = _status_message(response)
    assert code == 3
    assert message
    _still_accepting(guarded, before)


def test_invalid_utf8_in_a_protobuf_string_field_is_refused_with_400(guarded: RunningDaemon) -> None:
    body = _valid_protobuf(2, name="NAME-TO-BREAK")
    broken = body.replace(b"NAME-TO-BREAK", b"NAME\xff\xfeTO\xc3BREK", 1)
    assert len(broken) == len(body) and broken != body
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", broken, PROTOBUF)

    assert response.status_code == 400
    assert "UTF-8" in _status_message(response)[1]
    _still_accepting(guarded, before)


def test_invalid_utf8_json_body_is_refused_with_400(guarded: RunningDaemon) -> None:
    _, _, document = simple_json_trace(1)
    body = json_bytes(document).replace(b'"root"', b'"r\xff\xfet"')
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", body, JSON)

    assert response.status_code == 400
    _still_accepting(guarded, before)


# --- what the request says about its body ----------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/grpc", None])
def test_wrong_content_type_is_refused_with_415_and_stores_nothing(guarded: RunningDaemon, content_type: str | None) -> None:
    before = span_count(guarded)
    headers = {"Content-Type": content_type} if content_type else {}

    response = httpx.post(f"{guarded.http_url}/v1/traces", content=_valid_protobuf(), headers=headers, timeout=10)

    assert response.status_code == 415
    assert "content type" in _status_message(response)[1]
    _still_accepting(guarded, before)


def test_content_type_parameters_and_case_are_accepted(guarded: RunningDaemon) -> None:
    _, _, document = simple_json_trace(2)
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", json_bytes(document), {"Content-Type": "Application/JSON; charset=utf-8"})

    assert response.status_code == 200
    assert span_count(guarded) == before + 2


@pytest.mark.parametrize("encoding", ["br", "deflate", "zstd", "gzip, br"])
def test_unsupported_content_encoding_is_refused_with_415_and_stores_nothing(guarded: RunningDaemon, encoding: str) -> None:
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", _valid_protobuf(), PROTOBUF, **{"Content-Encoding": encoding})

    assert response.status_code == 415
    assert "encoding" in _status_message(response)[1]
    _still_accepting(guarded, before)


# --- size limits ------------------------------------------------------------------------------------------


def _oversized_json() -> bytes:
    trace_id = new_trace_id()
    spans = [
        json_span(trace_id, new_span_id(), f"span {index}", attributes={"filler": "x" * 500}) for index in range(150)
    ]
    body = json_bytes(json_traces(spans))
    assert len(body) > MAX_BODY
    return body


def test_body_over_max_body_bytes_is_refused_with_413_and_stores_nothing(guarded: RunningDaemon) -> None:
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", _oversized_json(), JSON)

    assert response.status_code == 413
    assert str(MAX_BODY) in _status_message(response)[1]
    _still_accepting(guarded, before)


def test_streamed_body_without_length_over_the_limit_is_refused_with_413(guarded: RunningDaemon) -> None:
    body = _oversized_json()
    before = span_count(guarded)

    def chunks() -> Iterator[bytes]:
        for offset in range(0, len(body), 8192):
            yield body[offset : offset + 8192]

    response = httpx.post(f"{guarded.http_url}/v1/traces", content=chunks(), headers=JSON, timeout=10)

    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert response.status_code == 413
    _still_accepting(guarded, before)


def test_gzip_bomb_is_refused_with_413_and_stores_nothing(guarded: RunningDaemon) -> None:
    _, _, document = simple_json_trace(1)
    # Valid JSON whose whitespace inflates 10 MB from a few kilobytes.
    expanded = json_bytes(document)[:-1] + b" " * 10_000_000 + b"}"
    bomb = gzip.compress(expanded, compresslevel=9)
    assert len(bomb) < MAX_BODY // 2
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", bomb, JSON, **{"Content-Encoding": "gzip"})

    assert response.status_code == 413
    assert "decompressed" in _status_message(response)[1]
    _still_accepting(guarded, before)


def test_gzip_body_that_expands_to_just_under_the_limit_is_accepted(guarded: RunningDaemon) -> None:
    _, _, document = simple_json_trace(3)
    plain = json_bytes(document)
    padded = plain[:-1] + b" " * (MAX_BODY - len(plain) - 10) + b"}"
    assert MAX_BODY - 20 < len(padded) <= MAX_BODY
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", gzipped(padded), JSON, **{"Content-Encoding": "gzip"})

    assert response.status_code == 200, response.text
    assert span_count(guarded) == before + 3


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"this was never gzip", id="not-gzip"),
        pytest.param(gzipped(_valid_protobuf(3))[:-12], id="truncated-stream"),
        pytest.param(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 40, id="corrupt-deflate"),
    ],
)
def test_invalid_gzip_is_refused_with_400_and_stores_nothing(guarded: RunningDaemon, body: bytes) -> None:
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", body, PROTOBUF, **{"Content-Encoding": "gzip"})

    assert response.status_code == 400
    assert "gzip" in _status_message(response)[1]
    _still_accepting(guarded, before)


# --- spans that break the data model: rejected one by one ------------------------------------------------


def test_spans_with_ids_of_wrong_length_are_rejected_and_the_rest_of_the_batch_is_stored(guarded: RunningDaemon) -> None:
    recorder = AgentRecorder("mixed-batch")
    root = recorder.start("root")
    for index in range(6):
        recorder.one(f"child {index}", parent=root)
    recorder.end(root)
    spans = recorder.take()
    request = protobuf_request(spans)
    stored = request.resource_spans[0].scope_spans[0].spans
    stored[0].trace_id = b"\x01" * 15  # one byte short
    stored[1].span_id = b"\x02" * 4
    stored[2].parent_span_id = b"\x03" * 3
    stored[3].trace_id = b"\x00" * 16  # the invalid all-zero id
    bad = {stored[index].span_id.hex() for index in range(4)}
    good = {span.span_id.hex() for span in stored[4:]}
    trace_id = stored[4].trace_id.hex()
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", request.SerializeToString(), PROTOBUF)

    assert response.status_code == 200
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(response.content)
    assert parsed.partial_success.rejected_spans == 4
    message = parsed.partial_success.error_message
    assert "invalid trace_id (2)" in message and "invalid span_id (1)" in message and "invalid parent_span_id (1)" in message
    assert span_count(guarded) == before + len(good)
    with offline(guarded) as query:
        rows = query(f"SELECT span_id FROM spans WHERE trace_id = '{trace_id}' OR span_id IN ({', '.join(repr(s) for s in bad)})")
    assert {row[0] for row in rows} == good


def test_json_spans_with_short_or_non_hex_ids_are_counted_in_partial_success(guarded: RunningDaemon) -> None:
    trace_id = new_trace_id()
    spans = [
        json_span(trace_id, new_span_id(), "good 1"),
        json_span(trace_id[:-2], new_span_id(), "short trace id"),
        json_span(trace_id, "zz" * 8, "non-hex span id"),
        json_span(trace_id, new_span_id(), "good 2"),
        json_span(trace_id, "", "empty span id"),
    ]
    before = span_count(guarded)

    response = post(f"{guarded.http_url}/v1/traces", json_bytes(json_traces(spans)), JSON)

    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 3
    assert "invalid" in partial["errorMessage"]
    assert span_count(guarded) == before + 2


def test_log_records_with_ids_of_wrong_length_are_rejected_and_the_rest_stored(guarded: RunningDaemon) -> None:
    records = [
        json_log(event_name="ok", trace_id=new_trace_id(), span_id=new_span_id()),
        json_log(event_name="short trace", trace_id="ab" * 15, span_id=new_span_id()),
        json_log(event_name="short span", trace_id=new_trace_id(), span_id="ab" * 3),
        json_log(event_name="no trace at all"),
    ]
    before = log_count(guarded)

    response = post(f"{guarded.http_url}/v1/logs", json_bytes(json_logs(records)), JSON)

    assert response.status_code == 200
    assert int(response.json()["partialSuccess"]["rejectedLogRecords"]) == 2
    assert log_count(guarded) == before + 2


def test_attribute_value_or_count_over_the_limit_is_stored_truncated_and_flagged(guarded: RunningDaemon) -> None:
    recorder = AgentRecorder("long-values")
    root = recorder.start("root", {"prompt": "p" * (MAX_VALUE * 5), "short": "fine"})
    recorder.one("child", {"short": "fine", "limit": "l" * MAX_VALUE}, parent=root)
    recorder.end(root)
    spans = recorder.take()
    trace_id = format(spans[0].context.trace_id, "032x")
    many = {f"attribute.{index:03d}": index for index in range(300)}
    many_trace_id = new_trace_id()
    crowded = json_traces([json_span(many_trace_id, new_span_id(), "crowded", attributes=many)])

    assert export_http(guarded, spans) is SpanExportResult.SUCCESS
    assert post(f"{guarded.http_url}/v1/traces", json_bytes(crowded), JSON).status_code == 200
    with offline(guarded) as query:
        crowded_attributes, crowded_truncated = query(
            f"SELECT attributes, truncated FROM spans WHERE trace_id = '{many_trace_id}'"
        )[0]
        rows = dict(
            (name, (json.loads(attributes), truncated))
            for name, attributes, truncated in query(
                f"SELECT name, attributes, truncated FROM spans WHERE trace_id = '{trace_id}'"
            )
        )
    root_attributes, root_truncated = rows["root"]
    assert root_attributes["prompt"] == "p" * MAX_VALUE
    assert root_attributes["short"] == "fine"
    assert root_truncated is True
    child_attributes, child_truncated = rows["child"]
    assert child_attributes["limit"] == "l" * MAX_VALUE  # exactly at the limit: kept whole
    assert child_truncated is False
    # Attributes beyond max_attributes_per_span (256 by default) are dropped, and the span flagged.
    assert json.loads(crowded_attributes) == {key: value for key, value in list(many.items())[:256]}
    assert crowded_truncated is True


def test_absurd_names_keys_status_messages_and_links_are_cut_to_their_limits(guarded: RunningDaemon) -> None:
    # Defaults: names and keys up to 1,024 bytes, links up to 128; the status message has the value limit.
    trace_id = new_trace_id()
    span = json_span(
        trace_id, new_span_id(), "n" * 5_000, attributes={"k" * 5_000: "v", "short": "fine"},
        events=[{"name": "e" * 5_000}], status=(2, "s" * 5_000),
    )  # fmt: skip
    span["links"] = [{"traceId": new_trace_id(), "spanId": new_span_id()} for _ in range(300)]
    neighbour_id = new_trace_id()
    neighbour = json_span(neighbour_id, new_span_id(), "neighbour", attributes={"short": "fine"})

    response = post(f"{guarded.http_url}/v1/traces", json_bytes(json_traces([span, neighbour])), JSON)
    assert response.status_code == 200
    with offline(guarded) as query:
        name, attributes, events, status_message, links, truncated = query(
            f"SELECT name, attributes, events, status_message, links, truncated FROM spans WHERE trace_id = '{trace_id}'"
        )[0]
        (neighbour_truncated,) = query(f"SELECT truncated FROM spans WHERE trace_id = '{neighbour_id}'")[0]
    assert name == "n" * 1024
    assert json.loads(attributes) == {"k" * 1024: "v", "short": "fine"}
    assert json.loads(events)[0]["name"] == "e" * 1024
    assert status_message == "s" * MAX_VALUE
    assert len(json.loads(links)) == 128
    assert truncated is True and neighbour_truncated is False


def test_multibyte_attribute_value_is_truncated_to_the_byte_limit(guarded: RunningDaemon) -> None:
    # 800 characters, 1,600 bytes of UTF-8: over a limit counted in bytes.
    value = "é" * 800
    assert len(value) < MAX_VALUE < len(value.encode())
    recorder = AgentRecorder("long-multibyte-values")
    recorder.one("root", {"answer": value})
    spans = recorder.take()
    trace_id = format(spans[0].context.trace_id, "032x")

    assert export_http(guarded, spans) is SpanExportResult.SUCCESS
    with offline(guarded) as query:
        attributes, truncated = query(f"SELECT attributes, truncated FROM spans WHERE trace_id = '{trace_id}'")[0]
    stored = json.loads(attributes)["answer"]
    assert len(stored.encode()) <= MAX_VALUE
    assert value.startswith(stored)
    assert truncated is True


# --- gRPC refusals ---------------------------------------------------------------------------------------


def _raw_export(daemon: RunningDaemon, body: bytes, method: str = TRACE_METHOD, metadata: tuple = ()) -> grpc.RpcError | bytes:
    """Send raw bytes as an Export request; returns the response bytes or the RpcError."""
    with grpc.insecure_channel(daemon.grpc_endpoint) as channel:
        export = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            return export(body, timeout=10, metadata=metadata)
        except grpc.RpcError as error:
            return error


@pytest.mark.parametrize("method", [TRACE_METHOD, LOGS_METHOD])
def test_grpc_malformed_bytes_are_refused_with_invalid_argument(guarded: RunningDaemon, method: str) -> None:
    spans_before, logs_before = span_count(guarded), log_count(guarded)

    outcome = _raw_export(guarded, b"\x0a\x05abc", method)

    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed protobuf" in outcome.details()
    assert (span_count(guarded), log_count(guarded)) == (spans_before, logs_before)
    _still_accepting(guarded, spans_before)


def test_grpc_invalid_utf8_is_refused_with_invalid_argument(guarded: RunningDaemon) -> None:
    body = _valid_protobuf(2, name="NAME-TO-BREAK").replace(b"NAME-TO-BREAK", b"NAME\xff\xfeTO\xc3BREK", 1)
    before = span_count(guarded)

    outcome = _raw_export(guarded, body)

    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() is grpc.StatusCode.INVALID_ARGUMENT
    _still_accepting(guarded, before)


def test_grpc_message_over_max_body_bytes_is_refused_with_resource_exhausted(guarded: RunningDaemon) -> None:
    recorder = AgentRecorder("big-grpc")
    root = recorder.start("root")
    for index in range(100):
        recorder.one(f"child {index}", {"filler": "x" * 900}, parent=root)
    recorder.end(root)
    body = protobuf_request(recorder.take()).SerializeToString()
    assert len(body) > MAX_BODY
    before = span_count(guarded)

    outcome = _raw_export(guarded, body)

    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_accepting(guarded, before)


def test_grpc_raw_valid_request_is_answered_with_an_export_response(guarded: RunningDaemon) -> None:
    before = span_count(guarded)

    outcome = _raw_export(guarded, _valid_protobuf(3))

    assert isinstance(outcome, bytes)
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(outcome)
    assert not parsed.HasField("partial_success")
    assert span_count(guarded) == before + 3


# --- bearer token ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.10.4", "tracefix.internal"])
def test_a_collector_beyond_loopback_without_a_token_is_refused_unless_the_config_accepts_anyone(host: str) -> None:
    from tracefix.daemon.core.settings import CollectorSettings

    with pytest.raises(ValueError, match=rf"binds to {host}, beyond loopback, without a token.*accept_anyone = true"):
        CollectorSettings(host=host)
    assert CollectorSettings(host=host, token="s3cret").open_to_anyone is False
    assert CollectorSettings(host=host, accept_anyone=True).open_to_anyone is True
    for local in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert CollectorSettings(host=local).open_to_anyone is False


def test_the_daemon_bound_beyond_loopback_without_a_token_does_not_start_and_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    config = tmp_path / "tracefix.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "tracefix.duckdb"}"\n')
    completed = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "daemon", "--config", str(config)],
        env={**os.environ, "TRACEFIX_COLLECTOR_HOST": "0.0.0.0"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode != 0
    assert "collector binds to 0.0.0.0, beyond loopback, without a token" in completed.stderr
    assert not (tmp_path / "tracefix.duckdb").exists()  # refused before anything was opened, let alone bound


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Bearer s3cret-and-more", "Basic s3cret", "s3cret", "Bearer"],
)
def test_http_without_or_with_a_wrong_bearer_token_is_refused_with_401(locked: RunningDaemon, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    _, _, document = simple_json_trace(2)
    spans_before, logs_before = span_count(locked), log_count(locked)

    traces = post(f"{locked.http_url}/v1/traces", json_bytes(document), JSON, **headers)
    logs = post(f"{locked.http_url}/v1/logs", json_bytes(json_logs([json_log(event_name="x")])), JSON, **headers)

    assert traces.status_code == 401
    assert logs.status_code == 401
    code, message = _status_message(traces)
    assert code == 16  # UNAUTHENTICATED
    assert "token" in message
    assert (span_count(locked), log_count(locked)) == (spans_before, logs_before)
    _still_accepting(locked, spans_before, Authorization=f"Bearer {TOKEN}")


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)])
def test_grpc_without_or_with_a_wrong_bearer_token_is_unauthenticated(locked: RunningDaemon, metadata: tuple) -> None:
    before = span_count(locked)

    outcome = _raw_export(locked, _valid_protobuf(2), metadata=metadata)

    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() is grpc.StatusCode.UNAUTHENTICATED
    assert span_count(locked) == before


def test_sdk_exporters_without_the_token_fail_and_store_nothing(locked: RunningDaemon) -> None:
    recorder = AgentRecorder("tokenless-agent")
    recorder.one("root")
    spans = recorder.take()
    before = span_count(locked)

    assert export_http(locked, spans) is SpanExportResult.FAILURE
    assert export_grpc(locked, spans) is SpanExportResult.FAILURE
    assert span_count(locked) == before


def test_right_bearer_token_is_accepted_over_http_and_grpc_for_traces_and_logs(locked: RunningDaemon) -> None:
    recorder = AgentRecorder("token-agent")
    recorder.one("over http")
    over_http = recorder.take()
    recorder.one("over grpc")
    over_grpc = recorder.take()
    records = record_logs("token-agent", [{"event_name": "token.check", "body": "hello"}])
    spans_before, logs_before = span_count(locked), log_count(locked)

    assert export_http(locked, over_http, headers={"Authorization": f"Bearer {TOKEN}"}) is SpanExportResult.SUCCESS
    assert export_grpc(locked, over_grpc, headers=(("authorization", f"Bearer {TOKEN}"),)) is SpanExportResult.SUCCESS
    assert export_logs_http(locked, records, headers={"Authorization": f"Bearer {TOKEN}"}).name == "SUCCESS"
    assert export_logs_grpc(locked, records, headers=(("authorization", f"Bearer {TOKEN}"),)).name == "SUCCESS"

    assert span_count(locked) == spans_before + 2
    assert log_count(locked) == logs_before + 1  # the same record twice is stored once
    assert hex_span_id(over_http[0]) != hex_span_id(over_grpc[0])
