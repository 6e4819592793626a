"""Capability health: per capability, how often failed and successful runs lack it, the gap (Δ), its
coverage, the failure rate with its interval and the trend over analysis passes, with the paper's
selection thresholds drawn. Selected capabilities (those that trigger training) are highlighted; when
failed runs go unexplained while only rules label them, the daemon's diagnosis is shown above the table.
Below, per agent, its generalist's state or why it waits; with one agent chosen, its profile: what its
policy requires before a change, with the evidence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import streamlit as st

from tracefix.daemon.core.states import CapabilityState
from tracefix.dashboard import agent_profile, charts, generalist, llm_labels
from tracefix.dashboard.capability_table import health_table, render_table, stats_row
from tracefix.dashboard.page import PageContext, no_traces, show


ALL_AGENTS = "all agents"
AGENT_HELP = (
    "The selection pools every agent's trajectories (another agent's or policy's successes are the contrast). "
    "One agent's own statistics count only the trajectories whose service.name or gen_ai.agent.name it is."
)


def scoped(items: list[dict[str, Any]], agent: Mapping[str, Any], window: str) -> list[dict[str, Any]]:
    """The capabilities with one agent's own statistics in `window` instead of those over all agents.
    A service's rows drive its own tracks: they show its selection and each track's state. Rows of a
    gen_ai.agent.name inside services select nothing, so none is highlighted as selected."""
    drives = agent.get("drives_tracks", False)
    own = {row["capability"]: row if drives else {**row, "selected": False, "rank": None} for row in agent["items"]}
    scoped_items = []
    for item in items:
        row = own.get(item["name"], {})
        track = {"state": row["state"], "state_reason": row.get("state_reason"), "state_since": None} if drives and row else {}
        scoped_items.append({**item, **track, "selected": bool(row.get("selected")), "windows": {window: row}})
    return scoped_items


def render_charts(rows: list[dict[str, Any]], history: list[dict[str, Any]], context: PageContext) -> None:
    analysis = context.settings.analysis
    left, right = st.columns(2)
    with left:
        st.subheader("Lacking rate: failed vs successful runs")
        st.altair_chart(charts.lacking_rates(rows))
    with right:
        st.subheader("Gap Δ = ER− − ER+")
        st.altair_chart(charts.threshold_bars(rows, "delta", analysis.min_delta, "Δ"))
    left, right = st.columns(2)
    with left:
        st.subheader("Coverage of failed runs")
        st.altair_chart(charts.threshold_bars(rows, "coverage", analysis.min_coverage, "coverage"))
    with right:
        st.subheader("Δ over time")
        if history:
            st.altair_chart(charts.trend(history, "delta", analysis.min_delta, "Δ"))
        else:
            st.caption("no analysis history yet")
    if history:
        st.subheader("Failure rate over time")
        st.altair_chart(charts.trend(history, "failure_rate", None, "failure rate"))


def render_states(items: list[Mapping[str, Any]]) -> None:
    """Why each capability that is not simply healthy is where it is, and its open training request."""
    moving = [item for item in items if item["state"] not in (CapabilityState.HEALTHY, CapabilityState.WATCHING) or item.get("selected")]
    if not moving:
        return
    st.subheader("Where the gaps are in the pipeline")
    for item in moving:
        since = f" since {item['state_since']}" if item.get("state_since") else ""
        st.markdown(f"**{item['name']}** · `{item['state']}`{since}: {item.get('state_reason') or ''}")
        request = item.get("open_training_request")
        if request:
            st.caption(
                f"training request #{request['request_id']} {request['status']} ({request['source']}, "
                f"{request['created_at']}): {request['reason']}"
            )


def render(context: PageContext) -> None:
    api, settings = context.api, context.settings
    st.title("Capability health")
    status = api.get("/api/status")
    llm_labels.render(status.get("llm"))
    if status["counts"]["trajectories"] == 0:
        no_traces(settings, status)
        return
    overview = api.get("/api/capabilities")
    items, diagnosis = overview["items"], overview.get("diagnosis")
    windows = sorted({name for item in items for name in (item.get("windows") or {})})
    if not windows:
        st.info(
            f"{status['counts']['trajectories']} trajectories stored; waiting for the first analysis pass "
            f"(every {settings.analysis.interval_s:g} s).",
            icon=":material/hourglass_empty:",
        )
        return
    default = settings.analysis.selection_window if settings.analysis.selection_window in windows else windows[0]
    left, right = st.columns(2)
    window = left.selectbox("Statistics window", windows, index=windows.index(default), key="health_window")
    agents = api.get("/api/agents")
    services = {item["service_name"] for item in agents["items"]}
    names = sorted({name for item in agents["items"] for name in (item["service_name"], item["agent_name"]) if name})
    for reason in agents.get("refused") or []:
        st.warning(reason, icon=":material/block:")
    agent = right.selectbox("Agent", [ALL_AGENTS, *names], key="health_agent", help=AGENT_HELP)
    if agent == ALL_AGENTS:
        histories = {item["name"]: api.get(f"/api/capabilities/{item['name']}", window=window)["history"] for item in items}
    else:
        own = api.get(f"/api/agents/{quote(agent, safe='')}/capabilities", window=window)
        items = scoped(items, own, window)
        if own.get("drives_tracks"):
            histories = {
                item["name"]: api.get(f"/api/capabilities/{item['name']}", window=window, agent=agent)["history"] for item in items
            }
            st.caption(f"{agent}'s own runs: they select its gaps, and its adapters train on its own tools.")
        else:
            histories = {}  # the stored passes hold each service's statistics, not a gen_ai.agent.name's
            st.caption(f"Statistics of the runs naming {agent}; selection and training use each service's own.")
    rows = [stats_row(item, window) for item in items]
    outcomes = status["outcomes"]
    judged = outcomes["success"] + outcomes["failure"]
    columns = st.columns(4)
    columns[0].metric("trajectories", status["counts"]["trajectories"])
    columns[1].metric("failure share", f"{outcomes['failure'] / judged:.0%}" if judged else "—", help="failed / (failed + successful)")
    columns[2].metric("selected capabilities", sum(row["selected"] for row in rows))
    analysis = status.get("analysis") or {}
    columns[3].metric("analysis pass", analysis.get("pass_id", "—"), help=f"every {settings.analysis.interval_s:g} s")
    if diagnosis:
        st.info(diagnosis["message"], icon=":material/visibility_off:")
    render_table(health_table(items, window, histories))
    st.caption(
        f"Selected when Δ ≥ {settings.analysis.min_delta:g}, coverage ≥ {settings.analysis.min_coverage:g} and at least "
        f"{settings.analysis.min_failures} failed runs need the capability (window '{window}')."
    )
    history = [row for rows_of in histories.values() for row in rows_of]
    render_charts(rows, history, context)
    render_states(items)
    if agent in services:
        agent_profile.render(agent, api.get(f"/api/agents/{quote(agent, safe='')}/profile"))
    generalist.render_overview(api)


show(render)
