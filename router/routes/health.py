"""Health and Prometheus metrics: open reads for probes and scrapers."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tracefix.router.routes.dependencies import Config, CurrentBackend, Table

router = APIRouter()


@router.get("/healthz")
def healthz(backend: CurrentBackend, table: Table, settings: Config) -> JSONResponse:
    healthy = backend.alive
    body = {"status": backend.health, "model": settings.model_name, "adapters": len(table.live())}
    return JSONResponse(body, 200 if healthy else 503)


@router.get("/metrics")
def prometheus_metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
