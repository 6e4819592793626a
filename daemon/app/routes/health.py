"""Liveness and Prometheus metrics: what a supervisor or scraper polls."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tracefix.daemon.app.routes.dependencies import CurrentDaemon
from tracefix.daemon.core import metrics

router = APIRouter()


@router.get("/healthz")
def healthz(daemon: CurrentDaemon) -> JSONResponse:
    healthy, problems = daemon.health()
    return JSONResponse({"status": "ok" if healthy else "degraded", "problems": problems}, 200 if healthy else 503)


@router.get("/metrics")
def prometheus_metrics(daemon: CurrentDaemon) -> Response:
    metrics.DATABASE_BYTES.set(daemon.store.database_bytes())
    metrics.DATABASE_MEMORY.set(daemon.store.memory_bytes())
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
