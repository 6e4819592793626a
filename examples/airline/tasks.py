"""Customer goals, τ-bench style: what the customer wants, how they open the conversation, and the
ground truth the outcome checker compares against (the writes a correct agent makes, and the facts
its answers must state).

Tasks come from the seeded database, so the same seed gives the same tasks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from examples.airline.database import (
    FREE_BAGS_BY_CABIN,
    FREE_BAGS_BY_MEMBERSHIP,
    SCHEDULE_DAYS,
    TODAY,
    Database,
)
from examples.airline.tools import execute

GOALS = ("cancel_reservation", "change_flight", "fix_passenger_name", "baggage_allowance")
_GOAL_WEIGHTS = (35, 25, 15, 25)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass(frozen=True)
class Task:
    """One customer's goal and the ground truth that decides whether the agent met it."""

    task_id: str
    goal: str  # one of GOALS
    user_id: str
    customer_name: str
    reservation_id: str
    opening: str  # the customer's first message
    restatement: str  # what the customer says when the agent asks something unrelated
    names_reservation: bool  # whether the opening gives the reservation id
    # The writes a correct agent makes, as (tool, arguments); replayed to get the expected database.
    actions: tuple[tuple[str, dict[str, Any]], ...] = ()
    # Facts the agent's answers must state: each entry lists the accepted spellings of one fact.
    answers: tuple[tuple[str, ...], ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def changes_state(self) -> bool:
        return bool(self.actions)

    def expected(self, initial: Database) -> Database:
        """The database after a correct agent's writes."""
        database = initial.copy()
        for name, arguments in self.actions:
            execute(database, name, dict(arguments))
        return database


def make_tasks(database: Database, count: int, seed: int = 0) -> list[Task]:
    """`count` reproducible tasks over the confirmed reservations of `database`."""
    rng = random.Random(f"tasks-{seed}")
    confirmed = sorted(rid for rid, reservation in database.reservations.items() if reservation["status"] == "confirmed")
    misspelled = [rid for rid in confirmed if rid in database.misspellings]
    tasks = []
    for index in range(count):
        goal = rng.choices(GOALS, weights=_GOAL_WEIGHTS)[0]
        if goal == "fix_passenger_name" and not misspelled:
            goal = "baggage_allowance"
        reservation = database.reservations[rng.choice(misspelled if goal == "fix_passenger_name" else confirmed)]
        user = database.users[reservation["user_id"]]
        build = {
            "cancel_reservation": _cancel,
            "change_flight": _change,
            "fix_passenger_name": _fix_name,
            "baggage_allowance": _baggage,
        }[goal]
        tasks.append(build(rng, f"task-{seed}-{index:04d}", database, user, reservation))
    return tasks


def _greeting(rng: random.Random, name: str, user_id: str) -> str:
    return rng.choice((f"Hi, I'm {name}, user id {user_id}.", f"Hello, this is {name} (user id {user_id}).",
                       f"{name} here, my user id is {user_id}."))  # fmt: skip


def _names(rng: random.Random) -> bool:
    # Three customers in ten leave out the reservation id, so the agent has to ask for it.
    return rng.random() < 0.7


def _cancel(rng: random.Random, task_id: str, database: Database, user: dict, reservation: dict) -> Task:
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    rid = reservation["reservation_id"]
    named = _names(rng)
    why = rng.choice(("my plans changed", "my plans have changed", "plans changed and I can't travel then"))
    opening = _greeting(rng, name, user["user_id"]) + " " + (
        rng.choice((f"Please cancel my reservation {rid}, {why}.", f"I need to cancel reservation {rid} because {why}."))
        if named
        else f"I need to cancel one of my reservations because {why}."
    )
    return Task(
        task_id, "cancel_reservation", user["user_id"], name, rid, opening,
        f"I want to cancel reservation {rid} because {why}.", named,
        actions=(("cancel_reservation", {"reservation_id": rid, "reason": "change_of_plan"}),),
    )  # fmt: skip


def _change(rng: random.Random, task_id: str, database: Database, user: dict, reservation: dict) -> Task:
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    rid = reservation["reservation_id"]
    current = date.fromisoformat(reservation["flights"][0]["date"])
    days = [TODAY + timedelta(days=offset) for offset in range(1, SCHEDULE_DAYS + 1)]
    new_day = rng.choice([day for day in days if day != current]).isoformat()
    earliest = database.departures(reservation["origin"], reservation["destination"], new_day)[0]
    named = _names(rng)
    want = f"to {new_day}, on the earliest flight that day"
    opening = _greeting(rng, name, user["user_id"]) + " " + (
        f"I'd like to move my reservation {rid} {want}." if named else f"I'd like to move one of my reservations {want}."
    )
    arguments = {
        "reservation_id": rid, "flight_number": earliest["flight_number"], "date": new_day,
        "payment_id": reservation["payment_id"],
    }  # fmt: skip
    return Task(
        task_id, "change_flight", user["user_id"], name, rid, opening,
        f"I want to move reservation {rid} {want}.", named,
        actions=(("update_reservation_flights", arguments),),
        details={"date": new_day, "flight_number": earliest["flight_number"]},
    )  # fmt: skip


def _fix_name(rng: random.Random, task_id: str, database: Database, user: dict, reservation: dict) -> Task:
    """A passenger's first name was booked with a typo; the customer wants it spelled right."""
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    rid = reservation["reservation_id"]
    index, wanted_first = database.misspellings[rid]
    passenger = reservation["passengers"][index]
    stored = f"{passenger['first_name']} {passenger['last_name']}"
    wanted = f"{wanted_first} {passenger['last_name']}"
    named = _names(rng)
    where = f"on reservation {rid}" if named else "on one of my reservations"
    opening = _greeting(rng, name, user["user_id"]) + f' The passenger name "{stored}" {where} is misspelled; '
    opening += f'it should be "{wanted}".'
    arguments = {"reservation_id": rid, "passenger_index": index, "first_name": wanted_first, "last_name": passenger["last_name"]}
    return Task(
        task_id, "fix_passenger_name", user["user_id"], name, rid, opening,
        f'On reservation {rid} the name "{stored}" should be "{wanted}".', named,
        actions=(("update_passenger", arguments),),
        details={"stored": stored, "wanted": wanted},
    )  # fmt: skip


def _baggage(rng: random.Random, task_id: str, database: Database, user: dict, reservation: dict) -> Task:
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    rid = reservation["reservation_id"]
    free = FREE_BAGS_BY_CABIN[reservation["cabin"]] + FREE_BAGS_BY_MEMBERSHIP[user["membership"]]
    named = _names(rng)
    which = f"on my reservation {rid}" if named else "on my upcoming trip"
    opening = _greeting(rng, name, user["user_id"]) + f" How many checked bags can each passenger bring for free {which}?"
    return Task(
        task_id, "baggage_allowance", user["user_id"], name, rid, opening,
        f"I only want to know how many checked bags are free on reservation {rid}.", named,
        answers=((str(free), NUMBER_WORDS[free]),),
        details={"free_checked_bags": free},
    )  # fmt: skip


def goal_counts(tasks: Sequence[Task]) -> dict[str, int]:
    """How many tasks of each goal."""
    return {goal: sum(1 for task in tasks if task.goal == goal) for goal in GOALS}
