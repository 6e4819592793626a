"""OTLP/HTTP receiver: POST /v1/traces and /v1/logs, protobuf or JSON, optionally gzip-compressed.

Responses follow the OTLP/HTTP spec: 200 with an Export*ServiceResponse (partial_success when some
rows were rejected), 4xx with a google.rpc.Status for a request that cannot be used, 503 with
Retry-After when the writer is saturated (exporters retry it).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf import json_format
from google.rpc import status_pb2
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from tracefix.collectors.ingest import Ingestor, Pending
from tracefix.collectors.otlp import (
    PayloadError,
    parse_logs_json,
    parse_logs_protobuf,
    parse_traces_json,
    parse_traces_protobuf,
)
from tracefix.daemon.core import metrics
from tracefix.daemon.store.writer import Overloaded, WriterStopped
from tracefix.daemon.core.auth import bearer_matches

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _media_type(request: Request) -> str:
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media in (PROTOBUF, "application/protobuf"):
        return PROTOBUF
    if media == JSON:
        return JSON
    raise HttpError(415, f"unsupported content type {content_type!r}; send {PROTOBUF} or {JSON}")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise HttpError(400, "client disconnected before the body was complete") from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise HttpError(415, f"unsupported content encoding {encoding!r}; send gzip or identity")
    return _gunzip(body, limit)


def _gunzip(body: bytes, limit: int) -> bytes:
    # Expansion is capped so a small compressed bomb cannot allocate more than the limit.
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
        if len(data) > limit or inflater.unconsumed_tail:
            raise HttpError(413, f"decompressed body exceeds the limit of {limit} bytes")
        data += inflater.flush()
    except zlib.error as error:
        raise HttpError(400, f"invalid gzip body: {error}") from None
    if not inflater.eof:
        raise HttpError(400, "invalid gzip body: truncated stream")
    if len(data) > limit:
        raise HttpError(413, f"decompressed body exceeds the limit of {limit} bytes")
    return data


def _encode(message: Any, media: str) -> bytes:
    if media == JSON:
        return orjson.dumps(json_format.MessageToDict(message))
    return message.SerializeToString()


# google.rpc.Code for each HTTP status this receiver answers with.
_RPC_CODES = {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}


def _status_response(status: int, message: str, media: str, headers: dict[str, str] | None = None) -> Response:
    body = status_pb2.Status(code=_RPC_CODES.get(status, 2), message=message)
    return Response(_encode(body, media), status_code=status, media_type=media, headers=headers)


class HttpReceiver:
    """The OTLP/HTTP endpoints, as a Starlette application."""

    def __init__(self, ingestor: Ingestor, max_body_bytes: int, token: str = "") -> None:
        self.ingestor = ingestor
        self.max_body_bytes = max_body_bytes
        self.token = token
        self.app = Starlette(
            routes=[
                Route("/v1/traces", self.traces, methods=["POST"]),
                Route("/v1/logs", self.logs, methods=["POST"]),
            ]
        )

    async def traces(self, request: Request) -> Response:
        return await self._export(request, "traces", parse_traces_protobuf, parse_traces_json, self.ingestor.traces)

    async def logs(self, request: Request) -> Response:
        return await self._export(request, "logs", parse_logs_protobuf, parse_logs_json, self.ingestor.logs)

    async def _export(
        self,
        request: Request,
        signal: str,
        parse_protobuf: Callable[[bytes], Any],
        parse_json: Callable[[bytes], Any],
        ingest: Callable[[Any, str], Pending],
    ) -> Response:
        started = time.perf_counter()
        media = PROTOBUF
        transport = "http"
        try:
            self._authorize(request)
            media = _media_type(request)
            transport = "http/json" if media == JSON else "http/protobuf"
            body = await _read_body(request, self.max_body_bytes)
            try:
                message = parse_json(body) if media == JSON else parse_protobuf(body)
            except PayloadError as error:
                raise HttpError(400, str(error)) from None
            try:
                pending = ingest(message, transport)
            except Overloaded as error:
                raise HttpError(503, str(error), {"Retry-After": "1"}) from None
            except WriterStopped as error:
                raise HttpError(503, str(error), {"Retry-After": "5"}) from None
            try:
                await asyncio.wrap_future(pending.future)
            except Exception as error:  # the commit failed: nothing was stored, the exporter may retry
                raise HttpError(503, f"could not store the request: {error}", {"Retry-After": "1"}) from None
            response = Response(_encode(pending.response(), media), media_type=media)
            status = "200"
        except HttpError as error:
            response = _status_response(error.status, error.message, media, error.headers)
            status = str(error.status)
        metrics.REQUESTS.labels(transport, signal, status).inc()
        metrics.REQUEST_SECONDS.labels(transport, signal).observe(time.perf_counter() - started)
        return response

    def _authorize(self, request: Request) -> None:
        if not self.token:
            return
        if not bearer_matches(request.headers.get("authorization", ""), self.token):
            raise HttpError(401, "missing or wrong bearer token; set the exporter header Authorization: Bearer <token>")
