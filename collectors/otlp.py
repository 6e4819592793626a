"""OTLP decoding: export requests (protobuf or JSON) into validated span and log rows.

Rows are column lists ready for an Arrow table; a span that breaks the OTLP data model is rejected
with a reason and the rest of its request is kept (OTLP ``partial_success``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracefix.collectors.dialects import conversation_id

SPAN_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind",
    "start_time_unix_nano", "end_time_unix_nano", "status_code", "status_message",
    "service_name", "scope_name", "scope_version", "conversation_id",
    "resource_attributes", "attributes", "events", "links", "truncated",
)  # fmt: skip
LOG_COLUMNS = (
    "log_id", "trace_id", "span_id", "time_unix_nano", "observed_time_unix_nano",
    "severity_number", "severity_text", "event_name", "body", "service_name", "scope_name",
    "conversation_id", "resource_attributes", "attributes", "truncated",
)  # fmt: skip

_MAX_DEPTH = 16


class PayloadError(ValueError):
    """The whole request is unusable (not OTLP, wrong encoding); answered with 400."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-span bounds; values beyond them are truncated and the span is flagged, never dropped silently."""

    max_attribute_value_bytes: int = 65536
    max_attributes_per_span: int = 256
    max_events_per_span: int = 256
    max_links_per_span: int = 128
    # Span, event and scope names and attribute keys: identifiers, never documents.
    max_name_bytes: int = 1024


@dataclass(slots=True)
class Decoded:
    """Rows decoded from one export request, and what was rejected."""

    columns: dict[str, list[Any]]
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def accepted(self) -> int:
        return len(self.columns[next(iter(self.columns))])

    @property
    def rejected_count(self) -> int:
        return sum(self.rejected.values())

    def rejection_message(self) -> str:
        if not self.rejected:
            return ""
        reasons = ", ".join(f"{reason} ({count})" for reason, count in sorted(self.rejected.items()))
        return f"{self.rejected_count} rejected: {reasons}"


class _AttributeDecoder:
    """Turns protobuf KeyValue lists into plain dicts, enforcing the size limits."""

    __slots__ = ("limits", "truncated")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.truncated = False

    def attributes(self, key_values: Any) -> dict[str, Any]:
        limit = self.limits.max_attributes_per_span
        if len(key_values) > limit:
            self.truncated = True
            key_values = key_values[:limit]
        cap = self.limits.max_name_bytes
        return {(kv.key if len(kv.key) * 4 <= cap else self.text(kv.key, cap)): self.value(kv.value, 0) for kv in key_values}

    def text(self, text: str, limit: int) -> str:
        """`text` cut to at most `limit` UTF-8 bytes (flagging the span when it was longer)."""
        if len(text) * 4 <= limit or len(text.encode()) <= limit:
            return text
        self.truncated = True
        return text.encode()[:limit].decode("utf-8", "ignore")

    def value(self, any_value: Any, depth: int) -> Any:
        kind = any_value.WhichOneof("value")
        if kind == "string_value":
            # Characters are 1-4 bytes: only values in between need encoding to be measured.
            return self.text(any_value.string_value, self.limits.max_attribute_value_bytes)
        if kind == "int_value":
            return any_value.int_value
        if kind == "double_value":
            return any_value.double_value
        if kind == "bool_value":
            return any_value.bool_value
        if depth >= _MAX_DEPTH and kind in ("array_value", "kvlist_value"):
            self.truncated = True
            return None
        if kind == "array_value":
            return [self.value(item, depth + 1) for item in any_value.array_value.values]
        if kind == "kvlist_value":
            return {kv.key: self.value(kv.value, depth + 1) for kv in any_value.kvlist_value.values}
        if kind == "bytes_value":
            raw = any_value.bytes_value
            if len(raw) > self.limits.max_attribute_value_bytes:
                self.truncated = True
                raw = raw[: self.limits.max_attribute_value_bytes]
            return base64.b64encode(raw).decode("ascii")
        return None


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _valid_id(raw: bytes, size: int) -> bool:
    return len(raw) == size and raw != b"\x00" * size


def parse_traces_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse an ExportTraceServiceRequest; malformed bytes or invalid UTF-8 raise PayloadError."""
    return _parse_protobuf(ExportTraceServiceRequest(), body)


def parse_logs_protobuf(body: bytes) -> ExportLogsServiceRequest:
    """Parse an ExportLogsServiceRequest; malformed bytes or invalid UTF-8 raise PayloadError."""
    return _parse_protobuf(ExportLogsServiceRequest(), body)


def _parse_protobuf(message: Any, body: bytes) -> Any:
    try:
        message.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise PayloadError(f"malformed protobuf {type(message).__name__}: {error}") from None
    return message


_ID_KEYS = {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"}
_INVALID_ID = base64.b64encode(b"\xff").decode()  # one byte: fails the length check, rejected per span


def _hex_ids_to_base64(node: Any) -> None:
    """OTLP/JSON writes ids as hex where proto3 JSON expects base64; rewrite them in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(binascii.unhexlify(value)).decode() if value else ""
                except (binascii.Error, ValueError):
                    node[key] = _INVALID_ID
            elif isinstance(value, (dict, list)):
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, (dict, list)):
                _hex_ids_to_base64(item)


def _parse_json(message: Any, body: bytes | str | dict) -> Any:
    if isinstance(body, dict):
        document = body
    else:
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise PayloadError(f"malformed JSON (or invalid UTF-8): {error}") from None
    if not isinstance(document, dict):
        raise PayloadError("an OTLP/JSON request must be a JSON object")
    _hex_ids_to_base64(document)
    try:
        return json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as error:
        raise PayloadError(f"invalid OTLP/JSON {type(message).__name__}: {error}") from None


def parse_traces_json(body: bytes | str | dict) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON trace export (hex ids, camelCase or snake_case keys)."""
    return _parse_json(ExportTraceServiceRequest(), body)


def parse_logs_json(body: bytes | str | dict) -> ExportLogsServiceRequest:
    """Parse an OTLP/JSON logs export (hex ids, camelCase or snake_case keys)."""
    return _parse_json(ExportLogsServiceRequest(), body)


def _resource_identity(resource: Any, decoder: _AttributeDecoder) -> tuple[str, str]:
    attributes = decoder.attributes(resource.attributes)
    service = attributes.get("service.name")
    return (str(service) if service is not None else "unknown_service"), _dumps(attributes)


def decode_spans(request: ExportTraceServiceRequest, limits: Limits) -> Decoded:
    """Flatten a trace export into span rows; spans with invalid ids are rejected by reason."""
    columns: dict[str, list[Any]] = {name: [] for name in SPAN_COLUMNS}
    decoded = Decoded(columns)
    (trace_ids, span_ids, parent_ids, trace_states, names, kinds, starts, ends, status_codes,
     status_messages, services, scope_names, scope_versions, conversations, resources,
     attribute_column, event_column, link_column, truncated_column) = columns.values()  # fmt: skip
    decoder = _AttributeDecoder(limits)
    max_events, max_links, max_name = limits.max_events_per_span, limits.max_links_per_span, limits.max_name_bytes
    for resource_spans in request.resource_spans:
        decoder.truncated = False
        service, resource_json = _resource_identity(resource_spans.resource, decoder)
        resource_truncated = decoder.truncated
        for scope_spans in resource_spans.scope_spans:
            decoder.truncated = resource_truncated
            scope_name = decoder.text(scope_spans.scope.name, max_name) or None
            scope_version = decoder.text(scope_spans.scope.version, max_name) or None
            scope_truncated = decoder.truncated
            for span in scope_spans.spans:
                trace_id, span_id, parent_id = span.trace_id, span.span_id, span.parent_span_id
                if not _valid_id(trace_id, 16):
                    decoded.rejected["invalid trace_id"] += 1
                    continue
                if not _valid_id(span_id, 8):
                    decoded.rejected["invalid span_id"] += 1
                    continue
                if parent_id and len(parent_id) != 8:
                    decoded.rejected["invalid parent_span_id"] += 1
                    continue
                decoder.truncated = scope_truncated
                attributes = decoder.attributes(span.attributes)
                events = span.events
                if len(events) > max_events:
                    decoder.truncated = True
                    events = events[:max_events]
                links = span.links
                if len(links) > max_links:
                    decoder.truncated = True
                    links = links[:max_links]
                trace_ids.append(trace_id.hex())
                span_ids.append(span_id.hex())
                parent_ids.append(parent_id.hex() if parent_id and parent_id != b"\x00" * 8 else None)
                trace_states.append(span.trace_state or None)
                names.append(decoder.text(span.name, max_name))
                kinds.append(span.kind)
                starts.append(span.start_time_unix_nano)
                ends.append(span.end_time_unix_nano)
                status_codes.append(span.status.code)
                status_messages.append(decoder.text(span.status.message, limits.max_attribute_value_bytes) or None)
                services.append(service)
                scope_names.append(scope_name)
                scope_versions.append(scope_version)
                conversations.append(conversation_id(attributes))
                resources.append(resource_json)
                attribute_column.append(_dumps(attributes))
                event_column.append(
                    _dumps(
                        [
                            {
                                "name": decoder.text(event.name, max_name),
                                "time_unix_nano": event.time_unix_nano,
                                "attributes": decoder.attributes(event.attributes),
                            }
                            for event in events
                        ]
                    )
                    if events
                    else "[]"
                )
                link_column.append(
                    _dumps(
                        [
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "attributes": decoder.attributes(link.attributes),
                            }
                            for link in links
                        ]
                    )
                    if links
                    else "[]"
                )
                truncated_column.append(decoder.truncated)
    return decoded


def decode_logs(request: ExportLogsServiceRequest, limits: Limits) -> Decoded:
    """Flatten a logs export into log rows; a record's id is a hash of its content, so retries deduplicate."""
    columns: dict[str, list[Any]] = {name: [] for name in LOG_COLUMNS}
    decoded = Decoded(columns)
    decoder = _AttributeDecoder(limits)
    for resource_logs in request.resource_logs:
        decoder.truncated = False
        service, resource_json = _resource_identity(resource_logs.resource, decoder)
        resource_truncated = decoder.truncated
        for scope_logs in resource_logs.scope_logs:
            scope_name = scope_logs.scope.name or None
            for record in scope_logs.log_records:
                trace_id, span_id = record.trace_id, record.span_id
                if trace_id and len(trace_id) != 16:
                    decoded.rejected["invalid trace_id"] += 1
                    continue
                if span_id and len(span_id) != 8:
                    decoded.rejected["invalid span_id"] += 1
                    continue
                decoder.truncated = resource_truncated
                attributes = decoder.attributes(record.attributes)
                body = decoder.value(record.body, 0) if record.HasField("body") else None
                identity = hashlib.blake2b(digest_size=16)
                identity.update(resource_json.encode())
                identity.update(record.SerializeToString(deterministic=True))
                has_trace = trace_id and trace_id != b"\x00" * 16
                columns["log_id"].append(identity.hexdigest())
                columns["trace_id"].append(trace_id.hex() if has_trace else None)
                columns["span_id"].append(span_id.hex() if has_trace and span_id else None)
                columns["time_unix_nano"].append(record.time_unix_nano or record.observed_time_unix_nano)
                columns["observed_time_unix_nano"].append(record.observed_time_unix_nano)
                columns["severity_number"].append(record.severity_number)
                columns["severity_text"].append(record.severity_text or None)
                columns["event_name"].append(record.event_name or attributes.get("event.name") or None)
                columns["body"].append(_dumps(body))
                columns["service_name"].append(service)
                columns["scope_name"].append(scope_name)
                columns["conversation_id"].append(conversation_id(attributes))
                columns["resource_attributes"].append(resource_json)
                columns["attributes"].append(_dumps(attributes))
                columns["truncated"].append(decoder.truncated)
    return decoded
