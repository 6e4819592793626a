"""The dashboard against a real daemon: traces sent over OTLP by the demo agent's generator, and the
later pipeline stages (a validated environment, finished training runs with their step records,
candidate adapters with evaluation reports) written to the daemon's DuckDB file before it starts.

Each page runs in Streamlit's AppTest; a headless Chromium then drives `tracefix dashboard` as a
real process: every page renders with data, the pages refresh by themselves, and clicking Approve
makes the candidate `approved` in the API.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.core.settings import StoreSettings
from tracefix.daemon.store.store import AnalysisStore, Store
from tracefix.dashboard.routing_stats import expert_rows, snapshot_of
from examples.traffic import TOOLS, generate, send
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon, wait_for
from tests.otlp_builders import JSON, json_bytes, json_span, json_traces, new_span_id, post
from tracefix.trainer.checks import check
from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.evaluation import Comparison, Score, paired
from tracefix.trainer.families import load_families
from tracefix.trainer.validation import Attempt, ValidationReport

APP = str(REPO / "dashboard" / "app.py")
GAPS = "precondition_verification=0.7:0.05,error_recovery=0.6:0.05"
PLANTED = {"precondition_verification", "error_recovery"}
# One trained candidate per capability; each test decides about its own adapter (ids in this order).
CANDIDATES = ("error_recovery", "precondition_verification", "tool_call_precision")
STEPS = 8


def router_down() -> dict[str, Any]:
    """No router runs in these tests: a free port answers at once (the default :8000 may be anyone's)."""
    return {"port": free_port()}


# -- data: the later pipeline stages, written before the daemon starts (DuckDB has one writer) ----


def _score(wins: int, seeds: int = 50) -> Score:
    successes = [index < wins for index in range(seeds)]
    return Score.of([1.0 if won else 0.3 for won in successes], successes)


def _evaluation(capability: str, base_wins: int, adapter_wins: int) -> dict[str, Any]:
    """A report in the shape trainer.evaluation.compare writes, from real Score and Comparison objects."""
    own = Comparison(capability, _score(base_wins), _score(adapter_wins))
    others = [Comparison(name, _score(20), _score(19)) for name in CANDIDATES if name != capability]
    return {
        "verdict": "candidate",
        "reasons": [],
        "margin": 0.2,
        "seeds": [0, 50],
        "target": own.to_dict(),
        "interference": [item.to_dict() for item in others],
        "replay": {"cases": 12, "reproducible": 9, "base_lacking": 8, "adapter_lacking": 2, "items": []},
        # What GRPO added to the warm start on the same seeds, as trainer.evaluation.paired reports it.
        "grpo_added": paired([seed % 3 == 0 for seed in range(50)], [seed % 3 == 0 or seed % 5 == 1 for seed in range(50)]),
    }


def _progress(step: int) -> dict[str, Any]:
    """One step record as trainer.grpo's progress callback writes it."""
    return {
        "step": step, "max_steps": STEPS, "mean_reward": round(0.2 + 0.08 * step, 4),
        "success_rate": round(0.05 + 0.1 * step, 4), "zero_variance_groups": max(0, 2 - step // 3), "groups": 2,
        "loss": 0.01, "rollouts": 8 * step, "tokens_per_s": 40.0, "elapsed_s": 30.0 * step,
        "clip_fraction_max": round(0.01 * step, 4), "ratio_mean": 1.001, "kl": round(0.002 * (step - 1), 4),
    }  # fmt: skip


def seed_pipeline(directory: Path) -> None:
    """Per candidate capability: an environment built from the demo agent's tools and checked for
    real, validated; a finished run with its progress.jsonl; a candidate adapter with its report."""
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    analysis, runs = AnalysisStore(store), RunStore(store)
    definitions = [{"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]} for tool in TOOLS]
    families = {family.capability: family for family in load_families().values()}
    for index, capability in enumerate(CANDIDATES):
        environment = Environment(families[capability], load_tools(definitions), 1)
        environment_id = analysis.add_environment(
            capability, environment.spec(), "skyways-support-agent", definitions, None, "checked", check(environment, 10).to_dict()
        )
        report = ValidationReport(
            True, 1, 0.25, "hints in 25 % of each group's rollouts",
            [Attempt(1, 0.0, 0.12, 0.15, 0.3, "too_weak"), Attempt(1, 0.25, 0.42, 0.27, 0.72, "ok")],
        ).to_dict()  # fmt: skip
        analysis.set_environment_status(environment_id, "checked", "validated", {**report, "rollouts": 800, "seconds": 95.0})
        run = runs.create_run(runs.environment(environment_id), {"steps": STEPS}, str(directory / "runs"))
        runs.set_run_status(run["run_id"], "queued", "running")
        run_dir = Path(run["directory"])
        run_dir.mkdir(parents=True)
        (run_dir / "progress.jsonl").write_text("".join(json.dumps(_progress(step)) + "\n" for step in range(1, STEPS + 1)))
        evaluation = _evaluation(capability, 5 + index, 40 - index)
        result = {
            "run_id": run["run_id"], "capability": capability, "verdict": "candidate", "evaluation": evaluation,
            "training": {
                "resumed_from": None, "warm_start": None, "rollouts": 8 * STEPS, "recipe": "sft+grpo",
                "tried": [
                    {"recipe": "sft", "validation": {"success_rate": 0.25, "mean_reward": 0.4}, "seconds": 300.0},
                    {"recipe": "sft+grpo", "validation": {"success_rate": 0.5, "mean_reward": 0.6}, "seconds": 900.0, "kept_step": 5,
                     "checkpoints": [{"step": step, "seeds": 8, "success_rate": rate, "mean_reward": rate} for step, rate in ((0, 0.25), (5, 0.5), (10, 0.375))]},
                    {"recipe": "guided_grpo", "skipped": "120 s of the budget left"},
                ],
            },
            "steps": STEPS, "device": "cuda", "memory_limit_mb": None,
            "seconds": 241.0, "adapter": str(run_dir / "adapter"),
        }  # fmt: skip
        assert runs.add_candidate(run, str(run_dir / "adapter"), "0" * 64, result) is not None
    store.close()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon with trained candidates and 160 trajectories of the demo agent with two planted gaps,
    analyzed; its config also carries the [dashboard] section the dashboard runs with."""
    directory = tmp_path_factory.mktemp("dashboard")
    seed_pipeline(directory)
    daemon = make_daemon(
        directory, analysis={"interval_s": 0.5}, dashboard={"port": free_port(), "refresh_s": 5.0}, router=router_down()
    ).start()
    send(generate(160, seed=5, failure_rate=0.4, gaps=GAPS), daemon.http_url, "http/protobuf", "log")
    daemon.wait_analyzed(timeout_s=60)
    yield daemon
    daemon.stop()


def app(config_path: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None) -> AppTest:
    """The dashboard's entry script run in-process with `config_path`, switched to `page`."""
    monkeypatch.setenv("TRACEFIX_CONFIG", str(config_path))
    test = AppTest.from_file(APP, default_timeout=60).run()
    if page is not None:
        test.switch_page(page).run()
    assert not test.exception, [item.value for item in test.exception]
    return test


def _chart_specs(test: AppTest) -> list[str]:
    """Each Altair chart as its Vega-Lite spec followed by its data rows (Streamlit ships them as Arrow)."""
    import pyarrow as pa

    charts = []
    for element in test.get("vega_lite_chart"):
        rows = [pa.ipc.open_stream(dataset.data.data).read_all().to_pylist() for dataset in element.proto.datasets]
        charts.append(element.proto.spec + json.dumps(rows, default=str, ensure_ascii=False))
    return charts


def _adapter(daemon: RunningDaemon, capability: str) -> dict[str, Any]:
    return next(item for item in daemon.get("/api/adapters")["items"] if item["capability"] == capability)


# -- AppTest: each page against the running daemon -----------------------------------------------


def test_health_page_lists_every_capability_and_highlights_the_planted_gaps(
    loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = app(loaded.config_path, monkeypatch)
    assert [title.value for title in test.title] == ["Capability health"]
    assert not test.error
    table = test.dataframe[0].value
    capabilities = loaded.get("/api/capabilities")["items"]
    assert set(table["capability"]) == {item["name"] for item in capabilities}
    assert set(table.loc[table["selected"], "capability"]) == PLANTED
    expected = {item["name"]: item["windows"]["all"]["delta"] for item in capabilities}
    assert {row["capability"]: row["Δ"] for _, row in table.iterrows()} == pytest.approx(expected)
    assert all(len(trend) >= 2 for trend in table["Δ trend"])  # one point per analysis pass
    metrics = {metric.label: metric.value for metric in test.metric}
    assert metrics["trajectories"] == str(loaded.status()["counts"]["trajectories"])
    assert metrics["selected capabilities"] == "2"
    assert loaded.get("/api/capabilities")["diagnosis"] is None  # gaps were found: nothing to diagnose
    assert not [info.value for info in test.info if "no capability is selected" in info.value]
    specs = _chart_specs(test)
    assert len(specs) >= 5
    # The paper's thresholds are drawn: Δ ≥ 0.2 on the gap and trend charts, coverage ≥ 0.1.
    thresholds = [spec for spec in specs if '"type": "rule"' in spec]
    assert sum('"threshold 0.2"' in spec for spec in thresholds) >= 2 and any('"threshold 0.1"' in spec for spec in thresholds)


def test_health_page_shows_one_agents_profile_with_its_evidence(loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = loaded.get("/api/agents")["items"][0]["service_name"]
    test = app(loaded.config_path, monkeypatch)
    test.selectbox(key="health_agent").select(agent).run()
    assert not test.exception and not test.error
    assert f"What {agent}'s policy requires before a change" in [header.value for header in test.subheader]
    table = next(frame.value for frame in test.dataframe if "its policy" in frame.value.columns)
    profile = loaded.get(f"/api/agents/{agent}/profile")["rules"]
    shown = {row["from"]: row["evidence"] for _, row in table.iterrows()}
    assert len(table) == 3 and all(rule["evidence"] in shown.values() for rule in profile.values())
    assert set(table["its policy"]) <= {"yes", "no", "undecided"}


@pytest.fixture(scope="module")
def unexplained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """Rules only, 30 runs of the demo agent that all failed, no gap planted: no capability is
    selected, the daemon says why, and ER+ has no data (no successful run needed any capability)."""
    daemon = make_daemon(tmp_path_factory.mktemp("unexplained"), analysis={"interval_s": 0.5}, router=router_down()).start()
    send(generate(30, seed=8, failure_rate=1.0, gaps="none"), daemon.http_url, "http/protobuf", "log")
    daemon.wait_analyzed(timeout_s=60)
    yield daemon
    daemon.stop()


def test_health_page_shows_the_daemons_diagnosis_of_failures_no_rule_explains(
    unexplained: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = unexplained.get("/api/capabilities")
    diagnosis = response["diagnosis"]
    assert diagnosis["kind"] == "rules_only_unexplained_failures" and diagnosis["failed"] == 30
    test = app(unexplained.config_path, monkeypatch)
    assert not test.error
    assert diagnosis["message"] in [info.value for info in test.info]  # the daemon's text, as it is
    table = test.dataframe[0]
    assert set(table.value["capability"]) == {item["name"] for item in response["items"]}
    # No successful run, so no ER+ and no rank anywhere: left missing, and the grid draws "—" for them.
    assert table.value["ER+ (successes)"].isna().all() and table.value["rank"].isna().all()
    assert table.proto.placeholder == "—"


def test_the_health_table_keeps_missing_statistics_missing_and_draws_them_as_a_dash() -> None:
    def page() -> None:
        from tracefix.dashboard.capability_table import health_table, render_table

        measured = {
            "er_plus": None, "er_minus": 0.1, "delta": 0.1, "coverage": 0.1, "failure_rate": 1.0,
            "failure_rate_low": None, "failure_rate_high": None, "lacking_failure": 3, "needed_failure": 30,
            "selected": False, "rank": None,
        }  # fmt: skip
        items = [
            {"name": "argument_grounding", "state": "healthy", "state_reason": "no gap", "windows": {"all": measured}},
            {"name": "error_recovery", "state": "healthy", "state_reason": "not analyzed yet", "windows": {}},
        ]
        render_table(health_table(items, "all", {}))

    test = AppTest.from_function(page).run()
    assert not test.exception, [item.value for item in test.exception]
    grid = test.dataframe[0]
    frame = grid.value
    assert grid.proto.placeholder == "—"  # what the grid draws in a missing cell (default: "None")
    numbers = ["rank", "ER− (failures)", "ER+ (successes)", "Δ", "coverage", "failure rate"]
    assert frame.loc[0, numbers].isna().tolist() == [True, False, True, False, False, False]
    assert frame.loc[1, numbers].isna().all()  # no statistics in this window at all
    assert not [value for value in frame[numbers].to_numpy().ravel() if isinstance(value, str)]  # not the text "None"
    assert frame["95 % interval"].tolist() == ["—", "—"]
    assert frame["failed runs lacking / needing"].tolist() == ["3 / 30", "—"]
    shown = {str(value) for column in frame.columns if column not in numbers for value in frame[column]}
    assert not shown & {"None", "nan", "NaN", "n/a"}


def test_evidence_page_puts_lacking_and_present_conversations_side_by_side_with_the_evidence_flagged(
    loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = app(loaded.config_path, monkeypatch, "views/evidence.py")
    test.selectbox(key="evidence_capability").select("error_recovery").run()
    assert not test.exception and not test.error
    headings = [heading.value for heading in test.subheader]
    assert any("LACKING" in heading and "failed runs" in heading for heading in headings)
    assert any("PRESENT" in heading and "successful runs" in heading for heading in headings)
    first_lacking = loaded.get("/api/trajectories", capability="error_recovery", label="LACKING", outcome="failure", limit=25)["items"][0]
    flags = [warning.value for warning in test.warning]
    assert f"Evidence: {first_lacking['reason']}" in flags
    detail = loaded.get(f"/api/trajectories/{first_lacking['trajectory_id']}")
    roles = {message["role"] for message in detail["messages"]} - {"system"}
    assert {message.name for message in test.chat_message} >= roles  # user, assistant and tool turns
    called = {call["tool_name"] for call in detail["tool_calls"]}
    shown = " ".join(markdown.value for markdown in test.markdown)
    assert all(f"**tool call** `{name}`" in shown for name in called)


def test_pipeline_page_shows_validation_figures_a_sampled_instance_and_training_curves(
    loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = app(loaded.config_path, monkeypatch, "views/pipeline.py")
    assert not test.error
    environments = test.dataframe[0].value
    runs = next(frame.value for frame in test.dataframe if "run" in frame.value.columns)
    assert set(CANDIDATES) <= set(environments["capability"])
    assert set(environments.loc[environments["status"] == "validated", "capability"]) == set(CANDIDATES)
    validated = [item["environment_id"] for item in loaded.get("/api/environments")["items"] if item["status"] == "validated"]
    test.selectbox(key="pipeline_environment").select(validated[0]).run()
    shown = " ".join(markdown.value for markdown in test.markdown)
    assert "Validation **passed** with hints in 25 % of each group's rollouts" in shown
    assert any("solution reward 1" in caption.value for caption in test.caption)  # the sampled instance replays its solution
    assert any(message.name == "user" for message in test.chat_message)
    assert set(runs["capability"]) == set(CANDIDATES) and set(runs["step"]) == {f"{STEPS} / {STEPS}"}
    metrics = {metric.label: metric.value for metric in test.metric}
    assert metrics["mean reward"] == f"{_progress(STEPS)['mean_reward']:.2f}"
    assert metrics["elapsed in this phase"] == f"{_progress(STEPS)['elapsed_s']:.0f} s"
    specs = _chart_specs(test)
    assert any("mean reward" in spec and "success rate" in spec for spec in specs)
    assert any("zero variance" in spec for spec in specs)
    assert any("groups with variance" in spec for spec in specs)  # the gate's figures against their bands
    # The run names its recipe, where it trained, what GRPO added to the warm start, and the recipes tried on validation seeds.
    assert "Recipe **sft+grpo**, trained on cuda. GRPO added +0.14 [" in shown, shown
    tried = next(frame.value for frame in test.dataframe if "validation success" in frame.value.columns)
    assert list(tried["recipe"]) == ["sft", "sft+grpo", "guided_grpo"] and list(tried["validation success"])[:2] == [0.25, 0.5]
    captions = " ".join(caption.value for caption in test.caption)
    assert "sft+grpo: validation success after GRPO step 0: 0.25, 5: 0.50, 10: 0.38 (8 seeds); kept step 5" in captions, captions
    assert any("clipped tokens" in spec and "KL to start" in spec for spec in specs)


def test_approve_on_the_adapters_page_makes_the_candidate_approved_with_the_token(
    loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = app(loaded.config_path, monkeypatch, "views/adapters.py")
    adapter = _adapter(loaded, "error_recovery")
    assert adapter["state"] == "candidate"
    assert any(f"error_recovery@v1 · adapter {adapter['adapter_id']} · candidate" in header.value for header in test.subheader)
    assert any("held-out success rate" in spec for spec in _chart_specs(test))
    test.button(key=f"approve_{adapter['adapter_id']}").click().run()
    assert not test.error, [error.value for error in test.error]
    assert any(f"adapter {adapter['adapter_id']} candidate → approved (by admin)" in item.value for item in test.success)
    assert _adapter(loaded, "error_recovery")["state"] == "approved"
    audit = loaded.get("/api/audit", adapter_id=adapter["adapter_id"])["items"]
    assert [(row["actor"], row["action"], row["to_state"]) for row in audit] == [("admin", "approve", "approved")]
    log = test.dataframe[-1].value
    assert ((log["adapter_id"] == adapter["adapter_id"]) & (log["move"] == "candidate → approved")).any()


def test_reject_needs_a_reason_and_records_it(loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    test = app(loaded.config_path, monkeypatch, "views/adapters.py")
    adapter_id = _adapter(loaded, "precondition_verification")["adapter_id"]
    test.button(key=f"reject_{adapter_id}").click().run()
    assert any("A reason is required to reject" in error.value for error in test.error)
    assert _adapter(loaded, "precondition_verification")["state"] == "candidate"
    test.text_input(key=f"reason_{adapter_id}").input("regresses refunds on replay").run()
    test.button(key=f"reject_{adapter_id}").click().run()
    assert _adapter(loaded, "precondition_verification")["state"] == "rejected"
    audit = loaded.get("/api/audit", adapter_id=adapter_id)["items"]
    assert [(row["action"], row["reason"]) for row in audit] == [("reject", "regresses refunds on replay")]


def test_without_a_token_decisions_are_disabled_and_say_why(
    loaded: RunningDaemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Same daemon, but a store folder without the daemon's api.token: the dashboard has no token.
    config = tmp_path / "no-token.toml"
    config.write_text(f'[api]\nport = {loaded.sections["api"]["port"]}\n[store]\npath = "{tmp_path / "elsewhere.duckdb"}"\n')
    test = app(config, monkeypatch, "views/adapters.py")
    adapter_id = _adapter(loaded, "tool_call_precision")["adapter_id"]
    assert any("No API token" in warning.value for warning in test.warning)
    assert test.button(key=f"approve_{adapter_id}").disabled


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, dict[str, tuple[int, int]]]]:
    """A daemon where error_recovery@v1 is live and v2 a canary against it, with agent trajectories
    whose traces carry the router's span naming the version that served them (as the router writes
    it). The router itself is down. Returns the daemon and (failed, routed) per version."""
    directory = tmp_path_factory.mktemp("routed")
    since_ns = time.time_ns() - 3600 * 10**9
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    for version, state in ((1, "live"), (2, "canary")):
        store.query(
            "INSERT INTO adapters (capability, version, run_id, environment_id, path, manifest_sha256, state, evaluation, "
            "created_at, routed_since_ns, baseline) VALUES ('error_recovery', ?, ?, 1, ?, 'x', ?, ?, now(), ?, ?) RETURNING adapter_id",
            [version, version, f"/adapters/v{version}", state, json.dumps(_evaluation("error_recovery", 5, 40)), since_ns,
             json.dumps({"failures": 20, "total": 40}) if state == "live" else None],
        )  # fmt: skip
    store.close()
    daemon = make_daemon(directory, analysis={"interval_s": 1.0}, router=router_down()).start()
    plans = generate(40, seed=3, failure_rate=0.5, gaps=GAPS)
    send(plans, daemon.http_url, "http/protobuf", "log")
    served: dict[str, tuple[int, int]] = {"error_recovery@v1": (0, 0), "error_recovery@v2": (0, 0)}
    spans = []
    for index, plan in enumerate(plans):
        name = "error_recovery@v2" if index % 2 else "error_recovery@v1"
        failed, total = served[name]
        served[name] = (failed + (plan.outcome == "failure"), total + 1)
        attributes = {"gen_ai.operation.name": "chat", "tracefix.router.capability": "error_recovery", "tracefix.router.adapter": name}
        spans.append(json_span(plan.trace_id, new_span_id(), "chat base", parent_span_id=new_span_id(), attributes=attributes, kind=2))
    posted = post(f"{daemon.http_url}/v1/traces", json_bytes(json_traces(spans, "tracefix-router")), JSON)
    assert posted.status_code == 200, posted.text
    daemon.wait_assembled()
    yield daemon, served
    daemon.stop()


def test_routing_page_shows_serving_versions_and_the_canary_comparison(
    routed: tuple[RunningDaemon, dict[str, tuple[int, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, served = routed
    judged = {item["name"]: item for item in wait_for(lambda: _judged(daemon), timeout_s=30)}
    test = app(daemon.config_path, monkeypatch, "views/routing.py")
    assert [header.value for header in test.header] == ["Serving versions", "Router"]
    serving = test.dataframe[0].value
    assert dict(zip(serving["served as"], serving["state"], strict=True)) == {"error_recovery@v1": "live", "error_recovery@v2": "canary"}
    assert any(warning.value.startswith("The router did not answer") for warning in test.warning)
    table = test.dataframe[1].value.set_index("version")
    for name, (failed, total) in served.items():
        assert table.loc[name, "failed / routed"] == f"{failed} / {total}"
        assert table.loc[name, "failure rate"] == pytest.approx(judged[name]["adapter"]["rate"])
    assert table.loc["error_recovery@v2", "judged against"] == "error_recovery@v1"
    assert table.loc["error_recovery@v1", "judged against"] == "before promotion"
    assert any("failure rate of routed trajectories" in spec for spec in _chart_specs(test))


def _judged(daemon: RunningDaemon) -> list[dict[str, Any]] | None:
    items = daemon.get("/api/routing")["adapters"]
    return items if len(items) == 2 and all(item.get("adapter", {}).get("total") for item in items) else None


def test_rolling_back_while_the_router_is_down_shows_the_daemons_reason_and_changes_nothing(
    routed: tuple[RunningDaemon, dict[str, tuple[int, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, _ = routed
    test = app(daemon.config_path, monkeypatch, "views/adapters.py")
    assert "Canaries" in [header.value for header in test.header]
    assert any(markdown.value.startswith("**Routed traffic**: failure rate") for markdown in test.markdown)
    test.text_input(key="reason_2").input("fails more than v1").run()
    test.button(key="rollback_2").click().run()
    assert not test.exception
    assert any("POST /api/adapters/2/rollback failed (502)" in error.value for error in test.error)
    assert daemon.get("/api/adapters/2")["state"] == "canary"


def test_routing_statistics_are_read_from_either_shape_of_the_endpoint() -> None:
    snapshot = {"mode": "gate", "fixed": None, "adapters": [{"name": "error_recovery@v1"}]}
    assert snapshot_of({"snapshot": snapshot, "experts": []}) == snapshot
    assert snapshot_of({**snapshot, "experts": []})["mode"] == "gate"
    as_list = expert_rows({"experts": [{"expert": "base", "requests": 3, "prompt_tokens": 10, "completion_tokens": 5}]})
    as_mapping = expert_rows({"experts": {"base": {"requests": 3, "prompt_tokens": 10, "completion_tokens": 5}}})
    assert as_list == as_mapping == [{"expert": "base", "requests": 3, "prompt_tokens": 10, "completion_tokens": 5, "tokens": 15}]


# -- empty states and errors -------------------------------------------------------------------


def test_an_empty_daemon_gets_empty_states_that_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = make_daemon(tmp_path, router=router_down()).start()
    hint = f"No traces yet — point your agent at {daemon.http_url}"
    try:
        for page, expected in (
            (None, hint),
            ("views/evidence.py", hint),
            ("views/pipeline.py", "No environments yet"),
            ("views/adapters.py", "No adapters yet"),
            ("views/routing.py", "No adapter is live"),
        ):
            test = app(daemon.config_path, monkeypatch, page)
            assert not test.error, (page, [error.value for error in test.error])
            assert any(info.value.startswith(expected) for info in test.info), (page, [info.value for info in test.info])
    finally:
        daemon.stop()


def test_an_unreachable_daemon_is_an_error_message_on_every_page_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    config = tmp_path / "unreachable.toml"
    config.write_text(f'[api]\nport = {port}\ntoken = "t"\n[dashboard]\ntimeout_s = 2.0\n')
    for page in (None, "views/evidence.py", "views/pipeline.py", "views/adapters.py", "views/routing.py"):
        test = app(config, monkeypatch, page)  # asserts no exception element
        messages = [error.value for error in test.error]
        assert any(f"not reachable at http://127.0.0.1:{port}" in message for message in messages), (page, messages)


# -- a real browser driving `tracefix dashboard` ---------------------------------------------------


INSTALL_CHROMIUM = (
    "install with `apt-get install -y chromium chromium-driver` (Debian/Ubuntu), "
    "or set CHROMIUM and CHROMEDRIVER to their paths"
)


def browser_or_reason(environ: Mapping[str, str], which: Callable[[str], str | None]) -> tuple[str, str]:
    """The paths of Chromium and its driver; when one is missing, fail under CI (a browser test must
    not pass without a browser there) and skip elsewhere, saying how to install them."""
    browser = which(environ.get("CHROMIUM") or "chromium")
    driver = which(environ.get("CHROMEDRIVER") or "chromedriver")
    if browser is not None and driver is not None:
        return browser, driver
    missing = " and ".join(name for name, path in (("chromium", browser), ("chromedriver", driver)) if path is None)
    if environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{missing} not found under CI; .ci/run installs them — {INSTALL_CHROMIUM}", pytrace=False)
    pytest.skip(f"{missing} not found: {INSTALL_CHROMIUM}")


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Chromium and its driver, found on PATH (or named by CHROMIUM, CHROMEDRIVER); tests install nothing."""
    return browser_or_reason(os.environ, shutil.which)


def _decision(environ: dict[str, str], programs: dict[str, str]) -> tuple[str, Any]:
    """browser_or_reason's outcome as a value: a skip or a fail must not end the test that checks it."""
    try:
        return "paths", browser_or_reason(environ, programs.get)
    except pytest.fail.Exception as error:
        return "fail", str(error)
    except pytest.skip.Exception as error:
        return "skip", str(error)


def test_without_chromium_the_browser_tests_fail_under_ci_and_skip_elsewhere_with_the_install_line() -> None:
    installed = {"chromium": "/usr/bin/chromium", "chromedriver": "/usr/bin/chromedriver"}
    no_driver = {"chromium": "/usr/bin/chromium"}
    install = "apt-get install -y chromium chromium-driver"
    for environ, programs, missing in (({"CI": "true"}, no_driver, "chromedriver"), ({"CI": "1"}, {}, "chromium and chromedriver")):
        action, message = _decision(environ, programs)
        assert action == "fail" and message.startswith(f"{missing} not found under CI") and install in message, (environ, message)
    for environ in ({}, {"CI": "false"}, {"CI": ""}):
        action, message = _decision(environ, no_driver)
        assert action == "skip" and install in message and "\n" not in message, (environ, message)
    paths = ("/usr/bin/chromium", "/usr/bin/chromedriver")
    assert _decision({"CI": "true"}, installed) == _decision({}, installed) == ("paths", paths)
    # CHROMIUM and CHROMEDRIVER name the programs instead of PATH's chromium and chromedriver.
    named = {"CHROMIUM": "/opt/chrome/chrome", "CHROMEDRIVER": "/opt/chrome/chromedriver"}
    elsewhere = {path: path for path in named.values()}
    assert _decision(named, elsewhere) == ("paths", ("/opt/chrome/chrome", "/opt/chrome/chromedriver"))


@contextmanager
def running_dashboard(daemon: RunningDaemon, port: int) -> Iterator[str]:
    """`tracefix dashboard --config ...` as a real process on a free loopback port (given as
    TRACEFIX_DASHBOARD_PORT, like any setting), stopped on exit."""
    import ctypes
    import signal
    import subprocess
    import sys

    def die_with_parent() -> None:  # survives the exec into Streamlit: no orphan after a killed test run
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    url = f"http://127.0.0.1:{port}"
    log_path = daemon.directory / f"dashboard-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "dashboard", "--config", str(daemon.config_path)],
        cwd=REPO, stdout=log_path.open("ab"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        env={**os.environ, "TRACEFIX_DASHBOARD_PORT": str(port)},
    )  # fmt: skip

    def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/_stcore/health", timeout=1).text == "ok"
        except httpx.TransportError:
            return False

    try:
        wait_for(healthy, timeout_s=60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def dashboard_url(loaded: RunningDaemon) -> Iterator[str]:
    with running_dashboard(loaded, loaded.sections["dashboard"]["port"]) as url:
        yield url


@pytest.fixture(scope="module")
def browser(chromium: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium[0]
    for argument in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
        "--window-size=1500,2400",
    ):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(chromium[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for_text(driver: Any, *texts: str, timeout_s: float = 60) -> str:
    from selenium.webdriver.common.by import By

    def rendered() -> str | None:
        body = driver.find_element(By.TAG_NAME, "body").text
        return body if all(text in body for text in texts) else None

    try:
        return wait_for(rendered, timeout_s=timeout_s, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"page never showed {texts}; it shows:\n{driver.find_element(By.TAG_NAME, 'body').text[:3000]}") from None


def _screenshot(driver: Any, name: str, directory: Path) -> None:
    """Every page is photographed; with TRACEFIX_SCREENSHOTS=DIR the pictures land there (docs/screenshots)."""
    target = Path(os.environ.get("TRACEFIX_SCREENSHOTS") or directory)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PAGES = (
    ("", "health", ("Capability health", "precondition_verification", "Lacking rate: failed vs successful runs")),
    ("evidence", "evidence", ("LACKING ·", "PRESENT ·", "Evidence:", "tool call")),
    ("pipeline", "pipeline", ("Environments", "Validation passed", "Sampled instance", "Training runs", "GRPO step 8/8")),
    ("adapters", "adapters", ("Candidates", "tool_call_precision@v1", "Audit log")),
    ("routing", "routing", ("Serving versions", "Router")),
)


def test_each_page_renders_with_data_in_a_real_browser(
    browser: Any, dashboard_url: str, loaded: RunningDaemon, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    for path, name, texts in PAGES:
        browser.get(f"{dashboard_url}/{path}")
        body = _wait_for_text(browser, *texts)
        assert "Traceback" not in body
        assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stException']"), name
        if name in ("health", "pipeline", "adapters"):
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".vega-embed canvas, .vega-embed svg"), timeout_s=30)
        if name != "routing":  # photographed with a canary in the next test
            _screenshot(browser, name, tmp_path)


def test_the_health_page_in_a_browser_says_what_the_rules_cannot_see(
    browser: Any, unexplained: RunningDaemon, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    message = unexplained.get("/api/capabilities")["diagnosis"]["message"]
    with running_dashboard(unexplained, free_port()) as url:
        browser.get(url)
        _wait_for_text(browser, "Capability health", "30 failed runs, yet no capability is selected")
        boxes = [" ".join(box.text.split()) for box in browser.find_elements(By.CSS_SELECTOR, "[data-testid='stAlert']")]
        shown = " ".join(message.replace("`", "").split())  # backticks become code spans
        assert any(shown in box for box in boxes), boxes
        assert any("[llm] enabled = true" in box and "[[capabilities.evaluations]]" in box for box in boxes)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "[data-testid='stDataFrame'] canvas"), timeout_s=30)
        _screenshot(browser, "health-unexplained", tmp_path)


def test_the_routing_page_in_a_browser_shows_the_canary_against_the_live_version(
    browser: Any, routed: tuple[RunningDaemon, dict[str, tuple[int, int]]], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    daemon, _ = routed
    wait_for(lambda: _judged(daemon), timeout_s=30)
    with running_dashboard(daemon, free_port()) as url:
        browser.get(f"{url}/routing")
        _wait_for_text(browser, "Serving versions", "The router did not answer", "Canary and live comparison")
        charts = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".vega-embed canvas, .vega-embed svg"), timeout_s=30)
        assert charts  # wait_for raises when none appear in time
        _screenshot(browser, "routing", tmp_path)


def test_pages_refresh_by_themselves_as_traces_arrive(browser: Any, dashboard_url: str, loaded: RunningDaemon) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url)
    _wait_for_text(browser, "Capability health", "trajectories")
    before = loaded.status()["counts"]["trajectories"]

    def shown_count() -> str:
        values = browser.find_elements(By.CSS_SELECTOR, "[data-testid='stMetricValue']")
        return values[0].text if values else ""

    wait_for(lambda: shown_count() == str(before), timeout_s=30)
    send(generate(12, seed=99, failure_rate=0.5, gaps=GAPS), loaded.http_url, "http/protobuf", "log")
    loaded.wait_assembled()
    # No reload, no click: the page's own refresh ([dashboard] refresh_s = 5) shows the new count.
    assert wait_for(lambda: shown_count() == str(before + 12), timeout_s=30)


def test_clicking_approve_in_the_browser_makes_the_adapter_approved_in_the_api(
    browser: Any, dashboard_url: str, loaded: RunningDaemon
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    adapter_id = _adapter(loaded, "tool_call_precision")["adapter_id"]
    assert _adapter(loaded, "tool_call_precision")["state"] == "candidate"
    browser.get(f"{dashboard_url}/adapters")
    _wait_for_text(browser, f"tool_call_precision@v1 · adapter {adapter_id} · candidate")

    def click_approve() -> bool:
        try:
            buttons = browser.find_elements(By.CSS_SELECTOR, f".st-key-approve_{adapter_id} button")
            if buttons and buttons[0].is_enabled():
                buttons[0].click()
                return True
        except StaleElementReferenceException:  # the page refreshed under the click; try again
            pass
        return False

    wait_for(click_approve, timeout_s=30)
    wait_for(lambda: _adapter(loaded, "tool_call_precision")["state"] == "approved", timeout_s=30)
    _wait_for_text(browser, f"adapter {adapter_id} candidate → approved")
    audit = loaded.get("/api/audit", adapter_id=adapter_id)["items"]
    assert [(row["actor"], row["action"]) for row in audit] == [("admin", "approve")]
