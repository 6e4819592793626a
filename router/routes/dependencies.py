"""What a route handler receives besides its own parameters: the backend, its routing table, the
telemetry, the router's settings and start time, kept on `app.state` by `create_app`; and the admin
check."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tracefix.daemon.core.auth import bearer_matches
from tracefix.daemon.core.settings import RouterSettings
from tracefix.router.backend import Backend
from tracefix.router.protocol import ApiError
from tracefix.router.routing import RoutingTable
from tracefix.router.telemetry import Telemetry


def current_backend(request: Request) -> Backend:
    return request.app.state.backend


def routing_table(request: Request) -> RoutingTable:
    return request.app.state.table


def telemetry(request: Request) -> Telemetry:
    return request.app.state.telemetry


def router_settings(request: Request) -> RouterSettings:
    return request.app.state.settings


def started(request: Request) -> int:
    """When the router started (Unix seconds): the base model's `created`."""
    return request.app.state.started


def authorized(request: Request) -> None:
    """Nothing for the right bearer token; a 401 in OpenAI's shape for any other."""
    if not bearer_matches(request.headers.get("authorization", ""), request.app.state.token):
        raise ApiError(
            401,
            "missing or wrong bearer token (see [router] token or <store dir>/router.token)",
            code="invalid_api_key",
            kind="authentication_error",
        )


CurrentBackend = Annotated[Backend, Depends(current_backend)]
Table = Annotated[RoutingTable, Depends(routing_table)]
CurrentTelemetry = Annotated[Telemetry, Depends(telemetry)]
Config = Annotated[RouterSettings, Depends(router_settings)]
Started = Annotated[int, Depends(started)]
