"""Where each goal breaks: the steps of a goal's reference solution that a conversation reached, the
first one it missed and the capability that step needed, on the scripted agent (clean and with its
planted flaws) and on hand-written conversations that break at known steps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from examples.airline import Database, make_tasks, run_conversations
from examples.airline.progress import GOAL_STEPS, progress, step_table
from examples.airline.tasks import Task
from examples.airline.tools import ToolError, execute
from tests.test_example_agent import SEED
from tests.test_example_agent import Transcript as Checked


class Transcript(Checked):
    """A hand-written conversation whose refused calls get the error result the agent would see."""

    def call(self, name: str, **arguments: Any) -> Transcript:
        try:
            execute(self.world.copy(), name, arguments)
        except ToolError as error:
            call_id = f"call_{len(self.messages)}"
            self.messages.append({
                "role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
            })  # fmt: skip
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(error.as_result())})
            return self
        super().call(name, **arguments)
        return self


@pytest.fixture(scope="module")
def database() -> Database:
    return Database.generate(SEED)


def _task(database: Database, goal: str, named: bool = True) -> Task:
    return next(task for task in make_tasks(database, 80, SEED) if task.goal == goal and task.names_reservation == named)


def test_the_clean_scripted_agent_reaches_every_step_of_every_goal() -> None:
    outcomes = run_conversations(conversations=40, policy="scripted", collector=None, seed=SEED)
    assert {outcome.goal for outcome in outcomes} == set(GOAL_STEPS)
    for outcome in outcomes:
        steps = GOAL_STEPS[outcome.goal]
        assert outcome.progress == {
            "goal": outcome.goal, "steps": steps, "reached": len(steps), "missed": None, "capability": None, "why": None,
        }, outcome.explanation  # fmt: skip


def test_planted_flaws_break_at_the_read_or_the_confirmation_with_precondition_verification() -> None:
    outcomes = run_conversations(conversations=40, policy="scripted", collector=None, seed=SEED, skip_confirmation=0.5, skip_read=0.3)
    flawed = [outcome for outcome in outcomes if outcome.flaws]
    assert flawed and len(flawed) < len(outcomes)
    for outcome in outcomes:
        if not outcome.flaws:
            assert outcome.progress["missed"] is None and outcome.success
            continue
        assert not outcome.success
        expected = "read" if "skip_read" in outcome.flaws else "confirm"
        assert (outcome.progress["missed"], outcome.progress["capability"]) == (expected, "precondition_verification"), outcome.progress
        assert outcome.progress["reached"] == GOAL_STEPS[outcome.goal].index(expected)


def test_known_breaks_name_the_step_and_the_capability_it_needed(database: Database) -> None:
    cancel = _task(database, "cancel_reservation")
    rid, uid = cancel.reservation_id, cancel.user_id

    def where(transcript: Transcript, task: Task = cancel) -> tuple[int, str | None, str | None]:
        found = progress(task, transcript.messages)
        return found.reached, found.missed, found.capability

    # Prose where the first call was needed.
    assert where(Transcript(database, cancel).say("I have cancelled it for you.")) == (0, "identify", "tool_call_precision")
    # The customer identified, then a reservation id nobody gave.
    invented = Transcript(database, cancel).call("get_user", user_id=uid).call("get_reservation", reservation_id="R-00000")
    assert where(invented.say("I could not find it.")) == (1, "read", "argument_grounding")
    # The same failing call again and again.
    repeated = Transcript(database, cancel).call("get_user", user_id="U-0000").call("get_user", user_id="U-0000")
    assert where(repeated) == (0, "identify", "error_recovery")
    # A call whose arguments break the tool's schema.
    assert where(Transcript(database, cancel).call("get_user", customer="me")) == (0, "identify", "tool_call_precision")
    # Read, then a stop with the change never proposed.
    stopped = Transcript(database, cancel).call("get_user", user_id=uid).call("get_reservation", reservation_id=rid)
    assert where(stopped.say("Your reservation is confirmed.")) == (2, "confirm", "multi_step_completion")
    # Cancelled without asking.
    unasked = Transcript(database, cancel).call("get_user", user_id=uid).call("get_reservation", reservation_id=rid)
    unasked.call("cancel_reservation", reservation_id=rid, reason="change_of_plan")
    assert where(unasked) == (2, "confirm", "precondition_verification")
    # Every step, then no final answer.
    whole = Transcript(database, cancel).call("get_user", user_id=uid).call("get_reservation", reservation_id=rid)
    whole.say(f"Shall I cancel reservation {rid}?").user("Yes, please go ahead.")
    whole.call("cancel_reservation", reservation_id=rid, reason="change_of_plan")
    assert where(whole) == (4, "answer", "multi_step_completion")
    assert where(whole.say("It is cancelled.")) == (5, None, None)

    # A baggage answer that states the wrong number.
    baggage = _task(database, "baggage_allowance")
    reservation = database.reservations[baggage.reservation_id]
    user = database.users[baggage.user_id]
    asked = Transcript(database, baggage).call("get_user", user_id=baggage.user_id)
    asked.call("get_reservation", reservation_id=baggage.reservation_id)
    asked.call("get_baggage_policy", cabin=reservation["cabin"], membership=user["membership"])
    free = baggage.details["free_checked_bags"]
    assert where(Transcript(database, baggage), baggage) == (0, "identify", "multi_step_completion")
    assert where(asked.say(f"You can check {free + 1} bags for free."), baggage) == (3, "answer", "structured_data_reasoning")
    assert where(asked.say(f"You can check {free} bags for free."), baggage) == (4, None, None)


def test_the_step_table_counts_who_reached_each_step_and_where_goals_broke() -> None:
    outcomes = run_conversations(conversations=40, policy="scripted", collector=None, seed=SEED, skip_confirmation=1.0)
    rows = {row["goal"]: row for row in step_table(outcome.progress for outcome in outcomes)}
    cancels = [outcome for outcome in outcomes if outcome.goal == "cancel_reservation"]
    row = rows["cancel_reservation"]
    assert row["conversations"] == len(cancels) and row["steps"] == list(GOAL_STEPS["cancel_reservation"])
    # Everyone identified and read; no one was asked before the change.
    assert row["reaching"] == [len(cancels), len(cancels), 0, 0, 0]
    assert row["breaks"] == [{"step": "confirm", "capability": "precondition_verification", "count": len(cancels)}]
    # Baggage changes nothing, so needs no yes: every one succeeds.
    baggage = rows["baggage_allowance"]
    assert baggage["reaching"] == [baggage["conversations"]] * 4 and baggage["breaks"] == []
