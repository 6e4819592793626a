"""The daemon's REST API on :8700: the only way other processes reach the store.

Reads are open on the loopback interface; every mutating call needs `Authorization: Bearer <token>`.
The endpoints live in `daemon.app.routes`, one module per group; handlers reach the daemon
through `app.state.daemon`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from tracefix.daemon.app.routes import adapters, agents, capabilities, health, pipeline, routing, status, trajectories
from tracefix.daemon.core.auth import api_token

if TYPE_CHECKING:
    from tracefix.daemon.app.service import Daemon

VERSION = "0.1.0"
ROUTERS = (
    health.router, status.router, capabilities.router, pipeline.router,
    adapters.router, routing.router, trajectories.router, agents.router,
)  # fmt: skip


def create_api(daemon: Daemon) -> FastAPI:
    """The FastAPI application of one running daemon."""
    api = FastAPI(title="tracefix daemon", version=VERSION)
    api.state.daemon = daemon
    api.state.api_token = api_token(daemon.settings, create=True)
    api.state.named_tokens = dict(daemon.settings.api.tokens)
    api.state.delegates = frozenset(daemon.settings.api.delegates)
    for router in ROUTERS:
        api.include_router(router)
    return api
