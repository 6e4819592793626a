"""Benchmark of the OTLP ingest path: a real daemon, driven by the official OpenTelemetry exporters.

Each (transport, repeat) starts a fresh `tracefix daemon` on its own temporary DuckDB file and free
loopback ports, with the default durability (a request is acknowledged only after its group commit).
`--clients` separate processes (multiprocessing, spawn) export batches of GenAI agent spans as fast
as the acknowledgements come back:

- http-protobuf: opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter
- grpc:          opentelemetry.exporter.otlp.proto.grpc.trace_exporter.OTLPSpanExporter
- http-json:     the Python SDK has no OTLP/JSON exporter; this file encodes the same spans to
                 OTLP/JSON (hex ids, camelCase) and POSTs them on a keep-alive requests session.

The spans are recorded once per client with an SDK TracerProvider, in the GenAI conventions as
examples/otlp.py writes every synthetic agent run; every request clones them with fresh trace/span
ids (a new SpanContext per span), so the clients spend their CPU on encoding and transport, not on
creating spans. Results: one JSON line on stdout; progress goes to stderr.

Diagnostics: `--client-encoding reuse` swaps the SDK exporters for a client that encodes each template
batch once and only rewrites ids (the receiver measured nearly alone); `--profile-server` runs the
daemon under cProfile in every thread and prints the hotspots of the measured window on stderr.

    python bench/ingest.py --seconds 15 --repeats 3
    python bench/ingest.py --transports http-protobuf --clients 3
    python bench/ingest.py --transports http-protobuf --client-encoding reuse
    python bench/ingest.py --transports http-protobuf --seconds 10 --profile-server
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.trace import Status, StatusCode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from examples.otlp import Agent, AgentRun, Recorder, evaluation_attributes, exporter, key_values  # noqa: E402

TRANSPORTS = ("http-protobuf", "http-json", "grpc")
TARGET_SPANS_PER_S = 20000  # DESIGN.md section 8, OTLP/HTTP protobuf, durable acknowledgement
TARGET_GRPC_RATIO = 0.8  # gRPC within 20 % of HTTP protobuf
PLACEHOLDER = "{{trajectory}}"  # replaced per clone, so every trajectory's content is unique
TEMPLATE_BATCHES = 4  # distinct recorded batches per client, cycled
EXPORT_TIMEOUT_S = 30.0


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- realistic GenAI spans ---------------------------------------------------------------------

_WORDS = (
    "repository function test failing import module config parse value return error stack trace "
    "file line branch commit patch diff review request response token model agent tool call result "
    "query database index schema migration column table row cache timeout retry queue worker thread "
    "handler route endpoint payload header status client server deploy build install package version "
    "lint format type check assert fixture mock input output buffer stream socket path directory"
).split()

_SYSTEM_PROMPT = (
    "You are a careful software engineering agent working inside a sandboxed repository. "
    "Use the tools to inspect files, run commands and edit code. Think about the failing behaviour "
    "before you change anything, keep edits minimal, run the tests after every change, and explain "
    "the root cause in your final answer. Never invent file contents: read them first. When a "
    "command fails, read its output and adapt instead of repeating it. If the task is ambiguous, "
    "state the assumption you make. Answer in English, in short paragraphs, with code in fenced "
    "blocks. You may call several tools in sequence; stop when the tests pass or when you are sure "
    "the task cannot be completed, and say which."
)

_TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a text file of the repository and return its content with line numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the repository root."},
                "start_line": {"type": "integer", "description": "First line to return (1-based)."},
                "end_line": {"type": "integer", "description": "Last line to return, inclusive."},
            },
            "required": ["path"],
        },
    },
    {
        "type": "function",
        "name": "run_command",
        "description": "Run a shell command in the repository and return exit status, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line, run with bash -lc."},
                "timeout_s": {"type": "number", "description": "Seconds before the command is killed."},
            },
            "required": ["command"],
        },
    },
    {
        "type": "function",
        "name": "edit_file",
        "description": "Replace an exact snippet of a file with new text; fails if the snippet is not unique.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string", "description": "Exact text to replace."},
                "new": {"type": "string", "description": "Replacement text."},
            },
            "required": ["path", "old", "new"],
        },
    },
    {
        "type": "function",
        "name": "search_code",
        "description": "Search the repository for a regular expression and return matching lines.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"}},
            "required": ["pattern"],
        },
    },
]


_AGENT = Agent(
    "coding-agent", "gpt-4.1-mini", _SYSTEM_PROMPT, _TOOLS, id="agent-7f3a", response_model="gpt-4.1-mini-2025-04-14",
    temperature=0.2, max_tokens=4096, server=("api.openai.com", 443),
)  # fmt: skip
_MS = 1_000_000  # nanoseconds


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _tool_arguments(rng: random.Random, tool: str) -> dict[str, Any]:
    if tool == "read_file":
        return {"path": f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py", "start_line": 1, "end_line": 120}
    if tool == "run_command":
        return {"command": f"python -m pytest -q tests/test_{rng.choice(_WORDS)}.py -x", "timeout_s": 120}
    if tool == "edit_file":
        return {
            "path": f"src/{rng.choice(_WORDS)}.py",
            "old": f"    return {rng.choice(_WORDS)}_{rng.choice(_WORDS)}(value)\n",
            "new": f"    if value is None:\n        return None\n    return {rng.choice(_WORDS)}(value)\n",
        }
    return {"pattern": f"def {rng.choice(_WORDS)}_", "glob": "**/*.py"}


def _record_trajectories(seed: int, spans_wanted: int) -> list[Any]:
    """Record whole agent trajectories with the SDK until there are `spans_wanted` spans, roots first."""
    rng = random.Random(seed)
    recorder = Recorder(
        {"service.name": "bench-coding-agent", "service.version": "1.4.2", "deployment.environment.name": "bench"},
        "tracefix.bench.agent",
        "0.1.0",
    )
    spans: list[Any] = []
    clock = 1_700_000_000_000_000_000
    while len(spans) < spans_wanted:
        clock = _record_trajectory(recorder.tracer, rng, clock)
        spans.extend(sorted(recorder.take(), key=lambda span: span.start_time))
    recorder.provider.shutdown()
    return spans[:spans_wanted]


def _record_trajectory(tracer: Any, rng: random.Random, start: int) -> int:
    """One coding-agent run from `start`: model calls with a tool run between consecutive ones, then
    the test verdict as an evaluation event on the root. Returns when the next run may start."""
    turns = rng.randint(3, 8)
    task = f"Task {PLACEHOLDER}: the test for {_text(rng, 4)} fails with {_text(rng, 6)}. {_text(rng, 30)}"
    run = AgentRun(tracer, _AGENT, PLACEHOLDER, start)
    messages: list[dict[str, Any]] = [{"role": "user", "parts": [{"type": "text", "content": task}]}]
    now = start + 2 * _MS
    input_tokens = 900
    for turn in range(1, turns + 1):
        last = turn == turns
        tool = rng.choice(_TOOLS)["name"]
        call_id = f"call_{PLACEHOLDER}_{turn}"
        if last:
            parts = [{"type": "text", "content": f"Fixed: {_text(rng, 60)}"}]
        else:
            parts = [
                {"type": "text", "content": _text(rng, 25)},
                {"type": "tool_call", "id": call_id, "name": tool, "arguments": _tool_arguments(rng, tool)},
            ]
        output = {"role": "assistant", "parts": parts, "finish_reason": "stop" if last else "tool_call"}
        duration = rng.randint(400, 3000) * _MS
        output_tokens = rng.randint(40, 400)
        run.chat(
            messages, output, now, now + duration, response_id=f"chatcmpl-{PLACEHOLDER}-{turn}",
            usage=(input_tokens, output_tokens),
        )  # fmt: skip
        now += duration
        messages.append(output)
        input_tokens += output_tokens
        if last:
            break
        result = f"exit 0\n{_text(rng, rng.randint(40, 160))}"
        tool_duration = rng.randint(5, 900) * _MS
        arguments = parts[1]["arguments"]
        run.tool(tool, call_id, arguments, now + _MS, now + tool_duration + 2 * _MS, result=result)
        now += tool_duration + 2 * _MS
        messages.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]})
        input_tokens += len(result) // 4
    passed = rng.random() < 0.6
    verdict = evaluation_attributes("tests_pass", passed)
    run.span.add_event("gen_ai.evaluation.result", attributes=verdict, timestamp=now)
    if not passed:
        run.span.set_status(Status(StatusCode.ERROR, "tests still failing"))
    run.end(now + _MS)
    return now + 10 * _MS


class BatchCloner:
    """Clones recorded template batches with fresh ids: new SpanContexts, shifted times, unique content."""

    def __init__(self, templates: list[list[Any]]) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, TraceFlags

        self._readable = ReadableSpan
        self._context = SpanContext
        self._flags = TraceFlags(TraceFlags.SAMPLED)
        self._batches = []
        for spans in templates:
            index = {span.context.span_id: position for position, span in enumerate(spans)}
            prepared = []
            for span in spans:
                attributes = dict(span.attributes)
                variable = tuple(
                    key for key, value in attributes.items() if isinstance(value, str) and PLACEHOLDER in value
                )
                parent = index.get(span.parent.span_id) if span.parent is not None else None
                prepared.append((span, attributes, variable, parent, span.parent is None))
            self._batches.append(prepared)
        self._base = min(span.start_time for spans in templates for span in spans)
        self._next = 0

    def next(self) -> list[Any]:
        prepared = self._batches[self._next % len(self._batches)]
        self._next += 1
        shift = time.time_ns() - self._base
        getrandbits = random.getrandbits
        contexts: list[Any] = []
        spans: list[Any] = []
        trace_id = 0
        token = ""
        for template, attributes, variable, parent, is_root in prepared:
            if is_root:
                trace_id = getrandbits(128) or 1
                token = f"{trace_id:032x}"
            context = self._context(trace_id, getrandbits(64) or 1, False, self._flags)
            contexts.append(context)
            if variable:
                attributes = dict(attributes)
                for key in variable:
                    attributes[key] = attributes[key].replace(PLACEHOLDER, token)
            spans.append(
                self._readable(
                    name=template.name,
                    context=context,
                    parent=contexts[parent] if parent is not None else None,
                    resource=template.resource,
                    attributes=attributes,
                    events=template.events,
                    links=template.links,
                    kind=template.kind,
                    status=template.status,
                    start_time=template.start_time + shift,
                    end_time=template.end_time + shift,
                    instrumentation_scope=template.instrumentation_scope,
                )
            )
        return spans


# -- OTLP/JSON encoding (the Python SDK has no JSON exporter) ----------------------------------


def _json_span(span: Any) -> dict[str, Any]:
    context = span.context
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": span.kind.value + 1,  # SDK SpanKind starts at INTERNAL=0, OTLP at SPAN_KIND_INTERNAL=1
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": key_values(span.attributes),
        "flags": 0x100,  # as the SDK's protobuf encoder: "is_remote known", set below when it is
    }
    if span.parent is not None:
        encoded["parentSpanId"] = f"{span.parent.span_id:016x}"
        if span.parent.is_remote:
            encoded["flags"] |= 0x200
    if span.events:
        encoded["events"] = [
            {"timeUnixNano": str(event.timestamp), "name": event.name, "attributes": key_values(event.attributes)}
            for event in span.events
        ]
    if span.links:
        encoded["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": key_values(link.attributes),
            }
            for link in span.links
        ]
    status: dict[str, Any] = {"code": span.status.status_code.value}
    if span.status.description:
        status["message"] = span.status.description
    encoded["status"] = status
    return encoded


def encode_json(spans: Sequence[Any]) -> bytes:
    """An OTLP/JSON ExportTraceServiceRequest for these spans, grouped by resource and scope."""
    import orjson

    resources: dict[int, tuple[Any, dict[tuple[str, str], tuple[Any, list[dict[str, Any]]]]]] = {}
    for span in spans:
        resource_entry = resources.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        resource_entry[1].setdefault(key, (scope, []))[1].append(_json_span(span))
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values(resource.attributes)},
                "scopeSpans": [
                    {
                        "scope": {"name": name, "version": version} if scope is not None else {},
                        "spans": encoded,
                    }
                    for (name, version), (scope, encoded) in scopes.items()
                ],
            }
            for resource, scopes in resources.values()
        ]
    }
    return orjson.dumps(document)


class HttpPoster:
    """POSTs ready bodies on one keep-alive session; retries 429/502/503/504 like the SDK exporters do."""

    def __init__(self, url: str, content_type: str, timeout_s: float) -> None:
        import requests

        self.url = url
        self.headers = {"Content-Type": content_type}
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.retries = 0

    def send(self, body: bytes) -> bool:
        import requests

        deadline = time.monotonic() + self.timeout_s
        delay = 1.0
        while True:
            retry_after = None
            try:
                response = self.session.post(self.url, data=body, headers=self.headers, timeout=self.timeout_s)
                status = response.status_code
                retry_after = response.headers.get("retry-after")
            except requests.RequestException:
                status = None
            if status == 200:
                return True
            if status not in (None, 429, 502, 503, 504):
                return False
            wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
            if time.monotonic() + wait > deadline:
                return False
            self.retries += 1
            time.sleep(wait)
            delay *= 2

    def shutdown(self) -> None:
        self.session.close()


class GrpcPoster:
    """Sends ready ExportTraceServiceRequest bytes on one channel; retries UNAVAILABLE with backoff."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        import grpc

        self.grpc = grpc
        self.channel = grpc.insecure_channel(endpoint)
        self.call = self.channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        self.timeout_s = timeout_s
        self.retries = 0

    def send(self, body: bytes) -> bool:
        deadline = time.monotonic() + self.timeout_s
        delay = 1.0
        while True:
            try:
                self.call(body, timeout=max(0.1, deadline - time.monotonic()))
                return True
            except self.grpc.RpcError as error:
                if error.code() != self.grpc.StatusCode.UNAVAILABLE or time.monotonic() + delay > deadline:
                    return False
            self.retries += 1
            time.sleep(delay)
            delay *= 2

    def shutdown(self) -> None:
        self.channel.close()


class JsonExporter:
    """The OTLP/JSON exporter the Python SDK lacks: encode_json per batch, then an HttpPoster."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.poster = HttpPoster(url, "application/json", timeout_s)

    @property
    def retries(self) -> int:
        return self.poster.retries

    def export(self, spans: Sequence[Any]) -> bool:
        return self.poster.send(encode_json(spans))

    def shutdown(self) -> None:
        self.poster.shutdown()


class ReusedBodies:
    """Diagnostic client (--client-encoding reuse): each template batch is encoded once; every request
    rewrites ids, times and the unique content in place and re-serializes, so the client costs a few
    milliseconds per batch and the receiver is measured alone."""

    def __init__(self, templates: list[list[Any]], as_json: bool) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self.as_json = as_json
        self._plans: list[tuple[Any, list[tuple[Any, ...]]]] = []
        for spans in templates:
            if as_json:
                import orjson

                document = orjson.loads(encode_json(spans))
                encoded = [span for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]
                ids = {span["spanId"]: position for position, span in enumerate(encoded)}
                plan = []
                for span in encoded:
                    variable = [(kv["value"], kv["value"]["stringValue"]) for kv in span["attributes"]
                                if PLACEHOLDER in kv["value"].get("stringValue", "")]  # fmt: skip
                    parent = ids.get(span.get("parentSpanId", ""))
                    plan.append((span, parent, variable, int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])))
                self._plans.append((document, plan))
            else:
                message = encode_spans(spans)
                encoded = [span for rs in message.resource_spans for ss in rs.scope_spans for span in ss.spans]
                ids = {span.span_id: position for position, span in enumerate(encoded)}
                plan = []
                for span in encoded:
                    variable = [(kv.value, kv.value.string_value) for kv in span.attributes
                                if PLACEHOLDER in kv.value.string_value]  # fmt: skip
                    parent = ids.get(span.parent_span_id) if span.parent_span_id else None
                    plan.append((span, parent, variable, span.start_time_unix_nano, span.end_time_unix_nano))
                self._plans.append((message, plan))
        self._base = min(entry[3] for _, plan in self._plans for entry in plan)
        self._next = 0
        self.spans_per_body = [len(plan) for _, plan in self._plans]

    def next(self) -> tuple[bytes, int]:
        message, plan = self._plans[self._next % len(self._plans)]
        self._next += 1
        shift = time.time_ns() - self._base
        getrandbits = random.getrandbits
        span_ids: list[Any] = []
        trace_id: Any = None
        token = ""
        for span, parent, variable, start, end in plan:
            if parent is None or trace_id is None:
                value = getrandbits(128) or 1
                token = f"{value:032x}"
                trace_id = token if self.as_json else value.to_bytes(16, "big")
            span_value = getrandbits(64) or 1
            span_id = f"{span_value:016x}" if self.as_json else span_value.to_bytes(8, "big")
            span_ids.append(span_id)
            if self.as_json:
                span["traceId"], span["spanId"] = trace_id, span_id
                if parent is not None:
                    span["parentSpanId"] = span_ids[parent]
                span["startTimeUnixNano"], span["endTimeUnixNano"] = str(start + shift), str(end + shift)
                for value_node, text in variable:
                    value_node["stringValue"] = text.replace(PLACEHOLDER, token)
            else:
                span.trace_id, span.span_id = trace_id, span_id
                if parent is not None:
                    span.parent_span_id = span_ids[parent]
                span.start_time_unix_nano, span.end_time_unix_nano = start + shift, end + shift
                for value_node, text in variable:
                    value_node.string_value = text.replace(PLACEHOLDER, token)
        if self.as_json:
            import orjson

            return orjson.dumps(message), len(plan)
        return message.SerializeToString(), len(plan)


# -- one client process ------------------------------------------------------------------------


def _make_exporter(transport: str, endpoint: str) -> Any:
    if transport == "http-json":
        return JsonExporter(endpoint, EXPORT_TIMEOUT_S)
    return exporter("traces", endpoint, "grpc" if transport == "grpc" else "http/protobuf", EXPORT_TIMEOUT_S)


def _make_poster(transport: str, endpoint: str) -> Any:
    if transport == "grpc":
        return GrpcPoster(endpoint, EXPORT_TIMEOUT_S)
    content_type = "application/json" if transport == "http-json" else "application/x-protobuf"
    return HttpPoster(endpoint, content_type, EXPORT_TIMEOUT_S)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def client_main(
    number: int,
    transport: str,
    endpoint: str,
    batch_size: int,
    encoding: str,
    timing: Any,
    go: Any,
    results: Any,
) -> None:
    """Export batches until timing[1]; measure the window [timing[0], timing[1])."""
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        templates = [
            _record_trajectories(seed=1000 * number + batch, spans_wanted=batch_size)
            for batch in range(TEMPLATE_BATCHES)
        ]
        sample = templates[0]
        shape = {
            "spans_per_batch": len(sample),
            "trajectories_per_batch": sum(1 for span in sample if span.parent is None),
            "protobuf_bytes_per_batch": len(encode_spans(sample).SerializeToString()),
            "json_bytes_per_batch": len(encode_json(sample)),
        }
        if encoding == "sdk":
            # The official exporter encodes and transports; the clone only gives the spans fresh ids.
            cloner = BatchCloner(templates)
            sender = _make_exporter(transport, endpoint)

            def prepare() -> tuple[Any, int]:
                batch = cloner.next()
                return batch, len(batch)

            def send(batch: Any) -> bool:
                outcome = sender.export(batch)
                return outcome is True or outcome == SpanExportResult.SUCCESS

        else:
            bodies = ReusedBodies(templates, as_json=transport == "http-json")
            sender = _make_poster(transport, endpoint)
            prepare = bodies.next
            send = sender.send
        results.put(("ready", number, shape))
        go.wait()
        measure_from, measure_to = timing[0], timing[1]
        latencies: list[float] = []
        acked = failed = window_spans = window_requests = 0
        prepare_cpu = 0.0
        cpu_start = None
        while True:
            before = time.thread_time()
            payload, count = prepare()
            prepared = time.thread_time() - before
            started = time.monotonic()
            if started >= measure_to:
                break
            if cpu_start is None and started >= measure_from:
                cpu_start = _cpu_seconds()
            if started >= measure_from:
                prepare_cpu += prepared
            ok = send(payload)
            finished = time.monotonic()
            if ok:
                acked += count
            else:
                failed += 1
            if ok and measure_from <= finished < measure_to:
                window_spans += count
                window_requests += 1
            if started >= measure_from:
                latencies.append(finished - started)
        cpu_window = _cpu_seconds() - cpu_start if cpu_start is not None else 0.0
        retries = getattr(sender, "retries", None)
        sender.shutdown()
        results.put(
            (
                "done",
                number,
                {
                    "acked_spans": acked,
                    "failed_exports": failed,
                    "window_spans": window_spans,
                    "window_requests": window_requests,
                    "latencies": latencies,
                    "cpu_s": cpu_window,
                    "prepare_cpu_s": prepare_cpu,
                    "client_retries": retries,
                },
            )
        )
    except BaseException:  # report, so the parent does not wait for a client that died
        results.put(("error", number, traceback.format_exc()))


# -- the daemon under test ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _proc_status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Daemon:
    """A `tracefix daemon` subprocess on a fresh temporary directory, database and ports."""

    def __init__(self, directory: Path, profile_path: Path | None = None) -> None:
        self.directory = directory
        self.db_path = directory / "tracefix.duckdb"
        self.http_port, self.grpc_port, self.api_port = free_port(), free_port(), free_port()
        self.config_path = directory / "tracefix.toml"
        # Only the paths and ports differ from the embedded defaults (durability included).
        self.config_path.write_text(
            f'[store]\npath = "{self.db_path}"\n'
            f"[collector]\nhttp_port = {self.http_port}\ngrpc_port = {self.grpc_port}\n"
            f"[api]\nport = {self.api_port}\n"
        )
        self.profile_path = profile_path
        self.log_path = directory / "daemon.log"
        self.process: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def endpoint(self, transport: str) -> str:
        if transport == "grpc":
            return f"127.0.0.1:{self.grpc_port}"
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def start(self, timeout_s: float = 60.0) -> None:
        import httpx

        if self.profile_path is not None:
            command = [sys.executable, str(Path(__file__).resolve()), "--serve-profiled", str(self.config_path),
                       str(self.profile_path)]  # fmt: skip
        else:
            command = [sys.executable, "-m", "tracefix.daemon.app.cli", "daemon", "--config", str(self.config_path)]
        environment = {key: value for key, value in os.environ.items() if not key.startswith("TRACEFIX_")}
        environment["PYTHONUNBUFFERED"] = "1"
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT, env=environment
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.api_url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"daemon did not become healthy:\n{self.log_path.read_text()}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def get(self, path: str) -> Any:
        import httpx

        response = httpx.get(f"{self.api_url}{path}", timeout=30)
        response.raise_for_status()
        return response.json() if path.startswith("/api") else response.text

    def stop(self, timeout_s: float = 120.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def file_bytes(self) -> int:
        wal = self.db_path.with_name(self.db_path.name + ".wal")
        return sum(path.stat().st_size for path in (self.db_path, wal) if path.exists())

    def checkpointed_bytes(self) -> int:
        """Size once the WAL is folded in (the daemon may exit without checkpointing)."""
        import duckdb

        with duckdb.connect(str(self.db_path)) as connection:
            connection.execute("CHECKPOINT")
        return self.file_bytes()


def _wait_assembled(daemon: Daemon, limit_s: float) -> float | None:
    """Seconds until the assembler has caught up with every commit; None if it did not within limit_s."""
    started = time.monotonic()
    while True:
        ingest = daemon.get("/api/status")["ingest"]
        if ingest["assembled_batch"] >= ingest["committed_batch"] and ingest["writer_queue_rows"] == 0:
            return round(time.monotonic() - started, 1)
        if time.monotonic() - started > limit_s:
            return None
        time.sleep(0.25)


def _metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    samples = []
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{(.*?)\}})? (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        samples.append((labels, float(match.group(2))))
    return samples


def _server_metrics(text: str) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for labels, value in _metric_samples(text, "tracefix_ingest_requests_total"):
        if labels.get("signal") == "traces":
            key = f"{labels.get('transport')} {labels.get('status')}"
            statuses[key] = statuses.get(key, 0) + int(value)

    def total(name: str) -> float:
        return sum(value for _, value in _metric_samples(text, name))

    commits = total("tracefix_commit_seconds_count")
    requests = max(1.0, total("tracefix_ingest_request_seconds_count"))
    return {
        "requests_by_status": statuses,
        "commits": int(commits),
        "mean_spans_per_commit": round(total("tracefix_commit_rows_sum") / commits, 1) if commits else None,
        "mean_commit_ms": round(1000 * total("tracefix_commit_seconds_sum") / commits, 2) if commits else None,
        "mean_server_request_ms": round(1000 * total("tracefix_ingest_request_seconds_sum") / requests, 2),
        "assembler_passes": int(total("tracefix_assembler_pass_seconds_count")),
        "assembler_lag_batches": total("tracefix_assembler_lag_batches"),
    }


# -- one measured run --------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def run_once(transport: str, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix=f"tracefix-bench-{transport}-"))
    profile_path = directory / "daemon.prof" if args.profile_server else None
    daemon = Daemon(directory, profile_path)
    context = mp.get_context("spawn")
    clients: list[Any] = []
    load_before = os.getloadavg()
    try:
        daemon.start()
        results = context.Queue()
        timing = context.Array("d", 2)
        go = context.Event()
        for number in range(args.clients):
            process = context.Process(
                target=client_main,
                args=(number, transport, daemon.endpoint(transport), args.batch_size, args.client_encoding, timing, go,
                      results),
                daemon=True,
            )
            process.start()
            clients.append(process)
        shapes = []
        for _ in range(args.clients):
            kind, number, payload = results.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"client {number} failed to start:\n{payload}")
            shapes.append(payload)
        measure_from = time.monotonic() + args.warmup
        measure_to = measure_from + args.seconds
        timing[0], timing[1] = measure_from, measure_to
        go.set()
        log(f"{transport} #{repeat + 1}: {args.clients} clients, warm-up {args.warmup:g} s, "
            f"measuring {args.seconds:g} s")
        time.sleep(max(0.0, measure_from - time.monotonic()))
        server_cpu_start = _proc_cpu_seconds(daemon.pid)
        if profile_path is not None:
            _request_profile_snapshot(daemon, Path(f"{profile_path}.1"))
        time.sleep(max(0.0, measure_to - time.monotonic()))
        server_cpu_window = _proc_cpu_seconds(daemon.pid) - server_cpu_start
        if profile_path is not None:
            _request_profile_snapshot(daemon, Path(f"{profile_path}.2"))
        done = []
        deadline = time.monotonic() + EXPORT_TIMEOUT_S * 3
        while len(done) < args.clients:
            kind, number, payload = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if kind == "error":
                raise RuntimeError(f"client {number} failed:\n{payload}")
            done.append(payload)
        for process in clients:
            process.join(30)
        assembler_catchup_s = _wait_assembled(daemon, args.assembler_wait)
        status = daemon.get("/api/status")
        metrics = _server_metrics(daemon.get("/metrics"))
        peak_rss_kb = _proc_status_kb(daemon.pid, "VmHWM")
        server_cpu_total = _proc_cpu_seconds(daemon.pid)
        live_bytes = status["database"]["bytes"]
    finally:
        for process in clients:
            if process.is_alive():
                process.kill()
        if daemon.process is not None:
            returncode = daemon.stop()
    load_after = os.getloadavg()
    exit_bytes = daemon.file_bytes()
    closed_bytes = daemon.checkpointed_bytes()
    acked = sum(client["acked_spans"] for client in done)
    stored = status["counts"]["spans"]
    latencies = [latency for client in done for latency in client["latencies"]]
    window_spans = sum(client["window_spans"] for client in done)
    shape = shapes[0]
    client_cpu = sum(client["cpu_s"] for client in done)
    result: dict[str, Any] = {
        "transport": transport,
        "repeat": repeat + 1,
        "spans_per_s": round(window_spans / args.seconds, 1),
        "requests": sum(client["window_requests"] for client in done),
        "p50_ms": round(1000 * _percentile(latencies, 0.50), 2) if latencies else None,
        "p99_ms": round(1000 * _percentile(latencies, 0.99), 2) if latencies else None,
        "failed_exports": sum(client["failed_exports"] for client in done),
        "acked_spans": acked,
        "stored_spans": stored,
        "verified": stored == acked,
        "client_cpu_s": round(client_cpu, 2),
        "client_prepare_cpu_s": round(sum(client["prepare_cpu_s"] for client in done), 2),
        "server_cpu_s": round(server_cpu_window, 2),
        "server_cpu_cores": round(server_cpu_window / args.seconds, 2),
        "server_cpu_us_per_span": round(1e6 * server_cpu_window / window_spans, 1) if window_spans else None,
        "client_cpu_us_per_span": round(1e6 * client_cpu / window_spans, 1) if window_spans else None,
        "server_cpu_total_s": round(server_cpu_total, 2),
        "server_peak_rss_mb": round(peak_rss_kb / 1024, 1),
        "db_bytes_live": live_bytes,
        "db_bytes_at_exit": exit_bytes,
        "db_bytes_checkpointed": closed_bytes,
        "db_mb_per_million_spans": round(closed_bytes / stored * 1e6 / 2**20, 1) if stored else None,
        "protobuf_bytes_per_span": round(shape["protobuf_bytes_per_batch"] / shape["spans_per_batch"]),
        "json_bytes_per_span": round(shape["json_bytes_per_batch"] / shape["spans_per_batch"]),
        "trajectories_per_batch": shape["trajectories_per_batch"],
        "server": metrics,
        "assembler_catchup_s": assembler_catchup_s,
        "assembled": status["ingest"]["assembled_batch"] >= status["ingest"]["committed_batch"],
        "trajectories": status["counts"]["trajectories"],
        "daemon_exit_code": returncode,
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in load_after],
    }
    retries = [client["client_retries"] for client in done if client["client_retries"] is not None]
    if retries:
        result["client_retries"] = sum(retries)
    if profile_path is not None:
        result["profile"] = {
            "measured_window": _profile_summary(
                Path(f"{profile_path}.1"), Path(f"{profile_path}.2"), f"{transport} measured window"
            ),
            "whole_run": _profile_summary(None, profile_path, f"{transport} whole run incl. assembly catch-up", top=15),
        }
    log(
        f"{transport} #{repeat + 1}: {result['spans_per_s']:.0f} spans/s, p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms, failed {result['failed_exports']}, stored {stored}/{acked}, "
        f"server cpu {result['server_cpu_s']} s, client cpu {result['client_cpu_s']} s"
    )
    if args.keep:
        log(f"kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return result


# -- profiling the server ----------------------------------------------------------------------


class _Snapshot:
    """Stats of one profiler, in the shape pstats.Stats.add accepts."""

    def __init__(self, stats: dict[Any, Any]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


def _dump_profiles(profilers: list[Any], path: str) -> None:
    import pstats

    merged = pstats.Stats()
    for profiler in list(profilers):
        profiler.snapshot_stats()  # also works for profilers of threads still running
        if profiler.stats:
            merged.add(_Snapshot(profiler.stats))
    merged.dump_stats(path + ".tmp")
    os.replace(path + ".tmp", path)


def serve_profiled(config_path: str, output_path: str) -> None:
    """Run the daemon with a cProfile profiler (thread CPU clock) in every thread.

    SIGUSR1 writes a merged snapshot to OUTPUT.1, OUTPUT.2, ... so the bench can take the measured
    window alone; the whole run is written to OUTPUT at exit.
    """
    import cProfile
    import itertools
    import threading

    profilers: list[cProfile.Profile] = []
    original_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()
        try:
            original_run(self)
        finally:
            profiler.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    snapshots = itertools.count(1)
    signal.signal(signal.SIGUSR1, lambda number, frame: _dump_profiles(profilers, f"{output_path}.{next(snapshots)}"))
    # uvicorn re-raises the SIGTERM it handled once it has shut down, with the handler that was there
    # before it; a no-op one lets the daemon's own shutdown and the final dump run.
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    from tracefix.daemon.app.cli import main

    profiler = cProfile.Profile(time.thread_time)
    profilers.append(profiler)
    profiler.enable()
    try:
        main(["daemon", "--config", config_path], standalone_mode=False)
    finally:
        profiler.disable()
        _dump_profiles(profilers, output_path)


def _request_profile_snapshot(daemon: Daemon, path: Path, timeout_s: float = 30.0) -> bool:
    os.kill(daemon.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _profile_summary(before: Path | None, after: Path, title: str, top: int = 25) -> dict[str, Any]:
    """Top functions by cumulative and by own thread-CPU time between two snapshots (or in one)."""
    import pstats

    if not after.exists() or (before is not None and not before.exists()):
        return {"error": f"the daemon wrote no profile for {title}"}
    late = pstats.Stats(str(after)).stats  # type: ignore[attr-defined]
    early = pstats.Stats(str(before)).stats if before is not None else {}  # type: ignore[attr-defined]
    rows = []
    for function, (_, calls, own, cumulative, _callers) in late.items():
        _, calls_before, own_before, cumulative_before, _ = early.get(function, (0, 0, 0.0, 0.0, None))
        if calls - calls_before or own - own_before:
            file, line, name = function
            where = f"{Path(file).name}:{line}({name})" if file != "~" else name
            own, cumulative = round(own - own_before, 3), round(cumulative - cumulative_before, 3)
            rows.append([calls - calls_before, own, cumulative, where])
    total = round(sum(row[1] for row in rows), 2)
    by_cumulative = sorted(rows, key=lambda row: row[2], reverse=True)[:top]
    by_own = sorted(rows, key=lambda row: row[1], reverse=True)[:top]
    for order, table in (("cumulative", by_cumulative), ("own (tottime)", by_own)):
        lines = [f"{'ncalls':>9} {'tottime':>8} {'cumtime':>8}  function"]
        lines += [f"{calls:>9} {own:>8.3f} {cumulative:>8.3f}  {where}" for calls, own, cumulative, where in table]
        log(f"server profile, {title} ({total} s of Python thread CPU), top {top} by {order}:\n" + "\n".join(lines))
    return {
        "window": title,
        "clock": "CPU time of each Python thread (DuckDB's own worker threads are not seen)",
        "python_thread_cpu_s": total,
        "top_cumulative": by_cumulative,
        "top_tottime": by_own,
    }


# -- summary -----------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    from importlib.metadata import version

    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    memory_kb = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0)
    versions = {}
    for package in ("duckdb", "opentelemetry-sdk", "protobuf", "grpcio", "uvicorn", "pyarrow"):
        try:
            versions[package] = version(package)
        except Exception:
            versions[package] = None
    try:
        from google.protobuf.internal import api_implementation

        protobuf_backend = api_implementation.Type()
    except Exception:
        protobuf_backend = None
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(memory_kb / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "protobuf_backend": protobuf_backend,
    }


_SUMMARY_KEYS = (
    "spans_per_s", "requests", "p50_ms", "p99_ms", "failed_exports", "client_cpu_s", "client_prepare_cpu_s",
    "server_cpu_s", "server_cpu_cores", "server_cpu_us_per_span", "client_cpu_us_per_span", "server_peak_rss_mb",
    "db_mb_per_million_spans",
)  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    median: dict[str, Any] = {}
    values: dict[str, list[Any]] = {}
    for key in _SUMMARY_KEYS:
        numbers = [run[key] for run in runs if run.get(key) is not None]
        values[key] = numbers
        median[key] = round(statistics.median(numbers), 2) if numbers else None
    median["failed_exports_total"] = sum(run["failed_exports"] for run in runs)
    median["all_verified"] = all(run["verified"] for run in runs)
    return {"median": median, "values": values, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated: " + ", ".join(TRANSPORTS))
    parser.add_argument("--seconds", type=float, default=20.0, help="measured duration per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the measurement starts")
    parser.add_argument("--clients", type=int, default=2, help="concurrent client processes")
    parser.add_argument("--batch-size", type=int, default=512, help="spans per export request")
    parser.add_argument("--repeats", type=int, default=1, help="runs per transport; medians are reported")
    parser.add_argument(
        "--client-encoding",
        choices=("sdk", "reuse"),
        default="sdk",
        help="sdk: the official exporters encode every batch (the measure); reuse: a diagnostic client that "
        "encodes each template once and rewrites ids, so the receiver is measured without the client's cost",
    )
    parser.add_argument(
        "--assembler-wait", type=float, default=30.0, help="seconds to let trajectory assembly catch up before sizing"
    )
    parser.add_argument("--profile-server", action="store_true", help="run the daemon under cProfile (all threads)")
    parser.add_argument("--keep", action="store_true", help="keep each run's temporary directory")
    parser.add_argument("--output", type=Path, help="also write the JSON result to this file")
    parser.add_argument("--serve-profiled", nargs=2, metavar=("CONFIG", "PROFILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_profiled:
        serve_profiled(*args.serve_profiled)
        return 0
    transports = [name.strip() for name in args.transports.split(",") if name.strip()]
    unknown = [name for name in transports if name not in TRANSPORTS]
    if unknown or not transports:
        parser.error(f"unknown transport(s) {unknown}; choose from {', '.join(TRANSPORTS)}")
    if args.clients < 1 or args.batch_size < 1 or args.repeats < 1 or args.seconds <= 0:
        parser.error("--clients, --batch-size, --repeats and --seconds must be positive")

    load_before = os.getloadavg()
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in transports}
    # Transports alternate within each repeat, so a change in background load hits all of them.
    for repeat in range(args.repeats):
        for transport in transports:
            runs[transport].append(run_once(transport, args, repeat))
    summaries = {name: summarize(results) for name, results in runs.items()}

    def ratio(numerator: str, denominator: str) -> dict[str, Any] | None:
        if numerator not in summaries or denominator not in summaries:
            return None
        top = summaries[numerator]["median"]["spans_per_s"]
        bottom = summaries[denominator]["median"]["spans_per_s"]
        paired = [
            round(a["spans_per_s"] / b["spans_per_s"], 3)
            for a, b in zip(runs[numerator], runs[denominator])
            if b["spans_per_s"]
        ]
        return {"of_medians": round(top / bottom, 3) if bottom else None, "per_repeat": paired}

    protobuf = summaries.get("http-protobuf", {}).get("median", {})
    grpc_ratio = ratio("grpc", "http-protobuf")
    output = {
        "benchmark": "tracefix ingest (OTLP)",
        "settings": {
            "transports": transports,
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "clients": args.clients,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "client_encoding": args.client_encoding,
            "profile_server": args.profile_server,
            "durability": "default: acknowledged after the group commit",
        },
        "json_encoder": "bench" if "http-json" in transports else None,  # the Python SDK has no OTLP/JSON exporter
        "machine": _machine(),
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in os.getloadavg()],
        "elapsed_s": round(time.monotonic() - started, 1),
        "transports": summaries,
        "ratios": {
            "grpc_vs_http_protobuf": grpc_ratio,
            "http_json_vs_http_protobuf": ratio("http-json", "http-protobuf"),
        },
        "target": {
            "http_protobuf_spans_per_s": TARGET_SPANS_PER_S,
            "http_protobuf_met": (protobuf.get("spans_per_s") or 0) >= TARGET_SPANS_PER_S if protobuf else None,
            "grpc_within_20_percent": (
                grpc_ratio["of_medians"] >= TARGET_GRPC_RATIO if grpc_ratio and grpc_ratio["of_medians"] else None
            ),
        },
    }
    line = json.dumps(output, separators=(",", ":"))
    if args.output:
        args.output.write_text(line + "\n")
    print(line, flush=True)
    failed = any(not summary["median"]["all_verified"] or summary["median"]["failed_exports_total"]
                 for summary in summaries.values())  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
