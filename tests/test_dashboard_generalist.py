"""The dashboard's view of generalists against a real daemon: an agent's generalist registered as a
candidate with a next-action evaluation (built by `trainer.next_action.score_actions` from real turn
matches) and the trajectories it learned from, a targeted adapter that started from it, and a second
agent whose generalist waits for successful runs (the daemon's generalist stage says so as it runs).

The adapters page shows the generalist as "the generalist of <agent>" with its evaluation and its
trajectories, the targeted adapter says what it started from, and the health page lists per agent
its generalist's state or why it waits: in Streamlit's AppTest here, and in a real browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracefix.daemon.core.intervals import mcnemar_p, paired_difference
from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.store.store import AnalysisStore, Store
from examples.traffic import SERVICE_NAME, TOOLS, generate, send
from tests.conftest import RunningDaemon, make_daemon, wait_for
from tests.test_dashboard import (  # noqa: F401 (browser and chromium are fixtures used by name)
    _chart_specs,
    _evaluation,
    _screenshot,
    _wait_for_text,
    app,
    browser,
    chromium,
    router_down,
    running_dashboard,
)
from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.families import load_families
from tracefix.trainer.next_action import ActionMatch, score_actions

AGENT = SERVICE_NAME
GENERALIST = f"generalist.{AGENT}"
OTHER = "checkout-agent"  # its generalist waits: too few successful runs with its tools
LEARNED, HELD_OUT = 8, 4


def _turns(*pattern: str) -> list[ActionMatch]:
    """One conversation's scored turns: c/C a call missed/matched (t: the tool right, arguments
    wrong), a/A a reply missed/matched."""
    kinds = {"c": ("call", False, False), "t": ("call", False, True), "C": ("call", True, True), "a": ("answer", False, False),
             "A": ("answer", True, True)}  # fmt: skip
    return [ActionMatch(*kinds[letter], answer_f1=(0.9 if letter == "A" else 0.2) if letter in "aA" else None) for letter in pattern]


def next_action_evaluation() -> dict[str, Any]:
    """A report in the shape trainer.imitation writes: each model's turns scored by score_actions, and
    their paired difference as compare_next_actions computes it."""
    base = [_turns("c", "C", "A"), _turns("t", "c", "A"), _turns("c", "C", "a"), _turns("c", "t", "A")]
    adapter = [_turns("C", "C", "A"), _turns("C", "t", "A"), _turns("C", "C", "A"), _turns("t", "C", "A")]
    base_hits, adapter_hits = ([turn.match for conversation in run for turn in conversation] for run in (base, adapter))
    pairs = list(zip(base_hits, adapter_hits, strict=True))
    adapter_only = sum(after and not before for before, after in pairs)
    base_only = sum(before and not after for before, after in pairs)
    both = sum(before and after for before, after in pairs)
    delta, low, high = paired_difference(adapter_only, base_only, both, len(pairs) - adapter_only - base_only - both)
    return {
        "kind": "next_action", "verdict": "candidate", "reasons": [], "conversations": HELD_OUT, "learned_from": LEARNED,
        "margin": 0.05, "turns": len(pairs), "base": score_actions(base), "adapter": score_actions(adapter),
        "difference": {"rate": round(delta, 4), "interval": [round(low, 4), round(high, 4)],
                       "mcnemar_p": round(mcnemar_p(adapter_only, base_only), 4), "adapter_only": adapter_only, "base_only": base_only,
                       "both": both},
    }  # fmt: skip


def seed_generalist(directory: Path, train: list[str], held_out: list[str]) -> dict[str, int]:
    """The agent's generalist as a candidate with its run's trajectories, and a targeted adapter of
    error_recovery whose run started from it; written before the daemon starts. Returns their ids."""
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    analysis, runs = AnalysisStore(store), RunStore(store)
    try:
        run = runs.create_generalist_run(GENERALIST, AGENT, {"warm_start_epochs": 2}, str(directory / "runs"), train, held_out)
        assert runs.set_run_status(run["run_id"], "queued", "running")
        evaluation = next_action_evaluation()
        result = {"run_id": run["run_id"], "capability": GENERALIST, "verdict": "candidate", "evaluation": evaluation,
                  "training": {"recipe": "imitation"}, "steps": 8, "seconds": 61.0, "adapter": f"{run['directory']}/adapter"}  # fmt: skip
        generalist_id = runs.add_candidate(run, result["adapter"], "0" * 64, result)
        definitions = [{"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]} for tool in TOOLS]
        family = next(family for family in load_families().values() if family.capability == "error_recovery")
        spec = Environment(family, load_tools(definitions), 1).spec()
        environment_id = analysis.add_environment("error_recovery", spec, AGENT, definitions, None, "checked", {})
        targeted = runs.create_run(runs.environment(environment_id), {"steps": 8}, str(directory / "runs"), starts_from=generalist_id)
        assert runs.set_run_status(targeted["run_id"], "queued", "running")
        targeted_result = {"run_id": targeted["run_id"], "capability": "error_recovery", "verdict": "candidate",
                           "evaluation": _evaluation("error_recovery", 5, 40), "steps": 8, "seconds": 90.0}  # fmt: skip
        targeted_id = runs.add_candidate(targeted, f"{targeted['directory']}/adapter", "1" * 64, targeted_result)
    finally:
        store.close()
    assert generalist_id is not None and targeted_id is not None
    return {"generalist": generalist_id, "targeted": targeted_id}


@pytest.fixture(scope="module")
def generalists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, dict[str, Any]]]:
    """A daemon with training on (the generalist stage runs with it) and nothing it could train: the
    agent's generalist waits for a decision, the other agent's for successes. Returns the daemon and
    the seeded ids (adapters, and the trajectories the generalist learned from and was scored on)."""
    directory = tmp_path_factory.mktemp("generalists")
    plans = generate(40, seed=11, failure_rate=0.4, gaps="none")
    successes = [plan.conversation_id for plan in plans if plan.outcome == "success"]
    held_out, train = successes[:HELD_OUT], successes[HELD_OUT : HELD_OUT + LEARNED]
    assert len(train) == LEARNED
    seeded = {**seed_generalist(directory, train, held_out), "train": sorted(train), "held_out": sorted(held_out)}
    daemon = make_daemon(
        directory, analysis={"interval_s": 1.0}, training={"enabled": True}, router=router_down(),
        generalist={"min_trajectories": 10, "min_failure_rate": 0.1, "min_successes": 500, "max_conversations": 8, "held_out": 2},
    ).start()  # fmt: skip
    send(plans, daemon.http_url, "http/protobuf", "log")
    send(generate(20, seed=12, failure_rate=0.5, gaps="none"), daemon.http_url, "http/protobuf", "log", service_name=OTHER)
    daemon.wait_analyzed(timeout_s=60)
    wait_for(lambda: {item["agent"] for item in daemon.get("/api/generalists")["items"] if item["waiting"]} == {AGENT, OTHER}, timeout_s=60)
    yield daemon, seeded
    daemon.stop()


def _waiting(daemon: RunningDaemon) -> dict[str, str]:
    return {item["agent"]: item["waiting"] for item in daemon.get("/api/generalists")["items"]}


def test_the_adapters_page_shows_the_generalist_with_its_next_action_evaluation_and_what_it_learned_from(
    generalists: tuple[RunningDaemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, seeded = generalists
    adapter_id = seeded["generalist"]
    evaluation = daemon.get(f"/api/adapters/{adapter_id}")["evaluation"]
    base, adapter, difference = evaluation["base"], evaluation["adapter"], evaluation["difference"]
    test = app(daemon.config_path, monkeypatch, "views/adapters.py")
    assert not test.error, [error.value for error in test.error]
    headings = [heading.value for heading in test.subheader]
    assert f"the generalist of {AGENT} · {GENERALIST}@v1 · adapter {adapter_id} · candidate" in headings, headings
    captions = [caption.value for caption in test.caption]
    assert any(f"learned by imitation from {AGENT}'s successful runs" in caption for caption in captions), captions
    assert not [caption for caption in captions if "environment None" in caption or "No evaluation report stored" in caption]
    # Adapter vs base next-action accuracy, and the tool alone, as the report has them.
    metrics = {metric.label: metric for metric in test.metric}
    shown = metrics["adapter next action (held-out)"]
    assert (shown.value, shown.delta) == (f"{adapter['matched']['rate']:.2f}", f"{difference['rate']:+.2f} vs base")
    assert metrics["base next action"].value == f"{base['matched']['rate']:.2f}"
    assert metrics["adapter tool only"].value == f"{adapter['tool_matched']['rate']:.2f}"
    table = next(frame.value for frame in test.dataframe if "measure" in frame.value.columns).set_index("measure")
    for measure, key in (("next action", "matched"), ("tool only", "tool_matched"), ("tool-call turns", "call"), ("reply turns", "answer")):
        assert table.loc[measure, "adapter"] == pytest.approx(adapter[key]["rate"])
        assert table.loc[measure, "base"] == pytest.approx(base[key]["rate"])
        assert table.loc[measure, "adapter hits"] == f"{adapter[key]['hits']} / {adapter[key]['total']}"
        low, high = adapter[key]["interval"]
        assert table.loc[measure, "adapter 95 % interval"] == f"{low:.2f}–{high:.2f}"
    assert (adapter["call"]["total"], adapter["answer"]["total"]) == (8, 4)
    text = " ".join([*captions, *(markdown.value for markdown in test.markdown)])
    paired = f"Teacher-forced on {HELD_OUT} held-out successful conversations (12 paired turns: 8 tool calls, 4 replies)"
    assert f"{paired}; learned from {LEARNED}." in text, text
    low, high = difference["interval"]
    assert (
        f"**Paired difference** (adapter − base, turn by turn): {difference['rate']:+.2f}, 95 % interval {low:+.2f} to {high:+.2f}, "
        f"McNemar p = {difference['mcnemar_p']:.3g}. Only the adapter matched {difference['adapter_only']} turns, only the base "
        f"{difference['base_only']}, both {difference['both']}."
    ) in text, text
    assert difference["adapter_only"] > 0 and difference["rate"] > 0
    assert any("held-out next-action accuracy" in spec and "base + margin" in spec for spec in _chart_specs(test))
    # The trajectories it learned from and was scored on, in an expander.
    expander = next(item for item in test.expander if item.label.startswith("Trajectories:"))
    assert expander.label == f"Trajectories: learned from {LEARNED}, scored on {HELD_OUT} held out"
    listed = " ".join(markdown.value for markdown in expander.markdown)
    assert all(f"`{identifier}`" in listed for identifier in seeded["train"] + seeded["held_out"]), listed
    # Every versions' table: the generalist by its next actions, the targeted adapter by its success.
    versions = next(frame.value for frame in test.dataframe if "base → adapter next action" in frame.value.columns).set_index("adapter")
    assert versions.loc[adapter_id, "base → adapter next action"] == f"{base['matched']['rate']:.2f} → {adapter['matched']['rate']:.2f}"
    assert versions.loc[adapter_id, "base → adapter success"] == "—"
    assert versions.loc[seeded["targeted"], "base → adapter success"] == "0.10 → 0.80"


def test_a_trajectory_the_generalist_was_scored_on_reads_as_its_conversation(
    generalists: tuple[RunningDaemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, seeded = generalists
    held_out = seeded["held_out"][0]
    detail = daemon.get(f"/api/trajectories/{held_out}")
    test = app(daemon.config_path, monkeypatch, "views/adapters.py")
    assert not test.chat_message  # nothing drawn until one is chosen
    test.selectbox(key=f"learned_{seeded['generalist']}").select(held_out).run()
    assert not test.exception and not test.error
    assert any(markdown.value.startswith(f"`{held_out}` · held out · {AGENT} · outcome **success**") for markdown in test.markdown)
    roles = {message["role"] for message in detail["messages"]} - {"system"}
    assert {message.name for message in test.chat_message} >= roles
    shown = " ".join(markdown.value for markdown in test.markdown)
    assert all(f"**tool call** `{call['tool_name']}`" in shown for call in detail["tool_calls"])


def test_a_targeted_adapter_that_started_from_the_generalist_says_so_and_keeps_its_environment_report(
    generalists: tuple[RunningDaemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, seeded = generalists
    detail = daemon.get(f"/api/adapters/{seeded['targeted']}")
    assert (detail["kind"], detail["starts_from"]) == ("targeted", seeded["generalist"])
    test = app(daemon.config_path, monkeypatch, "views/adapters.py")
    assert any(f"error_recovery@v1 · adapter {seeded['targeted']} · candidate" == heading.value for heading in test.subheader)
    line = next(caption.value for caption in test.caption if caption.value.startswith(f"run {detail['run_id']} ·"))
    assert f"environment {detail['environment_id']} · starts from {GENERALIST}@v1 ·" in line, line
    metrics = {metric.label: metric.value for metric in test.metric}
    assert metrics["adapter success (held-out)"] == "0.80" and metrics["base success"] == "0.10"
    assert any("held-out success rate" in spec for spec in _chart_specs(test))


def test_the_health_page_lists_each_agents_generalist_and_why_it_waits(
    generalists: tuple[RunningDaemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, seeded = generalists
    waiting = _waiting(daemon)
    assert waiting[OTHER].startswith("waits for successes:") and waiting[OTHER].endswith(", 500 needed"), waiting
    assert waiting[AGENT] == "v1 is candidate"
    test = app(daemon.config_path, monkeypatch)
    assert not test.error, [error.value for error in test.error]
    assert "Generalists" in [heading.value for heading in test.subheader]
    lines = [markdown.value for markdown in test.markdown]
    assert f"**{OTHER}** · no version yet — not training now: {waiting[OTHER]}" in lines, lines
    scored = daemon.get(f"/api/adapters/{seeded['generalist']}")["evaluation"]
    accuracy = f"{scored['base']['matched']['rate']:.2f} → {scored['adapter']['matched']['rate']:.2f}"
    assert accuracy == "0.42 → 0.83"  # 5 and 10 of the 12 turns
    assert f"**{AGENT}** · `{GENERALIST}@v1` candidate (next action {accuracy}) — not training now: v1 is candidate" in lines, lines


def test_the_pipeline_page_shows_a_generalist_runs_next_action_verdict(
    generalists: tuple[RunningDaemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, seeded = generalists
    run_id = daemon.get(f"/api/adapters/{seeded['generalist']}")["run_id"]
    test = app(daemon.config_path, monkeypatch, "views/pipeline.py")
    test.selectbox(key="pipeline_run").select(run_id).run()
    assert not test.exception and not test.error
    shown = " ".join(markdown.value for markdown in test.markdown)
    assert "Verdict **candidate** after 8 steps in 61.0 s: held-out next action 0.42 → 0.83 (base → adapter)." in shown, shown


def test_the_generalist_and_its_waits_in_a_real_browser(
    browser: Any, generalists: tuple[RunningDaemon, dict[str, Any]], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    from tests.conftest import free_port

    daemon, seeded = generalists
    waiting = _waiting(daemon)
    with running_dashboard(daemon, free_port()) as url:
        browser.get(f"{url}/adapters")
        _wait_for_text(
            browser, f"the generalist of {AGENT}", "Paired difference", f"starts from {GENERALIST}@v1",
            f"Trajectories: learned from {LEARNED}, scored on {HELD_OUT} held out",
        )  # fmt: skip
        browser.find_element(By.XPATH, "//summary[contains(., 'Trajectories: learned from')]").click()
        _wait_for_text(browser, *seeded["train"], *seeded["held_out"])
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")
        _screenshot(browser, "adapters-generalist", tmp_path)
        browser.get(url)
        _wait_for_text(browser, "Generalists", f"{OTHER} · no version yet — not training now: {waiting[OTHER]}")
        _screenshot(browser, "health-generalists", tmp_path)
