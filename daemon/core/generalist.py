"""The generalist: one adapter per agent, learned by imitation from the agent's successful runs, that
serves the agent's traffic where no capability-targeted adapter does. It is the agent's track of the
capability ``generalist`` (``daemon.core.tracks``: ``generalist.<agent>``), with adapters named like
any other (``<track>@v<N>``), so the promotion lifecycle, the canary and the router's versioned hot
swap handle it as they handle a capability.

An agent is named by its ``service.name`` (or ``gen_ai.agent.name``); in the router a request names
its agent in OpenAI's request ``metadata`` (``{"agent": ...}``).
"""

from __future__ import annotations

from tracefix.daemon.core import tracks

CAPABILITY = "generalist"
PREFIX = CAPABILITY + tracks.SEPARATOR
METADATA_KEY = "agent"  # the request metadata key that names the agent to the router


def capability(agent: str) -> str:
    """The track a generalist of `agent` is served and stored under (the agent's name made safe)."""
    if not agent:
        raise ValueError("a generalist needs the agent's name")
    return tracks.name(CAPABILITY, agent)


def is_generalist(name: str) -> bool:
    """Whether `name` (a track, or a served ``<track>@v<N>``) is a generalist's."""
    return name.startswith(PREFIX)


def agent_of(name: str) -> str | None:
    """The (made-safe) agent of a generalist track or served name; None for anything else."""
    return tracks.agent_of(name) if is_generalist(name) else None
