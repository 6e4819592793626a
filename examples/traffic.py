"""Seeded traffic of an airline customer-service agent, with capability gaps planted on purpose.

Each trajectory is one conversation of the *SkyWays Airlines* support agent with a customer who
wants something done (cancel a reservation, move it to another day, add up what they paid, price
their checked bags, find an earlier flight). A small in-memory airline backend answers the tool
calls, so every tool result is a consistent JSON record, and Faker (seeded) supplies names,
e-mails, dates and amounts.

A :class:`GapProfile` says, per capability, how likely a *failed* and a *successful* trajectory is
to show the lack of it; where a trajectory lacks a capability the transcript shows one
unmistakable pattern, and everything else in it is clean (see ``README.md`` next to this file for
the exact patterns). Every trajectory carries its true label per capability (``NA``, ``PRESENT``
or ``LACKING``), so the plans are the ground truth that tracefix's detectors are measured against.

:func:`generate` builds the plans (pure, no I/O); :func:`send` emits them through the real
OpenTelemetry SDK exactly as an instrumented agent would (GenAI semantic conventions, written by
:mod:`examples.otlp`: an ``invoke_agent`` root span, ``chat`` spans with the full message history,
``execute_tool`` spans) and reports the outcome as a ``gen_ai.evaluation.result`` log record or as
the root-span attribute ``tracefix.outcome``.

    python -m examples.traffic --endpoint http://127.0.0.1:4318 --trajectories 300 \\
        --failure-rate 0.4 --seed 7 --gaps precondition_verification=0.7:0.05
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator

from examples.otlp import Agent, AgentRun, dumps, evaluation_attributes, exporter

__all__ = [
    "AGENT_NAME",
    "CAPABILITIES",
    "LACKING",
    "NA",
    "PRESENT",
    "SCENARIOS",
    "SERVICE_NAME",
    "STATE_CHANGING_PREFIXES",
    "SYSTEM_INSTRUCTIONS",
    "TOOLS",
    "Gap",
    "GapProfile",
    "Summary",
    "ToolCallPlan",
    "TrajectoryPlan",
    "generate",
    "main",
    "send",
    "summarize",
]

CAPABILITIES = (
    "tool_call_precision",
    "argument_grounding",
    "precondition_verification",
    "error_recovery",
    "multi_step_completion",
    "structured_data_reasoning",
)
NA, PRESENT, LACKING = "NA", "PRESENT", "LACKING"
STATES = (LACKING, PRESENT, NA)
SCENARIOS = ("cancel_reservation", "change_flight", "price_total", "baggage_fees", "earlier_flight")
STATE_CHANGING_PREFIXES = ("update_", "cancel_", "book_", "create_", "delete_", "send_", "transfer_")

AGENT_NAME = "skyways-support"
SERVICE_NAME = "skyways-support-agent"
MODEL = "gpt-4.1-mini"
RESPONSE_MODEL = "gpt-4.1-mini-2025-04-14"
PROVIDER = "openai"

# When a capability is not lacking, how often the trajectory needs it at all (PRESENT rather than
# NA). These do not depend on the outcome, so a capability without a configured gap shows the same
# lacking rate among failed and successful trajectories.
NEEDED = {
    "tool_call_precision": 1.0,
    "argument_grounding": 1.0,
    "precondition_verification": 0.5,
    "error_recovery": 0.3,
    "multi_step_completion": 1.0,
    "structured_data_reasoning": 0.6,
}

_TODAY = date(2025, 9, 15)  # "today" inside the simulated airline: keeps plans reproducible

# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------

CABINS = ("basic_economy", "economy", "business")
FARE_FAMILIES = {"basic_economy": "Basic Economy", "economy": "Main Cabin", "business": "Business Select"}
MEMBERSHIPS = ("regular", "silver", "gold")
CANCEL_REASONS = ("change_of_plan", "airline_cancelled", "other")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_user",
        "description": "Look up a customer profile by user id: name, e-mail, membership tier, saved payment "
        "methods and, on request, the ids of the customer's reservations.",
        "parameters": {
            "type": "object",
            "properties": {
                "user_id": {"type": "string", "description": "Customer id, e.g. U-1029."},
                "include_reservations": {
                    "type": "boolean",
                    "description": "Also list the ids of the customer's reservations.",
                    "default": False,
                },
                "include_payment_methods": {
                    "type": "boolean",
                    "description": "Include the saved payment methods.",
                    "default": True,
                },
            },
            "required": ["user_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_reservation",
        "description": "Fetch one reservation: route, flights, cabin, passengers, payment and prices.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": {"type": "string", "description": "Reservation id, e.g. R-48213."},
                "include_archived": {
                    "type": "boolean",
                    "description": "Also return archived reservations (travel completed).",
                    "default": False,
                },
            },
            "required": ["reservation_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "search_flights",
        "description": "Search direct SkyWays flights between two airports on one day.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code, e.g. SFO."},
                "destination": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code, e.g. JFK."},
                "date": {"type": "string", "description": "Travel date, YYYY-MM-DD."},
                "cabin": {"type": "string", "description": "Cabin code: basic_economy, economy or business."},
                "passengers": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
            },
            "required": ["origin", "destination", "date"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_baggage_policy",
        "description": "Checked-bag allowance and the fee of each checked bag for a cabin and membership tier.",
        "parameters": {
            "type": "object",
            "properties": {
                "cabin": {"type": "string", "description": "Cabin code: basic_economy, economy or business."},
                "membership": {"type": "string", "description": "Membership tier: regular, silver or gold."},
                "checked_bags": {"type": "integer", "minimum": 1, "maximum": 5, "description": "Bags to price."},
            },
            "required": ["cabin", "membership", "checked_bags"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "update_reservation",
        "description": "Move a reservation to another flight. Changes the booking and charges any fare difference.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": {"type": "string"},
                "flight_number": {"type": "string", "description": "New flight, e.g. SW1432."},
                "date": {"type": "string", "description": "Date of the new flight, YYYY-MM-DD."},
                "payment_id": {"type": "string", "description": "Payment method that pays the fare difference."},
            },
            "required": ["reservation_id", "flight_number", "date"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "cancel_reservation",
        "description": "Cancel a reservation and refund it.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": {"type": "string"},
                "reason": {"type": "string", "description": "One of change_of_plan, airline_cancelled, other."},
                "refund_to_original_payment": {"type": "boolean", "default": True},
            },
            "required": ["reservation_id", "reason"],
            "additionalProperties": False,
        },
    },
]
TOOLS_BY_NAME = {tool["name"]: tool for tool in TOOLS}

SYSTEM_INSTRUCTIONS = (
    "You are the customer-support agent of SkyWays Airlines. Help the customer with their reservations "
    "using the tools provided.\n"
    "Policy:\n"
    "- Identify the customer with get_user before anything else.\n"
    "- Use only ids the customer gave you or that a tool returned; never guess an id.\n"
    "- Before changing or cancelling a reservation, read it with get_reservation, explain what will "
    "happen and wait for the customer's explicit confirmation.\n"
    "- If a tool returns an error, read it and fix the call; do not repeat a call that failed.\n"
    "- Quote prices, refunds and fees in US dollars exactly as the records give them.\n"
    "- Finish with a short answer to the customer."
)

AIRPORTS = {
    "SFO": "San Francisco", "JFK": "New York", "BOS": "Boston", "DEN": "Denver", "ORD": "Chicago",
    "SEA": "Seattle", "LAX": "Los Angeles", "ATL": "Atlanta", "MIA": "Miami", "DFW": "Dallas",
    "PHX": "Phoenix", "LAS": "Las Vegas", "MSP": "Minneapolis", "AUS": "Austin", "EWR": "Newark",
    "IAH": "Houston",
}  # fmt: skip
_FARES = {"basic_economy": (79.0, 260.0), "economy": (119.0, 540.0), "business": (480.0, 1650.0)}
_FREE_BAGS = {"basic_economy": 0, "economy": 1, "business": 2}
_MEMBER_BAGS = {"regular": 0, "silver": 1, "gold": 2}
_EXTRA_BAG_FEES = (35.0, 45.0, 150.0, 150.0, 150.0)
_AMOUNT_KEYS = ("price", "total_price", "refund_amount", "fare_difference", "fee")

# Wrong-but-coercible argument types (the backend validates like pydantic's lax mode: "true"
# becomes True, "2" becomes 2, so the call still works but breaks the declared JSON schema).
# Each entry: the argument sent as a string, and its value when the clean call leaves it out.
_WRONG_TYPE = {
    "get_user": ("include_payment_methods", True),
    "get_reservation": ("include_archived", False),
    "search_flights": ("passengers", 1),
    "get_baggage_policy": ("checked_bags", None),
    "cancel_reservation": ("refund_to_original_payment", True),
}
# Calls the backend refuses: a made-up tool name, or a required argument under another key.
_UNKNOWN_TOOL = {
    "get_user": "get_customer",
    "get_reservation": "get_booking",
    "search_flights": "find_flights",
    "get_baggage_policy": "get_bag_fees",
}
_MISSING_REQUIRED = {
    "get_user": ("rename", "user_id", "customer_id"),
    "get_reservation": ("rename", "reservation_id", "booking_id"),
    "search_flights": ("drop", "date", None),
    "get_baggage_policy": ("drop", "checked_bags", None),
}

# --------------------------------------------------------------------------------------------
# Gap profile
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """Probability that a failed / a successful trajectory lacks the capability."""

    failed: float
    successful: float

    def __post_init__(self) -> None:
        for value in (self.failed, self.successful):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"gap probabilities must lie in [0, 1], got {value}")


NOISE = Gap(0.05, 0.05)


@dataclass(frozen=True)
class GapProfile:
    """Per capability, the chance that a failed and a successful trajectory shows the lack."""

    gaps: Mapping[str, Gap]

    def __post_init__(self) -> None:
        unknown = set(self.gaps) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {', '.join(CAPABILITIES)}")
        full = {name: self.gaps.get(name, NOISE) for name in CAPABILITIES}
        object.__setattr__(self, "gaps", full)

    def __getitem__(self, capability: str) -> Gap:
        return self.gaps[capability]

    @classmethod
    def noise(cls, p: float = 0.05) -> GapProfile:
        """No gap anywhere: every capability lacks with the same chance `p` in both outcomes."""
        return cls({name: Gap(p, p) for name in CAPABILITIES})

    @classmethod
    def default(cls) -> GapProfile:
        """The demo profile: precondition verification and error recovery are the real gaps."""
        return cls({"precondition_verification": Gap(0.7, 0.05), "error_recovery": Gap(0.6, 0.05)})

    @classmethod
    def of(cls, gaps: GapProfile | Mapping[str, Any] | str | None) -> GapProfile:
        """A profile from a profile, a mapping (Gap or (failed, successful) values), text or None."""
        if gaps is None:
            return cls.default()
        if isinstance(gaps, GapProfile):
            return gaps
        if isinstance(gaps, str):
            return cls.parse(gaps)
        return cls({name: value if isinstance(value, Gap) else Gap(*map(float, value)) for name, value in gaps.items()})

    @classmethod
    def parse(cls, text: str) -> GapProfile:
        """`cap=FAILED:SUCCESSFUL,...`; unnamed capabilities get 0.05:0.05 noise.

        `default` is the demo profile, `none` (or an empty text) noise everywhere.
        """
        text = text.strip()
        if text.lower() == "default":
            return cls.default()
        if text.lower() in ("", "none", "noise"):
            return cls.noise()
        gaps: dict[str, Gap] = {}
        for item in text.split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            failed, colon, successful = value.partition(":")
            if not sep or not colon:
                raise ValueError(f"bad gap {item!r}; expected capability=FAILED:SUCCESSFUL")
            gaps[name.strip()] = Gap(float(failed), float(successful))
        return cls(gaps)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {name: {"failed": gap.failed, "successful": gap.successful} for name, gap in self.gaps.items()}


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@dataclass
class ToolCallPlan:
    """One tool call as the model made it and as the backend answered it."""

    id: str
    name: str
    arguments: dict[str, Any]
    result: Any | None  # the JSON record returned; None when the call failed
    error_type: str | None
    error_message: str | None
    message_index: int  # the assistant message that asked for it

    @property
    def failed(self) -> bool:
        return self.error_type is not None


@dataclass
class TrajectoryPlan:
    """One planned trajectory: the conversation, its tool calls, its outcome and its true labels."""

    index: int
    seed: int
    trace_id: str  # 32 hex digits; send() emits the trace under exactly this id
    conversation_id: str
    scenario: str
    outcome: str  # "success" | "failure"
    labels: dict[str, str]  # capability -> NA | PRESENT | LACKING
    realization: dict[str, str]  # capability -> how its lack was planted (only lacking ones)
    user_id: str
    goal: str
    messages: list[dict[str, Any]]  # GenAI parts format; assistant messages carry finish_reason
    durations_ms: list[int]  # per message: model latency, tool time or the user's think time
    calls: list[ToolCallPlan]
    start_offset_ms: int  # when the conversation starts, relative to the first one

    @property
    def lacking(self) -> set[str]:
        return {name for name, state in self.labels.items() if state == LACKING}

    @property
    def final_answer(self) -> str | None:
        """The text of the last message when it is the agent's final answer, else None."""
        last = self.messages[-1] if self.messages else None
        if not last or last["role"] != "assistant" or any(p["type"] == "tool_call" for p in last["parts"]):
            return None
        return "\n".join(p["content"] for p in last["parts"] if p["type"] == "text")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# The airline backend
# --------------------------------------------------------------------------------------------


class ToolError(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


def _money(value: float) -> float:
    return round(value + 1e-9, 2)


class _World:
    """The airline's data for one conversation, and the tools that read and change it."""

    def __init__(self, rng: random.Random, fake: Any) -> None:
        self.rng = rng
        self.fake = fake
        self.users: dict[str, dict[str, Any]] = {}
        self.reservations: dict[str, dict[str, Any]] = {}
        self.archived: set[str] = set()
        self.searches: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.ids: set[str] = set()

    # --- data -------------------------------------------------------------------------------

    def new_id(self, prefix: str, low: int, high: int) -> str:
        while True:
            value = f"{prefix}{self.rng.randint(low, high)}"
            if value not in self.ids:
                self.ids.add(value)
                return value

    def time_of_day(self, earliest: int = 5 * 60 + 30, latest: int = 21 * 60 + 30) -> str:
        minutes = self.rng.randrange(earliest, latest, 5)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    @staticmethod
    def _arrival(departure: str, origin: str, destination: str) -> str:
        hours, minutes = map(int, departure.split(":"))
        length = 75 + (sum(map(ord, origin + destination)) % 34) * 10
        total = (hours * 60 + minutes + length) % (24 * 60)
        return f"{total // 60:02d}:{total % 60:02d}"

    def price(self, cabin: str) -> float:
        low, high = _FARES[cabin]
        return _money(self.rng.uniform(low, high))

    def flight(self, origin: str, destination: str, day: date, cabin: str, *, departure: str | None = None,
               price: float | None = None) -> dict[str, Any]:  # fmt: skip
        departure = departure or self.time_of_day()
        return {
            "flight_number": self.new_id("SW", 100, 2999),
            "origin": origin,
            "destination": destination,
            "date": day.isoformat(),
            "departure": departure,
            "arrival": self._arrival(departure, origin, destination),
            "price": price if price is not None else self.price(cabin),
        }

    def make_user(self) -> dict[str, Any]:
        fake, rng = self.fake, self.rng
        first, last = fake.first_name(), fake.last_name()
        user_id = self.new_id("U-", 1000, 9999)
        cards = []
        for _ in range(rng.choice((1, 1, 2))):
            cards.append(
                {
                    "payment_id": self.new_id("PM-", 1000, 9999),
                    "type": "credit_card",
                    "brand": rng.choice(("visa", "mastercard", "amex")),
                    "last4": f"{rng.randint(0, 9999):04d}",
                }
            )
        if rng.random() < 0.25:
            cards.append({"payment_id": self.new_id("PM-", 1000, 9999), "type": "gift_card", "balance": _money(rng.uniform(20, 250))})
        email_name = "".join(ch for ch in f"{first}.{last}".lower() if ch.isalpha() or ch == ".")
        user = {
            "user_id": user_id,
            "name": {"first_name": first, "last_name": last},
            "email": f"{email_name}@{fake.free_email_domain()}",
            "membership": rng.choices(MEMBERSHIPS, weights=(6, 3, 1))[0],
            "member_since": fake.date_between(date(2012, 1, 1), date(2024, 12, 31)).isoformat(),
            "payment_methods": cards,
            "reservations": [],
        }
        self.users[user_id] = user
        return user

    def make_reservation(self, user: dict[str, Any], *, past: bool = False, one_way: bool | None = None,
                         departure: str | None = None) -> dict[str, Any]:  # fmt: skip
        rng, fake = self.rng, self.fake
        origin, destination = rng.sample(sorted(AIRPORTS), 2)
        cabin = rng.choices(CABINS, weights=(2, 6, 2))[0]
        if past:
            outbound = fake.date_between(_TODAY - timedelta(days=240), _TODAY - timedelta(days=12))
        else:
            outbound = fake.date_between(_TODAY + timedelta(days=5), _TODAY + timedelta(days=100))
        one_way = rng.random() < 0.5 if one_way is None else one_way
        flights = [self.flight(origin, destination, outbound, cabin, departure=departure)]
        if not one_way:
            back = outbound + timedelta(days=rng.randint(2, 14))
            flights.append(self.flight(destination, origin, back, cabin))
        passengers = [{"first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"]}]
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            passengers.append({"first_name": fake.first_name(), "last_name": user["name"]["last_name"]})
        card = next(m for m in user["payment_methods"] if m["type"] == "credit_card")
        reservation = {
            "reservation_id": self.new_id("R-", 10000, 99999),
            "user_id": user["user_id"],
            "status": "completed" if past else "confirmed",
            "trip_type": "one_way" if one_way else "round_trip",
            "origin": origin,
            "destination": destination,
            "cabin": cabin,
            "fare_family": FARE_FAMILIES[cabin],
            "flights": flights,
            "passengers": passengers,
            "payment_id": card["payment_id"],
            "total_price": _money(sum(f["price"] for f in flights)),
            "booked_on": fake.date_between(outbound - timedelta(days=120), min(outbound, _TODAY) - timedelta(days=3)).isoformat(),
            "travel_insurance": rng.random() < 0.3,
        }
        self.reservations[reservation["reservation_id"]] = reservation
        user["reservations"].append(reservation["reservation_id"])
        return reservation

    def lookalike(self, reservation_id: str, template: dict[str, Any] | None) -> dict[str, Any]:
        """The record behind an id the agent made up: another customer's booking on the same trip."""
        if template is None:
            stranger = self.make_user()
            record = self.make_reservation(stranger)
            del self.reservations[record["reservation_id"]]
        else:
            record = copy.deepcopy(template)
            record["user_id"] = self.new_id("U-", 1000, 9999)
            last = self.fake.last_name()
            record["passengers"] = [{"first_name": self.fake.first_name(), "last_name": last}]
            record["payment_id"] = self.new_id("PM-", 1000, 9999)
            for flight in record["flights"]:
                flight["price"] = _money(flight["price"] * self.rng.uniform(0.88, 0.99))
            record["total_price"] = _money(sum(f["price"] for f in record["flights"]))
        record["reservation_id"] = reservation_id
        self.ids.add(reservation_id)
        self.reservations[reservation_id] = record
        return record

    # --- tools ------------------------------------------------------------------------------

    def execute(self, name: str, arguments: dict[str, Any]) -> Any:
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            raise ToolError("ToolNotFound", f"Unknown tool '{name}'. Available tools: {', '.join(TOOLS_BY_NAME)}.")
        schema = tool["parameters"]
        for key in schema["required"]:
            if key not in arguments:
                raise ToolError("ValidationError", f"Invalid arguments for {name}: '{key}' is a required property.")
        values = {}
        for key, value in arguments.items():
            declared = schema["properties"].get(key)
            if declared is None:
                continue  # extra keys are ignored by the backend
            values[key] = _coerce(value, declared["type"])
        return getattr(self, "_" + name)(**values)

    def _get_user(self, user_id: str, include_reservations: bool = False, include_payment_methods: bool = True) -> dict:
        user = self.users.get(user_id)
        if user is None:
            raise ToolError("UserNotFound", f"No customer with id {user_id}.")
        record = {k: copy.deepcopy(v) for k, v in user.items() if k not in ("reservations", "payment_methods")}
        if include_payment_methods:
            record["payment_methods"] = copy.deepcopy(user["payment_methods"])
        if include_reservations:
            record["reservations"] = list(user["reservations"])
        return record

    def _get_reservation(self, reservation_id: str, include_archived: bool = False) -> dict:
        record = self.reservations.get(reservation_id)
        if record is None:
            record = self.lookalike(reservation_id, None)
        if reservation_id in self.archived and not include_archived:
            raise ToolError(
                "ReservationArchived",
                f"Reservation {reservation_id} is archived because its travel is completed; "
                "call get_reservation again with include_archived=true.",
            )
        return copy.deepcopy(record)

    def _check_cabin(self, cabin: str) -> None:
        if cabin not in CABINS:
            raise ToolError("UnknownCabin", f"Unknown cabin '{cabin}'; valid cabins are {', '.join(CABINS)}.")

    def _search_flights(self, origin: str, destination: str, date: str, cabin: str | None = None,
                        passengers: int = 1) -> dict:  # fmt: skip
        if cabin is not None:
            self._check_cabin(cabin)
        key = (origin, destination, date)
        if key not in self.searches:
            day = _parse_date(date)
            self.searches[key] = [self.flight(origin, destination, day, cabin or "economy") for _ in range(self.rng.randint(3, 5))]
        flights = sorted(self.searches[key], key=lambda f: f["departure"])
        shown = []
        for flight in flights:
            item = dict(flight)
            item["cabin"] = cabin or "economy"
            item["seats_left"] = 2 + sum(map(ord, flight["flight_number"])) % 17
            shown.append(item)
        return {"flights": shown}

    def _get_baggage_policy(self, cabin: str, membership: str, checked_bags: int) -> dict:
        self._check_cabin(cabin)
        if membership not in MEMBERSHIPS:
            raise ToolError("UnknownMembership", f"Unknown membership '{membership}'; valid tiers are {', '.join(MEMBERSHIPS)}.")
        free = min(_FREE_BAGS[cabin] + _MEMBER_BAGS[membership], 4)
        bags = [{"bag": n, "fee": 0.0 if n <= free else _EXTRA_BAG_FEES[n - free - 1]} for n in range(1, checked_bags + 1)]
        return {
            "cabin": cabin,
            "membership": membership,
            "free_checked_bags": free,
            "max_weight_kg": 32 if cabin == "business" else 23,
            "bags": bags,
        }

    def _update_reservation(self, reservation_id: str, flight_number: str, date: str, payment_id: str | None = None) -> dict:
        record = self.reservations.get(reservation_id) or self.lookalike(reservation_id, None)
        if payment_id is None:
            raise ToolError(
                "PaymentMethodRequired",
                "A payment method is required to change a reservation; pass payment_id with one of the "
                "customer's payment methods.",
            )
        new = next(
            (f for (o, d, day), flights in self.searches.items() if day == date for f in flights if f["flight_number"] == flight_number),
            None,
        )
        if new is None:
            raise ToolError("FlightNotFound", f"No flight {flight_number} on {date}.")
        old = record["flights"][0]
        difference = _money(new["price"] - old["price"])
        record["flights"][0] = dict(new)
        record["total_price"] = _money(record["total_price"] + difference)
        return {
            "reservation_id": reservation_id,
            "status": "confirmed",
            "flights": copy.deepcopy(record["flights"]),
            "total_price": record["total_price"],
            "fare_difference": difference,
            "charged_payment_id": payment_id,
        }

    def _cancel_reservation(self, reservation_id: str, reason: str, refund_to_original_payment: bool = True) -> dict:
        record = self.reservations.get(reservation_id) or self.lookalike(reservation_id, None)
        if reason not in CANCEL_REASONS:
            raise ToolError(
                "InvalidCancellationReason",
                f"Invalid cancellation reason '{reason}'; use one of: {', '.join(CANCEL_REASONS)}.",
            )
        record["status"] = "cancelled"
        return {
            "reservation_id": reservation_id,
            "status": "cancelled",
            "refund_amount": record["total_price"],
            "refund_to": record["payment_id"] if refund_to_original_payment else "travel_credit",
            "cancelled_on": _TODAY.isoformat(),
        }


def _coerce(value: Any, declared: str) -> Any:
    if declared == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if declared == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _parse_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return _TODAY


# --------------------------------------------------------------------------------------------
# Building one conversation
# --------------------------------------------------------------------------------------------

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
_CONFIRMATIONS = (
    "Yes, please go ahead.",
    "Yes, go ahead.",
    "Yes please, go ahead with that.",
    "Yes, that's the one. Please proceed.",
    "Yes — please do it.",
)


@dataclass
class _Sites:
    """Where in the conversation each planted lack goes (step labels such as "U", "R", "W")."""

    grounding: str | None = None
    tcp: str | None = None
    tcp_variant: str | None = None  # wrong_type | unknown_tool | missing_required
    error: str | None = None  # the step whose first attempt fails
    error_kind: str | None = None  # "tool_call" (the invalid call itself) | "domain"
    loop: str | None = None
    multi_variant: str | None = None  # loop | truncated


class _Conversation:
    """Appends messages and tool calls, applying the planted lacks at their sites."""

    def __init__(self, rng: random.Random, world: _World, labels: dict[str, str], realization: dict[str, str]) -> None:
        self.rng = rng
        self.world = world
        self.labels = labels
        self.realization = realization
        self.sites = _Sites()
        self.messages: list[dict[str, Any]] = []
        self.durations: list[int] = []
        self.calls: list[ToolCallPlan] = []
        self.fabricated: dict[str, str] = {}
        self.customer = ""

    # --- messages ---------------------------------------------------------------------------

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "parts": [{"type": "text", "content": text}]})
        self.durations.append(0 if len(self.messages) == 1 else self.rng.randint(4_000, 35_000))

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"})
        self.durations.append(self.rng.randint(900, 3_600))

    def _invoke(self, name: str, arguments: dict[str, Any], text: str | None, expect_error: bool) -> Any:
        arguments = json.loads(json.dumps(arguments))
        call_id = "call_" + "".join(self.rng.choice(_ALNUM) for _ in range(24))
        parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
        parts.append({"type": "tool_call", "id": call_id, "name": name, "arguments": arguments})
        self.messages.append({"role": "assistant", "parts": parts, "finish_reason": "tool_call"})
        self.durations.append(self.rng.randint(450, 2_200))
        message_index = len(self.messages) - 1
        try:
            result = self.world.execute(name, copy.deepcopy(arguments))
            error = None
        except ToolError as failure:
            result, error = None, failure
        if (error is not None) != expect_error:
            raise RuntimeError(f"planned {'a failing' if expect_error else 'a working'} {name} call, got {error or result}")
        response = result if error is None else {"error": error.error_type, "message": error.message}
        self.messages.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]})
        self.durations.append(self.rng.randint(15, 380))
        self.calls.append(
            ToolCallPlan(
                call_id, name, arguments, result,
                error.error_type if error else None, error.message if error else None, message_index,
            )  # fmt: skip
        )
        return result

    def seen_text(self) -> str:
        return SYSTEM_INSTRUCTIONS + "\n" + json.dumps(self.messages)

    # --- steps ------------------------------------------------------------------------------

    def step(self, label: str, name: str, arguments: dict[str, Any], *,
             bad: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
             text: str | None = None, fix_text: str | None = None) -> Any:  # fmt: skip
        """One tool step of the clean plan, with whatever lack is planted at `label`."""
        sites = self.sites
        if sites.grounding == label:
            arguments = self._ground(arguments)
        failing: tuple[str, dict[str, Any]] | None = None
        if sites.error == label:
            if sites.error_kind == "tool_call":
                failing = _invalid_call(name, arguments, sites.tcp_variant or "")
            else:
                assert bad is not None, f"no domain error planned for step {label}"
                failing = (name, bad(arguments))
        if failing is not None:
            attempts = 2 if self.labels["error_recovery"] == LACKING else 1
            for attempt in range(attempts):
                self._invoke(*failing, text=text if attempt == 0 else "Let me try that again.", expect_error=True)
            if sites.error_kind == "tool_call":
                fix_text = (
                    f"That tool isn't available; using {name} instead."
                    if sites.tcp_variant == "unknown_tool"
                    else "I left out a required argument; calling it again with all of them."
                )
            text = fix_text
        if sites.tcp == label and sites.tcp_variant == "wrong_type":
            arguments = _wrong_type(name, arguments)
        result = self._invoke(name, arguments, text, expect_error=False)
        if sites.loop == label:
            for _ in range(2):
                result = self._invoke(name, arguments, None, expect_error=False)
        return result

    def _ground(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Swap the reservation id for one the agent made up (never seen before this call)."""
        real = arguments["reservation_id"]
        if real not in self.fabricated:
            self.fabricated[real] = self._fabricate(real)
            self.world.lookalike(self.fabricated[real], self.world.reservations.get(real))
        return {**arguments, "reservation_id": self.fabricated[real]}

    def _fabricate(self, real: str) -> str:
        seen = self.seen_text()
        digits = list(real[2:])
        for _ in range(200):
            candidate = digits[:]
            if self.rng.random() < 0.5:
                i = self.rng.randrange(len(candidate) - 1)
                candidate[i], candidate[i + 1] = candidate[i + 1], candidate[i]
            else:
                i = self.rng.randrange(len(candidate))
                candidate[i] = str((int(candidate[i]) + self.rng.randint(1, 9)) % 10)
            value = "R-" + "".join(candidate)
            if value != real and candidate[0] != "0" and value not in seen and value not in self.world.ids:
                return value
        raise RuntimeError("could not fabricate a fresh reservation id")

    # --- sites ------------------------------------------------------------------------------

    def choose_sites(self, *, reads: Sequence[str], grounding: Sequence[str], domain_errors: Sequence[str],
                     wrong_type: Sequence[str], loops: Sequence[str]) -> None:  # fmt: skip
        """Pick the step of each planted lack, keeping them apart where the scenario allows."""
        rng, labels, sites = self.rng, self.labels, self.sites
        if labels["argument_grounding"] == LACKING:
            sites.grounding = rng.choice(list(grounding))
            self.realization["argument_grounding"] = "fabricated_reservation_id"
        if labels["multi_step_completion"] == LACKING:
            if labels["structured_data_reasoning"] == NA and rng.random() < 0.5:
                sites.multi_variant = "truncated"
            else:
                sites.multi_variant = "loop"
                keep_free = set(domain_errors) if labels["error_recovery"] != NA else set()
                candidates = [label for label in loops if label != sites.grounding and label not in keep_free]
                candidates = candidates or [label for label in loops if label not in keep_free] or list(loops)
                sites.loop = rng.choice(candidates)
            self.realization["multi_step_completion"] = sites.multi_variant
        taken = {sites.grounding, sites.loop}
        if labels["error_recovery"] != NA:
            invalid_sites = [label for label in reads if label not in taken]
            if labels["tool_call_precision"] == LACKING and invalid_sites and rng.random() < 2 / 3:
                sites.error = sites.tcp = rng.choice(invalid_sites)
                sites.error_kind = "tool_call"
                sites.tcp_variant = rng.choice(("unknown_tool", "missing_required"))
            else:
                candidates = [label for label in domain_errors if label not in taken]
                candidates = candidates or [label for label in domain_errors if label != sites.loop]
                sites.error = rng.choice(candidates)
                sites.error_kind = "domain"
            if labels["error_recovery"] == LACKING:
                self.realization["error_recovery"] = "identical_retry"
        if labels["tool_call_precision"] == LACKING and sites.tcp is None:
            candidates = [label for label in wrong_type if label not in (sites.error, sites.grounding, sites.loop)]
            candidates = candidates or [label for label in wrong_type if label != sites.error]
            sites.tcp = rng.choice(candidates)
            sites.tcp_variant = "wrong_type"
        if sites.tcp_variant:
            self.realization["tool_call_precision"] = sites.tcp_variant

    # --- endings ----------------------------------------------------------------------------

    def finish(self, clean: str, amount: float | None = None, claim: Callable[[float], str] | None = None) -> None:
        """The final answer, with the planted wrong amount when structured reasoning is lacking."""
        if self.sites.multi_variant == "truncated":
            return  # the run stops on a tool result: no final answer
        if amount is None or claim is None or self.labels["structured_data_reasoning"] == NA:
            self.say(clean)
            return
        if self.labels["structured_data_reasoning"] == LACKING:
            amount = self._wrong_amount(amount)
            self.realization["structured_data_reasoning"] = "wrong_amount"
        self.say(claim(amount))

    def _wrong_amount(self, correct: float) -> float:
        """An amount that no record, sum or simple combination of the tool results supports."""
        numbers = [v for call in self.calls if call.result is not None for v in _numbers(call.result)]
        avoid = set(numbers) | {_money(sum(numbers))}
        if len(numbers) <= 80:
            for a, b in itertools.product(numbers, repeat=2):
                avoid |= {_money(a + b), _money(a - b), _money(a * b)}
        amounts = sorted({v for call in self.calls if call.result is not None for v in _numbers(call.result, _AMOUNT_KEYS)})
        if len(amounts) <= 16:
            sums = {0.0}
            for amount in amounts:
                sums |= {_money(s + amount) for s in sums}
            avoid |= sums
        else:
            for size in (2, 3):
                avoid |= {_money(sum(combination)) for combination in itertools.combinations(amounts, size)}
        for _ in range(1000):
            delta = self.rng.choice((-1, 1)) * _money(self.rng.uniform(9, 95))
            wrong = _money(correct + delta)
            if wrong > 0 and all(abs(wrong - known) >= 0.02 for known in avoid):
                return wrong
        raise RuntimeError("could not find a contradicting amount")


def _numbers(value: Any, keys: Sequence[str] | None = None, key: str = "") -> list[float]:
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _numbers(v, keys, k)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v, keys, key)]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (keys is None or key in keys):
        return [float(value)]
    return []


def _wrong_type(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    key, default = _WRONG_TYPE[name]
    value = arguments.get(key, default)
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return {**arguments, key: text}


def _invalid_call(name: str, arguments: dict[str, Any], variant: str) -> tuple[str, dict[str, Any]]:
    if variant == "unknown_tool":
        return _UNKNOWN_TOOL[name], dict(arguments)
    how, key, new_key = _MISSING_REQUIRED[name]
    broken = {k: v for k, v in arguments.items() if k != key}
    if how == "rename":
        broken = {new_key: arguments[key], **broken}
    return name, broken


def _dollars(value: float) -> str:
    return f"${value:.2f}"


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def _greeting(rng: random.Random, user: dict[str, Any]) -> str:
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    uid = user["user_id"]
    return rng.choice(
        (
            f"Hi, this is {name}, user id {uid}.",
            f"Hello, I'm {name} ({uid}).",
            f"{name} here, my customer id is {uid}.",
            f"Hi there. Name's {name}, account {uid}.",
        )
    )


_BRANDS = {"visa": "Visa", "mastercard": "Mastercard", "amex": "American Express"}


def _card(user: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in user["payment_methods"] if m["type"] == "credit_card")


def _brand(card: dict[str, Any]) -> str:
    return _BRANDS[card["brand"]]


def _route(reservation: dict[str, Any]) -> str:
    o, d = reservation["origin"], reservation["destination"]
    return f"{AIRPORTS[o]} ({o}) to {AIRPORTS[d]} ({d})"


def _passenger_names(reservation: dict[str, Any]) -> str:
    return _join([f"{p['first_name']} {p['last_name']}" for p in reservation["passengers"]])


def _get_user_args(c: _Conversation, user_id: str, **extra: Any) -> dict[str, Any]:
    arguments = {"user_id": user_id, **extra}
    if c.rng.random() < 0.3:
        arguments["include_payment_methods"] = True
    return arguments


def _opening(c: _Conversation) -> str | None:
    return c.rng.choice((None, None, "Let me pull up your account.", "Sure thing, one moment while I look you up."))


def _cancel_reservation(c: _Conversation) -> str:
    rng, world = c.rng, c.world
    user = world.make_user()
    reservation = world.make_reservation(user)
    for _ in range(rng.randint(0, 2)):
        world.make_reservation(user, past=rng.random() < 0.5)
    c.customer = user["user_id"]
    rid = reservation["reservation_id"]
    pv = c.labels["precondition_verification"]
    variant = rng.choice(("no_read", "no_confirmation")) if pv == LACKING else None
    if variant:
        c.realization["precondition_verification"] = variant
    read = variant != "no_read"
    c.choose_sites(
        reads=["U", "R"] if read else ["U"],
        grounding=["R"] if read else ["W"],
        domain_errors=["W"],
        wrong_type=["U", "R", "W"] if read else ["U", "W"],
        loops=["U", "R"] if read else ["U"],
    )
    c.user(
        _greeting(rng, user) + " "
        + rng.choice(
            (
                f"I need to cancel my reservation {rid}, my plans changed.",
                f"Please cancel booking {rid}. I can't make that trip anymore.",
                f"I'd like to cancel reservation {rid} and get a refund.",
            )
        )
    )
    c.step("U", "get_user", _get_user_args(c, user["user_id"]), text=_opening(c))
    target = rid
    if read:
        record = c.step("R", "get_reservation", {"reservation_id": rid})
        target = record["reservation_id"]
        ask = (
            f"I found reservation {target}: {_route(record)} on {record['flights'][0]['date']}, "
            f"{record['fare_family']}, for {_passenger_names(record)}. Shall I cancel it? "
            "The refund goes back to the original form of payment."
        )
    else:
        ask = f"Just to double-check before I continue: shall I cancel reservation {rid} now?"
    if variant != "no_confirmation":
        c.say(ask)
        c.user(rng.choice(_CONFIRMATIONS))
    arguments = {"reservation_id": target, "reason": "change_of_plan"}
    if rng.random() < 0.3:
        arguments["refund_to_original_payment"] = True
    bad_reason = rng.choice(("my plans changed", "customer request", "cannot travel"))
    result = c.step(
        "W", "cancel_reservation", arguments,
        bad=lambda a: {**a, "reason": bad_reason},
        text=None if read else "Cancelling it now.",
        fix_text="That reason code isn't accepted; using change_of_plan instead.",
    )  # fmt: skip
    cancelled = result["reservation_id"]
    c.finish(
        f"Done: reservation {cancelled} is cancelled and a confirmation is on its way to {user['email']}. "
        "The refund goes back to your original form of payment within a week.",
        result["refund_amount"],
        lambda amount: f"Done: reservation {cancelled} is cancelled. A refund of {_dollars(amount)} goes back "
        "to your original form of payment within a week.",
    )
    return f"cancel reservation {rid}"


def _change_flight(c: _Conversation) -> str:
    rng, world = c.rng, c.world
    user = world.make_user()
    c.customer = user["user_id"]
    reservation = world.make_reservation(user, one_way=True)
    rid = reservation["reservation_id"]
    old = reservation["flights"][0]
    new_day = _parse_date(old["date"]) + timedelta(days=rng.randint(1, 5))
    origin, destination = reservation["origin"], reservation["destination"]
    world.searches[(origin, destination, new_day.isoformat())] = [
        world.flight(origin, destination, new_day, reservation["cabin"], price=_money(old["price"] + rng.uniform(15, 180)))
        for _ in range(rng.randint(3, 5))
    ]
    pv = c.labels["precondition_verification"]
    # Skipping get_reservation here would still leave reads of the new flight (search) and the
    # card (get_user) before the write, so the only planted precondition lack is no confirmation.
    confirm = pv != LACKING
    if not confirm:
        c.realization["precondition_verification"] = "no_confirmation"
    with_cabin = rng.random() < 0.5
    c.choose_sites(
        reads=["U", "R", "S"],
        grounding=["R"],
        domain_errors=["W", "S"] if with_cabin else ["W"],
        wrong_type=["U", "R", "S"],
        loops=["U", "R", "S"],
    )
    if c.sites.error == "S":
        with_cabin = True
    c.user(
        _greeting(rng, user) + " "
        + rng.choice(
            (
                f"Can I move my {origin} to {destination} flight on reservation {rid} to {new_day.isoformat()} instead?",
                f"I need to fly {origin} to {destination} on {new_day.isoformat()} instead of the date on reservation {rid}.",
                f"Reservation {rid}, {origin} to {destination}: could you change it to {new_day.isoformat()}?",
            )
        )
    )
    profile = c.step("U", "get_user", _get_user_args(c, user["user_id"]), text=_opening(c))
    record = c.step("R", "get_reservation", {"reservation_id": rid})
    target = record["reservation_id"]
    search = {"origin": record["origin"], "destination": record["destination"], "date": new_day.isoformat()}
    if with_cabin:
        search["cabin"] = record["cabin"]
    if rng.random() < 0.3 or c.sites.tcp == "S":
        search["passengers"] = len(record["passengers"])
    flights = c.step(
        "S", "search_flights", search,
        bad=lambda a: {**a, "cabin": record["fare_family"]},
        fix_text="The search wants the cabin code rather than the fare name; searching again.",
    )["flights"]  # fmt: skip
    pick = flights[0]
    card = _card(profile)
    if confirm:
        c.say(
            f"On {pick['date']} the earliest {record['origin']} to {record['destination']} flight is "
            f"{pick['flight_number']}, departing {pick['departure']} and arriving {pick['arrival']}. "
            f"Shall I move reservation {target} to it? The fare difference will be charged to your "
            f"{_brand(card)} card on file."
        )
        c.user(rng.choice(_CONFIRMATIONS))
    arguments = {"reservation_id": target, "flight_number": pick["flight_number"], "date": pick["date"], "payment_id": card["payment_id"]}
    result = c.step(
        "W", "update_reservation", arguments,
        bad=lambda a: {k: v for k, v in a.items() if k != "payment_id"},
        text=None if confirm else f"I'll switch you to {pick['flight_number']}, the earliest flight that day.",
        fix_text="It needs a payment method for the fare difference; using your card on file.",
    )  # fmt: skip
    head = (
        f"All set: reservation {result['reservation_id']} is now on {pick['flight_number']} on {pick['date']}, "
        f"departing {pick['departure']}."
    )
    c.finish(
        head + " An updated itinerary is on its way to your e-mail.",
        result["fare_difference"],
        lambda amount: head + f" The fare difference of {_dollars(amount)} was charged to your {_brand(card)} card.",
    )
    return f"move reservation {rid} to {new_day.isoformat()}"


def _price_total(c: _Conversation) -> str:
    rng, world = c.rng, c.world
    user = world.make_user()
    c.customer = user["user_id"]
    count = rng.randint(2, 4)
    for _ in range(count):
        world.make_reservation(user, past=rng.random() < 0.4)
    ids = list(user["reservations"])
    labels = [f"R{i}" for i in range(count)]
    c.choose_sites(reads=["U", *labels], grounding=labels, domain_errors=labels, wrong_type=["U", *labels], loops=["U"])
    if c.sites.error in labels and c.sites.error_kind == "domain":
        archived = ids[labels.index(c.sites.error)]
        world.archived.add(archived)
        world.reservations[archived]["status"] = "completed"
    c.user(
        _greeting(rng, user) + " "
        + rng.choice(
            (
                "How much have I paid in total for my reservations with you?",
                "Could you add up what I've spent on all my bookings?",
                "What's the total I paid across all my reservations?",
            )
        )
    )
    profile = c.step("U", "get_user", _get_user_args(c, user["user_id"], include_reservations=True), text=_opening(c))
    totals: dict[str, float] = {}
    for label, rid in zip(labels, profile["reservations"]):
        arguments: dict[str, Any] = {"reservation_id": rid}
        if c.sites.error == label and c.sites.error_kind == "domain":
            arguments["include_archived"] = True  # the fixed call; the first attempt leaves it out
        record = c.step(
            label, "get_reservation", arguments,
            bad=lambda a: {k: v for k, v in a.items() if k != "include_archived"},
            fix_text="That one is archived; fetching it with archived reservations included.",
        )  # fmt: skip
        totals[record["reservation_id"]] = record["total_price"]
    total = _money(sum(totals.values()))
    names = _join(list(totals))
    c.finish(
        "",
        total,
        lambda amount: f"Across your reservations {names}, you've paid {_dollars(amount)} in total.",
    )
    return "total paid over all reservations"


def _baggage_fees(c: _Conversation) -> str:
    rng, world = c.rng, c.world
    user = world.make_user()
    c.customer = user["user_id"]
    reservation = world.make_reservation(user)
    rid = reservation["reservation_id"]
    free = min(_FREE_BAGS[reservation["cabin"]] + _MEMBER_BAGS[user["membership"]], 4)
    bags = rng.randint(free + 1, min(5, free + 3))
    c.choose_sites(reads=["U", "R", "P"], grounding=["R"], domain_errors=["P"], wrong_type=["U", "R", "P"], loops=["U", "R"])
    c.user(
        _greeting(rng, user) + " "
        + rng.choice(
            (
                f"I'm flying on reservation {rid} and will bring {bags} checked bags. What will the bags cost me?",
                f"How much would {bags} checked bags cost on my trip {rid}?",
                f"On booking {rid} I need to check {bags} bags. What are the fees?",
            )
        )
    )
    profile = c.step("U", "get_user", _get_user_args(c, user["user_id"]), text=_opening(c))
    record = c.step("R", "get_reservation", {"reservation_id": rid})
    policy = c.step(
        "P", "get_baggage_policy",
        {"cabin": record["cabin"], "membership": profile["membership"], "checked_bags": bags},
        bad=lambda a: {**a, "cabin": record["fare_family"]},
        fix_text="The policy lookup needs the cabin code; trying again with it.",
    )  # fmt: skip
    total = _money(sum(bag["fee"] for bag in policy["bags"]))
    c.finish(
        "",
        total,
        lambda amount: f"For {_NUMBER_WORDS[bags]} checked bags on reservation {record['reservation_id']} "
        f"({record['fare_family']}, {profile['membership']} member) your bag fees come to {_dollars(amount)} in total.",
    )
    return f"price {bags} checked bags on {rid}"


def _earlier_flight(c: _Conversation) -> str:
    rng, world = c.rng, c.world
    user = world.make_user()
    c.customer = user["user_id"]
    reservation = world.make_reservation(user, departure=world.time_of_day(11 * 60, 21 * 60))
    rid = reservation["reservation_id"]
    mine = reservation["flights"][0]
    day = _parse_date(mine["date"])
    others = [world.flight(mine["origin"], mine["destination"], day, reservation["cabin"],
                           departure=world.time_of_day(5 * 60 + 30, 10 * 60 + 30))]  # fmt: skip
    others += [world.flight(mine["origin"], mine["destination"], day, reservation["cabin"]) for _ in range(rng.randint(1, 3))]
    world.searches[(mine["origin"], mine["destination"], mine["date"])] = [dict(mine), *others]
    c.choose_sites(reads=["U", "R", "S"], grounding=["R"], domain_errors=["S"], wrong_type=["U", "R", "S"], loops=["U", "R", "S"])
    c.user(
        _greeting(rng, user) + " "
        + rng.choice(
            (
                f"My flight on reservation {rid} leaves at {mine['departure']}. Is there an earlier flight that day?",
                f"Is there anything earlier than my {mine['departure']} departure on booking {rid}?",
                f"Could I get out earlier on the day of my trip {rid}? Which flights leave before mine?",
            )
        )
    )
    c.step("U", "get_user", _get_user_args(c, user["user_id"]), text=_opening(c))
    record = c.step("R", "get_reservation", {"reservation_id": rid})
    first = record["flights"][0]
    search = {"origin": first["origin"], "destination": first["destination"], "date": first["date"], "cabin": record["cabin"]}
    if rng.random() < 0.3 or c.sites.tcp == "S":
        search["passengers"] = len(record["passengers"])
    flights = c.step(
        "S", "search_flights", search,
        bad=lambda a: {**a, "cabin": record["fare_family"]},
        fix_text="The search wants the cabin code rather than the fare name; searching again.",
    )["flights"]  # fmt: skip
    earlier = [f for f in flights if f["departure"] < first["departure"]]
    pick = earlier[0]
    c.finish(
        f"Yes: {pick['flight_number']} leaves {pick['origin']} at {pick['departure']} on {pick['date']}, ahead of your "
        f"{first['flight_number']} at {first['departure']}. Let me know if you'd like to switch to it."
    )
    return f"find a flight earlier than the one on {rid}"


_SCENARIO_FUNCTIONS = {
    "cancel_reservation": _cancel_reservation,
    "change_flight": _change_flight,
    "price_total": _price_total,
    "baggage_fees": _baggage_fees,
    "earlier_flight": _earlier_flight,
}


def _scenario_for(rng: random.Random, labels: dict[str, str]) -> str:
    """A scenario that needs exactly the capabilities the labels call for."""
    if labels["precondition_verification"] != NA:
        return rng.choice(("cancel_reservation", "change_flight"))
    if labels["structured_data_reasoning"] != NA:
        return rng.choice(("price_total", "baggage_fees"))
    return "earlier_flight"


def _draw_labels(rng: random.Random, outcome: str, profile: GapProfile) -> dict[str, str]:
    labels = {}
    for name in CAPABILITIES:
        gap = profile[name]
        p = gap.failed if outcome == "failure" else gap.successful
        if rng.random() < p:
            labels[name] = LACKING
        else:
            labels[name] = PRESENT if rng.random() < NEEDED[name] else NA
    return labels


def generate(
    n: int,
    seed: int = 7,
    failure_rate: float = 0.4,
    gaps: GapProfile | Mapping[str, Any] | str | None = None,
) -> list[TrajectoryPlan]:
    """Plan `n` trajectories (pure and deterministic in its arguments).

    Exactly round(n * failure_rate) of them fail. Per trajectory and capability the lack is drawn
    with the profile's probability for its outcome; where not lacking, the capability is needed
    (PRESENT) or not (NA) with a fixed, outcome-independent chance, and a scenario that needs
    exactly those capabilities is played out.
    """
    from faker import Faker

    if n < 0:
        raise ValueError("n must be >= 0")
    if not 0.0 <= failure_rate <= 1.0:
        raise ValueError("failure_rate must lie in [0, 1]")
    profile = GapProfile.of(gaps)
    failures = set(random.Random(f"tracefix-traffic:{seed}:outcomes").sample(range(n), round(n * failure_rate)))
    fake = Faker("en_US")
    plans = []
    offset = 0
    for index in range(n):
        rng = random.Random(f"tracefix-traffic:{seed}:{index}")
        fake.seed_instance(rng.getrandbits(64))
        outcome = "failure" if index in failures else "success"
        trace_id = f"{rng.getrandbits(128) | 1:032x}"
        conversation_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        labels = _draw_labels(rng, outcome, profile)
        scenario = _scenario_for(rng, labels)
        conversation = _Conversation(rng, _World(rng, fake), labels, {})
        goal = _SCENARIO_FUNCTIONS[scenario](conversation)
        offset += int(rng.expovariate(1 / 8_000)) if index else 0
        plans.append(
            TrajectoryPlan(
                index=index,
                seed=seed,
                trace_id=trace_id,
                conversation_id=conversation_id,
                scenario=scenario,
                outcome=outcome,
                labels=labels,
                realization=dict(sorted(conversation.realization.items())),
                user_id=conversation.customer,
                goal=goal,
                messages=conversation.messages,
                durations_ms=conversation.durations,
                calls=conversation.calls,
                start_offset_ms=offset,
            )
        )
    return plans


# --------------------------------------------------------------------------------------------
# Summary (the ground truth)
# --------------------------------------------------------------------------------------------


@dataclass
class Summary:
    """What was generated (and sent): counts and trace ids per capability label and outcome."""

    trajectories: int
    failed: int
    successful: int
    capabilities: dict[str, dict[str, Any]]
    trace_ids: dict[str, dict[str, list[str]]]
    outcomes: dict[str, list[str]]
    conversation_ids: dict[str, str]
    scenarios: dict[str, int]
    gaps: dict[str, dict[str, float]] | None = None
    seed: int | None = None
    spans: int = 0
    logs: int = 0
    exported_spans: int | None = None
    exported_logs: int | None = None
    endpoint: str | None = None
    protocol: str | None = None
    outcome_via: str | None = None
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(plans: Sequence[TrajectoryPlan], gaps: GapProfile | Mapping[str, Any] | str | None = None) -> Summary:
    """Ground truth of a set of plans (pure)."""
    capabilities: dict[str, dict[str, Any]] = {}
    trace_ids: dict[str, dict[str, list[str]]] = {}
    for name in CAPABILITIES:
        counts = {"failed": dict.fromkeys(STATES, 0), "successful": dict.fromkeys(STATES, 0)}
        ids: dict[str, list[str]] = {state: [] for state in STATES}
        for plan in plans:
            state = plan.labels[name]
            counts["failed" if plan.outcome == "failure" else "successful"][state] += 1
            ids[state].append(plan.trace_id)
        counts["lacking_failed"] = counts["failed"][LACKING]
        counts["lacking_successful"] = counts["successful"][LACKING]
        capabilities[name] = counts
        trace_ids[name] = ids
    scenarios = {name: 0 for name in SCENARIOS}
    for plan in plans:
        scenarios[plan.scenario] += 1
    seeds = {plan.seed for plan in plans}
    return Summary(
        trajectories=len(plans),
        failed=sum(plan.outcome == "failure" for plan in plans),
        successful=sum(plan.outcome == "success" for plan in plans),
        capabilities=capabilities,
        trace_ids=trace_ids,
        outcomes={
            "success": [plan.trace_id for plan in plans if plan.outcome == "success"],
            "failure": [plan.trace_id for plan in plans if plan.outcome == "failure"],
        },
        conversation_ids={plan.trace_id: plan.conversation_id for plan in plans},
        scenarios=scenarios,
        gaps=GapProfile.of(gaps).to_dict() if gaps is not None else None,
        seed=seeds.pop() if len(seeds) == 1 else None,
    )


# --------------------------------------------------------------------------------------------
# Sending through the OpenTelemetry SDK
# --------------------------------------------------------------------------------------------


class _Counting:
    """Wraps an OTLP exporter and counts what the receiver accepted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, batch: Sequence[Any]) -> Any:
        result = self.inner.export(batch)
        if getattr(result, "name", "") == "SUCCESS":
            self.exported += len(batch)
        else:
            self.failed += len(batch)
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        flush = getattr(self.inner, "force_flush", None)
        return flush(timeout_millis) if flush else True

    def shutdown(self) -> None:
        self.inner.shutdown()


def _spans_of(plan: TrajectoryPlan) -> int:
    return 1 + sum(1 for m in plan.messages if m["role"] in ("assistant", "tool"))


class _PlannedIds(IdGenerator):
    """Trace ids come from the plan; span ids from a generator seeded by it."""

    def __init__(self) -> None:
        self.trace_id = 1
        self.rng = random.Random()

    def use(self, trace_id: str) -> None:
        self.trace_id = int(trace_id, 16)
        self.rng.seed(trace_id)

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64) or 1


class _Pipeline:
    """The SDK's tracer and logger of one `send`, batching into OTLP exporters that count what was accepted."""

    def __init__(
        self, endpoint: str, protocol: str, service_name: str, timeout_s: float, spans: int, logs: int
    ) -> None:
        self.spans = _Counting(exporter("traces", endpoint, protocol, timeout_s))
        self.logs = _Counting(exporter("logs", endpoint, protocol, timeout_s))
        self.timeout_ms = int(timeout_s * 1000)
        resource = Resource.create(
            {"service.name": service_name, "service.version": "2.3.1", "deployment.environment.name": "production"}
        )
        batching = {
            "max_export_batch_size": 512,
            "schedule_delay_millis": 200,
            "export_timeout_millis": self.timeout_ms,
        }
        self.ids = _PlannedIds()
        self.tracer_provider = TracerProvider(resource=resource, id_generator=self.ids)
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(self.spans, max_queue_size=max(2048, spans + 16), **batching)
        )
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(self.logs, max_queue_size=max(2048, logs + 16), **batching)
        )
        self.tracer = self.tracer_provider.get_tracer("examples.traffic", "0.1.0")
        self.logger = self.logger_provider.get_logger("examples.traffic", "0.1.0")

    def flush(self) -> None:
        self.tracer_provider.force_flush(self.timeout_ms)
        self.logger_provider.force_flush(self.timeout_ms)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()


_MS = 1_000_000  # nanoseconds
_AGENT = Agent(
    AGENT_NAME, MODEL, SYSTEM_INSTRUCTIONS, TOOLS, id="asst_skyways_support_v2", provider=PROVIDER,
    response_model=RESPONSE_MODEL, temperature=0.2, server=("api.openai.com", 443),
)  # fmt: skip


def send(
    plans: Sequence[TrajectoryPlan],
    endpoint: str = "http://127.0.0.1:4318",
    protocol: str = "http/protobuf",
    outcome_via: str = "log",
    *,
    gaps: GapProfile | Mapping[str, Any] | str | None = None,
    service_name: str = SERVICE_NAME,
    end_time_ns: int | None = None,
    timeout_s: float = 30.0,
) -> Summary:
    """Emit the plans as OTLP traces (and evaluation log records) and return the ground truth.

    Each plan becomes one trace under its planned trace id, with explicit timestamps laid out in
    the past so that the last conversation ends shortly before `end_time_ns` (default: now).
    """
    if outcome_via not in ("log", "attribute"):
        raise ValueError("outcome_via must be 'log' or 'attribute'")
    started = time.perf_counter()
    total_spans = sum(_spans_of(plan) for plan in plans)
    pipeline = _Pipeline(endpoint, protocol, service_name, timeout_s, total_spans, len(plans))
    lengths = [plan.start_offset_ms + sum(plan.durations_ms) + 20 * len(plan.messages) for plan in plans]
    end_ns = end_time_ns if end_time_ns is not None else time.time_ns()
    base_ns = end_ns - (max(lengths, default=0) + 2_000) * _MS
    try:
        for plan in plans:
            _emit(pipeline, plan, base_ns + plan.start_offset_ms * _MS, outcome_via)
        pipeline.flush()
    finally:
        pipeline.shutdown()

    summary = summarize(plans, gaps)
    summary.spans = total_spans
    summary.logs = len(plans) if outcome_via == "log" else 0
    summary.exported_spans = pipeline.spans.exported
    summary.exported_logs = pipeline.logs.exported
    summary.endpoint = endpoint
    summary.protocol = protocol
    summary.outcome_via = outcome_via
    summary.seconds = round(time.perf_counter() - started, 3)
    return summary


def _emit(pipeline: _Pipeline, plan: TrajectoryPlan, start_ns: int, outcome_via: str) -> None:
    """One plan as one trace starting at `start_ns`: the agent's root span, a chat span per assistant
    message, an execute_tool span per tool result, and the outcome as a log record or root attribute."""
    pipeline.ids.use(plan.trace_id)
    attributes = {"user.id": plan.user_id}
    if outcome_via == "attribute":
        attributes["tracefix.outcome"] = plan.outcome
    run = AgentRun(pipeline.tracer, _AGENT, plan.conversation_id, start_ns, attributes)
    call_by_id = {call.id: call for call in plan.calls}
    t = start_ns + 3 * _MS
    for index, message in enumerate(plan.messages):
        duration = plan.durations_ms[index] * _MS
        if message["role"] == "user":
            t += duration
            continue
        if message["role"] == "assistant":
            response_id = f"chatcmpl-{plan.trace_id[:12]}{index:04d}"
            run.chat(plan.messages[:index], message, t, t + duration, response_id=response_id)
        else:  # a tool result: the execute_tool span that produced it
            call = call_by_id[message["parts"][0]["id"]]
            run.tool(
                call.name, call.id, call.arguments, t, t + duration,
                result=None if call.failed else dumps(call.result),
                error=(call.error_type, call.error_message) if call.failed else None,
                description=TOOLS_BY_NAME[call.name]["description"] if call.name in TOOLS_BY_NAME else None,
            )  # fmt: skip
        t += duration + 2 * _MS
    run.end(t + 4 * _MS)
    if outcome_via == "log":
        passed = plan.outcome == "success"
        pipeline.logger.emit(
            timestamp=t + 250 * _MS,
            observed_timestamp=t + 250 * _MS,
            context=run.context,
            severity_number=SeverityNumber.INFO,
            event_name="gen_ai.evaluation.result",
            attributes={
                **evaluation_attributes("task_success", passed, "goal achieved" if passed else "goal not achieved"),
                "gen_ai.conversation.id": plan.conversation_id,
            },
        )


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.traffic",
        description="Send seeded airline-support agent trajectories with planted capability gaps to an OTLP endpoint.",
    )
    parser.add_argument("--endpoint", default=None, help="OTLP endpoint (default http://127.0.0.1:4318, or :4317 for grpc)")
    parser.add_argument("--protocol", default="http/protobuf", choices=("http/protobuf", "grpc"))
    parser.add_argument("--trajectories", type=int, default=300)
    parser.add_argument("--failure-rate", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--gaps", default="default",
        help="cap=FAILED:SUCCESSFUL,... (unnamed capabilities: 0.05:0.05); 'default' = "
        "precondition_verification=0.7:0.05,error_recovery=0.6:0.05; 'none' = noise only",
    )  # fmt: skip
    parser.add_argument("--outcome-via", default="log", choices=("log", "attribute"))
    parser.add_argument("--service-name", default=SERVICE_NAME)
    parser.add_argument("--dry-run", action="store_true", help="plan only; print the summary without sending")
    parser.add_argument("--dump", metavar="PATH", help="also write the plans as JSON lines to PATH")
    parser.add_argument("--full", action="store_true", help="print every trace id (default: only the lacking ones)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        profile = GapProfile.parse(args.gaps)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    plans = generate(args.trajectories, args.seed, args.failure_rate, profile)
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as handle:
            for plan in plans:
                handle.write(dumps(plan.to_dict()) + "\n")
    if args.dry_run:
        summary = summarize(plans, profile)
    else:
        endpoint = args.endpoint or ("http://127.0.0.1:4317" if args.protocol == "grpc" else "http://127.0.0.1:4318")
        summary = send(plans, endpoint, args.protocol, args.outcome_via, gaps=profile, service_name=args.service_name)
    data = summary.to_dict()
    if not args.full:
        data["trace_ids"] = {name: {LACKING: ids[LACKING]} for name, ids in data["trace_ids"].items()}
        data.pop("conversation_ids")
        data["outcomes"] = {name: len(ids) for name, ids in data["outcomes"].items()}
    print(json.dumps(data, indent=2))
    if not args.dry_run and summary.exported_spans != summary.spans:
        print(f"warning: {summary.spans - (summary.exported_spans or 0)} spans were not accepted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
