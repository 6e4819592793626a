"""Simulated customers: scripted replies to the agent's questions, no language model.

A customer answers only questions (an agent message with a ``?``); any other agent text ends the
conversation. They give the ids they are asked for; they agree with "Yes, ..." to a proposed change
(a question asking the go-ahead for a named change) of the reservation they mean, and decline a
change of another one; otherwise they repeat what they want. Only confirmations start with "Yes",
and no other reply contains a confirming word, so a write that follows any other reply is
unconfirmed.
"""

from __future__ import annotations

import random
import re

from examples.airline.tasks import Task

_RESERVATION_ID = re.compile(r"\bR-\d{5}\b")
_USER_ID = re.compile(r"\bU-\d{4}\b")
# A proposed change: asks for the go-ahead, and names a change ("How can I help?" is no proposal).
_PROPOSAL = re.compile(r"\b(shall i|should i|do you want me to|would you like me to|want me to|confirm|proceed|go ahead)\b")
_CHANGE = re.compile(r"\b(cancel|change|move|update|switch|rebook|fix|correct|rename|make)")
_ASKS_RESERVATION = re.compile(r"\b(reservation|booking|confirmation)\b.*\b(id|number|code)\b|\bwhich reservation\b")
_ASKS_USER = re.compile(r"\b(user|customer|account)\s*(id|number)\b")
_ASKS_DATE = re.compile(r"\b(date|day|when)\b")

CONFIRMATIONS = ("Yes, please go ahead.", "Yes, please do that.", "Yes, that's what I want.")


class SimulatedUser:
    """One customer pursuing one task."""

    def __init__(self, task: Task, rng: random.Random) -> None:
        self.task = task
        self.rng = rng

    def opening(self) -> str:
        return self.task.opening

    def reply(self, agent_text: str) -> str | None:
        """The customer's answer to an agent message, or None when the message asks nothing (the end)."""
        if "?" not in agent_text:
            return None
        text = agent_text.lower()
        task = self.task
        mentioned = set(_RESERVATION_ID.findall(agent_text))
        if _ASKS_RESERVATION.search(text) and not mentioned:
            return self.rng.choice((f"It's {task.reservation_id}.", f"The reservation id is {task.reservation_id}."))
        if _ASKS_USER.search(text) and not _USER_ID.search(agent_text):
            return f"My user id is {task.user_id}."
        if _PROPOSAL.search(text) and _CHANGE.search(text):
            if not task.changes_state:
                return task.restatement
            if mentioned and task.reservation_id not in mentioned:
                return f"No, that is not the reservation I mean. I mean {task.reservation_id}."
            return self.rng.choice(CONFIRMATIONS)
        if task.goal == "change_flight" and _ASKS_DATE.search(text):
            return f"I'd like to fly on {task.details['date']}, on the earliest flight that day."
        return task.restatement
