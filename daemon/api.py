"""The daemon's REST API on :8700: the only way other processes reach the store."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from daemon import metrics

if TYPE_CHECKING:
    from daemon.service import Daemon

VERSION = "0.1.0"


def create_api(daemon: Daemon) -> FastAPI:
    """The FastAPI application serving health, metrics and status for one running daemon."""
    api = FastAPI(title="tracefix daemon", version=VERSION)

    @api.get("/healthz")
    def healthz() -> JSONResponse:
        healthy, problems = daemon.health()
        return JSONResponse({"status": "ok" if healthy else "degraded", "problems": problems}, 200 if healthy else 503)

    @api.get("/metrics")
    def prometheus_metrics() -> Response:
        metrics.DATABASE_BYTES.set(daemon.store.database_bytes())
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @api.get("/api/status")
    def status() -> dict[str, Any]:
        counts = daemon.store.counts()
        healthy, problems = daemon.health()
        return {
            "version": VERSION,
            "healthy": healthy,
            "problems": problems,
            "uptime_s": round(time.monotonic() - daemon.started_at, 1),
            "database": {
                "path": str(daemon.store.path),
                "bytes": daemon.store.database_bytes(),
                "schema_version": daemon.store.schema_version(),
            },
            "counts": {
                "spans": counts.get("spans", 0),
                "logs": counts.get("logs", 0),
                "trajectories": counts.get("trajectories", 0),
                "messages": counts.get("messages", 0),
                "tool_calls": counts.get("tool_calls", 0),
                "tool_definitions": counts.get("tool_definitions", 0),
            },
            "outcomes": {name: counts.get(name, 0) for name in ("success", "failure", "unknown")},
            "ingest": {
                "committed_batch": daemon.writer.committed_batch,
                "assembled_batch": daemon.assembler.position[0],
                "writer_queue_rows": int(metrics.WRITER_QUEUE._value.get()),
            },
            "endpoints": daemon.endpoints,
        }

    return api
