"""OTLP/HTTP ingest end to end: the real SDK exporters and hand-made OTLP/JSON against a running daemon,
and the conversation each attribute dialect describes, assembled in the database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import RunningDaemon, make_daemon
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otlp_builders import (
    CANCEL_ARGUMENTS,
    CANCEL_ERROR,
    FINAL_ANSWER,
    GET_ARGUMENTS,
    JSON,
    ORDER_RECORD,
    PROTOBUF,
    SYSTEM_PROMPT,
    TOOLS,
    USER_REQUEST,
    AgentRecorder,
    Call,
    Compression,
    Conversation,
    Msg,
    SpanExportResult,
    SpanKind,
    export_http,
    export_logs_http,
    gzipped,
    hex_trace_id,
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
    record_conversation,
    record_logs,
    simple_json_trace,
    span_count,
)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("http")).start()
    yield running
    running.stop()


# --- transports -----------------------------------------------------------------------------------


def test_sdk_protobuf_export_stores_every_span_with_ids_parents_status_and_typed_attributes(
    collector: RunningDaemon,
) -> None:
    recorder = AgentRecorder("checkout-agent", deployment="staging")
    root = recorder.start("POST /checkout", {"http.request.method": "POST"}, kind=SpanKind.SERVER)
    child = recorder.start(
        "charge card",
        {"amount": 1250, "ratio": 0.25, "retried": True, "tags": ["vip", "eu"], "counts": [1, 2, 3]},
        parent=root,
        kind=SpanKind.CLIENT,
    )
    child.add_event("card.declined", {"code": 51}, timestamp=recorder.tick())
    recorder.end(child, error="card declined")
    recorder.end(root)
    spans = recorder.take()
    before = span_count(collector)

    assert export_http(collector, spans) is SpanExportResult.SUCCESS
    assert span_count(collector) == before + 2

    trace_id = hex_trace_id(spans[0])
    with offline(collector) as query:
        rows = query(
            "SELECT span_id, parent_span_id, name, kind, status_code, status_message, service_name, scope_name, "
            "scope_version, resource_attributes, attributes, events, truncated, start_time_unix_nano "
            f"FROM spans WHERE trace_id = '{trace_id}' ORDER BY start_time_unix_nano"
        )
    assert len(rows) == 2
    (root_id, root_parent, root_name, root_kind, root_status, _, service, scope, version, resource, _, _, _, start) = rows[0]
    assert (root_id, root_parent, root_name, root_kind, root_status) == (
        format(root.get_span_context().span_id, "016x"), None, "POST /checkout", 2, 0
    )
    assert (service, scope, version) == ("checkout-agent", "agent-under-test", "1.2.3")
    assert json.loads(resource)["deployment"] == "staging"
    assert start == spans[1].start_time  # the root ended last, so the SDK lists it second
    child_row = rows[1]
    assert child_row[0] == format(child.get_span_context().span_id, "016x")
    assert child_row[1] == root_id
    assert child_row[3:6] == (3, 2, "card declined")
    attributes = json.loads(child_row[10])
    assert attributes == {"amount": 1250, "ratio": 0.25, "retried": True, "tags": ["vip", "eu"], "counts": [1, 2, 3]}
    events = json.loads(child_row[11])
    assert [event["name"] for event in events] == ["card.declined", "exception"]
    assert events[0]["attributes"] == {"code": 51}
    assert events[1]["attributes"]["exception.message"] == "card declined"
    assert child_row[12] is False


def test_otlp_json_request_with_hex_ids_and_string_integers_is_stored_as_sent(collector: RunningDaemon) -> None:
    trace_id, root_id, child_id = new_trace_id(), new_span_id(), new_span_id()
    start = 1_700_000_000_123_456_789
    document = json_traces(
        [
            json_span(trace_id, root_id, "agent turn", start=start, duration_ns=9_000_000, kind=2),
            json_span(
                trace_id,
                child_id,
                "lookup",
                parent_span_id=root_id,
                start=start + 1_000,
                attributes={
                    "big": 9_007_199_254_740_993,  # above 2**53: only exact as a string
                    "flag": False,
                    "score": 0.5,
                    "ids": ["a", "b"],
                    "nested": {"depth": 1, "labels": ["x"]},
                },
                events=[{"name": "cache.miss", "time": start + 2_000, "attributes": {"key": "user:7"}}],
                status=(2, "lookup failed"),
            ),
        ],
        service_name="json-agent",
    )
    before = span_count(collector)

    response = post(f"{collector.http_url}/v1/traces", json_bytes(document), JSON)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {}  # a full success carries no partialSuccess
    assert span_count(collector) == before + 2
    with offline(collector) as query:
        rows = query(
            "SELECT span_id, parent_span_id, kind, start_time_unix_nano, end_time_unix_nano, status_code, "
            f"status_message, attributes, events, service_name FROM spans WHERE trace_id = '{trace_id}' "
            "ORDER BY start_time_unix_nano"
        )
    assert [row[0] for row in rows] == [root_id, child_id]
    assert rows[0][1] is None and rows[1][1] == root_id
    assert rows[0][2:5] == (2, start, start + 9_000_000)
    assert rows[1][5:7] == (2, "lookup failed")
    assert json.loads(rows[1][7]) == {
        "big": 9_007_199_254_740_993,
        "flag": False,
        "score": 0.5,
        "ids": ["a", "b"],
        "nested": {"depth": 1, "labels": ["x"]},
    }
    assert json.loads(rows[1][8]) == [{"name": "cache.miss", "time_unix_nano": start + 2_000, "attributes": {"key": "user:7"}}]
    assert rows[0][9] == "json-agent"


def test_protobuf_response_is_an_export_trace_service_response(collector: RunningDaemon) -> None:
    recorder = AgentRecorder("proto-agent")
    recorder.one("single")
    body = protobuf_request(recorder.take()).SerializeToString()

    response = post(f"{collector.http_url}/v1/traces", body, PROTOBUF)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-protobuf")
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(response.content)
    assert not parsed.HasField("partial_success")


def test_sdk_gzip_protobuf_export_is_accepted_and_every_span_stored(collector: RunningDaemon) -> None:
    recorder = AgentRecorder("gzip-agent")
    root = recorder.start("root")
    for index in range(40):
        recorder.one(f"step {index}", {"payload": "lorem ipsum " * 20}, parent=root)
    recorder.end(root)
    spans = recorder.take()
    before = span_count(collector)

    assert export_http(collector, spans, compression=Compression.Gzip) is SpanExportResult.SUCCESS
    assert span_count(collector) == before + 41


def test_gzip_compressed_json_body_is_accepted_and_stored(collector: RunningDaemon) -> None:
    _, _, document = simple_json_trace(5)
    before = span_count(collector)

    response = post(f"{collector.http_url}/v1/traces", gzipped(json_bytes(document)), JSON, **{"Content-Encoding": "gzip"})

    assert response.status_code == 200, response.text
    assert span_count(collector) == before + 5


def test_sdk_http_log_exporter_stores_log_records_with_their_trace_context(collector: RunningDaemon) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    records = record_logs(
        "log-agent",
        [
            {
                "event_name": "agent.step",
                "attributes": {"step": 1, "tool": "get_order"},
                "trace_id": trace_id,
                "span_id": span_id,
                "body": "looked the order up",
            },
            {"attributes": {"event.name": "agent.note"}, "body": {"text": "no trace here"}},
        ],
    )
    before = log_count(collector)

    result = export_logs_http(collector, records)

    assert result.name == "SUCCESS"
    assert log_count(collector) == before + 2
    with offline(collector) as query:
        rows = query(
            "SELECT event_name, trace_id, span_id, severity_text, body, attributes, service_name FROM logs "
            "WHERE service_name = 'log-agent' ORDER BY event_name"
        )
    assert len(rows) == 2
    note, step = rows
    assert step[:4] == ("agent.step", trace_id, span_id, "INFO")
    assert json.loads(step[4]) == "looked the order up"
    assert json.loads(step[5]) == {"step": 1, "tool": "get_order"}
    # The older way to name an event, an `event.name` attribute, names it too.
    assert note[0] == "agent.note"
    assert note[1] is None and note[2] is None
    assert json.loads(note[4]) == {"text": "no trace here"}


def test_otlp_json_logs_request_is_stored(collector: RunningDaemon) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    document = json_logs(
        [
            json_log(event_name="agent.done", attributes={"turns": 3}, trace_id=trace_id, span_id=span_id, body="ok"),
            json_log(attributes={"event.name": "agent.started"}, body="hello"),
        ],
        service_name="json-log-agent",
    )
    before = log_count(collector)

    response = post(f"{collector.http_url}/v1/logs", json_bytes(document), JSON)

    assert response.status_code == 200
    assert response.json() == {}
    assert log_count(collector) == before + 2


def test_gzip_compressed_json_logs_are_accepted(collector: RunningDaemon) -> None:
    document = json_logs([json_log(event_name="agent.gzip", body=f"line {index}") for index in range(4)])
    before = log_count(collector)

    response = post(f"{collector.http_url}/v1/logs", gzipped(json_bytes(document)), JSON, **{"Content-Encoding": "gzip"})

    assert response.status_code == 200, response.text
    assert log_count(collector) == before + 4


# --- dialects, assembled into trajectories --------------------------------------------------------------

DIALECTS = ("genai", "genai_indexed", "openinference", "openllmetry")

FIRST_TURN = Conversation(
    messages=[
        Msg("user", "Where is my order A-1001?"),
        Msg("assistant", calls=(Call("call_a", "get_order", GET_ARGUMENTS),)),
        Msg("tool", ORDER_RECORD, tool_call_id="call_a"),
        Msg("assistant", "Order A-1001 has shipped."),
    ]
)
SECOND_TURN = Conversation(
    messages=[
        *FIRST_TURN.messages,
        Msg("user", "Then cancel it, please."),
        Msg("assistant", calls=(Call("call_b", "cancel_order", CANCEL_ARGUMENTS),)),
        Msg("tool", CANCEL_ERROR, tool_call_id="call_b"),
        Msg("assistant", FINAL_ANSWER),
    ],
    failures={"call_b": CANCEL_ERROR},
)


class Assembled:
    """A stopped daemon whose database holds the dialect conversations, and their trace ids."""

    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.trace_ids: dict[str, str] = {}
        self.exports: dict[str, SpanExportResult] = {}
        self.status: dict[str, Any] = {}

    def rows(self, sql: str) -> list[tuple]:
        return self.daemon.query(sql)


@pytest.fixture(scope="module")
def assembled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Assembled]:
    daemon = make_daemon(tmp_path_factory.mktemp("dialects")).start()
    result = Assembled(daemon)
    try:
        for dialect in DIALECTS:
            recorder = AgentRecorder(f"shop-{dialect}")
            record_conversation(recorder, dialect)
            spans = recorder.take()
            result.trace_ids[dialect] = hex_trace_id(spans[0])
            result.exports[dialect] = export_http(daemon, spans)
        # One conversation over two traces (two user turns), in two requests, second turn first.
        recorder = AgentRecorder("shop-conversation")
        record_conversation(recorder, "genai", FIRST_TURN, conversation_id="conv-7f3a")
        first = recorder.take()
        record_conversation(recorder, "genai", SECOND_TURN, conversation_id="conv-7f3a", start_at=4)
        second = recorder.take()
        result.trace_ids["turn 1"], result.trace_ids["turn 2"] = hex_trace_id(first[0]), hex_trace_id(second[0])
        result.exports["turn 2"] = export_http(daemon, second)
        result.exports["turn 1"] = export_http(daemon, first)
        # A conversation id that arrives late: the root span (without it) is stored and assembled on
        # its own before the model calls that carry it.
        record_conversation(recorder, "genai", FIRST_TURN, conversation_id="conv-late", session_on_root=False)
        late = recorder.take()
        late_root = [span for span in late if span.parent is None]
        result.trace_ids["late root"] = hex_trace_id(late_root[0])
        result.exports["late root"] = export_http(daemon, late_root)
        daemon.wait_assembled()
        result.exports["late children"] = export_http(daemon, [span for span in late if span.parent is not None])
        record_conversation(recorder, "genai", SECOND_TURN, conversation_id="conv-late", start_at=4)
        late_second = recorder.take()
        result.trace_ids["late turn 2"] = hex_trace_id(late_second[0])
        result.exports["late turn 2"] = export_http(daemon, late_second)
        result.status = daemon.wait_assembled()
    finally:
        daemon.stop()
    yield result


def _messages(assembled: Assembled, trajectory_id: str) -> list[tuple]:
    return assembled.rows(
        "SELECT position, role, content, tool_calls, tool_call_id FROM messages "
        f"WHERE trajectory_id = '{trajectory_id}' ORDER BY position"
    )


def _tool_calls(assembled: Assembled, trajectory_id: str) -> list[dict[str, Any]]:
    names = ("position", "tool_name", "call_id", "arguments", "result", "error", "source", "message_position")
    rows = assembled.rows(
        f"SELECT {', '.join(names)} FROM tool_calls WHERE trajectory_id = '{trajectory_id}' ORDER BY position"
    )
    return [dict(zip(names, row)) for row in rows]


def _expected_transcript(call_ids: tuple[str, str] = ("call_1", "call_2")) -> list[tuple]:
    first, second = call_ids
    return [
        ("system", SYSTEM_PROMPT, [], None),
        ("user", USER_REQUEST, [], None),
        ("assistant", "", [(first, "get_order", GET_ARGUMENTS)], None),
        ("tool", ORDER_RECORD, [], first),
        ("assistant", "", [(second, "cancel_order", CANCEL_ARGUMENTS)], None),
        ("tool", CANCEL_ERROR, [], second),
        ("assistant", FINAL_ANSWER, [], None),
    ]


def _normalised(rows: list[tuple]) -> list[tuple]:
    """Messages with tool-call arguments parsed, so formatting differences do not matter."""
    normalised = []
    for position, (index, role, content, calls, tool_call_id) in enumerate(rows):
        assert index == position
        parsed = [(call["id"], call["name"], json.loads(call["arguments"])) for call in json.loads(calls)]
        normalised.append((role, content, parsed, tool_call_id))
    return normalised


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_is_exported_and_assembled_into_one_trajectory(assembled: Assembled, dialect: str) -> None:
    assert assembled.exports[dialect] is SpanExportResult.SUCCESS
    trace_id = assembled.trace_ids[dialect]
    rows = assembled.rows(
        "SELECT trace_ids, n_llm_calls, n_tool_calls, n_tool_errors, dialects, tool_names, service_name "
        f"FROM trajectories WHERE trajectory_id = '{trace_id}'"
    )
    assert len(rows) == 1
    trace_ids, n_llm, n_tools, n_errors, dialects, tool_names, service = rows[0]
    assert trace_ids == [trace_id]
    assert n_llm == 3
    assert n_tools == 2
    # Only tool spans say that a run failed; an agent that traces model calls alone shows none.
    assert n_errors == (0 if dialect == "genai_indexed" else 1)
    assert dialect in dialects
    assert tool_names == ["cancel_order", "get_order"]
    assert service == f"shop-{dialect}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_assembles_the_full_transcript_with_system_prompt_tool_calls_and_results(
    assembled: Assembled, dialect: str
) -> None:
    messages = _normalised(_messages(assembled, assembled.trace_ids[dialect]))
    assert messages == _expected_transcript()


def test_genai_structured_tool_spans_give_arguments_results_and_the_failing_calls_error(assembled: Assembled) -> None:
    calls = _tool_calls(assembled, assembled.trace_ids["genai"])
    assert [(c["tool_name"], c["call_id"], c["source"], c["message_position"]) for c in calls] == [
        ("get_order", "call_1", "tool_span", 2),
        ("cancel_order", "call_2", "tool_span", 4),
    ]
    assert json.loads(calls[0]["arguments"]) == GET_ARGUMENTS
    assert calls[0]["result"] == ORDER_RECORD and calls[0]["error"] is None
    assert json.loads(calls[1]["arguments"]) == CANCEL_ARGUMENTS
    assert calls[1]["error"] == CANCEL_ERROR


def test_genai_indexed_tool_calls_come_from_messages_with_results_from_tool_messages(assembled: Assembled) -> None:
    calls = _tool_calls(assembled, assembled.trace_ids["genai_indexed"])
    assert [(c["tool_name"], c["call_id"], c["source"], c["message_position"]) for c in calls] == [
        ("get_order", "call_1", "message", 2),
        ("cancel_order", "call_2", "message", 4),
    ]
    assert json.loads(calls[0]["arguments"]) == GET_ARGUMENTS
    assert calls[0]["result"] == ORDER_RECORD
    assert json.loads(calls[1]["arguments"]) == CANCEL_ARGUMENTS
    assert calls[1]["result"] == CANCEL_ERROR


def test_openinference_tool_spans_match_requested_calls_by_name_and_arguments(assembled: Assembled) -> None:
    # TOOL spans carry no call id and format their input differently; they still pair with the request.
    calls = _tool_calls(assembled, assembled.trace_ids["openinference"])
    assert [(c["tool_name"], c["source"], c["message_position"]) for c in calls] == [
        ("get_order", "tool_span", 2),
        ("cancel_order", "tool_span", 4),
    ]
    assert json.loads(calls[0]["arguments"]) == GET_ARGUMENTS
    assert calls[0]["result"] == ORDER_RECORD and calls[0]["error"] is None
    assert json.loads(calls[1]["arguments"]) == CANCEL_ARGUMENTS
    assert calls[1]["error"] == CANCEL_ERROR


def test_openllmetry_tool_spans_give_keyword_arguments_results_and_the_failing_calls_error(assembled: Assembled) -> None:
    calls = _tool_calls(assembled, assembled.trace_ids["openllmetry"])
    assert [(c["tool_name"], c["source"], c["message_position"]) for c in calls] == [
        ("get_order", "tool_span", 2),
        ("cancel_order", "tool_span", 4),
    ]
    assert json.loads(calls[0]["arguments"]) == GET_ARGUMENTS  # the kwargs of {"args": [], "kwargs": {...}}
    assert calls[0]["result"] == ORDER_RECORD and calls[0]["error"] is None
    assert json.loads(calls[1]["arguments"]) == CANCEL_ARGUMENTS
    assert calls[1]["error"] == CANCEL_ERROR
    dialects = assembled.rows(
        f"SELECT dialects FROM trajectories WHERE trajectory_id = '{assembled.trace_ids['openllmetry']}'"
    )[0][0]
    assert dialects == ["genai_indexed", "openllmetry"]  # its LLM spans use the indexed GenAI attributes


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_records_the_offered_tools_with_their_json_schemas(assembled: Assembled, dialect: str) -> None:
    expected = sorted((tool["name"], tool["description"], tool["parameters"]) for tool in TOOLS)
    per_trajectory = assembled.rows(
        "SELECT tool_name, description, parameters FROM trajectory_tools "
        f"WHERE trajectory_id = '{assembled.trace_ids[dialect]}' ORDER BY tool_name"
    )
    assert [(name, description, json.loads(parameters)) for name, description, parameters in per_trajectory] == expected
    per_service = assembled.rows(
        "SELECT tool_name, description, parameters FROM tool_definitions "
        f"WHERE service_name = 'shop-{dialect}' ORDER BY tool_name"
    )
    assert [(name, description, json.loads(parameters)) for name, description, parameters in per_service] == expected


def test_two_traces_sharing_a_conversation_id_become_one_trajectory(assembled: Assembled) -> None:
    assert assembled.exports["turn 1"] is SpanExportResult.SUCCESS
    assert assembled.exports["turn 2"] is SpanExportResult.SUCCESS
    first, second = assembled.trace_ids["turn 1"], assembled.trace_ids["turn 2"]
    rows = assembled.rows(
        "SELECT trajectory_id, conversation_id, trace_ids, n_llm_calls, n_tool_calls, n_tool_errors FROM trajectories "
        f"WHERE list_contains(trace_ids, '{first}') OR list_contains(trace_ids, '{second}') "
        f"OR trajectory_id IN ('{first}', '{second}')"
    )
    assert len(rows) == 1
    trajectory_id, conversation, trace_ids, n_llm, n_tools, n_errors = rows[0]
    assert conversation == "conv-7f3a"
    assert sorted(trace_ids) == sorted([first, second])
    assert (n_llm, n_tools, n_errors) == (2 + 2, 2, 1)
    mapped = assembled.rows(
        f"SELECT DISTINCT trajectory_id FROM trace_trajectories WHERE trace_id IN ('{first}', '{second}')"
    )
    assert mapped == [(trajectory_id,)]
    # The second turn resends the first; the transcript holds each message once, in order.
    messages = _normalised(_messages(assembled, trajectory_id))
    assert [(role, content) for role, content, _, _ in messages] == [
        ("system", SYSTEM_PROMPT),
        ("user", "Where is my order A-1001?"),
        ("assistant", ""),
        ("tool", ORDER_RECORD),
        ("assistant", "Order A-1001 has shipped."),
        ("user", "Then cancel it, please."),
        ("assistant", ""),
        ("tool", CANCEL_ERROR),
        ("assistant", FINAL_ANSWER),
    ]
    calls = _tool_calls(assembled, trajectory_id)
    assert [(c["tool_name"], c["call_id"], c["error"]) for c in calls] == [
        ("get_order", "call_a", None),
        ("cancel_order", "call_b", CANCEL_ERROR),
    ]


def test_a_trace_whose_conversation_id_arrives_late_moves_into_the_conversation(assembled: Assembled) -> None:
    assert all(assembled.exports[name] is SpanExportResult.SUCCESS for name in ("late root", "late children", "late turn 2"))
    first, second = assembled.trace_ids["late root"], assembled.trace_ids["late turn 2"]
    rows = assembled.rows(
        "SELECT trajectory_id, trace_ids, n_spans FROM trajectories "
        f"WHERE list_contains(trace_ids, '{first}') OR list_contains(trace_ids, '{second}') "
        f"OR trajectory_id IN ('{first}', '{second}')"
    )
    assert [(trajectory_id, sorted(trace_ids)) for trajectory_id, trace_ids, _ in rows] == [("conv-late", sorted([first, second]))]
    # No leftovers of the trajectory the root span formed on its own.
    for table in ("messages", "tool_calls", "trajectory_tools", "outcomes"):
        assert assembled.rows(f"SELECT count(*) FROM {table} WHERE trajectory_id = '{first}'") == [(0,)], table
    assert len(_messages(assembled, "conv-late")) == 9


def test_status_counts_the_assembled_dialect_trajectories(assembled: Assembled) -> None:
    counts = assembled.status["counts"]
    assert counts["trajectories"] == len(DIALECTS) + 2
    assert counts["messages"] == 7 * len(DIALECTS) + 9 + 9
    assert counts["tool_calls"] == 2 * len(DIALECTS) + 2 + 2
    assert counts["tool_definitions"] == 2 * (len(DIALECTS) + 1)
    assert assembled.status["outcomes"]["unknown"] == len(DIALECTS) + 2
