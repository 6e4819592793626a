"""Altair charts of the dashboard. Each takes plain rows from the API and draws the threshold that
decides something (Δ, coverage, the validation gate, the evaluation margin) on the chart itself,
so a reader sees how far a value is from the line that matters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import altair as alt
import pandas as pd

SELECTED = "#d62728"
OTHER = "#7f7f7f"
THRESHOLD = "#ff7f0e"


def _times(values: pd.Series) -> pd.Series:
    """Timestamps from ISO 8601 text or from seconds since the epoch, converted in one pass."""
    if pd.api.types.is_numeric_dtype(values):
        return pd.to_datetime(values, unit="s", utc=True)
    return pd.to_datetime(values, utc=True, format="ISO8601")


def _threshold_rule(value: float, label: str, axis: str = "y") -> alt.LayerChart:
    """A dashed line at `value` with its label, the same on every chart."""
    frame = pd.DataFrame({"value": [value], "label": [f"{label} {value:g}"]})
    encode = {axis: alt.Y("value:Q") if axis == "y" else alt.X("value:Q")}
    rule = alt.Chart(frame).mark_rule(color=THRESHOLD, strokeDash=[6, 4], strokeWidth=2).encode(**encode)
    text = alt.Chart(frame).mark_text(color=THRESHOLD, align="left", dx=4, dy=-6).encode(**encode, text="label:N")
    return rule + text


def lacking_rates(rows: Iterable[Mapping[str, Any]]) -> alt.LayerChart:
    """Per capability, the lacking rate on failed runs (ER−) next to the one on successful runs (ER+),
    each with its 95 % interval: the gap the paper selects on is the distance between them."""
    records = []
    for row in rows:
        for outcome, key in (("on failures (ER−)", "er_minus"), ("on successes (ER+)", "er_plus")):
            if row.get(key) is None:
                continue
            records.append(
                {
                    "capability": row["capability"],
                    "outcome": outcome,
                    "rate": row[key],
                    "low": row.get(f"{key}_low"),
                    "high": row.get(f"{key}_high"),
                    "selected": bool(row.get("selected")),
                }
            )
    frame = pd.DataFrame(records, columns=["capability", "outcome", "rate", "low", "high", "selected"])
    colors = alt.Scale(domain=["on failures (ER−)", "on successes (ER+)"], range=[SELECTED, "#1f77b4"])
    base = alt.Chart(frame).encode(
        y=alt.Y("capability:N", title=None),
        yOffset="outcome:N",
        color=alt.Color("outcome:N", scale=colors, title="lacking rate"),
    )
    axis = alt.X("low:Q", title="share of runs needing it that lack it", scale=alt.Scale(domain=[0, 1]))
    bars = base.mark_errorbar(ticks=True).encode(x=axis, x2="high:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x="rate:Q",
        tooltip=["capability", "outcome", *(alt.Tooltip(f"{name}:Q", format=".2f") for name in ("rate", "low", "high"))],
    )
    return (bars + points).properties(height=alt.Step(16))


def threshold_bars(rows: Iterable[Mapping[str, Any]], field: str, threshold: float, title: str) -> alt.LayerChart:
    """One bar per capability, selected ones highlighted, with the selection threshold drawn."""
    frame = pd.DataFrame(
        [{"capability": row["capability"], "value": row.get(field), "selected": bool(row.get("selected"))} for row in rows],
        columns=["capability", "value", "selected"],
    )
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("capability:N", title=None, sort="-y"),
            y=alt.Y("value:Q", title=title),
            color=alt.condition(alt.datum.selected, alt.value(SELECTED), alt.value(OTHER)),
            tooltip=["capability", alt.Tooltip("value:Q", format=".3f"), "selected"],
        )
    )
    return (bars + _threshold_rule(threshold, "threshold")).properties(height=260)


def trend(history: Iterable[Mapping[str, Any]], field: str, threshold: float | None, title: str) -> alt.LayerChart | alt.Chart:
    """A statistic per analysis pass over time, one line per capability; selected ones drawn thicker."""
    frame = pd.DataFrame(
        [
            {
                "computed_at": row["computed_at"],
                "capability": row["capability"],
                "value": row.get(field),
                "selected": bool(row.get("selected")),
            }
            for row in history
        ],
        columns=["computed_at", "capability", "value", "selected"],
    )
    frame["computed_at"] = _times(frame["computed_at"])
    lines = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("computed_at:T", title="analysis pass"),
            y=alt.Y("value:Q", title=title),
            color=alt.Color("capability:N"),
            strokeWidth=alt.condition(alt.datum.selected, alt.value(3), alt.value(1)),
            tooltip=["capability", alt.Tooltip("computed_at:T", format="%H:%M:%S"), alt.Tooltip("value:Q", format=".3f")],
        )
    )
    chart = lines if threshold is None else lines + _threshold_rule(threshold, "threshold")
    return chart.properties(height=260)


def training_curves(progress: Iterable[Mapping[str, Any]]) -> alt.Chart:
    """Mean reward and success rate per optimisation step of a run."""
    return _step_curves(progress, (("mean reward", "mean_reward"), ("success rate", "success_rate")), domain=(0, 1))


def clipping(progress: Iterable[Mapping[str, Any]]) -> alt.Chart:
    """Per GRPO step: the share of policy tokens the clipped surrogate held back (the highest of the
    step's passes) and the KL to the adapter GRPO started from."""
    return _step_curves(progress, (("clipped tokens", "clip_fraction_max"), ("KL to start", "kl")))


def _step_curves(progress: Iterable[Mapping[str, Any]], curves: tuple[tuple[str, str], ...], domain: tuple[float, float] | None = None) -> alt.Chart:
    frame = pd.DataFrame(
        [{"step": record["step"], "curve": name, "value": record.get(key)} for record in progress for name, key in curves],
        columns=["step", "curve", "value"],
    )
    scale = alt.Scale(domain=list(domain)) if domain else alt.Undefined
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=None, scale=scale),
            color=alt.Color("curve:N", title=None),
            tooltip=["step", "curve", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(height=260)
    )


def zero_variance_groups(progress: Iterable[Mapping[str, Any]]) -> alt.Chart:
    """Groups per step whose rollouts all earned the same reward: they teach nothing (dropped)."""
    frame = pd.DataFrame(
        [
            {"step": record["step"], "kind": kind, "groups": count}
            for record in progress
            for kind, count in (
                ("zero variance (no signal)", record.get("zero_variance_groups") or 0),
                ("with variance", max((record.get("groups") or 0) - (record.get("zero_variance_groups") or 0), 0)),
            )
        ],
        columns=["step", "kind", "groups"],
    )
    colors = alt.Scale(domain=["zero variance (no signal)", "with variance"], range=[OTHER, "#2ca02c"])
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("step:O", title="step"),
            y=alt.Y("groups:Q", title="groups", stack=True),
            color=alt.Color("kind:N", scale=colors, title=None),
            tooltip=["step", "kind", "groups"],
        )
        .properties(height=220)
    )


def validation_figures(attempt: Mapping[str, Any], gate: Mapping[str, float]) -> alt.LayerChart:
    """The gate's three figures for one attempt, each with the band it must fall in."""
    rows = [
        {"figure": "mean reward", "value": attempt.get("mean"), "low": gate["mean_low"], "high": gate["mean_high"]},
        {"figure": "reward std", "value": attempt.get("std"), "low": gate["min_std"], "high": None},
        {"figure": "groups with variance", "value": attempt.get("variance_groups"), "low": gate["min_variance_groups"], "high": None},
    ]
    frame = pd.DataFrame(rows, columns=["figure", "value", "low", "high"])
    base = alt.Chart(frame).encode(y=alt.Y("figure:N", title=None, sort=None))
    bars = base.mark_bar(color="#1f77b4").encode(
        x=alt.X("value:Q", title=None, scale=alt.Scale(domain=[0, 1])),
        tooltip=["figure", alt.Tooltip("value:Q", format=".3f"), "low", "high"],
    )
    low = base.mark_tick(color=THRESHOLD, thickness=3, size=28).encode(x="low:Q")
    high = base.transform_filter("isValid(datum.high)").mark_tick(color=THRESHOLD, thickness=3, size=28).encode(x="high:Q")
    return (bars + low + high).properties(height=alt.Step(34))


def evaluation(report: Mapping[str, Any]) -> alt.LayerChart:
    """Held-out success of base and adapter with 95 % intervals, on the adapter's own environment and
    on every other one (interference); the tick on the own environment is the bar it had to clear."""
    comparisons = [report.get("target") or {}, *(report.get("interference") or [])]
    records = []
    for index, comparison in enumerate(comparisons):
        if not comparison:
            continue
        name = comparison["environment"] + (" (own)" if index == 0 else "")
        for model in ("base", "adapter"):
            score = comparison.get(model) or {}
            low, high = (score.get("success_interval") or [None, None])[:2]
            records.append({"environment": name, "model": model, "success": score.get("success_rate"), "low": low, "high": high})
    frame = pd.DataFrame(records, columns=["environment", "model", "success", "low", "high"])
    colors = alt.Scale(domain=["base", "adapter"], range=[OTHER, "#2ca02c"])
    base = alt.Chart(frame).encode(
        y=alt.Y("environment:N", title=None, sort=None), yOffset="model:N", color=alt.Color("model:N", scale=colors, title=None)
    )
    axis = alt.X("low:Q", title="held-out success rate", scale=alt.Scale(domain=[0, 1]))
    bars = base.mark_errorbar(ticks=True).encode(x=axis, x2="high:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x="success:Q", tooltip=["environment", "model", alt.Tooltip("success:Q", format=".2f"), "low", "high"]
    )
    chart = bars + points
    target = report.get("target") or {}
    if target and report.get("margin") is not None:
        needed = min(1.0, (target.get("base") or {}).get("success_rate", 0.0) + float(report["margin"]))
        bar = pd.DataFrame(
            {"environment": [target["environment"] + " (own)"], "needed": [needed], "label": [f"base + margin {needed:.2f}"]}
        )
        marker = alt.Chart(bar).encode(y=alt.Y("environment:N", sort=None), x="needed:Q")
        chart += marker.mark_tick(color=THRESHOLD, thickness=3, size=30)
        chart += marker.mark_text(color=THRESHOLD, dy=-14).encode(text="label:N")
    return chart.properties(height=alt.Step(16))


def expert_totals(rows: Iterable[Mapping[str, Any]], field: str, title: str) -> alt.Chart:
    """One bar per expert (base or adapter) for a counter such as requests or tokens."""
    frame = pd.DataFrame([{"expert": row["expert"], "value": row.get(field) or 0} for row in rows], columns=["expert", "value"])
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(x=alt.X("value:Q", title=title), y=alt.Y("expert:N", title=None, sort="-x"), tooltip=["expert", "value"])
        .properties(height=alt.Step(22))
    )


def expert_series(rows: Iterable[Mapping[str, Any]], field: str, title: str) -> alt.Chart:
    """A counter per expert over time, stacked, so the share each expert takes is visible."""
    frame = pd.DataFrame(
        [{"at": row["at"], "expert": row["expert"], "value": row.get(field) or 0} for row in rows], columns=["at", "expert", "value"]
    )
    frame["at"] = _times(frame["at"])
    return (
        alt.Chart(frame)
        .mark_area()
        .encode(
            x=alt.X("at:T", title=None),
            y=alt.Y("value:Q", title=title, stack=True),
            color=alt.Color("expert:N", title="expert"),
            tooltip=["expert", alt.Tooltip("at:T"), "value"],
        )
        .properties(height=240)
    )


def routed_failure_rates(rows: Iterable[Mapping[str, Any]]) -> alt.LayerChart:
    """Per canary or live adapter, the failure rate of the traffic it served next to the rate it is
    judged against (its control arm, or the rate before promotion), each with its interval."""
    records = []
    for row in rows:
        for arm, key in (("served by it", "adapter"), ("reference", "reference")):
            figures = row.get(key) or {}
            low, high = (figures.get("interval") or [None, None])[:2]
            label = row["name"] if key == "adapter" else f"{figures.get('name', 'reference')}"
            records.append({"adapter": row["name"], "arm": arm, "who": label, "rate": figures.get("rate"), "low": low, "high": high,
                            "trajectories": figures.get("total")})  # fmt: skip
    frame = pd.DataFrame(records, columns=["adapter", "arm", "who", "rate", "low", "high", "trajectories"])
    colors = alt.Scale(domain=["served by it", "reference"], range=["#2ca02c", OTHER])
    base = alt.Chart(frame).encode(
        y=alt.Y("adapter:N", title=None), yOffset="arm:N", color=alt.Color("arm:N", scale=colors, title=None)
    )
    axis = alt.X("low:Q", title="failure rate of routed trajectories", scale=alt.Scale(domain=[0, 1]))
    bars = base.mark_errorbar(ticks=True).encode(x=axis, x2="high:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x="rate:Q", tooltip=["who", "arm", alt.Tooltip("rate:Q", format=".2f"), "low", "high", "trajectories"]
    )
    return (bars + points).properties(height=alt.Step(18))


NEXT_ACTION_MEASURES = (
    ("next action", "matched"),
    ("tool only", "tool_matched"),
    ("tool-call turns", "call"),
    ("reply turns", "answer"),
    ("whole conversations", "conversations"),
)


def next_action(report: Mapping[str, Any]) -> alt.LayerChart:
    """A generalist's held-out next-action accuracy, base vs adapter with 95 % intervals, per measure
    (any turn, the tool alone, call turns, reply turns, conversations with every turn right); the
    tick on "next action" is base + margin, the bar it had to beat."""
    records = []
    for measure, key in NEXT_ACTION_MEASURES:
        for model in ("base", "adapter"):
            score = (report.get(model) or {}).get(key) or {}
            if not score.get("total"):
                continue
            low, high = (score.get("interval") or [None, None])[:2]
            records.append({"measure": measure, "model": model, "accuracy": score.get("rate"), "low": low, "high": high,
                            "hits": f"{score.get('hits')} / {score.get('total')}"})  # fmt: skip
    frame = pd.DataFrame(records, columns=["measure", "model", "accuracy", "low", "high", "hits"])
    colors = alt.Scale(domain=["base", "adapter"], range=[OTHER, "#2ca02c"])
    base = alt.Chart(frame).encode(
        y=alt.Y("measure:N", title=None, sort=None), yOffset="model:N", color=alt.Color("model:N", scale=colors, title=None)
    )
    axis = alt.X("low:Q", title="held-out next-action accuracy", scale=alt.Scale(domain=[0, 1]))
    bars = base.mark_errorbar(ticks=True).encode(x=axis, x2="high:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x="accuracy:Q", tooltip=["measure", "model", alt.Tooltip("accuracy:Q", format=".2f"), "low", "high", "hits"]
    )
    chart = bars + points
    matched = (report.get("base") or {}).get("matched") or {}
    if matched.get("total") and report.get("margin") is not None:
        needed = min(1.0, matched.get("rate", 0.0) + float(report["margin"]))
        bar = pd.DataFrame({"measure": ["next action"], "needed": [needed], "label": [f"base + margin {needed:.2f}"]})
        marker = alt.Chart(bar).encode(y=alt.Y("measure:N", sort=None), x="needed:Q")
        chart += marker.mark_tick(color=THRESHOLD, thickness=3, size=30)
        chart += marker.mark_text(color=THRESHOLD, dy=-14).encode(text="label:N")
    return chart.properties(height=alt.Step(16))
