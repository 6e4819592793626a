"""Adapters: each candidate with its evaluation report (held-out base vs adapter with intervals,
interference on the other capabilities' environments, replay of real failures; for an agent's
generalist, its next actions on held-out successful conversations and the trajectories it learned
from), Approve / Reject / Rollback calling the daemon API with the configured token, every adapter's
state, and the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from tracefix.daemon.app.client import ApiError, DaemonClient
from tracefix.daemon.core.progress import retention_text
from tracefix.daemon.core.states import SERVING_STATES, AdapterState
from tracefix.dashboard import charts, generalist
from tracefix.dashboard.page import PageContext, interval, rate, show

DECISION = "adapter_decision"
NEEDS_REASON = {"reject", "rollback"}


def decide(api: DaemonClient, adapter_id: int, action: str, reason_key: str) -> None:
    """Button callback (runs before the page reruns, so the page shows the new state): POST the
    decision and keep its outcome for the page to show."""
    reason = str(st.session_state.get(reason_key) or "").strip()
    if action in NEEDS_REASON and not reason:
        st.session_state[DECISION] = ("error", f"A reason is required to {action} adapter {adapter_id}; type it first.")
        return
    try:
        answer = api.post(f"/api/adapters/{adapter_id}/{action}", {"reason": reason})
    except ApiError as error:
        st.session_state[DECISION] = ("error", str(error))
        return
    moves = "; ".join(f"adapter {move['adapter_id']} {move['from_state']} → {move['to_state']}" for move in answer["decisions"])
    st.session_state[DECISION] = ("success", f"{action}: {moves} (by {answer['decisions'][0]['actor']})")
    st.session_state[reason_key] = ""


def show_decision() -> None:
    """The outcome of the last decision taken here; it stays through refreshes until the next one."""
    outcome = st.session_state.get(DECISION)
    if outcome is None:
        return
    kind, message = outcome
    if kind == "success":
        st.success(message, icon=":material/check_circle:")
    else:
        st.error(message, icon=":material/block:")


def interference_table(report: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for item in report.get("interference") or []:
        base, adapter = item.get("base") or {}, item.get("adapter") or {}
        rows.append(
            {
                "environment": item["environment"],
                "base success": base.get("success_rate"),
                "base 95 % interval": interval(*(base.get("success_interval") or [None, None])[:2]),
                "adapter success": adapter.get("success_rate"),
                "adapter 95 % interval": interval(*(adapter.get("success_interval") or [None, None])[:2]),
                "worse": bool(item.get("worse")),
            }
        )
    return pd.DataFrame(rows)


def render_evaluation(report: Mapping[str, Any]) -> None:
    target = report.get("target") or {}
    if not target:
        st.caption("No evaluation report stored for this adapter.")
        return
    base, adapter = target["base"], target["adapter"]
    seeds = report.get("seeds") or [None, None]
    columns = st.columns(4)
    against = "the generalist" if report.get("reference") else "base"
    columns[0].metric("adapter success (held-out)", rate(adapter["success_rate"]), delta=f"{target.get('gain', 0):+.2f} vs {against}")
    columns[1].metric(f"{against} success", rate(base["success_rate"]))
    reward_gain = (adapter.get("mean_reward") or 0.0) - (base.get("mean_reward") or 0.0)
    columns[2].metric("adapter mean reward", rate(adapter.get("mean_reward")), delta=f"{reward_gain:+.2f}")
    columns[3].metric("margin required", rate(report.get("margin")))
    st.altair_chart(charts.evaluation(report))
    held_out = f"seeds {seeds[0]}–{seeds[1] - 1}" if seeds[0] is not None and seeds[1] else "held-out seeds"
    st.caption(
        f"Greedy episodes on {held_out}; intervals are Wilson 95 %. Adapter {interval(*adapter['success_interval'][:2])}, "
        f"base {interval(*base['success_interval'][:2])}."
    )
    interference = interference_table(report)
    if not interference.empty:
        worse = interference["worse"].sum()
        st.markdown(f"**Interference** on the other capabilities' environments: {worse} got worse beyond the base's interval.")
        st.dataframe(interference, hide_index=True, column_config={
            "base success": st.column_config.NumberColumn(format="%.2f"),
            "adapter success": st.column_config.NumberColumn(format="%.2f"),
        })  # fmt: skip
    if kept := retention_text(report):
        st.markdown(f"**Started from {report['reference']}**, it was measured against it; {kept}.")
    replay = report.get("replay") or {}
    if replay.get("cases"):
        st.markdown(
            f"**Replay** of {replay['cases']} real failed runs labelled LACKING ({replay.get('reproducible', 0)} reproducible "
            f"from their first turn): the base still lacks it in {replay.get('base_lacking', 0)}, the adapter in "
            f"{replay.get('adapter_lacking', 0)}."
        )
    elif replay:
        st.caption(f"Replay: {replay.get('reason') or 'no cases'}")
    for reason in report.get("reasons") or []:
        st.warning(reason, icon=":material/warning:")


def render_routed(routing: Mapping[str, Any] | None) -> None:
    """How the traffic this version served has gone, against what it is judged by."""
    if not routing:
        st.caption("No routed trajectory with an outcome yet.")
        return
    own, reference, verdict = routing["adapter"], routing["reference"], routing.get("verdict") or {}
    st.markdown(
        f"**Routed traffic**: failure rate {rate(own['rate'])} ({interval(*own['interval'][:2])}) on {own['total']} "
        f"trajectories (a verdict needs {routing.get('needed', '?')}), against {reference['name']} "
        f"{rate(reference['rate'])} ({interval(*reference['interval'][:2])}) on {reference['total']}."
    )
    if verdict.get("reason"):
        st.caption(verdict["reason"])


def render_adapter(api: DaemonClient, adapter: Mapping[str, Any], actions: tuple[str, ...], names: Mapping[int, str]) -> None:
    """One adapter with its report and the decisions its state allows; `names` are the served
    names of the adapters by id (what a targeted adapter started from)."""
    adapter_id = adapter["adapter_id"]
    name = f"{adapter['capability']}@v{adapter['version']}"
    detail = api.get(f"/api/adapters/{adapter_id}")
    evaluation = adapter.get("evaluation") or {}
    with st.container(border=True):
        if detail.get("kind") == "generalist":
            st.subheader(f"{generalist.title(adapter['capability'])} · {name} · adapter {adapter_id} · {adapter['state']}")
            origin = f"learned by imitation from {detail.get('agent') or 'its agent'}'s successful runs"
        else:
            st.subheader(f"{name} · adapter {adapter_id} · {adapter['state']}")
            origin = f"environment {adapter['environment_id']}"
            start = detail.get("starts_from")
            if start is not None:
                origin += f" · starts from {names.get(start) or f'adapter {start}'}"
        st.caption(f"run {adapter['run_id']} · {origin} · created {adapter['created_at']} · {adapter['path']}")
        if adapter.get("last_error"):
            st.warning(f"Not live yet: {adapter['last_error']}", icon=":material/sync_problem:")
        if adapter["state"] in SERVING_STATES:
            render_routed(detail.get("routing"))
        if evaluation.get("kind") == "next_action":
            generalist.render_evaluation(evaluation)
        else:
            render_evaluation(evaluation)
        if detail.get("kind") == "generalist":
            generalist.render_trajectories(api, adapter_id)
        reason_key = f"reason_{adapter_id}"
        required = " (required to reject or roll back)" if NEEDS_REASON & set(actions) else ""
        st.text_input(f"Reason{required}", key=reason_key, placeholder="why, for the audit log")
        columns = st.columns(len(actions) + 2)
        labels = {"approve": "Approve", "reject": "Reject", "rollback": "Roll back"}
        for column, action in zip(columns, actions, strict=False):
            column.button(
                labels[action], key=f"{action}_{adapter_id}", type="primary" if action == "approve" else "secondary",
                disabled=not api.has_token, on_click=decide, args=(api, adapter_id, action, reason_key),
            )  # fmt: skip


def adapter_table(items: list[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for item in items:
        evaluation = item.get("evaluation") or {}
        target = evaluation.get("target") or {}
        next_action = evaluation.get("kind") == "next_action"
        rows.append(
            {
                "adapter": item["adapter_id"],
                "name": f"{item['capability']}@v{item['version']}",
                "state": item["state"],
                "base → adapter success": (
                    f"{rate(target['base']['success_rate'])} → {rate(target['adapter']['success_rate'])}" if target else "—"
                ),
                # A generalist is scored on next actions in held-out conversations, not on an environment.
                "base → adapter next action": generalist.accuracy(evaluation) if next_action else "—",
                "why": item.get("state_reason") or "",
                "router error": item.get("last_error") or "",
                "created": item.get("created_at"),
                "updated": item.get("updated_at"),
            }
        )
    frame = pd.DataFrame(rows)
    if not any((item.get("evaluation") or {}).get("kind") == "next_action" for item in items):
        frame = frame.drop(columns="base → adapter next action", errors="ignore")
    return frame


def render(context: PageContext) -> None:
    api = context.api
    st.title("Adapters")
    show_decision()
    if context.identity.needs:
        st.warning(f"{context.identity.needs} (in the sidebar)", icon=":material/key_off:")
    elif not api.has_token:
        st.warning(
            "No API token: approvals are disabled. Set [api] token in the config the dashboard runs with, or run it "
            "where it can read the daemon's <store dir>/api.token.",
            icon=":material/key_off:",
        )
    adapters = api.get("/api/adapters")["items"]
    if not adapters:
        st.info(
            "No adapters yet: a training run that beats the base by the margin on held-out seeds becomes a candidate "
            "here (see Pipeline).",
            icon=":material/hourglass_empty:",
        )
    candidates = [item for item in adapters if item["state"] == AdapterState.CANDIDATE]
    approved = [item for item in adapters if item["state"] == AdapterState.APPROVED]
    canaries = [item for item in adapters if item["state"] == AdapterState.CANARY]
    live = [item for item in adapters if item["state"] == AdapterState.LIVE]
    names = {item["adapter_id"]: f"{item['capability']}@v{item['version']}" for item in adapters}
    if adapters:
        st.header(f"Candidates ({len(candidates)})")
        if not candidates:
            st.caption("No candidate waits for a decision.")
        for adapter in candidates:
            render_adapter(api, adapter, ("approve", "reject"), names)
    if approved:
        st.header("Approved, going live")
        for adapter in approved:
            render_adapter(api, adapter, ("reject",), names)
    if canaries:
        st.header("Canaries")
        for adapter in canaries:
            render_adapter(api, adapter, ("rollback",), names)
    if live:
        st.header("Live")
        for adapter in live:
            render_adapter(api, adapter, ("rollback",), names)
    if adapters:
        st.header("All versions")
        st.dataframe(adapter_table(adapters), hide_index=True)
    st.header("Audit log")
    audit = api.get("/api/audit", limit=200)["items"]
    if not audit:
        st.caption("No decision recorded yet.")
        return
    frame = pd.DataFrame(audit)
    frame["move"] = frame["from_state"] + " → " + frame["to_state"]
    st.dataframe(frame[["decided_at", "actor", "action", "adapter_id", "capability", "move", "reason"]], hide_index=True)


show(render)
