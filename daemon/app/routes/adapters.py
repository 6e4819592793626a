"""Adapter versions and the decisions about them: approve, reject, roll back, and the audit log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from tracefix.daemon.core import generalist
from tracefix.daemon.app.routes.dependencies import Caller, CurrentDaemon, Limit
from tracefix.daemon.promotion.lifecycle import IllegalTransition, NotFound
from tracefix.daemon.promotion.router_client import RouterError

router = APIRouter()


class Decide(BaseModel):
    reason: str = Field(default="", max_length=2_000, description="Why; required to reject or roll back.")


def decided(call: Callable[[], Any]) -> dict[str, Any]:
    """The decisions `call` made, or the HTTP status its refusal means."""
    try:
        decisions = call()
    except NotFound as error:
        raise HTTPException(404, str(error)) from None
    except IllegalTransition as error:
        raise HTTPException(409, str(error)) from None
    except RouterError as error:
        raise HTTPException(502, str(error)) from None
    except ValueError as error:
        raise HTTPException(422, str(error)) from None
    decisions = decisions if isinstance(decisions, list) else [decisions]
    return {"decisions": [asdict(decision) for decision in decisions]}


@router.get("/api/adapters")
def adapters(daemon: CurrentDaemon, capability: str | None = None, state: str | None = None) -> dict[str, Any]:
    return {"items": daemon.runs.adapters(capability, state)}


@router.get("/api/adapters/{adapter_id}")
def adapter(adapter_id: int, daemon: CurrentDaemon) -> dict[str, Any]:
    """One adapter version with its evaluation report and, for a canary or live version, its
    routed failure rate against what it is judged by."""
    item = daemon.runs.adapter(adapter_id)
    if item is None:
        raise HTTPException(404, f"no adapter {adapter_id}")
    run = daemon.runs.run(item["run_id"]) or {}
    return {**item, "kind": run.get("kind") or "targeted", "agent": run.get("agent"), "starts_from": run.get("starts_from"),
            "routing": daemon.promotion.routing(item)}  # fmt: skip


@router.get("/api/adapters/{adapter_id}/trajectories")
def learned_from(adapter_id: int, daemon: CurrentDaemon) -> dict[str, Any]:
    """The stored trajectories a generalist learned from (``train``) and was scored on (``held_out``);
    empty for an adapter trained on an environment."""
    item = daemon.runs.adapter(adapter_id)
    if item is None:
        raise HTTPException(404, f"no adapter {adapter_id}")
    return {"adapter_id": adapter_id, **daemon.runs.run_trajectories(item["run_id"])}


@router.get("/api/generalists")
def generalists(daemon: CurrentDaemon) -> dict[str, Any]:
    """Each agent the generalist stage has looked at: why its generalist is not training now (or
    null), and its generalist's versions."""
    waiting = dict(daemon.training.generalist.waiting)
    versions = daemon.runs.generalists()
    agents = sorted({*waiting, *(run["agent"] for run in daemon.runs.runs(limit=1000) if run.get("kind") == "generalist")})
    return {
        "enabled": daemon.settings.generalist.enabled,
        "items": [
            {"agent": agent, "capability": generalist.capability(agent), "waiting": waiting.get(agent),
             "adapters": [item for item in versions if item["capability"] == generalist.capability(agent)]}
            for agent in agents
        ],
    }  # fmt: skip


@router.post("/api/adapters/{adapter_id}/approve")
def approve(adapter_id: int, caller: Caller, daemon: CurrentDaemon, body: Decide | None = None) -> dict[str, Any]:
    """Approve a candidate; the promote job (woken now) loads it into the router and makes it live."""
    decision = decided(lambda: daemon.promotion.approve(adapter_id, caller, body.reason if body else ""))
    daemon.wake("promote")
    return decision


@router.post("/api/adapters/{adapter_id}/reject")
def reject(adapter_id: int, body: Decide, caller: Caller, daemon: CurrentDaemon) -> dict[str, Any]:
    return decided(lambda: daemon.promotion.reject(adapter_id, caller, body.reason))


@router.post("/api/adapters/{adapter_id}/rollback")
def rollback(adapter_id: int, body: Decide, caller: Caller, daemon: CurrentDaemon) -> dict[str, Any]:
    """Take a canary or live version out of service; the version it replaced serves again."""
    return decided(lambda: daemon.promotion.rollback(adapter_id, caller, body.reason, daemon.router_admin))


@router.get("/api/audit")
def audit(daemon: CurrentDaemon, adapter_id: int | None = None, limit: Limit = 200) -> dict[str, Any]:
    """Every human and automatic decision about adapters: who, when, what, why."""
    return {"items": daemon.promotion.audit(adapter_id, min(limit, daemon.settings.api.max_page))}
