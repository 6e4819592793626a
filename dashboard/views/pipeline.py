"""Pipeline: the environments synthesized for capability gaps (family, checks, the validation gate's
figures against its thresholds, a sampled instance) and the training runs (live reward and success
curves, zero-variance groups, progress and elapsed time)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from tracefix.dashboard import charts, conversation, generalist
from tracefix.dashboard.page import PageContext, rate, show
from tracefix.daemon.app.client import ApiError
from tracefix.daemon.core.progress import checkpoints_text, grpo_added_text, grpo_steps, progress_text, reference_name
from tracefix.daemon.core.states import RunStatus


def environment_table(items: list[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for item in items:
        checks = item.get("checks") or {}
        validation = item.get("validation") or {}
        rows.append(
            {
                "environment": item["environment_id"],
                "capability": item["capability"],
                "family": f"{item['family']} v{item['family_version']}",
                "difficulty": validation.get("difficulty", item["difficulty"]),
                "status": item["status"],
                "agent": item.get("service_name") or "",
                "tools": len(item.get("tools") or []),
                "solution mean": (checks.get("solution") or {}).get("mean"),
                "no-op mean": checks.get("noop_mean"),
                "random mean": checks.get("random_mean"),
                "gate remedy": validation.get("remedy") or ("none needed" if validation.get("passed") else ""),
                "hint share": validation.get("hint_share"),
                "created": item.get("created_at"),
            }
        )
    return pd.DataFrame(rows)


def render_validation(environment: Mapping[str, Any], context: PageContext) -> None:
    """The gate's report: each attempt's mean, std and share of groups with variance against the bands."""
    validation = environment.get("validation")
    if not validation:
        gate = "off ([validation] enabled = false)" if not context.settings.validation.enabled else "waiting for the gate"
        st.caption(f"Not validated against the base model: {gate}.")
        return
    if validation.get("error"):
        st.warning(f"The validation run failed: {validation['error']}", icon=":material/warning:")
        return
    attempts = validation.get("attempts") or []
    verdict = "passed" if validation.get("passed") else "rejected"
    remedy = f" with {validation['remedy']}" if validation.get("remedy") else ""
    st.markdown(
        f"Validation **{verdict}**{remedy}: {validation.get('rollouts', '?')} rollouts in {validation.get('seconds', '?')} s "
        f"(difficulty {validation.get('difficulty')}, hint share {validation.get('hint_share', 0):g})."
    )
    gate = context.settings.validation.model_dump()
    if attempts:
        chosen = attempts[-1]
        st.altair_chart(charts.validation_figures(chosen, gate))
        st.caption(
            f"Last attempt (verdict {chosen['verdict']}); the orange ticks are the gate: mean reward in "
            f"{gate['mean_low']:g}–{gate['mean_high']:g}, std > {gate['min_std']:g}, "
            f"groups with variance > {gate['min_variance_groups']:g}."
        )
        st.dataframe(pd.DataFrame(attempts), hide_index=True)


def render_instance(environment: Mapping[str, Any], context: PageContext) -> None:
    """One instance of the environment, built by the daemon from its stored family and tools, with a
    replay of its ground-truth solution: what the model is asked to do and what earns full reward."""
    identifier = environment["environment_id"]
    seed = st.number_input("seed", min_value=0, max_value=1_000_000, value=0, step=1, key=f"seed_{identifier}")
    try:
        instance = context.api.get(f"/api/environments/{identifier}/instance", seed=int(seed))
    except ApiError as error:
        if error.status not in (404, 409):  # an unreachable daemon is the page's error, not this panel's
            raise
        st.warning(f"No instance to show: {error.reason}", icon=":material/warning:")
        return
    hint_text = f" · hint: {instance['hint']}" if instance["hint"] else ""
    st.caption(
        f"seed {instance['seed']} · difficulty {instance['difficulty']} · solution reward {instance['solution_reward']:g}{hint_text}"
    )
    conversation.render(conversation.instance_turns(instance["messages"]))


def render_environments(context: PageContext) -> None:
    st.header("Environments")
    items = context.api.get("/api/environments")["items"]
    if not items:
        st.info(
            "No environments yet: one is synthesized for a capability once its gap holds and a training request "
            "opens (see Capability health), or when one is requested with POST /api/capabilities/{name}/train.",
            icon=":material/hourglass_empty:",
        )
        return
    st.dataframe(
        environment_table(items),
        hide_index=True,
        column_config={
            name: st.column_config.NumberColumn(format="%.2f") for name in ("solution mean", "no-op mean", "random mean", "hint share")
        },
    )
    by_id = {item["environment_id"]: item for item in items}
    options = list(by_id)
    # The newest environment the gate has reported on says the most; else simply the newest.
    judged = [identifier for identifier in options if by_id[identifier].get("validation")]
    chosen = st.selectbox(
        "Environment", options, index=options.index(judged[0]) if judged else 0, key="pipeline_environment",
        format_func=lambda identifier: f"{identifier} · {by_id[identifier]['capability']} · {by_id[identifier]['status']}",
    )  # fmt: skip
    environment = by_id[chosen]
    checks = environment.get("checks") or {}
    if checks.get("errors"):
        st.warning("Checks: " + "; ".join(checks["errors"][:3]), icon=":material/warning:")
    left, right = st.columns(2, gap="large")
    with left:
        st.subheader("Validation gate")
        render_validation(environment, context)
    with right:
        st.subheader("Sampled instance")
        render_instance(environment, context)


def run_table(items: list[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for item in items:
        progress = item.get("progress") or {}
        rows.append(
            {
                "run": item["run_id"],
                "capability": item["capability"],
                "version": item["version"],
                "status": item["status"],
                "now": progress_text(item["latest"]) if item["status"] == RunStatus.RUNNING and item.get("latest") else "",
                "step": f"{progress.get('step', 0)} / {progress.get('max_steps', item.get('config', {}).get('steps', '?'))}",
                "mean reward": progress.get("mean_reward"),
                "success rate": progress.get("success_rate"),
                "zero-variance groups": f"{progress.get('zero_variance_groups', 0)} / {progress.get('groups', 0)}" if progress else "",
                "elapsed s": progress.get("elapsed_s"),
                "started": item.get("started_at"),
                "finished": item.get("finished_at"),
            }
        )
    return pd.DataFrame(rows)


def recipe_row(trial: Mapping[str, Any]) -> dict[str, Any]:
    validation = trial.get("validation") or {}
    return {
        "recipe": trial["recipe"], "validation success": validation.get("success_rate"),
        "mean reward": validation.get("mean_reward"), "minutes": round(trial.get("seconds", 0) / 60, 1) if "seconds" in trial else None,
        "note": trial.get("skipped", ""),
    }  # fmt: skip


def render_run(run: Mapping[str, Any]) -> None:
    records = run.get("progress") or []
    progress = grpo_steps(records)
    last = progress[-1] if progress else {}
    latest = records[-1] if records else {}
    steps = (run.get("config") or {}).get("steps") or 0
    max_steps = latest.get("max_steps") or steps
    if latest.get("phase") == "evaluation":
        share = 1.0  # training is over; the held-out evaluation runs
    else:
        share = min(latest.get("step", 0) / max_steps, 1.0) if max_steps else 0.0
    name = f"run {run['run_id']} ({run['capability']} v{run['version']})"
    where = progress_text(latest, steps) if latest else "loading the model"
    st.progress(share, text=f"{name}: {run['status']}, {where}")
    columns = st.columns(4)
    columns[0].metric("elapsed in this phase", f"{latest.get('elapsed_s', 0):.0f} s")
    columns[1].metric("mean reward", rate(last.get("mean_reward")))
    columns[2].metric("success rate", rate(last.get("success_rate")))
    columns[3].metric("zero-variance groups", f"{last.get('zero_variance_groups', 0)} / {last.get('groups', 0)}" if last else "—")
    if run.get("error"):
        st.warning(f"Run failed: {run['error']}", icon=":material/warning:")
    if not progress:
        st.caption("No GRPO step finished yet" + (f" ({where})." if latest else " (the model is loading)."))
    else:
        left, right = st.columns(2)
        with left:
            st.caption("Reward and success of the training rollouts per step")
            st.altair_chart(charts.training_curves(progress))
        with right:
            st.caption("Groups per step; zero-variance groups carry no learning signal")
            st.altair_chart(charts.zero_variance_groups(progress))
        if any("clip_fraction_max" in record for record in progress):
            st.caption("Per step: share of policy tokens clipped (highest pass) and the KL to the adapter GRPO started from")
            st.altair_chart(charts.clipping(progress))
    result = run.get("result") or {}
    if result:
        evaluation = result.get("evaluation") or {}
        target = evaluation.get("target") or {}
        summary = f"Verdict **{result.get('verdict')}** after {result.get('steps', '?')} steps in {result.get('seconds', '?')} s"
        if target:
            summary += f": held-out success {rate(target['adapter']['success_rate'])} vs {reference_name(evaluation)} {rate(target['base']['success_rate'])}"
        elif evaluation.get("kind") == "next_action":
            summary += f": held-out next action {generalist.accuracy(evaluation)} (base → adapter)"
        st.markdown(summary + ".")
        for reason in evaluation.get("reasons") or []:
            st.caption(reason)
        training = result.get("training") or {}
        if training.get("recipe"):
            where = f", trained on {result['device']}" if result.get("device") else ""  # runs from before devices were recorded say nothing
            added = grpo_added_text(evaluation.get("grpo_added"))
            st.markdown(f"Recipe **{training['recipe']}**{where}" + (f". {added}." if added else "."))
        tried = [item for item in training.get("tried") or [] if "validation" in item or "skipped" in item]
        if tried:
            st.caption("Recipes tried on the validation seeds (the best is kept)")
            st.dataframe(pd.DataFrame([recipe_row(item) for item in tried]), hide_index=True)
        for trial in training.get("tried") or []:
            if chosen := checkpoints_text(trial):
                st.caption(f"GRPO's checkpoints on the validation seeds (keep_best): {chosen}")


def render_runs(context: PageContext) -> None:
    st.header("Training runs")
    items = context.api.get("/api/runs")["items"]
    if not items:
        training = "on" if context.settings.training.enabled else "off ([training] enabled = false)"
        st.info(
            f"No training runs yet (training is {training}): a run starts when an environment is ready.",
            icon=":material/hourglass_empty:",
        )
        return
    st.dataframe(
        run_table(items),
        hide_index=True,
        column_config={name: st.column_config.NumberColumn(format="%.2f") for name in ("mean reward", "success rate")},
    )
    by_id = {item["run_id"]: item for item in items}
    running = [item["run_id"] for item in items if item["status"] == RunStatus.RUNNING]
    options = list(by_id)
    chosen = st.selectbox(
        "Run", options, index=options.index(running[0]) if running else 0, key="pipeline_run",
        format_func=lambda run_id: f"{run_id} · {by_id[run_id]['capability']} v{by_id[run_id]['version']} · {by_id[run_id]['status']}",
    )  # fmt: skip
    render_run(context.api.get(f"/api/runs/{chosen}"))


def render(context: PageContext) -> None:
    st.title("Pipeline")
    render_environments(context)
    render_runs(context)


show(render)
