"""`tracefix import`: send an OTLP/JSON file to the running collector, request by request.

A file holds one export request per line (what the OpenTelemetry Collector's file exporter
writes) or a single JSON document. Requests go through the same receiver as live traffic, so they
are validated, deduplicated and stored exactly like it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson


class ImportFailed(RuntimeError):
    """The file or the collector refused the import; the message says why."""


@dataclass(slots=True)
class ImportReport:
    requests: int = 0
    spans: int = 0
    logs: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


def _requests(path: Path) -> Iterator[tuple[int, Any]]:
    text = path.read_bytes()
    try:
        yield 1, orjson.loads(text)
        return
    except orjson.JSONDecodeError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, orjson.loads(line)
        except orjson.JSONDecodeError as error:
            yield number, error


def _count(document: dict[str, Any], resource_key: str, scope_key: str, item_key: str) -> int:
    total = 0
    for resource in document.get(resource_key) or []:
        for scope in resource.get(scope_key) or []:
            total += len(scope.get(item_key) or [])
    return total


def import_file(path: Path, endpoint: str, token: str = "", timeout_s: float = 60.0) -> ImportReport:
    """Post every request of `path` to the collector at `endpoint` (http://host:port)."""
    if not path.is_file():
        raise ImportFailed(f"no such file: {path}")
    return import_requests(_requests(path), endpoint, token, timeout_s)


def import_requests(
    documents: Iterable[tuple[int, Any]], endpoint: str, token: str = "", timeout_s: float = 60.0, unit: str = "line"
) -> ImportReport:
    """Post OTLP/JSON export requests, numbered (`unit` N) for the error messages, to the collector at `endpoint`."""
    report = ImportReport()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(base_url=endpoint, timeout=timeout_s, headers=headers) as http:
        for line, document in documents:
            if isinstance(document, Exception) or not isinstance(document, dict):
                report.errors.append(f"{unit} {line}: not a JSON object")
                continue
            if "resourceSpans" in document or "resource_spans" in document:
                route, rejected_key, kind = "/v1/traces", "rejectedSpans", "spans"
                sent = _count(document, "resourceSpans", "scopeSpans", "spans") or _count(
                    document, "resource_spans", "scope_spans", "spans"
                )
            elif "resourceLogs" in document or "resource_logs" in document:
                route, rejected_key, kind = "/v1/logs", "rejectedLogRecords", "logs"
                sent = _count(document, "resourceLogs", "scopeLogs", "logRecords") or _count(
                    document, "resource_logs", "scope_logs", "log_records"
                )
            else:
                report.errors.append(f"{unit} {line}: neither resourceSpans nor resourceLogs")
                continue
            try:
                response = http.post(route, content=orjson.dumps(document))
            except httpx.TransportError:
                raise ImportFailed(
                    f"the collector is not reachable at {endpoint}; start it with `tracefix up`"
                ) from None
            if response.status_code != 200:
                try:
                    message = response.json().get("message", response.text)
                except ValueError:
                    message = response.text
                report.errors.append(f"{unit} {line}: {response.status_code} {message}")
                continue
            partial = (response.json() or {}).get("partialSuccess") or {}
            rejected = int(partial.get(rejected_key, 0) or 0)
            # Only what the collector accepted counts as imported.
            report.requests += 1
            report.rejected += rejected
            setattr(report, kind, getattr(report, kind) + sent - rejected)
            if rejected:
                report.errors.append(f"{unit} {line}: {partial.get('errorMessage', '')}")
    return report
