"""Trajectories: the filtered list, one trajectory with its messages and labels, and outcome feedback."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from tracefix.daemon.app.routes.dependencies import Caller, CurrentDaemon, Limit, Offset

router = APIRouter()


class Feedback(BaseModel):
    trajectory_id: str = Field(min_length=1, max_length=512)
    outcome: Literal["success", "failure"]
    reward: float | None = Field(default=None, ge=-1e9, le=1e9)
    comment: str | None = Field(default=None, max_length=10_000)
    feedback_id: str | None = Field(default=None, max_length=128, description="Re-sending the same id updates it.")


@router.get("/api/trajectories")
def trajectories(
    daemon: CurrentDaemon,
    capability: str | None = None,
    label: Literal["NA", "PRESENT", "LACKING"] | None = None,
    outcome: Literal["success", "failure", "unknown"] | None = None,
    service: str | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> dict[str, Any]:
    max_page = daemon.settings.api.max_page
    if limit > max_page:
        raise HTTPException(422, f"limit must be at most {max_page}")
    if label is not None and capability is None:
        raise HTTPException(422, "filtering by label needs a capability")
    if capability is not None and capability not in daemon.registry:
        raise HTTPException(404, f"unknown capability {capability!r}")
    items, total = daemon.analysis_store.list_trajectories(capability, label, outcome, service, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


# `:path`: trajectory ids may hold '/'.
@router.get("/api/trajectories/{trajectory_id:path}")
def trajectory(trajectory_id: str, daemon: CurrentDaemon) -> dict[str, Any]:
    found = daemon.analysis_store.trajectory(trajectory_id)
    if found is None:
        raise HTTPException(404, f"no trajectory {trajectory_id!r}")
    return found


@router.post("/api/feedback", status_code=201)
def feedback(body: Feedback, caller: Caller, daemon: CurrentDaemon) -> dict[str, Any]:
    feedback_id = body.feedback_id or uuid.uuid4().hex
    stored = daemon.analysis_store.add_feedback(
        feedback_id, body.trajectory_id, body.outcome, body.reward, body.comment, caller
    )
    if not stored:
        raise HTTPException(404, f"no trajectory {body.trajectory_id!r} (has it been assembled yet?)")
    return {"feedback_id": feedback_id, "trajectory_id": body.trajectory_id, "outcome": body.outcome}
