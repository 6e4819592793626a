"""The capability health table: one row per capability in a statistics window, selected ones
highlighted; a statistic without data (ER+ when no successful run needed the capability) reads "—"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from tracefix.dashboard.page import interval

TREND_POINTS = 40
MISSING = "—"  # shown for a statistic without data (ER+ when no successful run needed the capability)


def stats_row(item: Mapping[str, Any], window: str) -> dict[str, Any]:
    """One capability's statistics in `window`, with the fields the table and charts need."""
    stats = (item.get("windows") or {}).get(window) or {}
    return {**stats, "capability": item["name"], "selected": bool(stats.get("selected")), "state": item["state"]}


def health_table(items: list[Mapping[str, Any]], window: str, histories: Mapping[str, list[dict[str, Any]]]) -> pd.DataFrame:
    """The table's rows: statistics stay numbers (sortable), a missing one stays missing (drawn as MISSING)."""
    rows = []
    for item in items:
        stats = stats_row(item, window)
        rows.append(
            {
                "capability": item["name"],
                "state": item["state"],
                "selected": stats["selected"],
                "rank": stats.get("rank"),
                "ER− (failures)": stats.get("er_minus"),
                "ER+ (successes)": stats.get("er_plus"),
                "Δ": stats.get("delta"),
                "coverage": stats.get("coverage"),
                "failure rate": stats.get("failure_rate"),
                "95 % interval": interval(stats.get("failure_rate_low"), stats.get("failure_rate_high")),
                "failed runs lacking / needing": (
                    f"{stats['lacking_failure']} / {stats['needed_failure']}" if "needed_failure" in stats else MISSING
                ),
                "Δ trend": [row.get("delta") or 0.0 for row in histories.get(item["name"], [])][-TREND_POINTS:],
                "why": item.get("state_reason") or "",
            }
        )
    return pd.DataFrame(rows)


def _highlight_selected(row: pd.Series) -> list[str]:
    style = "background-color: rgba(214, 39, 40, 0.15); font-weight: 600" if row["selected"] else ""
    return [style] * len(row)


def render_table(frame: pd.DataFrame) -> None:
    """The table as a sortable grid; every missing cell reads MISSING, never None or nan."""
    st.dataframe(
        frame.style.apply(_highlight_selected, axis=1),
        hide_index=True,
        placeholder=MISSING,
        column_config={
            "selected": st.column_config.CheckboxColumn("selected", help="Δ and coverage pass the thresholds on enough failures"),
            "rank": st.column_config.NumberColumn(help="order among the selected, by coverage", format="%d"),
            "ER− (failures)": st.column_config.NumberColumn(help="LACKING / needed among failed runs", format="%.2f"),
            "ER+ (successes)": st.column_config.NumberColumn(help="LACKING / needed among successful runs", format="%.2f"),
            "Δ": st.column_config.NumberColumn(help="ER− − ER+", format="%.2f"),
            # A number, not a progress bar: a bar cannot show that a window has no failed runs at all.
            "coverage": st.column_config.NumberColumn(help="failed runs lacking it / all failed runs", format="%.2f"),
            "failure rate": st.column_config.NumberColumn(help="failed / runs that need the capability", format="%.2f"),
            "Δ trend": st.column_config.LineChartColumn(help="Δ per analysis pass", y_min=-1.0, y_max=1.0),
            "why": st.column_config.TextColumn(width="large"),
        },
    )
