"""The routing page: the router's table, each served adapter's verdict so far, the gate's state."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from tracefix.daemon.app.routes.dependencies import CurrentDaemon
from tracefix.daemon.core.states import SERVING_STATES
from tracefix.daemon.promotion.router_client import RouterError
from tracefix.daemon.promotion.served_traffic import routing_latency, served

router = APIRouter()


@router.get("/api/routing")
def routing(daemon: CurrentDaemon, window_s: float = Query(3600, gt=0, le=90 * 86400)) -> dict[str, Any]:
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
        for state in SERVING_STATES for item in daemon.promotion.in_state(state)
    ]  # fmt: skip
    return {
        "router": table, "router_error": error, "adapters": judged, "gate": gate,
        **served(daemon.store, window_s), "latency": routing_latency(daemon.router_admin.metrics()),
    }  # fmt: skip
