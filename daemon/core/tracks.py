"""A track: one agent's loop for one capability. Each agent (its ``service.name``) has its own
selection, trigger state, training requests, environments and adapters for every capability, so
two agents with different tools and policies never share a diagnosis or an adapter's environment.

A track is named ``<capability>.<agent>`` (``tool_call_precision.checkout-agent``); the name is the
key of its state, its requests, environments and runs, and its adapters are served as
``<capability>.<agent>@v<N>``. A capability name is snake_case and never holds a ``.``, so the first
``.`` separates the two. The generalist is the track of the capability ``generalist``
(``daemon.core.generalist``). A bare capability name (a track of no agent) is still valid: an
adapter trained or loaded for it serves any agent.
"""

from __future__ import annotations

import hashlib
import re

SEPARATOR = "."
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe(agent: str) -> str:
    """The agent's name as it appears in a track: characters other than letters, digits, ``.``, ``_``
    and ``-`` become ``-`` (the name is also a served model name and a path)."""
    if not agent:
        raise ValueError("a track needs the agent's name")
    return _UNSAFE.sub("-", agent)


def name(capability: str, agent: str | None) -> str:
    """The track of `capability` for `agent` (the bare capability for no agent)."""
    return capability if not agent else capability + SEPARATOR + safe(agent)


def _unversioned(track: str) -> str:
    return track.split("@v", 1)[0]


def capability_of(track: str) -> str:
    """The capability of a track or of a served ``<track>@v<N>``."""
    return _unversioned(track).split(SEPARATOR, 1)[0]


def agent_of(track: str) -> str | None:
    """The (made-safe) agent of a track or served name; None for a bare capability."""
    parts = _unversioned(track).split(SEPARATOR, 1)
    return parts[1] if len(parts) == 2 else None


def serves(track: str, agent: str | None) -> bool:
    """Whether the adapters of `track` may serve a request of `agent` (None: the request names none):
    a bare capability's serve anyone; an agent's track serves that agent only."""
    own = agent_of(track)
    return own is None or (agent is not None and own == safe(agent))


INSTRUCTIONS_KEY = re.compile(r"^[0-9a-f]{32}$")


def instructions_key(text: str) -> str:
    """How the router recognises an agent by its system instructions without storing them: a digest
    of the text with its whitespace collapsed (the daemon sends the digests of each agent's
    instructions with its adapters; a request's system message is digested the same way)."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:32]
