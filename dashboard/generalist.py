"""How the dashboard shows a generalist (one adapter per agent, learned by imitation from its
successful runs): its next-action evaluation, teacher-forced on held-out successful conversations,
the trajectories it learned from and was scored on, and per agent why its generalist waits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pandas as pd
import streamlit as st

from tracefix.daemon.app.client import ApiError, DaemonClient
from tracefix.daemon.core import generalist
from tracefix.dashboard import charts, conversation
from tracefix.dashboard.page import interval, rate

LEARNED_FROM = "learned from"
HELD_OUT = "held out"


def title(capability: str) -> str:
    """A capability as a person reads it: "the generalist of <agent>" for a generalist's."""
    agent = generalist.agent_of(capability)
    return f"the generalist of {agent}" if agent else capability


def accuracy(report: Mapping[str, Any]) -> str:
    """A next-action report's accuracy, base → adapter: "0.31 → 0.62"."""
    base, adapter = ((report.get(model) or {}).get("matched") or {} for model in ("base", "adapter"))
    return f"{rate(base.get('rate'))} → {rate(adapter.get('rate'))}"


def _signed_interval(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"{low:+.2f} to {high:+.2f}"


def measure_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """Per measure, base and adapter accuracy with hits / turns and the 95 % Wilson interval."""
    rows = []
    for measure, key in charts.NEXT_ACTION_MEASURES:
        row: dict[str, Any] = {"measure": measure}
        for model in ("base", "adapter"):
            score = (report.get(model) or {}).get(key) or {}
            row[model] = score.get("rate") if score.get("total") else None
            row[f"{model} hits"] = f"{score.get('hits', 0)} / {score.get('total', 0)}"
            row[f"{model} 95 % interval"] = interval(*(score.get("interval") or [None, None])[:2]) if score.get("total") else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def render_evaluation(report: Mapping[str, Any]) -> None:
    """A generalist's next-action evaluation: base vs adapter on the same held-out turns, the paired
    difference with its interval and McNemar's p, and what it learned from."""
    base, adapter = report.get("base") or {}, report.get("adapter") or {}
    difference = report.get("difference") or {}
    base_matched, adapter_matched = base.get("matched") or {}, adapter.get("matched") or {}
    base_tool, adapter_tool = base.get("tool_matched") or {}, adapter.get("tool_matched") or {}
    columns = st.columns(4)
    columns[0].metric(
        "adapter next action (held-out)", rate(adapter_matched.get("rate")), delta=f"{difference.get('rate', 0.0):+.2f} vs base"
    )
    columns[1].metric("base next action", rate(base_matched.get("rate")))
    tool_gain = (adapter_tool.get("rate") or 0.0) - (base_tool.get("rate") or 0.0)
    columns[2].metric(
        "adapter tool only", rate(adapter_tool.get("rate")), delta=f"{tool_gain:+.2f}", help="the same tools called, arguments aside"
    )
    columns[3].metric("margin required", rate(report.get("margin")))
    st.altair_chart(charts.next_action(report))
    st.dataframe(measure_table(report), hide_index=True, column_config={
        "base": st.column_config.NumberColumn(format="%.2f"), "adapter": st.column_config.NumberColumn(format="%.2f"),
    })  # fmt: skip
    calls, answers = adapter.get("call") or {}, adapter.get("answer") or {}
    st.caption(
        f"Teacher-forced on {report.get('conversations', '?')} held-out successful conversations ({report.get('turns', '?')} "
        f"paired turns: {calls.get('total', 0)} tool calls, {answers.get('total', 0)} replies); learned from "
        f"{report.get('learned_from', '?')}. Intervals are Wilson 95 %. Adapter "
        f"{interval(*(adapter_matched.get('interval') or [None, None])[:2])}, base "
        f"{interval(*(base_matched.get('interval') or [None, None])[:2])}."
    )
    if difference:
        p = difference.get("mcnemar_p")
        st.markdown(
            f"**Paired difference** (adapter − base, turn by turn): {difference.get('rate', 0.0):+.2f}, 95 % interval "
            f"{_signed_interval(*(difference.get('interval') or [None, None])[:2])}, McNemar p = "
            f"{'—' if p is None else f'{p:.3g}'}. Only the adapter matched {difference.get('adapter_only', 0)} turns, only the "
            f"base {difference.get('base_only', 0)}, both {difference.get('both', 0)}."
        )
    f1 = [(name, (report.get(name) or {}).get("mean_answer_f1")) for name in ("base", "adapter")]
    if any(value is not None for _, value in f1):
        st.caption("Mean word F1 of the replies (never decides a match): " + ", ".join(f"{name} {rate(value)}" for name, value in f1) + ".")
    if adapter.get("skipped"):
        st.caption(f"{adapter['skipped']} turns skipped: the conversation before them did not fit the model's context.")
    for reason in report.get("reasons") or []:
        st.warning(reason, icon=":material/warning:")


def render_trajectories(api: DaemonClient, adapter_id: int) -> None:
    """The trajectories a generalist learned from and was scored on, in an expander; one chosen
    there is drawn as a conversation below it."""
    parts = api.get(f"/api/adapters/{adapter_id}/trajectories")
    train, held_out = parts.get("train") or [], parts.get("held_out") or []
    part = {**{item: LEARNED_FROM for item in train}, **{item: HELD_OUT for item in held_out}}
    with st.expander(f"Trajectories: learned from {len(train)}, scored on {len(held_out)} held out"):
        st.markdown(f"**Learned from** ({len(train)}): " + (", ".join(f"`{item}`" for item in train) or "—"))
        st.markdown(f"**Held out**, scored on ({len(held_out)}): " + (", ".join(f"`{item}`" for item in held_out) or "—"))
        chosen = st.selectbox(
            "Read one as a conversation", [*held_out, *train], index=None, placeholder="a trajectory id",
            format_func=lambda item: f"{item} · {part[item]}", key=f"learned_{adapter_id}",
        )  # fmt: skip
    if chosen is None:
        return
    # Drawn outside the expander: a conversation's system prompt has an expander of its own.
    try:
        trajectory = api.get(f"/api/trajectories/{quote(chosen, safe='')}")
    except ApiError as error:
        if error.status != 404:  # an unreachable daemon is the page's error, not this panel's
            raise
        st.caption(f"`{chosen}` is no longer stored ([retention] removed it).")
        return
    with st.container(border=True):
        st.markdown(
            f"`{trajectory['trajectory_id']}` · {part[chosen]} · {trajectory.get('service_name') or ''} · "
            f"outcome **{trajectory.get('outcome')}**"
        )
        conversation.render(conversation.trajectory_turns(trajectory))


def render_overview(api: DaemonClient) -> None:
    """Per agent the generalist stage has looked at: its generalist's newest version and state, and
    why it does not train now."""
    answer = api.get("/api/generalists")
    st.subheader("Generalists")
    if not answer.get("enabled"):
        st.caption("Off ([generalist] enabled = false): no agent gets an adapter learned from its successful runs.")
        return
    items = answer.get("items") or []
    if not items:
        st.caption(
            "No agent considered yet: an agent that fails often gets a generalist learned from its successful runs "
            "(looked at while [training] is enabled)."
        )
        return
    for item in items:
        versions = item.get("adapters") or []
        newest = versions[0] if versions else None
        if newest is None:
            state = "no version yet"
        else:
            evaluation = newest.get("evaluation") or {}
            scored = f" (next action {accuracy(evaluation)})" if evaluation.get("kind") == "next_action" else ""
            state = f"`{newest['capability']}@v{newest['version']}` {newest['state']}{scored}"
        waiting = f" — not training now: {item['waiting']}" if item.get("waiting") else ""
        st.markdown(f"**{item['agent']}** · {state}{waiting}")
