"""Evidence: for one capability, trajectories labelled LACKING next to trajectories labelled PRESENT,
each conversation rendered turn by turn with the labelled span marked and the labeler's reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import streamlit as st

from tracefix.dashboard import conversation
from tracefix.dashboard.page import PageContext, no_traces, short_id, show

PAGE_SIZE = 25
# The contrast the statistics are built on: lacking in failures, present in successes.
SIDES = (("LACKING", "failure", "error"), ("PRESENT", "success", "success"))


def _option(item: Mapping[str, Any]) -> str:
    failed = f" ({item['n_tool_errors']} failed)" if item.get("n_tool_errors") else ""
    return f"{short_id(item['trajectory_id'], 12)} · {item['outcome']} · {item['n_tool_calls']} calls{failed}"


def render_side(context: PageContext, capability: str, label: str, outcome: str | None, tone: str) -> None:
    """One column: the list of trajectories with this label and the chosen one's conversation."""
    page = context.api.get("/api/trajectories", capability=capability, label=label, outcome=outcome, limit=PAGE_SIZE)
    items, total = page["items"], page["total"]
    described = {"failure": "failed ", "success": "successful ", None: ""}[outcome]
    heading = f"{label} · {total} {described}run{'s' if total != 1 else ''}"
    st.subheader(f":{'red' if tone == 'error' else 'green'}[{heading}]")
    if not items:
        st.info(f"No {outcome or ''} trajectory is labelled {label} for {capability} yet.", icon=":material/search_off:")
        return
    by_id = {item["trajectory_id"]: item for item in items}
    chosen_id = st.selectbox(
        f"{label} trajectory", list(by_id), format_func=lambda identifier: _option(by_id[identifier]),
        key=f"evidence_{capability}_{label}_{outcome}", label_visibility="collapsed",
    )  # fmt: skip
    chosen = by_id[chosen_id]
    trajectory = context.api.get(f"/api/trajectories/{quote(chosen['trajectory_id'], safe='')}")
    labels = [row for row in trajectory.get("labels") or [] if row["capability"] == capability]
    reason = chosen.get("reason") or (labels[0]["reason"] if labels else None)
    span_ids = chosen.get("span_ids") or [span for row in labels for span in row.get("span_ids") or []]
    outcome_line = f"outcome **{trajectory['outcome']}** ({trajectory.get('outcome_source') or 'unknown source'})"
    if trajectory.get("outcome_detail"):
        outcome_line += f": {trajectory['outcome_detail']}"
    st.markdown(f"`{trajectory['trajectory_id']}` · {trajectory.get('service_name') or ''} · {outcome_line}")
    st.markdown(f"**{label}** because: {reason or '—'}")
    turns = conversation.trajectory_turns(trajectory, span_ids)
    conversation.render(turns, reason if label == "LACKING" else None)


def render(context: PageContext) -> None:
    api = context.api
    st.title("Evidence")
    status = api.get("/api/status")
    if status["counts"]["trajectories"] == 0:
        no_traces(context.settings, status)
        return
    items = api.get("/api/capabilities")["items"]
    names = [item["name"] for item in items]
    if not names:
        st.info("No capabilities are registered; check [capabilities] disabled and the plugin errors in /api/status.")
        return
    # The API lists capabilities ranked (selected first), so the default is the biggest gap.
    capability = st.selectbox("Capability", names, key="evidence_capability")
    described = next(item for item in items if item["name"] == capability)
    st.caption(described.get("description") or "")
    contrast = st.toggle(
        "Contrast: LACKING in failed runs vs PRESENT in successful runs", value=True, key="evidence_contrast",
        help="Off: every trajectory with the label, whatever its outcome.",
    )  # fmt: skip
    columns = st.columns(2, gap="large")
    for column, (label, outcome, tone) in zip(columns, SIDES, strict=True):
        with column:
            render_side(context, capability, label, outcome if contrast else None, tone)


show(render)
