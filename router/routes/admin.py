"""The admin API through which the daemon loads, promotes and removes adapter versions and sets the
routing mode; every call needs `Authorization: Bearer <token>`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, field_validator

from tracefix.daemon.core import generalist, tracks
from tracefix.daemon.core.settings import CAPABILITY_NAME
from tracefix.router.backend import AdapterConflict, BackendUnavailable
from tracefix.router.protocol import ApiError
from tracefix.router.routes.dependencies import CurrentBackend, Table, authorized
from tracefix.router.routes.errors import unavailable
from tracefix.router.routing import RoutingError, UnknownAdapter
from tracefix.trainer.adapters import AdapterRejected

router = APIRouter(dependencies=[Depends(authorized)])


class AdapterLoad(BaseModel):
    capability: str = Field(
        max_length=200,
        description="A capability's name, one agent's track of it (<capability>.<agent>), or a generalist's (generalist.<agent>).",
    )
    version: int = Field(ge=1)
    path: str = Field(min_length=1)
    description: str = Field("", max_length=2000, description="What the capability is; the classifier reads it.")
    canary: float | None = Field(
        None, gt=0, lt=1, description="Load as a canary taking this share of the capability's traffic until promoted."
    )
    instructions: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Digests of the agent's system instructions (daemon.core.tracks.instructions_key): a request naming no"
        " agent whose system message has one of them is this agent's.",
    )

    @field_validator("capability")
    @classmethod
    def _capability(cls, capability: str) -> str:
        bare, agent = tracks.capability_of(capability), tracks.agent_of(capability)
        generalist_track = bare == generalist.CAPABILITY and agent is not None
        named = generalist_track or (bare != generalist.CAPABILITY and CAPABILITY_NAME.match(bare) is not None)
        if "@" not in capability and named and (agent is None or tracks.name(bare, agent) == capability):
            return capability
        raise ValueError(
            f"{capability!r} is not a capability name ({CAPABILITY_NAME.pattern}), an agent's track of one (<capability>.<agent>)"
            " or a generalist's (generalist.<agent>)"
        )


    @field_validator("instructions")
    @classmethod
    def _digests(cls, digests: list[str]) -> list[str]:
        wrong = [digest for digest in digests if not tracks.INSTRUCTIONS_KEY.match(digest)]
        if wrong:
            raise ValueError(f"{wrong[0][:40]!r} is not an instructions digest (32 lowercase hex digits)")
        return digests


class RoutingChange(BaseModel):
    mode: str
    adapter: str | None = Field(None, description="With mode 'fixed': a live adapter, its capability, or 'base'.")
    gate: str | None = Field(None, description="With mode 'gate': the gate weights trained for live adapters.")


def adapter_not_found(name: str) -> ApiError:
    return ApiError(404, f"no live adapter named {name!r}", code="adapter_not_found")


@router.post("/admin/adapters")
def load_adapter(body: AdapterLoad, table: Table) -> dict[str, Any]:
    try:
        return table.add(body.capability, body.version, Path(body.path), body.description, body.canary, body.instructions)
    except AdapterRejected as error:
        raise ApiError(422, str(error), code="adapter_rejected", param="path") from None
    except AdapterConflict as error:
        raise ApiError(409, str(error), code="adapter_exists") from None
    except BackendUnavailable as error:
        raise unavailable(error) from None


@router.post("/admin/adapters/{name}/promote")
def promote_adapter(name: str, table: Table) -> dict[str, Any]:
    try:
        return table.promote(name)
    except UnknownAdapter:
        raise adapter_not_found(name) from None
    except RoutingError as error:
        raise ApiError(409, str(error), code="not_a_canary") from None


@router.delete("/admin/adapters/{name}")
def remove_adapter(name: str, table: Table) -> dict[str, Any]:
    try:
        return table.remove(name)
    except UnknownAdapter:
        raise adapter_not_found(name) from None


@router.put("/admin/routing")
def change_routing(body: RoutingChange, table: Table) -> dict[str, Any]:
    try:
        return table.set_mode(body.mode, body.adapter, body.gate)
    except RoutingError as error:
        raise ApiError(400, str(error), param="mode") from None


@router.get("/admin/routing")
def routing(table: Table, backend: CurrentBackend) -> dict[str, Any]:
    """The routing table, with the serving engine's health ("ok", "degraded: …", or why it is down)."""
    return {**table.snapshot(), "health": backend.health}
