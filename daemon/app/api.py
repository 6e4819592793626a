"""The daemon's REST API on :8700: the only way other processes reach the store.

Reads are open on the loopback interface; every mutating call needs `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, Field

from daemon.core import metrics
from daemon.core.settings import Settings
from daemon.analysis.diagnosis import capability_diagnosis
from daemon.core.auth import api_token, bearer_matches
from daemon.promotion.lifecycle import IllegalTransition, NotFound
from daemon.promotion.routing_stats import routing_latency, served
from daemon.promotion.router_client import RouterError
from daemon.core.progress import grpo_steps
from daemon.core.progress import read_progress

if TYPE_CHECKING:
    from daemon.app.service import Daemon

VERSION = "0.1.0"


class Feedback(BaseModel):
    trajectory_id: str = Field(min_length=1, max_length=512)
    outcome: Literal["success", "failure"]
    reward: float | None = Field(default=None, ge=-1e9, le=1e9)
    comment: str | None = Field(default=None, max_length=10_000)
    feedback_id: str | None = Field(default=None, max_length=128, description="Re-sending the same id updates it.")


class TrainRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=2_000)


class Decide(BaseModel):
    reason: str = Field(default="", max_length=2_000, description="Why; required to reject or roll back.")


class Relabel(BaseModel):
    capability: str | None = None


class Discover(BaseModel):
    samples: int = Field(default=4, ge=1, le=20, description="Trajectories of each outcome shown to the model.")
    max_capabilities: int = Field(default=10, ge=1, le=10)


def authorized(request: Request) -> str:
    """The caller's name, for mutating calls ("admin" for the main token, else the name of the
    [api.tokens] entry); 401 without a right bearer token."""
    header = request.headers.get("authorization", "")
    if bearer_matches(header, request.app.state.api_token):
        return "admin"
    for name, token in request.app.state.named_tokens.items():
        if token and bearer_matches(header, token):
            return name
    raise HTTPException(401, "missing or wrong bearer token (see [api] token or <store dir>/api.token)")


Caller = Annotated[str, Depends(authorized)]
Limit = Annotated[int, Query(ge=1)]
Offset = Annotated[int, Query(ge=0)]


def create_api(daemon: Daemon) -> FastAPI:
    """The FastAPI application of one running daemon."""
    api = FastAPI(title="tracefix daemon", version=VERSION)
    api.state.api_token = api_token(daemon.settings, create=True)
    api.state.named_tokens = dict(daemon.settings.api.tokens)
    max_page = daemon.settings.api.max_page

    @api.get("/healthz")
    def healthz() -> JSONResponse:
        healthy, problems = daemon.health()
        return JSONResponse({"status": "ok" if healthy else "degraded", "problems": problems}, 200 if healthy else 503)

    @api.get("/metrics")
    def prometheus_metrics() -> Response:
        metrics.DATABASE_BYTES.set(daemon.store.database_bytes())
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @api.get("/api/status")
    def status() -> dict[str, Any]:
        # Positions before counts: counts then include at least everything the positions claim.
        ingest = {
            "committed_batch": daemon.writer.committed_batch,
            "assembled_batch": daemon.assembler.assembled_batch,
            "writer_queue_rows": int(metrics.WRITER_QUEUE._value.get()),
        }
        counts = daemon.store.counts()
        healthy, problems = daemon.health()
        return {
            "version": VERSION,
            "healthy": healthy,
            "problems": problems,
            "uptime_s": round(time.monotonic() - daemon.started_at, 1),
            "database": {
                "path": str(daemon.store.path),
                "bytes": daemon.store.database_bytes(),
                "schema_version": daemon.store.schema_version(),
            },
            "counts": {
                name: counts.get(name, 0)
                for name in ("spans", "logs", "trajectories", "messages", "tool_calls", "tool_definitions")
            },
            "outcomes": {name: counts.get(name, 0) for name in ("success", "failure", "unknown")},
            "ingest": ingest,
            "analysis": daemon.last_analysis,
            "capabilities": daemon.registry.names(),
            "plugin_errors": daemon.registry.errors,
            "endpoints": daemon.endpoints,
        }

    @api.get("/api/capabilities")
    def capabilities() -> dict[str, Any]:
        """Each capability's overview, and a diagnosis (or null) when failures go unexplained by rules alone."""
        items = daemon.capability_overview()
        return {"items": items, "diagnosis": capability_diagnosis(items, daemon.settings)}

    @api.get("/api/capabilities/{name}")
    def capability(name: str, window: str | None = None) -> dict[str, Any]:
        if name not in daemon.registry:
            raise HTTPException(404, f"unknown capability {name!r}; known: {', '.join(daemon.registry.names())}")
        overview = next(item for item in daemon.capability_overview() if item["name"] == name)
        window = window or daemon.settings.analysis.selection_window
        overview["history"] = daemon.analysis_store.stats_history(name, window)
        overview["transitions"] = daemon.analysis_store.transitions(name)
        return overview

    @api.post("/api/capabilities/{name}/train", status_code=202)
    def train(name: str, caller: Caller, body: TrainRequest | None = None) -> dict[str, Any]:
        if name not in daemon.registry:
            raise HTTPException(404, f"unknown capability {name!r}; known: {', '.join(daemon.registry.names())}")
        if daemon.analysis_store.open_training_request(name) is not None:
            raise HTTPException(409, f"a training request for {name} is already open")
        reason = (body.reason if body else None) or "requested through the API"
        request = daemon.analysis_store.create_training_request(name, "manual", reason, caller, None)
        metrics.TRAINING_REQUESTS.labels(name, "manual").inc()
        return request

    @api.get("/api/environments")
    def environments(capability: str | None = None) -> dict[str, Any]:
        """Stored environment specs with their check reports."""
        return {"items": daemon.analysis_store.environments(capability)}

    @api.get("/api/tools")
    def tools(service: str | None = None) -> dict[str, Any]:
        """Tool definitions seen per agent (service.name): what environments are built from."""
        return {"items": daemon.analysis_store.tool_definitions(service)}

    @api.get("/api/training_requests")
    def training_requests(status: str | None = None) -> dict[str, Any]:
        return {"items": daemon.analysis_store.training_requests(status)}

    @api.get("/api/runs")
    def runs(capability: str | None = None) -> dict[str, Any]:
        """Training runs, newest first, each with its latest GRPO step record (``progress``) and its
        latest record of any phase (``latest``: a warm-start update, a GRPO step, an evaluation part)."""
        items = daemon.adapter_registry.runs(capability)
        for item in items:
            history = read_progress(item["directory"])
            steps = grpo_steps(history)
            item["progress"] = steps[-1] if steps else None
            item["latest"] = history[-1] if history else None
        return {"items": items}

    @api.get("/api/runs/{run_id}")
    def run(run_id: int) -> dict[str, Any]:
        """One run with its step-by-step progress and, once finished, its evaluation report."""
        item = daemon.adapter_registry.run(run_id)
        if item is None:
            raise HTTPException(404, f"no training run {run_id}")
        item["progress"] = read_progress(item["directory"])
        return item

    @api.get("/api/adapters")
    def adapters(capability: str | None = None, state: str | None = None) -> dict[str, Any]:
        return {"items": daemon.adapter_registry.adapters(capability, state)}

    @api.get("/api/adapters/{adapter_id}")
    def adapter(adapter_id: int) -> dict[str, Any]:
        """One adapter version with its evaluation report and, for a canary or live version, its
        routed failure rate against what it is judged by."""
        item = daemon.adapter_registry.adapter(adapter_id)
        if item is None:
            raise HTTPException(404, f"no adapter {adapter_id}")
        return {**item, "routing": daemon.promotion.routing(item)}

    @api.get("/api/routing")
    def routing(window_s: float = Query(3600, gt=0, le=90 * 86400)) -> dict[str, Any]:
        """The router's routing table (mode, live versions, canary splits), per canary or live
        adapter its routed failure rate and verdict so far, and the token-level gate's training state. `router` is null with `router_error`
        when the router cannot be reached."""
        # The gate's state first: it says "serving" only once the router took the gate, so a table read
        # after it is never older than the state (read the other way round, a switch in between showed
        # a serving gate next to the router's previous one).
        gate = daemon.gates.state() or None
        try:
            table, error = daemon.router_admin.routing(), None
        except RouterError as failure:
            table, error = None, str(failure)
        judged = [
            {"adapter_id": item["adapter_id"], "name": f"{item['capability']}@v{item['version']}", "state": item["state"],
             **(daemon.promotion.routing(item) or {})}
            for state in ("canary", "live") for item in daemon.promotion.in_state(state)
        ]  # fmt: skip
        return {
            "router": table, "router_error": error, "adapters": judged, "gate": gate,
            **served(daemon.store, window_s), "latency": routing_latency(f"{daemon.router_admin.base_url}/metrics"),
        }  # fmt: skip

    def decided(call: Any) -> dict[str, Any]:
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

    @api.post("/api/adapters/{adapter_id}/approve")
    def approve(adapter_id: int, caller: Caller, body: Decide | None = None) -> dict[str, Any]:
        """Approve a candidate; the promote job loads it into the router and makes it live."""
        return decided(lambda: daemon.promotion.approve(adapter_id, caller, body.reason if body else ""))

    @api.post("/api/adapters/{adapter_id}/reject")
    def reject(adapter_id: int, body: Decide, caller: Caller) -> dict[str, Any]:
        return decided(lambda: daemon.promotion.reject(adapter_id, caller, body.reason))

    @api.post("/api/adapters/{adapter_id}/rollback")
    def rollback(adapter_id: int, body: Decide, caller: Caller) -> dict[str, Any]:
        """Take a canary or live version out of service; the version it replaced serves again."""
        return decided(lambda: daemon.promotion.rollback(adapter_id, caller, body.reason, daemon.router_admin))

    @api.get("/api/audit")
    def audit(adapter_id: int | None = None, limit: Limit = 200) -> dict[str, Any]:
        """Every human and automatic decision about adapters: who, when, what, why."""
        return {"items": daemon.promotion.audit(adapter_id, min(limit, daemon.settings.api.max_page))}

    @api.post("/api/relabel", status_code=202)
    def relabel(caller: Caller, body: Relabel | None = None) -> dict[str, Any]:
        capability = body.capability if body else None
        if capability is not None and capability not in daemon.registry:
            raise HTTPException(404, f"unknown capability {capability!r}")
        removed = daemon.analyzer.forget(capability)
        return {"labels_removed": removed, "capability": capability}

    @api.post("/api/capabilities/discover")
    def discover(caller: Caller, body: Discover | None = None) -> dict[str, Any]:
        """Ask the [llm] endpoint for capabilities whose absence explains failures (the paper's discovery step)."""
        from daemon.analysis.llm_labeler import ChatClient, LLMOutputError, LLMUnavailable, discover_capabilities

        body = body or Discover()
        store = daemon.analysis_store
        failures = daemon.analyzer.trajectories(store.sample_trajectories("failure", body.samples * 3))
        successes = daemon.analyzer.trajectories(store.sample_trajectories("success", body.samples * 3))
        if not failures or not successes:
            raise HTTPException(409, "discovery needs both failed and successful trajectories; send more traces first")
        known = {capability.name: capability.description for capability in daemon.registry}
        try:
            with ChatClient.from_settings(daemon.settings.llm) as client:
                proposals = discover_capabilities(
                    client, successes, failures, body.max_capabilities, daemon.settings.llm,
                    known=known, samples_per_outcome=body.samples,
                )  # fmt: skip
        except (LLMUnavailable, LLMOutputError) as error:
            raise HTTPException(502, f"discovery failed: {error}") from None
        return {
            "capabilities": proposals,
            "hint": "add the ones you want to config.toml as [[llm.custom]] entries and set [llm] enabled = true",
        }

    @api.get("/api/trajectories")
    def trajectories(
        capability: str | None = None,
        label: Literal["NA", "PRESENT", "LACKING"] | None = None,
        outcome: Literal["success", "failure", "unknown"] | None = None,
        service: str | None = None,
        limit: Limit = 50,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        if limit > max_page:
            raise HTTPException(422, f"limit must be at most {max_page}")
        if label is not None and capability is None:
            raise HTTPException(422, "filtering by label needs a capability")
        if capability is not None and capability not in daemon.registry:
            raise HTTPException(404, f"unknown capability {capability!r}")
        items, total = daemon.analysis_store.list_trajectories(capability, label, outcome, service, limit, offset)
        return {"items": items, "total": total, "limit": limit, "offset": offset}

    @api.get("/api/trajectories/{trajectory_id:path}")
    def trajectory(trajectory_id: str) -> dict[str, Any]:
        found = daemon.analysis_store.trajectory(trajectory_id)
        if found is None:
            raise HTTPException(404, f"no trajectory {trajectory_id!r}")
        return found

    @api.post("/api/feedback", status_code=201)
    def feedback(body: Feedback, caller: Caller) -> dict[str, Any]:
        feedback_id = body.feedback_id or uuid.uuid4().hex
        stored = daemon.analysis_store.add_feedback(
            feedback_id, body.trajectory_id, body.outcome, body.reward, body.comment, caller
        )
        if not stored:
            raise HTTPException(404, f"no trajectory {body.trajectory_id!r} (has it been assembled yet?)")
        return {"feedback_id": feedback_id, "trajectory_id": body.trajectory_id, "outcome": body.outcome}

    return api
