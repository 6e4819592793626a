"""`tracefix demo`: its settings are defaults under the user's, and (slow, by hand) the whole loop
runs unattended on the embedded model: `make test-slow` or `pytest -m slow tests/test_demo.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.demo_loop import STAGE_WIDTH, stage
from examples.demo.settings import layered_settings
from tests.conftest import REPO, free_port


def test_demo_settings_never_override_the_users_file_or_environment(tmp_path: Path) -> None:
    config = tmp_path / "mine.toml"
    config.write_text('[store]\npath = "%s"\n[promotion]\ncanary_min_trajectories = 7\n' % (tmp_path / "db.duckdb"))
    environ = {"TRACEFIX_ANALYSIS_INTERVAL_S": "42"}
    settings, variables = layered_settings(config, fast=False, environ=environ)
    assert settings.promotion.canary_min_trajectories == 7  # the file wins
    assert settings.analysis.interval_s == 42  # the environment wins
    assert settings.training.warm_start_examples == 96 and settings.promotion.canary_fraction == 0.5  # demo defaults
    assert "TRACEFIX_PROMOTION_CANARY_MIN_TRAJECTORIES" not in variables and "TRACEFIX_ANALYSIS_INTERVAL_S" not in variables
    assert variables["TRACEFIX_TRAINING_WARM_START_EXAMPLES"] == "96"


def test_fast_settings_skip_the_gate_and_train_on_fewer_demonstrations(tmp_path: Path) -> None:
    settings, variables = layered_settings(None, fast=True, environ={})
    assert not settings.validation.enabled
    assert settings.training.recipe == "sft+grpo" and settings.training.steps > 0  # GRPO follows the warm start here too
    assert settings.training.warm_start_examples < layered_settings(None, fast=False, environ={})[0].training.warm_start_examples
    assert variables["TRACEFIX_VALIDATION_ENABLED"] == "false" and variables["TRACEFIX_VALIDATION_HINT_SHARES"] == "[]"
    assert settings.promotion.canary_min_trajectories < 30


@pytest.mark.slow
def test_the_demo_runs_the_loop_unattended_to_a_candidate_and_beyond(tmp_path: Path) -> None:
    """About 15 minutes on 2 CPU cores: traffic, a selected gap, an environment, a warm-start
    adapter on SmolLM2-135M, auto-approval and its canary."""
    ports = {"api": free_port(), "http": free_port(), "grpc": free_port(), "router": free_port(), "dashboard": free_port()}
    config = tmp_path / "demo.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "data" / "tracefix.duckdb"}"\n'
        f"[collector]\nhttp_port = {ports['http']}\ngrpc_port = {ports['grpc']}\n[api]\nport = {ports['api']}\n"
        f"[router]\nport = {ports['router']}\n[dashboard]\nport = {ports['dashboard']}\n"
    )
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "demo", "--config", str(config), "--fast", "--auto-approve", "--minutes", "20",
               "--policy", "scripted"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "capability selected: precondition_verification" in done.stderr
    assert "candidate ready" in done.stderr and "approved" in done.stderr
    with pytest.raises(httpx.HTTPError):  # everything stopped with the demo
        httpx.get(f"http://127.0.0.1:{ports['api']}/healthz", timeout=2)


@pytest.mark.timeout(900)
def test_the_demo_passes_every_stage_on_a_tiny_model(tmp_path: Path, tiny_model: Path) -> None:
    """The quick variant: a tiny random model behind the router fails every task and never calls a
    tool; next to scripted flows that succeed, tool_call_precision is the gap. It goes through an
    environment, a warm-start adapter, auto-approval, the canary (fixed routing sends all of the
    capability's traffic through the split), promotion, and conversations measured after it."""
    ports = {"api": free_port(), "http": free_port(), "grpc": free_port(), "router": free_port(), "dashboard": free_port()}
    config = tmp_path / "demo.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "data" / "tracefix.duckdb"}"\n'
        f"[collector]\nhttp_port = {ports['http']}\ngrpc_port = {ports['grpc']}\n[api]\nport = {ports['api']}\n"
        f'[router]\nport = {ports["router"]}\nrouting = "fixed"\nfixed_adapter = "tool_call_precision"\nmax_context_tokens = 4096\n'
        f"[dashboard]\nport = {ports['dashboard']}\n"
        f'[model]\nname = "{tiny_model}"\nmax_new_tokens = 8\n'
        "[analysis]\ninterval_s = 1.0\nmin_failures = 5\n"
        "[training]\nwarm_start_examples = 2\neval_seeds = 2\neval_margin = 0.0\n"
        "[promotion]\ninterval_s = 1.0\ncanary_min_trajectories = 3\nwatch_min_trajectories = 1000\n"
        # The generalist comes first; a tiny random model learns nothing from the flows' successes,
        # and a margin it cannot meet keeps its path fixed: never offered, then the targeted adapter.
        "[generalist]\nmin_trajectories = 3\nmargin = 0.99\n"
    )
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "demo", "--config", str(config), "--fast", "--auto-approve",
               "--minutes", "12", "--after", "3", "--rate", "4", "--report", str(tmp_path / "report.json")]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, env=os.environ)
    output = done.stderr
    assert done.returncode == 0, output[-3000:]
    generalist = "training run 1 (generalist.airline-support-agent v1): "
    track = "tool_call_precision.airline-support-agent"  # the model-driven agent's own track (daemon.core.tracks)
    assert output.find(generalist + "running") < output.find(generalist + "rejected_by_eval") < output.find("training run 2"), output[-4000:]
    stages = [
        "capability selected: tool_call_precision", "environment 1 (tool_call_precision): checked",
        f"training run 2 ({track} v1): running", "model-driven traffic resumes",
        f"candidate ready: {track}@v1",
        f"{track}@v1: candidate → approved by admin", f"{track}@v1: approved → canary by promotion",
        f"{track}@v1: canary → live by promotion",
        "model-driven conversations since the adapter went live: done",
    ]  # fmt: skip
    positions = [output.find(stage) for stage in stages]
    assert all(position >= 0 for position in positions) and positions == sorted(positions), (positions, output[-4000:])
    # The traffic is held when the targeted run starts (since its environment's gate or its wait for
    # the trainer, or since the generalist's run) and resumes only after the run.
    hold = output.rfind("model-driven traffic holds while ", 0, positions[2])
    assert hold >= 0 and output.find("model-driven traffic resumes", hold) > positions[2], output[-4000:]
    before, _, after = output.rpartition("model-driven failure rate before the adapter: ")[2].partition("; after: ")
    assert before.split(" on ")[1].strip().isdigit() and int(after.split(" on ")[1].split()[0]) >= 3, output[-1000:]
    assert f"{track} lacking before the adapter: " in output, output[-1000:]
    # Conversations finished while the canary routed a share to the adapter count neither as before nor after.
    assert output.find(f"{track}@v1 is in canary") < output.find(f"{track}@v1 is live"), output[-4000:]

    # The report holds the same run's numbers: the stages in order with their times, the gap as it
    # was selected, the candidate's evaluation, and before vs after on the panel's conversations.
    report = json.loads((tmp_path / "report.json").read_text())
    seconds = [event["seconds"] for event in report["timeline"]]
    assert seconds == sorted(seconds) and 0 < seconds[-1] <= report["seconds"]
    # The clock starts with the command: the processes' start is on it, then the first gap.
    events = [event["event"] for event in report["timeline"]]
    assert events[0] == "started" and seconds[0] > 1 and events[1].startswith("selected:tool_call_precision")
    assert report["live"] == track and report["capability"] == track
    assert (report["settings"]["minutes"], report["settings"]["after"]) == (12, 3)  # how it was run, for bench/demo_loop.py
    assert report["selected"]["tool_call_precision"]["delta"] > 0
    assert "target" in report["candidates"][f"{track}@v1"]
    # The demo trains a warm start and then GRPO, and every run measures what GRPO added on the same seeds.
    assert report["settings"]["training"]["recipe"] == "sft+grpo" and report["settings"]["training"]["steps"] > 0
    added = report["candidates"][f"{track}@v1"]["grpo_added"]
    assert added["seeds"] == 2 and "GRPO added" in output[output.find("candidate ready") :].splitlines()[0]
    # Task success per period with intervals, and what the generalist would have learned from: nothing of the panel.
    assert report["panel"] == {"batches": 12, "goals": 48} and report["success"]["before"]["count"] == 0
    assert "task success on the panel — before: 0.00" in output
    assert report["generalist"] is None and report["learned_from"] == []  # never offered: no adapter learned from stored runs
    failure = report["failure"]
    assert failure["after"]["total"] >= 3 and failure["before"]["total"] == int(before.split(" on ")[1])
    assert set(failure) == set(report["lacking"]) == {"before", "canary", "after"}
    assert failure["before"]["count"] == failure["before"]["total"]  # a random tiny model never meets a goal
    # How far each goal got, per period: the same conversations as the failure rate.
    steps = report["goal_steps"]
    assert sum(row["conversations"] for row in steps["before"]) == failure["before"]["total"]
    assert all(row["reaching"][-1] == 0 and sum(item["count"] for item in row["breaks"]) == row["conversations"] for row in steps["before"])
    # The model-driven agent's own statistics leave the scripted flows (another service) out: no successes.
    own = report["agent_stats"]["items"]["tool_call_precision"]
    assert report["agent_stats"]["agent"] == "airline-support-agent" and own["n_success"] == 0 and own["n_failure"] > 0
    assert report["selected"]["tool_call_precision"]["n_success"] > 0  # pooled, the flows' successes are the contrast
    lacking = report["lacking"]["before"]
    assert 0 < lacking["total"] <= failure["before"]["total"] and lacking["interval"][0] <= lacking["rate"] <= lacking["interval"][1]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{ports['router']}/healthz", timeout=2)


def test_a_capability_selected_without_successes_to_compare_is_narrated_not_fatal() -> None:
    """After an adapter goes live, a capability can be selected whose ER+ has no successful run to
    come from (None in the API): the narration says n/a instead of stopping the demo."""
    from examples.demo.narrator import Narrator
    from examples.demo.panel import Tally

    lines: list[str] = []
    narrator = Narrator(None, Tally(), False, "http://127.0.0.1:8501", lines.append)  # type: ignore[arg-type]
    item = {
        "name": "precondition_verification", "selected": True, "state": "gap_detected",
        "windows": {"all": {"delta": None, "coverage": 0.4, "er_minus": 1.0, "er_plus": None}},
    }  # fmt: skip
    narrator._capabilities([item])
    assert lines == [
        "capability selected: precondition_verification — Δ n/a, coverage 0.40 "
        "(lacking in 100% of failed runs that need it vs n/a of successful ones)"
    ]
    assert narrator.rows["capabilities"] == "precondition_verification: gap_detected"


@pytest.mark.parametrize(
    ("status", "verdicts", "warm_start", "expected"),
    [
        ("rejected", ["too_weak", "too_weak"], True,
         "too hard for the base model (base mean reward 0.05 on 8 rollouts): training starts with a warm start on its solutions"),
        ("rejected", ["too_weak"], False, "rejected by the validation gate: too_weak (base mean reward 0.05 on 8 rollouts)"),
        ("rejected", ["too_weak", "no_variance"], True,
         "rejected by the validation gate: no_variance, too_weak (base mean reward 0.05 on 8 rollouts)"),
        ("validated", ["too_strong", "ok"], True, "validated (base mean reward 0.01 on 8 rollouts, hint share 0.25)"),
        ("checked", [], True, "checked"),
    ],
)  # fmt: skip
def test_an_environment_is_narrated_with_what_the_gate_measured(
    status: str, verdicts: list[str], warm_start: bool, expected: str
) -> None:
    """A rejected environment is not a dead end when the warm start is on: the narration says why the
    gate decided and what happens next, instead of a bare status."""
    from examples.demo.narrator import Narrator
    from examples.demo.panel import Tally

    lines: list[str] = []
    narrator = Narrator(None, Tally(), False, "http://127.0.0.1:8501", lines.append, warm_start=warm_start)  # type: ignore[arg-type]
    attempts = [{"verdict": verdict, "mean": 0.05 if index == 0 else 0.01} for index, verdict in enumerate(verdicts)]
    validation = {"attempts": attempts, "rollouts": 8, "hint_share": 0.25} if attempts else None
    narrator._environments([{"environment_id": 3, "family": "tool_call_precision", "status": status, "validation": validation}])
    assert lines == [f"environment 3 (tool_call_precision): {expected}"]


def test_conversations_during_the_canary_count_neither_before_nor_after() -> None:
    """'Before' is the base alone: once a canary routes a share of the traffic to the adapter, the
    conversations that finish go to their own bucket until it is live; a canary that ends without
    going live hands the traffic back to the base, and 'before' again."""
    from examples.demo.narrator import Narrator
    from examples.demo.panel import Tally

    lines: list[str] = []
    tally = Tally()
    narrator = Narrator(None, tally, False, "http://127.0.0.1:8501", lines.append)  # type: ignore[arg-type]
    adapter = {"adapter_id": 1, "capability": "tool_call_precision", "version": 1}
    tally.add("a", False)
    narrator._adapters([{**adapter, "state": "canary"}], {})
    tally.add("b", True)
    narrator._adapters([{**adapter, "state": "rejected"}], {})  # rolled back from its canary
    tally.add("c", False)
    narrator._adapters([{**adapter, "adapter_id": 2, "version": 2, "state": "canary"}], {})
    tally.add("d", False)
    narrator._adapters([{**adapter, "adapter_id": 2, "version": 2, "state": "live"}], {})
    tally.add("e", True)
    assert (tally.before, tally.canary, tally.after) == ({"a": False, "c": False}, {"b": True, "d": False}, {"e": True})
    assert lines == [
        "tool_call_precision@v1 is in canary: the conversations until it goes live are counted apart, as 'canary'",
        "tool_call_precision@v2 is in canary: the conversations until it goes live are counted apart, as 'canary'",
        "tool_call_precision@v2 is live: the agent's conversations from now on count as 'after'",
    ]


def test_with_two_adapters_wanted_each_gets_its_periods_and_after_waits_for_both() -> None:
    """`tracefix demo --adapters 2`: the first adapter's canary and live periods are numbered, the
    model-driven traffic holds again while the second capability trains, and 'after' begins once
    both adapters are live."""
    import threading

    from examples.demo.narrator import Narrator

    from examples.demo.panel import Tally

    lines: list[str] = []
    tally, hold = Tally(), threading.Event()
    narrator = Narrator(None, tally, False, "http://127.0.0.1:8501", lines.append, hold, adapters=2)  # type: ignore[arg-type]
    first = {"adapter_id": 1, "capability": "tool_call_precision", "version": 1}
    second = {"adapter_id": 2, "capability": "error_recovery", "version": 1}
    tally.add("a", False)
    narrator._adapters([{**first, "state": "canary"}], {})
    tally.add("b", False)
    narrator._adapters([{**first, "state": "live"}], {})
    tally.add("c", True)
    # The second capability trains: with one adapter live of two wanted, the traffic holds for it.
    narrator._hold_traffic([], [{"run_id": 2, "environment_id": 2, "status": "rejected_by_eval"},
                                {"run_id": 3, "environment_id": 2, "status": "running"}], measuring=False)  # fmt: skip
    assert hold.is_set()
    narrator._adapters([{**first, "state": "live"}, {**second, "state": "canary"}], {})
    tally.add("d", True)
    narrator._adapters([{**first, "state": "live"}, {**second, "state": "live"}], {})
    tally.add("e", True)
    assert tally.outcomes == {"before": {"a": False}, "canary 1": {"b": False}, "after 1": {"c": True}, "canary 2": {"d": True}, "after": {"e": True}}
    assert narrator.lives == ["tool_call_precision", "error_recovery"] and narrator.live == "tool_call_precision"
    assert lines[-1] == "error_recovery@v1 is live: the agent's conversations from now on count as 'after'"


def test_a_run_whose_time_ends_before_after_still_closes_with_what_it_measured() -> None:
    """With two adapters wanted and the time up while the second trains, the periods reached are
    reported and the ones not reached say so (the closing line once raised on the missing 'after',
    and the run lost its report)."""
    from examples.demo.narrator import lacking_text

    measured = {
        "capability": "tool_call_precision",
        "lacking": {"before": {"count": 20, "total": 20}, "canary 1": {"count": 10, "total": 26}, "after 1": {"count": 9, "total": 24}},
    }
    line = lacking_text(measured)
    assert line is not None and line.startswith("tool_call_precision lacking before the adapter: 1.00")
    assert "after: not reached" in line and "during the canary: not reached" in line
    measured["lacking"]["after"] = {"count": 3, "total": 24}
    assert "after: 0.12" in (lacking_text(measured) or "")
    assert lacking_text({"capability": "tool_call_precision"}) is None


def test_the_generalist_has_periods_of_its_own_before_the_targeted_adapters() -> None:
    """Before (the base alone) → the generalist's canary → the generalist alone → the targeted
    adapter's canary → after (both): each conversation counts in the period it finished in, and task
    success is compared paired on the same goals (each goal's first conversation in each period)."""
    from examples.demo.narrator import Narrator, success_text
    from examples.demo.panel import Tally

    lines: list[str] = []
    tally = Tally()
    narrator = Narrator(None, tally, False, "http://127.0.0.1:8501", lines.append)  # type: ignore[arg-type]
    generalist = {"adapter_id": 1, "capability": "generalist.airline-support-agent", "version": 1}
    targeted = {"adapter_id": 2, "capability": "tool_call_precision", "version": 1}
    for goal in "wxyz":
        tally.add(f"before-{goal}", goal == "w", goal=goal)
    tally.add("before-again", True, goal="x")  # a goal's second conversation in a period is not its pair
    narrator._adapters([{**generalist, "state": "canary"}], {})
    tally.add("g-canary", True, goal="w")
    narrator._adapters([{**generalist, "state": "live"}], {})
    for goal in "wxyz":
        tally.add(f"generalist-{goal}", goal in "wxy", goal=goal)
    narrator._adapters([{**generalist, "state": "live"}, {**targeted, "state": "canary"}], {})
    tally.add("t-canary", False, goal="x")
    narrator._adapters([{**generalist, "state": "live"}, {**targeted, "state": "live"}], {})
    for goal in "wxyz":
        tally.add(f"after-{goal}", True, goal=goal)
    assert list(tally.outcomes) == ["before", "generalist canary", "generalist", "canary", "after"]
    assert (len(tally.before), tally.outcomes["generalist canary"], len(tally.after)) == (5, {"g-canary": True}, 4)
    assert narrator.generalist == "generalist.airline-support-agent@v1" and narrator.lives == ["tool_call_precision"]
    assert lines[1] == "generalist.airline-support-agent@v1, the agent's generalist, is live: the agent's conversations from now on count as 'generalist'"
    paired = tally.paired("before", "generalist")
    # w met in both; x and y met only with the generalist; z in neither: 1 → 3 of 4 goals.
    assert (paired["goals"], paired["before"], paired["after"], paired["after_only"], paired["before_only"]) == (4, 1, 3, 2, 0)
    assert paired["difference"] == 0.5 and paired["interval"][0] < 0.5 < paired["interval"][1] and paired["mcnemar_p"] == 0.5
    assert tally.paired("before", "nothing") is None
    measured = {"success": {"before": {"count": 2, "total": 5}, "after": {"count": 4, "total": 4}}, "paired": [tally.paired("before", "after")]}
    text = success_text(measured)
    assert text.startswith("task success on the panel — before: 0.40 [") and "after: 1.00 [" in text
    assert "paired: after vs before on 4 goals +0.75 [" in text and "McNemar p 0.25" in text


def test_a_generalist_candidate_is_narrated_by_its_next_actions() -> None:
    from examples.demo.narrator import candidate_text

    rate = lambda value, low, high: {"rate": value, "interval": [low, high]}  # noqa: E731
    evaluation = {"kind": "next_action", "learned_from": 32, "turns": 40, "adapter": {"matched": rate(0.6, 0.45, 0.74)},
                  "base": {"matched": rate(0.1, 0.04, 0.23)}}  # fmt: skip
    assert candidate_text(evaluation) == (
        "the agent's generalist, learned from 32 successful conversations: next action right on 0.60 [0.45, 0.74] of 40 held-out turns vs base 0.10"
    )


def test_a_targeted_candidate_from_the_generalist_is_narrated_against_it_with_what_it_kept() -> None:
    from examples.demo.narrator import candidate_text

    rate = lambda value: {"rate": value, "interval": [value - 0.1, value + 0.1]}  # noqa: E731
    target = {"adapter": {"success_rate": 0.46}, "base": {"success_rate": 0.02}}
    assert candidate_text({"target": target}) == "held-out success 0.46 vs base 0.02"
    kept = {"generalist": {"matched": rate(0.81)}, "adapter": {"matched": rate(0.52)}, "turns": 81, "margin": 0.05, "forgets": True,
            "difference": {"rate": -0.29, "interval": [-0.4, -0.18], "mcnemar_p": 0.0}}  # fmt: skip
    assert candidate_text({"target": target, "reference": "generalist.support@v1", "retention": kept}) == (
        "held-out success 0.46 vs the generalist generalist.support@v1 0.02; next actions on the generalist's held-out conversations: "
        "generalist 0.81 → adapter 0.52 of 81 turns (-0.29 [-0.40, -0.18], McNemar p 0.00): forgets them (margin 0.05)"
    )


def test_the_demo_without_the_example_agent_says_where_it_runs(tmp_path: Path) -> None:
    # An installed wheel ships no examples/: `tracefix demo` says so in one line instead of a traceback.
    code = "import sys; sys.modules['examples.demo'] = None; from tracefix.daemon.app.cli import main; sys.argv = ['tracefix', 'demo']; main()"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "tracefix demo runs the example airline agent in the repository's examples/ folder" in done.stderr
    assert "run `make demo` in a clone" in done.stderr


def test_the_measured_sections_timeline_names_each_stage_without_the_numbers_its_tables_hold() -> None:
    assert stage("capability selected: refunds — Δ 1.00, coverage 1.00 (lacking in 100% of failed runs)") == "capability selected: refunds"
    assert stage("model-driven traffic resumes") == "model-driven traffic resumes"
    long = "candidate ready: refunds@v1, held-out success 0.69 vs the generalist 0.10; " + "GRPO added +0.02 on the same seeds, " * 5
    shown = stage(long)
    assert len(shown) <= STAGE_WIDTH and shown.endswith(" …") and long.startswith(shown[:-2])
