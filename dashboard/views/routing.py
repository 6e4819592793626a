"""Routing: which versions serve (live, and canaries on a share of their capability's traffic), how
the router routes (mode, gate, canary splits, loaded adapters), and each canary's and live
version's routed failure rate against what it is judged by — the comparison that promotes it or
rolls it back.

The registry's side comes from GET /api/adapters; the router's side from GET /api/routing, which
carries the router's routing table (or the reason it could not be read) and the judged versions.
Requests and tokens per expert, per-token gate shares and routing latency are drawn when the
endpoint reports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from tracefix.daemon.core.states import SERVING_STATES
from tracefix.dashboard import charts
from tracefix.dashboard.page import PageContext, interval, show
from tracefix.dashboard.routing_stats import expert_rows, snapshot_of

def render_serving(adapters: list[Mapping[str, Any]]) -> None:
    """The versions the registry says serve traffic."""
    st.header("Serving versions")
    serving = [adapter for adapter in adapters if adapter["state"] in SERVING_STATES]
    if not serving:
        st.info(
            "No adapter is live: the router serves the base model only. Approve a candidate on the Adapters page.",
            icon=":material/info:",
        )
        return
    rows = []
    for adapter in serving:
        target = (adapter.get("evaluation") or {}).get("target") or {}
        rows.append(
            {
                "served as": f"{adapter['capability']}@v{adapter['version']}",
                "state": adapter["state"],
                "since": adapter.get("updated_at"),
                "held-out gain": target.get("gain"),
                "why": adapter.get("state_reason") or "",
                "router error": adapter.get("last_error") or "",
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config={"held-out gain": st.column_config.NumberColumn(format="%+.2f")})


def render_table(snapshot: Mapping[str, Any], base_name: str) -> None:
    """The router's routing table: mode, the version each capability routes to, canary splits."""
    columns = st.columns(3)
    columns[0].metric("routing mode", snapshot.get("mode", "—"))
    columns[1].metric("fixed to", snapshot.get("fixed") or "—")
    gate = snapshot.get("gate") or {}
    columns[2].metric("gate experts", len(gate.get("adapters") or []) if gate else "—")
    canaries = snapshot.get("canaries") or {}
    routes = [
        {
            "capability": capability,
            "routes to": snapshot.get("capabilities", {}).get(capability) or base_name,
            "canary": (canaries.get(capability) or {}).get("name") or "",
            "canary share": (canaries.get(capability) or {}).get("share"),
        }
        for capability in sorted({*(snapshot.get("capabilities") or {}), *canaries})
    ]
    if routes:
        st.markdown("**Routes and canary splits**")
        share = st.column_config.ProgressColumn(format="%.2f", min_value=0.0, max_value=1.0)
        st.dataframe(pd.DataFrame(routes), hide_index=True, column_config={"canary share": share})
    adapters = snapshot.get("adapters") or []
    if adapters:
        st.markdown("**Loaded adapters**")
        st.dataframe(pd.DataFrame(adapters), hide_index=True)
    else:
        st.caption("The router has no adapter loaded; it serves the base model.")


def comparison_table(judged: list[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for item in judged:
        own, reference, verdict = item.get("adapter") or {}, item.get("reference") or {}, item.get("verdict") or {}
        total, needed = own.get("total", 0), item.get("needed")
        if not verdict:
            decision = "not routed yet"
        elif needed is not None and total < needed:
            decision = f"waiting: {total} of {needed} routed trajectories with outcomes"
        else:
            decision = "worse" if verdict.get("worse") else "not worse"
        rows.append(
            {
                "version": item["name"],
                "state": item["state"],
                "failure rate": own.get("rate"),
                "95 % interval": interval(*(own.get("interval") or [None, None])[:2]),
                "failed / routed": f"{own.get('failures', 0)} / {total}",
                "judged against": reference.get("name", ""),
                "its failure rate": reference.get("rate"),
                "its interval": interval(*(reference.get("interval") or [None, None])[:2]),
                "difference": verdict.get("delta"),
                "verdict": decision,
                "why": verdict.get("reason", ""),
            }
        )
    return pd.DataFrame(rows)


def render_comparison(judged: list[Mapping[str, Any]]) -> None:
    st.subheader("Canary and live comparison")
    if not judged:
        st.caption("No canary or live version to judge.")
        return
    st.dataframe(
        comparison_table(judged),
        hide_index=True,
        column_config={
            name: st.column_config.NumberColumn(format="%.2f") for name in ("failure rate", "its failure rate", "difference")
        },
    )
    measured = [item for item in judged if item.get("adapter")]
    if measured:
        st.altair_chart(charts.routed_failure_rates(measured))
        st.caption(
            "A canary goes live when the interval of its difference does not lie above zero; a live version is rolled "
            "back when it does."
        )


def render_experts(data: Mapping[str, Any]) -> None:
    st.subheader("Requests and tokens per expert")
    rows = expert_rows(data)
    series = data.get("series") or []
    if series:
        left, right = st.columns(2)
        with left:
            st.altair_chart(charts.expert_series(series, "requests", "requests"))
        with right:
            st.altair_chart(charts.expert_series(series, "tokens", "tokens"))
    if rows:
        left, right = st.columns(2)
        with left:
            st.altair_chart(charts.expert_totals(rows, "requests", "requests since the router started"))
        with right:
            st.altair_chart(charts.expert_totals(rows, "tokens", "tokens since the router started"))
    if not rows and not series:
        st.caption(
            "Not reported by this daemon: GET /api/routing carries no per-expert counters yet (the router counts them in "
            "its /metrics as tracefix_router_requests_total and tracefix_router_tokens_total)."
        )


def render_gate(data: Mapping[str, Any], snapshot: Mapping[str, Any]) -> None:
    shares = data.get("token_shares") or []
    if isinstance(shares, Mapping):
        shares = [{"expert": name, "share": value} for name, value in shares.items()]
    if not shares and not snapshot:
        return  # nothing known about the router's mode
    st.subheader("Per-token expert shares (gate)")
    if shares:
        rows = [{"expert": row["expert"], "share": row["share"]} for row in shares]
        st.altair_chart(charts.expert_totals(rows, "share", "mean gate weight per token"))
    elif snapshot.get("mode") == "gate":
        st.caption("The gate has reported no token shares yet.")
    else:
        st.caption(f"Only in routing mode 'gate' (now '{snapshot.get('mode', 'unknown')}').")


def render_latency(data: Mapping[str, Any]) -> None:
    latency = data.get("latency") or {}
    if not latency:
        return
    st.subheader("Routing latency")
    flat = {key: value for key, value in latency.items() if isinstance(value, (int, float))}
    if flat:
        columns = st.columns(len(flat))
        for column, (key, value) in zip(columns, flat.items(), strict=True):
            column.metric(key.replace("_", " "), f"{value:.2f}")
    nested = [{"by": key, **value} for key, value in latency.items() if isinstance(value, Mapping)]
    if nested:
        st.dataframe(pd.DataFrame(nested), hide_index=True)


def render(context: PageContext) -> None:
    api = context.api
    st.title("Routing")
    render_serving(api.get("/api/adapters")["items"])
    st.header("Router")
    data = api.get_optional("/api/routing")
    if data is None:
        st.info(
            "Routing statistics are not available: this daemon does not serve GET /api/routing. The serving versions "
            "above come from the adapter registry.",
            icon=":material/info:",
        )
        return
    problem = data.get("router_error") or data.get("error")
    if problem or data.get("reachable") is False:
        st.warning(f"The router did not answer: {problem or 'unreachable'}", icon=":material/cloud_off:")
    snapshot = snapshot_of(data)
    health = (data.get("router") or {}).get("health") if isinstance(data.get("router"), Mapping) else None
    if health and health != "ok":
        st.warning(f"The router's serving engine: {health}", icon=":material/warning:")
    if snapshot:
        render_table(snapshot, context.settings.router.model_name)
    render_comparison([item for item in data.get("adapters") or [] if isinstance(item, Mapping) and "name" in item])
    render_experts(data)
    render_gate(data, snapshot)
    render_latency(data)


show(render)
