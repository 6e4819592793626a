"""The training pipeline's records: training requests, environments (and a sampled instance of one), tool
definitions, training runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from tracefix.daemon.app.routes.dependencies import CurrentDaemon
from tracefix.daemon.core.progress import grpo_steps, read_progress
from tracefix.trainer.environment import rollout, solution_policy
from tracefix.trainer.families import build_environment

router = APIRouter()


@router.get("/api/training_requests")
def training_requests(daemon: CurrentDaemon, status: str | None = None) -> dict[str, Any]:
    return {"items": daemon.analysis_store.training_requests(status)}


@router.get("/api/environments")
def environments(daemon: CurrentDaemon, capability: str | None = None) -> dict[str, Any]:
    """Stored environment specs with their check reports."""
    return {"items": daemon.analysis_store.environments(capability)}


@router.get("/api/environments/{environment_id}/instance")
def environment_instance(environment_id: int, daemon: CurrentDaemon, seed: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
    """One seeded instance of a stored environment, at the difficulty its gate settled on, with its
    ground-truth solution played through: what the model is asked to do and what earns full reward."""
    stored = daemon.runs.environment(environment_id)
    if stored is None:
        raise HTTPException(404, f"no environment {environment_id}")
    difficulty = (stored.get("validation") or {}).get("difficulty", stored["difficulty"])
    try:
        environment = build_environment({**stored, "difficulty": difficulty})
        instance = environment.instance(seed)
        episode = rollout(instance, solution_policy(instance))
        hint = environment.instance(seed).hint()
    except (ValueError, KeyError, TypeError) as error:  # a family that is not installed, tools it cannot use
        raise HTTPException(409, f"environment {environment_id} cannot be instantiated here: {error}") from None
    return {
        "environment_id": environment_id,
        "family": environment.family.name,
        "seed": seed,
        "difficulty": environment.difficulty,
        "solution_reward": episode.reward,
        "hint": hint,
        "messages": episode.messages,
    }


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


@router.get("/api/runs/{run_id}/trajectories")
def run_trajectories(run_id: int, daemon: CurrentDaemon) -> dict[str, Any]:
    """The stored trajectories a generalist run learned from (``train``) and was scored on (``held_out``)."""
    if daemon.runs.run(run_id) is None:
        raise HTTPException(404, f"no training run {run_id}")
    return {"run_id": run_id, **daemon.runs.run_trajectories(run_id)}


@router.get("/api/runs/{run_id}")
def run(run_id: int, daemon: CurrentDaemon) -> dict[str, Any]:
    """One run with its step-by-step progress and, once finished, its evaluation report."""
    item = daemon.runs.run(run_id)
    if item is None:
        raise HTTPException(404, f"no training run {run_id}")
    item["progress"] = read_progress(item["directory"])
    return item
