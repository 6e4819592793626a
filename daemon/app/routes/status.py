"""The daemon's status page: health, store size and counts, ingest positions, loaded capabilities, LLM judging."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from tracefix.daemon.app.routes.dependencies import Caller, CurrentDaemon
from tracefix.daemon.core import metrics

router = APIRouter()


@router.get("/api/whoami")
def whoami(caller: Caller) -> dict[str, str]:
    """The name the audit log records for this bearer token (and X-Tracefix-Actor): 401 for none."""
    return {"actor": caller}


@router.get("/api/status")
def status(request: Request, daemon: CurrentDaemon) -> dict[str, Any]:
    # Positions before counts: counts then include at least everything the positions claim.
    ingest = {
        "committed_batch": daemon.writer.committed_batch,
        "assembled_batch": daemon.assembler.assembled_batch,
        "writer_queue_rows": int(metrics.WRITER_QUEUE._value.get()),
    }
    counts = daemon.store.counts()
    healthy, problems = daemon.health()
    return {
        "version": request.app.version,
        "healthy": healthy,
        "problems": problems,
        "uptime_s": round(time.monotonic() - daemon.started_at, 1),
        "database": {
            "path": str(daemon.store.path),
            "bytes": daemon.store.database_bytes(),
            "schema_version": daemon.store.schema_version(),
        },
        "counts": {
            name: counts.get(name, 0)
            for name in ("spans", "logs", "trajectories", "messages", "tool_calls", "tool_definitions")
        },
        "outcomes": {name: counts.get(name, 0) for name in ("success", "failure", "unknown")},
        "ingest": ingest,
        "analysis": daemon.last_analysis,
        # The LLM labeler's progress beside the analysis (daemon/analysis/judging.py); null when off.
        "llm": daemon.judging.status() if daemon.settings.llm.enabled else None,
        "capabilities": daemon.registry.names(),
        "plugin_errors": daemon.registry.errors,
        "endpoints": daemon.endpoints,
    }
