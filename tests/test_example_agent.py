"""examples/airline: the example customer-service agent, its simulated customers and outcome checker,
and its traces as a real daemon assembles and labels them, with the scripted policy (a planted
confirmation gap) and with the llm policy against a real `tracefix router` serving a tiny model."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.airline import STATE_CHANGING, TOOLS, Database, RouterUnavailable, check, execute, make_tasks, run_conversations
from examples.airline.conversation import Conversation
from examples.airline.outcomes import Outcome
from examples.airline.policies import Reply, ToolCallRequest
from examples.airline.tasks import Task
from examples.airline.telemetry import Telemetry
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon, wait_for

SEED = 5
SERVICE = "airline-support-agent"
CAPABILITIES = (
    "tool_call_precision", "argument_grounding", "precondition_verification", "error_recovery",
    "multi_step_completion", "structured_data_reasoning",
)  # fmt: skip


@pytest.fixture(scope="module")
def database() -> Database:
    return Database.generate(SEED)


def _task(database: Database, goal: str) -> Task:
    return next(task for task in make_tasks(database, 60, SEED) if task.goal == goal)


class Transcript:
    """A hand-written conversation: tool calls really run against a copy of the database."""

    def __init__(self, database: Database, task: Task) -> None:
        self.world = database.copy()
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "policy"}, {"role": "user", "content": task.opening}]

    def user(self, text: str) -> Transcript:
        self.messages.append({"role": "user", "content": text})
        return self

    def say(self, text: str) -> Transcript:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def call(self, name: str, **arguments: Any) -> Transcript:
        call_id = f"call_{len(self.messages)}"
        self.messages.append({
            "role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
        })  # fmt: skip
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(execute(self.world, name, arguments))})
        return self


# -- the outcome checker --------------------------------------------------------------------------


def test_a_cancellation_read_confirmed_and_made_succeeds(database: Database) -> None:
    task = _task(database, "cancel_reservation")
    rid = task.reservation_id
    transcript = (
        Transcript(database, task)
        .call("get_user", user_id=task.user_id)
        .call("get_reservation", reservation_id=rid)
        .say(f"Shall I cancel reservation {rid}?")
        .user("Yes, please go ahead.")
        .call("cancel_reservation", reservation_id=rid, reason="change_of_plan")
        .say(f"Reservation {rid} is cancelled.")
    )
    verdict = check(task, database, transcript.world, transcript.messages)
    assert verdict.success and verdict.reward == 1.0, verdict.explanation


def test_a_cancellation_without_the_customers_confirmation_fails(database: Database) -> None:
    task = _task(database, "cancel_reservation")
    rid = task.reservation_id
    transcript = (
        Transcript(database, task)
        .call("get_user", user_id=task.user_id)
        .call("get_reservation", reservation_id=rid)
        .call("cancel_reservation", reservation_id=rid, reason="change_of_plan")
        .say(f"Reservation {rid} is cancelled.")
    )
    verdict = check(task, database, transcript.world, transcript.messages)
    assert not verdict.success and verdict.reward == 0.0
    assert verdict.reasons == (f"cancel_reservation on {rid} without the customer's confirmation",)


def test_cancelling_another_reservation_than_the_customers_fails(database: Database) -> None:
    task = _task(database, "cancel_reservation")
    other = next(
        rid for rid, record in database.reservations.items() if rid != task.reservation_id and record["status"] == "confirmed"
    )
    transcript = (
        Transcript(database, task)
        .call("get_reservation", reservation_id=other)
        .say(f"Shall I cancel reservation {other}?")
        .user("Yes, please go ahead.")
        .call("cancel_reservation", reservation_id=other, reason="change_of_plan")
    )
    verdict = check(task, database, transcript.world, transcript.messages)
    assert not verdict.success
    assert {reason.split(" differs")[0] for reason in verdict.reasons} == {
        f"reservation {task.reservation_id}", f"reservation {other}"
    }


def test_a_cancellation_never_made_fails_and_a_question_needs_its_answer(database: Database) -> None:
    cancel = _task(database, "cancel_reservation")
    assert not check(cancel, database, database.copy(), Transcript(database, cancel).say("Goodbye.").messages).success
    baggage = _task(database, "baggage_allowance")
    free = baggage.details["free_checked_bags"]
    wrong = (free + 1) % 10
    assert check(baggage, database, database.copy(), Transcript(database, baggage).say(f"You get {free} free bags.").messages).success
    failed = check(baggage, database, database.copy(), Transcript(database, baggage).say(f"You get {wrong} free bags.").messages)
    assert failed.reasons == (f"the answer never states '{free}'",)


# -- the conversation loop --------------------------------------------------------------------------


class CannedPolicy:
    """Answers with the given replies in turn: what a weak model says, including broken tool calls."""

    name, provider, model = "llm", "test", "canned"

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)

    def respond(self, messages: list[dict[str, Any]], headers: dict[str, str], seed: int, conversation_id: str) -> Reply:
        assert headers["traceparent"].startswith("00-")  # every model call carries the trace context
        assert conversation_id == "c-canned"  # and names its conversation
        return self.replies.pop(0)


def _converse(database: Database, task: Task, replies: list[Reply], max_turns: int) -> tuple[Conversation, Outcome]:
    telemetry = Telemetry(None)  # spans are made and propagated, but sent nowhere
    conversation = Conversation(task, database, CannedPolicy(replies), telemetry, "c-canned", random.Random(1))
    outcome = conversation.run(max_turns)
    telemetry.shutdown()
    return conversation, outcome


def test_malformed_tool_calls_become_tool_errors_the_agent_sees(database: Database) -> None:
    task = _task(database, "cancel_reservation")
    broken = [
        ToolCallRequest("c1", "get_booking", '{"reservation_id": "R-00000"}'),  # unknown tool
        ToolCallRequest("c2", "get_user", '{"user_id": '),  # not JSON
        ToolCallRequest("c3", "get_user", '["U-1000"]'),  # not an object
        ToolCallRequest("c4", "cancel_reservation", '{"reservation_id": "R-1"}'),  # fails the schema
        ToolCallRequest("c5", "", ""),  # nothing at all
    ]
    replies = [Reply("", broken, "tool_calls"), Reply("What can I do for you?"), Reply("<tool_call>{oops")]
    conversation, outcome = _converse(database, task, replies, max_turns=5)
    assert (outcome.success, outcome.ended, outcome.turns, outcome.tool_calls, outcome.tool_errors) == (False, "answer", 3, 5, 5)
    errors = [json.loads(message["content"])["error"] for message in conversation.messages if message["role"] == "tool"]
    assert errors == ["ToolNotFound", "InvalidArguments", "InvalidArguments", "ValidationError", "ToolNotFound"]
    assert conversation.messages[-2] == {"role": "user", "content": task.restatement}  # the customer repeated the goal
    assert conversation.world.state() == database.state()  # nothing changed
    assert outcome.explanation.startswith(f"reservation {task.reservation_id} differs from the goal")


def test_the_turn_limit_ends_a_conversation_that_keeps_asking(database: Database) -> None:
    task = _task(database, "baggage_allowance")
    conversation, outcome = _converse(database, task, [Reply("Anything else?")] * 3, max_turns=2)
    assert (outcome.ended, outcome.turns, outcome.success) == ("turn_limit", 2, False)
    assert conversation.messages[-1]["role"] == "user"


def test_a_run_is_reproducible_from_its_seed_and_the_scripted_agent_is_clean_without_flaws() -> None:
    first = run_conversations(conversations=40, policy="scripted", collector=None, seed=SEED)
    second = run_conversations(conversations=40, policy="scripted", collector=None, seed=SEED)
    assert [(o.task_id, o.goal, o.tool_calls) for o in first] == [(o.task_id, o.goal, o.tool_calls) for o in second]
    assert first.success_rate == 1.0, [o.explanation for o in first if not o.success]
    assert {o.goal for o in first} == {"cancel_reservation", "change_flight", "fix_passenger_name", "baggage_allowance"}
    assert "40/40 conversations succeeded (100.0%)" in first.summary()


def test_the_command_line_prints_a_one_line_summary_and_names_an_unreachable_router() -> None:
    command = [sys.executable, "-m", "examples.airline", "--policy", "scripted", "--collector", "", "--conversations", "8",
               "--skip-confirmation", "1", "--seed", str(SEED)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("airline agent: ") and "skip confirmation 1" in lines[0]
    with pytest.raises(RouterUnavailable, match="cannot reach the model endpoint"):
        run_conversations(conversations=1, policy="llm", router=f"http://127.0.0.1:{free_port()}/v1", collector=None)


# -- the scripted agent's traces in a real daemon ---------------------------------------------------


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, list[Outcome]]]:
    daemon = make_daemon(tmp_path_factory.mktemp("airline"), analysis={"interval_s": 0.5}).start()
    try:
        outcomes = run_conversations(
            conversations=30, policy="scripted", skip_confirmation=0.4, skip_read=0.4, collector=daemon.http_url, seed=SEED
        )
        assert outcomes.exported_spans > 0 and outcomes.failed_spans == 0
        daemon.wait_analyzed(timeout_s=60)
        yield daemon, outcomes
    finally:
        daemon.stop()


def test_every_conversation_is_assembled_with_its_outcome_messages_and_tool_definitions(
    scripted_run: tuple[RunningDaemon, list[Outcome]],
) -> None:
    daemon, outcomes = scripted_run
    listed = daemon.get("/api/trajectories", service=SERVICE, limit=100)
    assert listed["total"] == len(outcomes)
    by_id = {item["trajectory_id"]: item for item in listed["items"]}
    assert {o.conversation_id: ("success" if o.success else "failure") for o in outcomes} == {
        trajectory_id: item["outcome"] for trajectory_id, item in by_id.items()
    }
    assert {item["outcome_source"] for item in by_id.values()} == {"evaluation"}
    assert 0 < sum(o.success for o in outcomes) < len(outcomes)

    change = next(o for o in outcomes if o.goal == "change_flight" and o.success)
    detail = daemon.get(f"/api/trajectories/{change.conversation_id}")
    assert detail["trace_ids"] == [change.trace_id]
    assert {tool["tool_name"]: json.loads(tool["parameters"]) for tool in detail["tools"]} == {
        tool["name"]: tool["parameters"] for tool in TOOLS
    }
    roles = [message["role"] for message in detail["messages"]]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant" and {"tool", "assistant"} <= set(roles)
    calls = [(call["tool_name"], call["source"], call["error"]) for call in detail["tool_calls"]]
    assert calls == [
        (name, "tool_span", None)
        for name in ("get_user", "get_reservation", "search_flights", "update_reservation_flights")
    ]
    assert all(json.loads(call["result"]) for call in detail["tool_calls"])
    assert detail["outcome_evidence"][0]["detail"] == "task_success pass goal achieved"


def test_skipped_confirmations_and_reads_make_precondition_verification_lacking_in_exactly_the_failures(
    scripted_run: tuple[RunningDaemon, list[Outcome]],
) -> None:
    daemon, outcomes = scripted_run
    failures = {o.conversation_id for o in outcomes if not o.success}
    assert failures == {o.conversation_id for o in outcomes if o.flaws}
    unread = {o.conversation_id for o in outcomes if "skip_read" in o.flaws}
    assert unread and unread != failures  # both flaws applied somewhere
    items = daemon.get("/api/trajectories", capability="precondition_verification", limit=100)["items"]
    labels = {item["trajectory_id"]: item["label"] for item in items}
    assert {trajectory for trajectory, label in labels.items() if label == "LACKING"} == failures
    reasons = {item["trajectory_id"]: item["reason"] for item in items}
    assert all("without a prior read" in reasons[trajectory] for trajectory in unread)
    assert all("without the user's confirmation" in reasons[trajectory] for trajectory in failures - unread)
    writes = {o.conversation_id for o in outcomes if o.goal != "baggage_allowance"}
    assert {trajectory for trajectory, label in labels.items() if label == "NA"} == set(labels) - writes

    stats = daemon.get("/api/capabilities/precondition_verification")["windows"]["all"]
    assert (stats["lacking_failure"], stats["needed_failure"], stats["lacking_success"]) == (len(failures), len(failures), 0)
    assert stats["delta"] == 1.0 and stats["coverage"] == 1.0
    # Apart from the planted flaw the scripted agent is clean: no other capability lacks anywhere.
    for capability in CAPABILITIES:
        if capability != "precondition_verification":
            lacking = daemon.get("/api/trajectories", capability=capability, label="LACKING")["total"]
            assert lacking == 0, capability


def test_the_tool_definitions_mark_exactly_the_writes_as_state_changing() -> None:
    prefixes = ("update_", "cancel_", "book_", "create_", "delete_", "send_", "transfer_")
    assert {tool["name"] for tool in TOOLS if tool["name"].startswith(prefixes)} == STATE_CHANGING


# -- the llm policy against a real router -----------------------------------------------------------


@pytest.fixture
def router_stack(tmp_path: Path, tiny_model: Path) -> Iterator[tuple[RunningDaemon, str, subprocess.Popen]]:
    import peft  # noqa: F401  (installed by make test: never skipped)
    daemon = make_daemon(
        tmp_path,
        model={"name": str(tiny_model), "threads": 1},
        router={"port": free_port(), "routing": "off", "max_context_tokens": 4096, "max_new_tokens": 24},
    )
    daemon.start()
    url = f"http://127.0.0.1:{daemon.sections['router']['port']}"
    log = (tmp_path / "router.log").open("ab")
    router = subprocess.Popen(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(daemon.config_path)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert router.poll() is None, (tmp_path / "router.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "router did not become healthy"
            time.sleep(0.2)
        yield daemon, f"{url}/v1", router
    finally:
        if router.poll() is None:
            router.send_signal(signal.SIGTERM)
            router.wait(30)
        daemon.stop()


def test_the_llm_agent_survives_a_random_model_and_the_routers_span_joins_its_trace(
    router_stack: tuple[RunningDaemon, str, subprocess.Popen],
) -> None:
    daemon, router_url, router = router_stack
    outcomes = run_conversations(
        conversations=3, policy="llm", router=router_url, collector=daemon.http_url, seed=SEED,
        max_turns=3, max_tokens=16, concurrency=3,
    )  # fmt: skip
    assert len(outcomes) == 3 and outcomes.failed_spans == 0
    assert all(o.ended in ("answer", "turn_limit") and o.turns >= 1 for o in outcomes), [o.as_dict() for o in outcomes]
    assert not any(o.success for o in outcomes)  # random tokens do not cancel reservations
    assert [o.served_by for o in outcomes] == [["base"]] * 3  # the model the router said answered each call

    for outcome in outcomes:
        detail = wait_for(lambda: _assembled(daemon, outcome.conversation_id))
        assert detail["outcome"] == "failure" and detail["outcome_source"] == "evaluation"
        assert [m["role"] for m in detail["messages"]][:3] == ["system", "user", "assistant"]
        assert len(detail["tools"]) == len(TOOLS)

    router.send_signal(signal.SIGTERM)  # the router flushes its spans on the way out
    router.wait(30)
    daemon.wait_assembled()
    daemon.stop()
    spans = daemon.query("SELECT trace_id, span_id, parent_span_id, name, service_name FROM spans")
    for outcome in outcomes:
        trace = [span for span in spans if span[0] == outcome.trace_id]
        chats = {span[1] for span in trace if span[4] == SERVICE and span[3].startswith("chat ")}
        served = [span for span in trace if span[4] == "tracefix-router"]
        assert len(chats) == outcome.turns and len(served) == outcome.turns
        assert {span[2] for span in served} == chats  # each router span is the child of the chat span that called it


def _assembled(daemon: RunningDaemon, conversation_id: str) -> dict[str, Any] | None:
    """The trajectory once it is assembled with its outcome (the evaluation event may come after the spans)."""
    try:
        detail = daemon.get(f"/api/trajectories/{conversation_id}")
    except httpx.HTTPStatusError:
        return None
    return detail if detail["outcome"] != "unknown" else None
