"""The generalist: one adapter per agent, learned by imitation from the agent's successful runs, that
serves the agent's traffic where no capability-targeted adapter does. Its adapters are named like
any other (``<capability>@v<N>``) under the capability ``generalist.<agent>``, so the promotion
lifecycle, the canary and the router's versioned hot swap handle it as they handle a capability.

An agent is named by its ``service.name`` (or ``gen_ai.agent.name``); in the router a request names
its agent in OpenAI's request ``metadata`` (``{"agent": ...}``).
"""

from __future__ import annotations

import re

PREFIX = "generalist."
METADATA_KEY = "agent"  # the request metadata key that names the agent to the router
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def capability(agent: str) -> str:
    """The capability name a generalist of `agent` is served and stored under. Characters other than
    letters, digits, ``.``, ``_`` and ``-`` become ``-``: the name is also a model name and a path."""
    if not agent:
        raise ValueError("a generalist needs the agent's name")
    return PREFIX + _UNSAFE.sub("-", agent)


def is_generalist(name: str) -> bool:
    """Whether `name` (a capability, or a served ``<capability>@v<N>``) is a generalist's."""
    return name.startswith(PREFIX)


def agent_of(name: str) -> str | None:
    """The (made-safe) agent of a generalist capability or served name; None for anything else."""
    if not is_generalist(name):
        return None
    return name[len(PREFIX) :].split("@v", 1)[0]
