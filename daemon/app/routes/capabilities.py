"""Capabilities: their overview and history, a manual training request, relabeling, and discovery
of new capabilities by the [llm] endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from tracefix.daemon.analysis.diagnosis import capability_diagnosis
from tracefix.daemon.app.routes.dependencies import Caller, CurrentDaemon
from tracefix.daemon.core import metrics, tracks

if TYPE_CHECKING:
    from tracefix.daemon.app.service import Daemon

router = APIRouter()


class TrainRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=2_000)
    agent: str | None = Field(
        default=None, max_length=200, description="The agent (service.name) to train for; default: the only one that sent runs."
    )


class Relabel(BaseModel):
    capability: str | None = None


class Discover(BaseModel):
    samples: int = Field(default=4, ge=1, le=20, description="Trajectories of each outcome shown to the model.")
    max_capabilities: int = Field(default=10, ge=1, le=10)


def known_capability(daemon: Daemon, name: str) -> None:
    """404 naming the known capabilities unless `name` is one."""
    if name not in daemon.registry:
        raise HTTPException(404, f"unknown capability {name!r}; known: {', '.join(daemon.registry.names())}")


@router.get("/api/capabilities")
def capabilities(daemon: CurrentDaemon) -> dict[str, Any]:
    """Each capability's overview, and a diagnosis (or null) when failures go unexplained by rules alone."""
    items = daemon.capability_overview()
    return {"items": items, "diagnosis": capability_diagnosis(items, daemon.settings)}


@router.get("/api/capabilities/{name}")
def capability(name: str, daemon: CurrentDaemon, window: str | None = None, agent: str | None = None) -> dict[str, Any]:
    """One capability's overview, its statistics' history in `window` (over all agents, or `agent`'s
    own) and the transitions of its tracks, newest first."""
    known_capability(daemon, name)
    overview = next(item for item in daemon.capability_overview() if item["name"] == name)
    window = window or daemon.settings.analysis.selection_window
    overview["history"] = daemon.analysis_store.stats_history(name, window, agent=agent or "")
    found = [item for track in {name, *(track["track"] for track in overview["tracks"])} for item in daemon.analysis_store.transitions(track)]
    overview["transitions"] = sorted(found, key=lambda item: item["transition_id"], reverse=True)[:100]
    return overview


@router.post("/api/capabilities/{name}/train", status_code=202)
def train(name: str, caller: Caller, daemon: CurrentDaemon, body: TrainRequest | None = None) -> dict[str, Any]:
    """Open a training request for one agent's track of the capability (``daemon.core.tracks``)."""
    known_capability(daemon, name)
    body = body or TrainRequest()
    services = daemon.analysis_store.services()
    if body.agent is not None and body.agent not in services:
        raise HTTPException(404, f"no runs from agent {body.agent!r}; known: {', '.join(services) or 'none yet'}")
    if body.agent is None and len(services) != 1:
        which = f"name one of {', '.join(services)}" if services else "no agent has sent runs yet"
        raise HTTPException(422, f"which agent's {name} to train: {which} in 'agent'")
    track = tracks.name(name, body.agent or services[0])
    if daemon.analysis_store.open_training_request(track) is not None:
        raise HTTPException(409, f"a training request for {track} is already open")
    request = daemon.analysis_store.create_training_request(track, "manual", body.reason or "requested through the API", caller, None)
    metrics.TRAINING_REQUESTS.labels(track, "manual").inc()
    return request


@router.post("/api/relabel", status_code=202)
def relabel(caller: Caller, daemon: CurrentDaemon, body: Relabel | None = None) -> dict[str, Any]:
    capability = body.capability if body else None
    if capability is not None and capability not in daemon.registry:
        raise HTTPException(404, f"unknown capability {capability!r}")
    removed = daemon.analyzer.forget(capability)
    return {"labels_removed": removed, "capability": capability}


@router.post("/api/capabilities/discover")
def discover(caller: Caller, daemon: CurrentDaemon, body: Discover | None = None) -> dict[str, Any]:
    """Ask the [llm] endpoint for capabilities whose absence explains failures (the paper's discovery step)."""
    from tracefix.daemon.analysis.discovery import discover_capabilities
    from tracefix.daemon.analysis.llm_client import ChatClient, LLMOutputError, LLMUnavailable

    body = body or Discover()
    store = daemon.analysis_store
    failures = daemon.analyzer.trajectories(store.sample_trajectories("failure", body.samples * 3))
    successes = daemon.analyzer.trajectories(store.sample_trajectories("success", body.samples * 3))
    if not failures or not successes:
        raise HTTPException(409, "discovery needs both failed and successful trajectories; send more traces first")
    known = {capability.name: capability.description for capability in daemon.registry}
    try:
        with ChatClient.from_settings(daemon.settings.llm) as client:
            proposals = discover_capabilities(
                client, successes, failures, body.max_capabilities, daemon.settings.llm,
                known=known, samples_per_outcome=body.samples,
            )  # fmt: skip
    except (LLMUnavailable, LLMOutputError) as error:
        raise HTTPException(502, f"discovery failed: {error}") from None
    return {
        "capabilities": proposals,
        "hint": "add the ones you want to config.toml as [[llm.custom]] entries and set [llm] enabled = true",
    }
