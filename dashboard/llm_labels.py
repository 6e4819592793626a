"""How the dashboard shows the LLM labels judged beside the analysis: one line of progress, budget and
the endpoint's state, from the `llm` block of /api/status."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import streamlit as st


def _ago(at: float) -> str:
    return f"{max(0.0, time.time() - at):.0f} s ago"


def summary(llm: Mapping[str, Any]) -> str:
    """The line: pairs pending and judged, calls against the budget, and the endpoint's last error."""
    pending = "?" if llm["pending"] is None else llm["pending"]
    budget = f"{llm['calls_per_minute']}/min" if llm["calls_per_minute"] else "unlimited"
    text = (
        f"LLM labels: {pending} pending, {llm['in_flight']} in flight, {llm['judged']} judged "
        f"({llm['judged_last_minute']} in the last minute, {llm['calls_last_minute']} calls; "
        f"budget {budget}, concurrency {llm['concurrency']})."
    )
    if llm["endpoint_answering"] is False:
        text += " The endpoint is not answering; the pairs are judged once it does."
    error = llm.get("last_error")
    if error:
        message = str(error["message"]).replace("`", "'")
        text += f" Last error {_ago(error['at'])}: `{message}`"
    return text


def render(llm: Mapping[str, Any] | None) -> None:
    """The line, as a warning while the endpoint is not answering; nothing when the LLM labeler is off."""
    if not llm:
        return
    if llm["endpoint_answering"] is False:
        st.warning(summary(llm), icon=":material/cloud_off:")
    else:
        st.caption(summary(llm))
