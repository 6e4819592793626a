"""The training pipeline's records: training requests, environments, tool definitions, training runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from daemon.app.routes.dependencies import CurrentDaemon
from daemon.core.progress import grpo_steps, read_progress

router = APIRouter()


@router.get("/api/training_requests")
def training_requests(daemon: CurrentDaemon, status: str | None = None) -> dict[str, Any]:
    return {"items": daemon.analysis_store.training_requests(status)}


@router.get("/api/environments")
def environments(daemon: CurrentDaemon, capability: str | None = None) -> dict[str, Any]:
    """Stored environment specs with their check reports."""
    return {"items": daemon.analysis_store.environments(capability)}


@router.get("/api/tools")
def tools(daemon: CurrentDaemon, service: str | None = None) -> dict[str, Any]:
    """Tool definitions seen per agent (service.name): what environments are built from."""
    return {"items": daemon.analysis_store.tool_definitions(service)}


@router.get("/api/runs")
def runs(daemon: CurrentDaemon, capability: str | None = None) -> dict[str, Any]:
    """Training runs, newest first, each with its latest GRPO step record (``progress``) and its
    latest record of any phase (``latest``: a warm-start update, a GRPO step, an evaluation part)."""
    items = daemon.runs.runs(capability)
    for item in items:
        history = read_progress(item["directory"])
        steps = grpo_steps(history)
        item["progress"] = steps[-1] if steps else None
        item["latest"] = history[-1] if history else None
    return {"items": items}


@router.get("/api/runs/{run_id}")
def run(run_id: int, daemon: CurrentDaemon) -> dict[str, Any]:
    """One run with its step-by-step progress and, once finished, its evaluation report."""
    item = daemon.runs.run(run_id)
    if item is None:
        raise HTTPException(404, f"no training run {run_id}")
    item["progress"] = read_progress(item["directory"])
    return item
