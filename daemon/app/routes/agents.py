"""Agents: who sends trajectories, each one's own capability statistics, and its profile (what its
policy requires before a change, with the evidence: daemon/analysis/profile.py).

One tracefix daemon often watches several agents (services, or named agents inside one service) or
several policies of one agent. Each service is its own loop (``daemon.core.tracks``): its own
statistics select its gaps, and its tracks train on its own tools; another policy's successes lend
it no contrast. The statistics over all agents are shown beside them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from tracefix.daemon.app.routes.dependencies import CurrentDaemon
from tracefix.daemon.core import tracks
from tracefix.daemon.core.states import CapabilityState

router = APIRouter()


@router.get("/api/agents")
def agents(daemon: CurrentDaemon) -> dict[str, Any]:
    """Each agent (service.name, and gen_ai.agent.name where the spans give one) with its trajectory
    counts by outcome; `refused`: the [[capabilities.agents]] overrides not applied, with the name."""
    return {"items": daemon.analysis_store.agents(), "refused": daemon.analyzer.refused_overrides()}


@router.get("/api/agents/{agent}/profile")
def agent_profile(agent: str, daemon: CurrentDaemon) -> dict[str, Any]:
    """What the agent's policy requires before a change — confirmation, a read first, whether the
    user's own request authorizes — each rule with its value (true, false or null: undecided),
    its source and its evidence, as the labelers consult it; derived now when not yet derived."""
    if agent not in daemon.analysis_store.services():
        known = daemon.analysis_store.services()
        raise HTTPException(404, f"no trajectories from agent {agent!r}; known: {', '.join(known) or 'none yet'}")
    profile = daemon.analyzer.profiles.get(agent)
    if profile is None:
        daemon.analyzer.profiles.refresh([agent], force=True)
        profile = daemon.analyzer.profiles.get(agent)
    return profile.to_dict() if profile else {}


@router.get("/api/agents/{agent}/capabilities")
def agent_capabilities(agent: str, daemon: CurrentDaemon, window: str | None = None) -> dict[str, Any]:
    """Every capability's statistics over the trajectories of one agent in one window (default: the
    selection window). For a service, the latest analysis pass's own rows, which drive its tracks:
    each item carries its track's name and state. For a gen_ai.agent.name inside services, computed
    now over the runs that name it; they trigger nothing, and `selected` says what the rule would
    decide on them."""
    known = {name for item in daemon.analysis_store.agents() for name in (item["service_name"], item["agent_name"]) if name}
    if agent not in known:
        raise HTTPException(404, f"no trajectories from agent {agent!r}; known: {', '.join(sorted(known)) or 'none yet'}")
    window = window or daemon.settings.analysis.selection_window
    windows = {*daemon.settings.analysis.windows, daemon.settings.analysis.selection_window}
    if window not in windows:
        raise HTTPException(422, f"unknown window {window!r}; configured: {', '.join(sorted(windows))}")
    if agent in daemon.analysis_store.services():
        own = {track["track"]: track for found in daemon.capability_tracks(agent).values() for track in found}
        rows = [row for row in daemon.analysis_store.stats(agent=agent) if row["window_name"] == window]
        for row in rows:
            track = own.get(tracks.name(row["capability"], agent), {})
            row.update(track=tracks.name(row["capability"], agent), state=track.get("state", CapabilityState.HEALTHY), state_reason=track.get("state_reason"))
        return {"agent": agent, "window": window, "items": rows, "drives_tracks": True}
    rows = [row for row in daemon.analyzer.agent_stats(agent) if row["window_name"] == window]
    return {"agent": agent, "window": window, "items": rows, "drives_tracks": False}
