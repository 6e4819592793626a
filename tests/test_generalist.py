"""The generalist stage end to end, with a real daemon, a real `tracefix router` process and a real
(tiny) model: an agent that fails often, with successful conversations of its tools stored from OTLP,
gets a generalist trained by imitation in the train job's subprocess, scored teacher-forced against
the base on held-out successes, offered as a candidate with the trajectories it learned from, and
approved into the router, which serves it to the agent's conversations. Then the waits and limits:
too few successes (it says how many it has and needs), several agents (each learns from its own
tools' runs only), a generalist that does not beat the base (never offered), and a targeted adapter
started from the generalist (it carries it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import trl  # noqa: F401  (installed by make test: never skipped)

from tracefix.daemon.core import tracks  # noqa: E402
from tracefix.daemon.core.settings import StoreSettings  # noqa: E402
from tracefix.daemon.store.runs import RunStore  # noqa: E402
from tracefix.daemon.store.store import Store  # noqa: E402
from tests.conftest import RunningDaemon, free_port, make_daemon, wait_for  # noqa: E402
from tests.conversations import TOOLS, Call, Conversation, ConversationSender, Say, User  # noqa: E402
from tests.lora_support import make_adapter  # noqa: E402
from tests.test_going_live import RouterProcess, _post, _state  # noqa: E402

AGENT = "support-agent"
GENERALIST = "generalist.support-agent"
# What the agent's successful runs do, the same way every time: a pattern a 2-layer model learns in
# a few updates, so the test can tell a generalist that learned from one that did not.
LEARNED = {"order_id": "A-1"}
TINY = {
    "recipe": "sft", "steps": 0, "warm_start_examples": 2, "warm_start_epochs": 1, "warm_start_batch": 2,
    "warm_start_learning_rate": 5e-3, "eval_seeds": 2, "eval_margin": 0.0, "eval_interference": False, "max_new_tokens": 48,
}  # fmt: skip


def success(index: int) -> Conversation:
    return Conversation(
        [User(f"Please list the items of my order, request {index}."), Call("list_items", LEARNED, {"items": ["pen"]}), Say("Done.")],
        "success", conversation_id=f"conversation-success-{index}",
    )  # fmt: skip


def failure(index: int) -> Conversation:
    return Conversation([User(f"Cancel my booking {index}."), Say("I cannot.")], "failure", conversation_id=f"conversation-failure-{index}")


def mixed(failures: int, successes: int) -> list[Conversation]:
    """The agent's runs, failures among its successes as they come in."""
    runs = [failure(index) for index in range(failures)] + [success(index) for index in range(successes)]
    return runs[::2] + runs[1::2]


def send(daemon: RunningDaemon, conversations: list[Conversation], service: str = AGENT) -> None:
    sender = ConversationSender(daemon.http_url, service)
    try:
        for conversation in conversations:
            sender.send(conversation)
    finally:
        sender.close()


def generalist_runs(daemon: RunningDaemon) -> list[dict]:
    return [run for run in daemon.get("/api/runs")["items"] if run.get("kind") == "generalist"]


def finished(daemon: RunningDaemon, timeout: float = 200) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = generalist_runs(daemon)
        if runs and runs[0]["status"] not in ("queued", "running"):
            return daemon.get(f"/api/runs/{runs[0]['run_id']}")
        time.sleep(0.5)
    raise TimeoutError(f"no generalist run finished: {generalist_runs(daemon)}; {daemon.get('/api/generalists')}")


def generalist_daemon(tmp_path: Path, tiny_model: Path, **generalist: object) -> RunningDaemon:
    return make_daemon(
        tmp_path,
        analysis={"interval_s": 0.5},
        model={"name": str(tiny_model), "max_new_tokens": 48, "threads": 1},
        training=TINY,
        generalist={"min_trajectories": 16, "min_failure_rate": 0.3, "min_successes": 6, "held_out": 2, "max_conversations": 8,
                    "epochs": 6, **generalist},  # fmt: skip
        router={"port": free_port(), "routing": "classifier", "max_context_tokens": 2048},
        promotion={"canary": False, "interval_s": 0.5},
    )


def test_an_agent_that_fails_often_gets_a_generalist_trained_and_scored_on_held_out_successes(tmp_path: Path, tiny_model: Path) -> None:
    """The stage end to end in the train job's subprocess. A 2-layer random model cannot learn to
    write the agent's call from a few conversations (its 32-wide output layer is tied to the
    embeddings), so it scores as the base does: not better, so never offered."""
    # It trains once all 10 successes are in (10 needed: the run learns from 8, 2 held out).
    daemon = generalist_daemon(tmp_path, tiny_model, min_successes=10).start()
    try:
        send(daemon, mixed(8, 10))
        run = finished(daemon)
        learned = daemon.get(f"/api/runs/{run['run_id']}/trajectories")
        adapters = daemon.get("/api/adapters")["items"]
        waiting = wait_for(lambda: [item["waiting"] for item in daemon.get("/api/generalists")["items"]
                                    if (item["waiting"] or "").startswith("cooling down")], timeout_s=60)  # fmt: skip
        outcomes = {daemon.get(f"/api/trajectories/{item}")["outcome"] for item in learned["train"] + learned["held_out"]}
    finally:
        daemon.stop()
    assert (run["kind"], run["agent"], run["capability"]) == ("generalist", AGENT, GENERALIST), run
    assert run["result"]["training"]["imitation"]["updates"] == 8 // 2 * 6  # 8 conversations, 2 an update, 6 epochs
    evaluation = run["result"]["evaluation"]
    # Scored teacher-forced on the 2 newest successes: 2 agent turns each (the call, the answer).
    assert (evaluation["kind"], evaluation["conversations"], evaluation["learned_from"], evaluation["turns"]) == ("next_action", 2, 8, 4)
    assert (evaluation["base"]["call"]["total"], evaluation["base"]["answer"]["total"]) == (2, 2)
    assert evaluation["base"]["call"]["hits"] == 0  # the base never writes the agent's call
    assert evaluation["adapter"]["matched"]["rate"] <= evaluation["base"]["matched"]["rate"]
    # Not better than the base: never offered, and not trained again at once.
    assert run["status"] == "rejected_by_eval" and evaluation["reasons"][0].startswith("next-action accuracy"), run
    assert adapters == [] and waiting
    # The trajectories it learned from and was scored on: the agent's successes, apart.
    assert (len(learned["train"]), len(learned["held_out"])) == (8, 2) and not set(learned["train"]) & set(learned["held_out"])
    assert outcomes == {"success"}


@pytest.fixture
def stack(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, RouterProcess, int]]:
    """A daemon and router, with a generalist of the agent waiting for approval as its run leaves one."""
    path = make_adapter(tiny_model, tmp_path / "adapters" / "generalist", GENERALIST, 1, 1)
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    try:
        runs = RunStore(store)
        run = runs.create_generalist_run(GENERALIST, AGENT, {}, str(tmp_path / "runs"), ["t-1", "t-2"], ["t-3"])
        runs.set_run_status(run["run_id"], "queued", "running")
        adapter_id = runs.add_candidate(run, str(path), "x", {"evaluation": {"kind": "next_action"}})
    finally:
        store.close()
    daemon = generalist_daemon(tmp_path, tiny_model).start()
    router = RouterProcess(daemon).start()
    yield daemon, router, adapter_id  # type: ignore[misc]
    router.stop()
    daemon.stop()


def test_a_generalist_is_approved_like_any_adapter_and_the_router_serves_it_to_its_agent(
    stack: tuple[RunningDaemon, RouterProcess, int],
) -> None:
    daemon, router, adapter_id = stack
    detail = daemon.get(f"/api/adapters/{adapter_id}")
    assert (detail["kind"], detail["agent"], detail["environment_id"], detail["state"]) == ("generalist", AGENT, None, "candidate")
    assert daemon.get(f"/api/adapters/{adapter_id}/trajectories") == {"adapter_id": adapter_id, "train": ["t-1", "t-2"], "held_out": ["t-3"]}
    assert _post(daemon, f"/api/adapters/{adapter_id}/approve", {"reason": "learns the agent's runs"}).status_code == 200
    wait_for(lambda: _state(daemon, adapter_id) == "live", timeout_s=60)
    assert f"{GENERALIST}@v1" in router.models()

    def ask(agent: str) -> str:
        answer = httpx.post(
            f"{router.url}/v1/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "Please list the items of my order."}], "max_tokens": 4,
                  "metadata": {"conversation_id": f"c-{agent}", "agent": agent}},  # fmt: skip
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["model"]

    assert ask(AGENT) == f"{GENERALIST}@v1"
    assert ask("another-agent") == "base"
    # While it is live, the stage does not train the agent another one.
    send(daemon, mixed(8, 10))
    wait_for(lambda: [item["waiting"] for item in daemon.get("/api/generalists")["items"]] == ["v1 is live"], timeout_s=60)
    assert [run["status"] for run in generalist_runs(daemon)] == ["candidate"]


def test_too_few_successes_wait_and_say_how_many_there_are_and_are_needed(tmp_path: Path, tiny_model: Path) -> None:
    daemon = generalist_daemon(tmp_path, tiny_model, min_successes=20, min_trajectories=12).start()
    try:
        send(daemon, mixed(8, 5))
        expected = "waits for successes: 5 usable successful trajectories with its tools, 20 needed"
        wait_for(lambda: [item["waiting"] for item in daemon.get("/api/generalists")["items"]] == [expected], timeout_s=60)
        (item,) = daemon.get("/api/generalists")["items"]
        assert item["agent"] == AGENT and item["adapters"] == []
        assert generalist_runs(daemon) == []
    finally:
        daemon.stop()


def test_each_agent_learns_only_from_the_runs_of_its_own_tools(tmp_path: Path) -> None:
    """Another service offered the same tools lends its successes (a stronger model serving part of
    the traffic); one with other tools does not, and the excluded conversations never count."""
    daemon = make_daemon(tmp_path).start()
    other_tools = [{**TOOLS[0], "name": "get_ticket"}]
    try:
        send(daemon, [failure(index) for index in range(3)] + [success(index) for index in range(3)])
        send(daemon, [success(index) for index in range(10, 14)], service="stronger-model")
        other = [Conversation([User(f"Show ticket {index}."), Call("get_ticket", {"reservation_id": "T"}, {}), Say("Here.")], "success",
                              tools=other_tools, conversation_id=f"other-{index}") for index in range(3)]  # fmt: skip
        send(daemon, other, service="ticket-agent")
        wait_for(lambda: len(daemon.get("/api/trajectories?limit=100")["items"]) == 13, timeout_s=60)
    finally:
        daemon.stop()
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    try:
        runs = RunStore(store)
        services = lambda ids: sorted(store.query("SELECT service_name FROM trajectories WHERE list_contains(?, trajectory_id)", [ids]),
                                      key=str)  # noqa: E731  # fmt: skip
        support = runs.successes_with_tools_of(AGENT, [], 100)
        assert len(support) == 7 and {row["service_name"] for row in services(support)} == {AGENT, "stronger-model"}
        tickets = runs.successes_with_tools_of("ticket-agent", [], 100)
        assert len(tickets) == 3 and {row["service_name"] for row in services(tickets)} == {"ticket-agent"}
        # A panel kept apart from training: its conversations are never learned from.
        assert len(runs.successes_with_tools_of(AGENT, ["conversation-success-2"], 100)) == 6
        assert runs.agent_outcomes(AGENT, 100) == (3, 6)
    finally:
        store.close()


def test_targeted_selection_counts_an_agents_runs_from_when_its_generalist_went_live(tmp_path: Path) -> None:
    from tracefix.daemon.analysis.analyzer import Analyzer
    from tracefix.daemon.analysis.registry import build_registry
    from tracefix.daemon.core.settings import Settings
    from tracefix.daemon.store.store import AnalysisStore

    daemon = make_daemon(tmp_path, analysis={"interval_s": 0.5}).start()
    try:
        send(daemon, mixed(4, 4))
        send(daemon, [success(index) for index in range(10, 13)], service="stronger-model")
        wait_for(lambda: len(daemon.get("/api/trajectories?limit=100")["items"]) == 11, timeout_s=60)
    finally:
        daemon.stop()
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    try:
        settings = Settings(store=StoreSettings(path=tmp_path / "tracefix.duckdb"))
        analyzer = Analyzer(store, build_registry(settings.capabilities, settings.llm), settings.analysis)
        analyzer.run_pass()

        def counted() -> int:
            rows = [row for row in AnalysisStore(store).stats() if row["window_name"] == "all"]
            return max(row["n_success"] + row["n_failure"] for row in rows)

        assert counted() == 11
        runs = RunStore(store)
        run = runs.create_generalist_run(GENERALIST, AGENT, {}, str(tmp_path / "runs"), [], [])
        runs.set_run_status(run["run_id"], "queued", "running")
        adapter_id = runs.add_candidate(run, "unused", "x", {"evaluation": {}})
        runs.transition(adapter_id, "live", "test", "test", "go_live", lambda state: None, {"routed_since_ns": time.time_ns()})
        analyzer.run_pass()
        # The agent's 8 runs began before its generalist went live; the other service's 3 still count.
        assert counted() == 3
    finally:
        store.close()


def test_a_targeted_adapter_starts_from_the_generalist_and_carries_it(tmp_path: Path, wide_tiny_model: Path) -> None:
    import torch

    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.trainer.recipes import load_policy

    generalist_path = make_adapter(wide_tiny_model, tmp_path / "generalist", GENERALIST, 1, 3)
    config = TrainingSettings(lora_r=4, lora_alpha=8, threads=1)
    fresh, tokenizer = load_policy(wide_tiny_model, config)
    started, _ = load_policy(wide_tiny_model, config, generalist_path)
    saved = {name: value for name, value in started.named_parameters() if "lora_B" in name}
    # It starts with the generalist's weights, trainable, where a fresh adapter starts at zero.
    assert saved and all(value.requires_grad and value.abs().sum() > 0 for value in saved.values())
    assert all(value.abs().sum() == 0 for name, value in fresh.named_parameters() if "lora_B" in name)
    prompt = tokenizer("Please list the items of my order.", return_tensors="pt")
    with torch.no_grad():
        written = [model.generate(**prompt, max_new_tokens=8, do_sample=False)[0].tolist() for model in (fresh, started)]
    assert written[0] != written[1]  # what the generalist learned shows in what it writes
    with pytest.raises(ValueError, match="LoRA r, alpha, targets"):
        load_policy(wide_tiny_model, TrainingSettings(lora_r=16, threads=1), generalist_path)


def test_an_environment_selected_before_the_generalist_went_live_waits_to_be_selected_again_on_its_traffic(tmp_path: Path) -> None:
    from tracefix.daemon.core.settings import Settings
    from tracefix.daemon.pipeline.training_runner import TrainingRunner
    from tracefix.daemon.store.store import AnalysisStore
    from tracefix.trainer.environment import Environment, load_tools
    from tracefix.trainer.families import load_families

    family = load_families()["tool_call_precision"]
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    try:
        analysis, runs = AnalysisStore(store), RunStore(store)
        tools = [{key: value for key, value in tool.items() if key != "type"} for tool in TOOLS]
        environment = Environment(family, load_tools(tools), family.levels[0])
        # The agent's own track of the capability (daemon.core.tracks), as the trigger names it.
        track = tracks.name(family.capability, AGENT)
        analysis.add_environment(track, environment.spec(), AGENT, tools, None, "checked", {"passed": True})
        runner = TrainingRunner(analysis, runs, Settings(store=StoreSettings(path=tmp_path / "tracefix.duckdb")))
        assert runs.environment_to_train(False, True, runner._waits)["environment_id"] == 1  # no generalist: it trains
        # Carrying a goal through its steps comes first among ready environments, even when selected later.
        steps = load_families()["multi_step_completion"]
        steps_track = tracks.name(steps.capability, AGENT)
        analysis.add_environment(steps_track, Environment(steps, load_tools(tools), steps.levels[0]).spec(), AGENT, tools, None, "checked", {"passed": True})
        assert runs.environment_to_train(False, True)["capability"] == steps_track
        store.query("DELETE FROM environments WHERE capability = ?", [steps_track])
        run = runs.create_generalist_run(GENERALIST, AGENT, {}, str(tmp_path / "runs"), [], [])
        runs.set_run_status(run["run_id"], "queued", "running")
        adapter_id = runs.add_candidate(run, "unused", "x", {"evaluation": {}})
        runs.transition(adapter_id, "live", "test", "test", "go_live", lambda state: None, {"routed_since_ns": time.time_ns()})
        # Selected on the base's traffic, before the generalist: it waits for the generalist's own.
        assert runs.environment_to_train(False, True, runner._waits) is None
        selected = (
            "INSERT INTO capability_stats (pass_id, computed_at, window_name, capability, n_success, n_failure, n_unknown, needed_success, "
            "needed_failure, lacking_success, lacking_failure, runs, runs_selected, selected, agent) "
            "VALUES (1, now(), 'all', ?, 5, 20, 0, 5, 20, 0, 20, 1, 1, true, ?)"
        )
        # A pass computed before the generalist went live judged the base's traffic: it does not count.
        store.query(selected.replace("now()", "now() - INTERVAL 1 HOUR"), [family.capability, AGENT])
        assert runs.environment_to_train(False, True, runner._waits) is None
        store.query("DELETE FROM capability_stats")
        store.query(selected, [family.capability, "another-agent"])  # another agent's selection is not its own
        assert runs.environment_to_train(False, True, runner._waits) is None
        store.query(selected, [family.capability, AGENT])
        assert runs.environment_to_train(False, True, runner._waits)["environment_id"] == 1
        # Its canary's control arm, and so its reference, is the generalist that serves the agent without it.
        from tracefix.daemon.promotion.lifecycle import Promotion
        from tests.lora_support import register_candidate

        targeted = runs.adapter(register_candidate(store, track, 1, "unused", 99, environment_id=1))
        assert Promotion(store)._control_name(targeted) == f"{GENERALIST}@v1"
        # The run is told of the generalist's weights and its conversations: those it learned from are
        # rehearsed, those it was scored on must keep its next actions.
        told = runner._starts_from(adapter_id)
        assert told["name"] == f"{GENERALIST}@v1" and told["conversations"] is None  # its run left no conversations file
        from tracefix.daemon.pipeline.generalist import CONVERSATIONS

        Path(run["directory"]).mkdir(parents=True, exist_ok=True)
        (Path(run["directory"]) / CONVERSATIONS).write_text('{"train": [], "held_out": []}')
        told = runner._starts_from(adapter_id)
        assert told["conversations"] == str(Path(run["directory"]) / CONVERSATIONS)
        assert (told["rehearsal_share"], told["retention_margin"]) == (0.3, 0.05)
    finally:
        store.close()
