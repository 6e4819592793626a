"""Agents: who sends trajectories, each one's own capability statistics, and its profile (what its
policy requires before a change, with the evidence: daemon/analysis/profile.py).

One tracefix daemon often watches several agents (services, or named agents inside one service) or
several policies of one agent. The selection statistics pool them all; an agent's own view counts
only its trajectories, so another policy's successes lend it no contrast.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from daemon.app.routes.dependencies import CurrentDaemon

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
    """Every capability's statistics over the trajectories of one agent (matched by service.name or
    gen_ai.agent.name) in one window (default: the selection window), computed now with the
    selection thresholds. They are not stored and trigger nothing; `selected` says what the rule
    would decide on this agent's runs alone."""
    known = {name for item in daemon.analysis_store.agents() for name in (item["service_name"], item["agent_name"]) if name}
    if agent not in known:
        raise HTTPException(404, f"no trajectories from agent {agent!r}; known: {', '.join(sorted(known)) or 'none yet'}")
    window = window or daemon.settings.analysis.selection_window
    windows = {*daemon.settings.analysis.windows, daemon.settings.analysis.selection_window}
    if window not in windows:
        raise HTTPException(422, f"unknown window {window!r}; configured: {', '.join(sorted(windows))}")
    rows = [row for row in daemon.analyzer.agent_stats(agent) if row["window_name"] == window]
    return {"agent": agent, "window": window, "items": rows}
