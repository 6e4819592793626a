"""The agent's tools: their JSON schemas (what the model is offered) and what each one does to the database.

Arguments are checked against the schema before a tool runs, the way a strict function-calling
runtime does; a call that fails the check, names no known tool, or breaks a business rule raises
:class:`ToolError`, whose type and message the agent sees as the tool's result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema

from examples.airline.database import (
    AIRPORTS,
    CABINS,
    EXTRA_BAG_FEE,
    FREE_BAGS_BY_CABIN,
    FREE_BAGS_BY_MEMBERSHIP,
    MEMBERSHIPS,
    TODAY,
    Database,
    money,
)

_AIRPORT = {"type": "string", "pattern": "^[A-Z]{3}$", "description": f"IATA code, one of {', '.join(sorted(AIRPORTS))}."}
_DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "YYYY-MM-DD."}
_RESERVATION_ID = {"type": "string", "pattern": r"^R-\d{5}$", "description": "Reservation id, e.g. R-48213."}

# Each tool in the GenAI semantic conventions' flat form; `openai_tools()` nests them for `tools=`.
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_user",
        "description": "Look up a customer by user id: name, e-mail, membership tier, payment methods and, "
        "on request, the ids of their reservations.",
        "parameters": {
            "type": "object",
            "properties": {
                "user_id": {"type": "string", "pattern": r"^U-\d{4}$", "description": "Customer id, e.g. U-1029."},
                "include_reservations": {"type": "boolean", "description": "Also list the customer's reservation ids."},
            },
            "required": ["user_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_reservation",
        "description": "Fetch one reservation: status, route, cabin, flights, passengers, payment and total price.",
        "parameters": {
            "type": "object",
            "properties": {"reservation_id": _RESERVATION_ID},
            "required": ["reservation_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "search_flights",
        "description": "Direct flights between two airports on one day, with departure and arrival times and fares.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": _AIRPORT,
                "destination": _AIRPORT,
                "date": _DATE,
                "cabin": {"type": "string", "enum": list(CABINS), "description": "Only this cabin's fare."},
            },
            "required": ["origin", "destination", "date"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_baggage_policy",
        "description": "Free checked bags per passenger and the fee of each extra bag, for a cabin and membership tier.",
        "parameters": {
            "type": "object",
            "properties": {
                "cabin": {"type": "string", "enum": list(CABINS)},
                "membership": {"type": "string", "enum": list(MEMBERSHIPS)},
            },
            "required": ["cabin", "membership"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "update_reservation_flights",
        "description": "Move a reservation to another flight on the same route and cabin. Charges or refunds the "
        "fare difference for all passengers to the given payment method.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": _RESERVATION_ID,
                "flight_number": {"type": "string", "pattern": r"^BJ\d{4}$", "description": "New flight, e.g. BJ1032."},
                "date": _DATE,
                "payment_id": {"type": "string", "pattern": r"^PM-\d{4}$", "description": "Pays the fare difference."},
            },
            "required": ["reservation_id", "flight_number", "date", "payment_id"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "update_passenger",
        "description": "Change the name of one passenger on a reservation (passengers are numbered from 0).",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": _RESERVATION_ID,
                "passenger_index": {"type": "integer", "minimum": 0, "maximum": 8},
                "first_name": {"type": "string", "minLength": 1},
                "last_name": {"type": "string", "minLength": 1},
            },
            "required": ["reservation_id", "passenger_index", "first_name", "last_name"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "cancel_reservation",
        "description": "Cancel a reservation. Refunds the total price to the original payment method, except for "
        "basic economy, which is not refundable.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": _RESERVATION_ID,
                "reason": {"type": "string", "enum": ["change_of_plan", "airline_cancelled", "other"]},
            },
            "required": ["reservation_id", "reason"],
            "additionalProperties": False,
        },
    },
]
TOOL_NAMES = tuple(tool["name"] for tool in TOOLS)
STATE_CHANGING = frozenset({"update_reservation_flights", "update_passenger", "cancel_reservation"})
_VALIDATORS = {tool["name"]: jsonschema.Draft202012Validator(tool["parameters"]) for tool in TOOLS}


def openai_tools() -> list[dict[str, Any]]:
    """The tools in the shape of OpenAI's `tools=` parameter."""
    return [
        {"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")}}
        for tool in TOOLS
    ]


class ToolError(Exception):
    """A call the airline's backend refuses; `error_type` names the kind of problem."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message

    def as_result(self) -> dict[str, str]:
        return {"error": self.error_type, "message": self.message}


def execute(database: Database, name: str, arguments: Any) -> dict[str, Any]:
    """Run one tool call against `database` (changing it for writes) and return its JSON result."""
    tool = _IMPLEMENTATIONS.get(name)
    if tool is None:
        raise ToolError("ToolNotFound", f"there is no tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    if not isinstance(arguments, dict):
        raise ToolError("InvalidArguments", f"{name} takes a JSON object of arguments, got {type(arguments).__name__}")
    error = jsonschema.exceptions.best_match(_VALIDATORS[name].iter_errors(arguments))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "arguments"
        raise ToolError("ValidationError", f"{name}: {where}: {error.message}")
    # A copy: the result is a snapshot, not a view of records later calls may change.
    return copy.deepcopy(tool(database, **arguments))


def _user(database: Database, user_id: str) -> dict[str, Any]:
    user = database.users.get(user_id)
    if user is None:
        raise ToolError("UserNotFound", f"no customer with id {user_id}")
    return user


def _reservation(database: Database, reservation_id: str) -> dict[str, Any]:
    reservation = database.reservations.get(reservation_id)
    if reservation is None:
        raise ToolError("ReservationNotFound", f"no reservation with id {reservation_id}")
    return reservation


def _changeable(database: Database, reservation_id: str) -> dict[str, Any]:
    reservation = _reservation(database, reservation_id)
    if reservation["status"] != "confirmed":
        raise ToolError("ReservationCancelled", f"reservation {reservation_id} is already cancelled")
    return reservation


def get_user(database: Database, user_id: str, include_reservations: bool = False) -> dict[str, Any]:
    user = dict(_user(database, user_id))
    if not include_reservations:
        user.pop("reservations")
    return user


def get_reservation(database: Database, reservation_id: str) -> dict[str, Any]:
    return _reservation(database, reservation_id)


def search_flights(database: Database, origin: str, destination: str, date: str, cabin: str | None = None) -> dict[str, Any]:
    for code in (origin, destination):
        if code not in AIRPORTS:
            raise ToolError("UnknownAirport", f"we do not fly to {code}; airports: {', '.join(sorted(AIRPORTS))}")
    if origin == destination:
        raise ToolError("InvalidRoute", "origin and destination are the same airport")
    flights = []
    for flight in database.departures(origin, destination, date):
        found = {key: flight[key] for key in ("flight_number", "date", "departure", "arrival", "seats_left")}
        if cabin is None:
            found["prices"] = dict(flight["prices"])
        else:
            found["cabin"], found["price"] = cabin, flight["prices"][cabin]
        flights.append(found)
    return {"origin": origin, "destination": destination, "date": date, "flights": flights}


def get_baggage_policy(database: Database, cabin: str, membership: str) -> dict[str, Any]:
    return {
        "cabin": cabin,
        "membership": membership,
        "free_checked_bags": FREE_BAGS_BY_CABIN[cabin] + FREE_BAGS_BY_MEMBERSHIP[membership],
        "extra_bag_fee": EXTRA_BAG_FEE[cabin],
    }


def update_reservation_flights(
    database: Database, reservation_id: str, flight_number: str, date: str, payment_id: str
) -> dict[str, Any]:
    reservation = _changeable(database, reservation_id)
    flight = database.flights.get((flight_number, date))
    if flight is None:
        raise ToolError("FlightNotFound", f"no flight {flight_number} on {date}")
    if (flight["origin"], flight["destination"]) != (reservation["origin"], reservation["destination"]):
        raise ToolError(
            "RouteMismatch",
            f"{flight_number} flies {flight['origin']}-{flight['destination']}, the reservation is "
            f"{reservation['origin']}-{reservation['destination']}",
        )
    current = reservation["flights"][0]
    if (current["flight_number"], current["date"]) == (flight_number, date):
        raise ToolError("SameFlight", f"reservation {reservation_id} is already on {flight_number} on {date}")
    owner = database.users[reservation["user_id"]]
    if payment_id not in {method["payment_id"] for method in owner["payment_methods"]}:
        raise ToolError("PaymentMethodNotFound", f"{payment_id} is not a payment method of {owner['user_id']}")
    price = flight["prices"][reservation["cabin"]]
    difference = money((price - current["price"]) * len(reservation["passengers"]))
    reservation["flights"] = [{key: flight[key] for key in ("flight_number", "date", "departure", "arrival")} | {"price": price}]
    reservation["total_price"] = money(reservation["total_price"] + difference)
    if difference:
        reservation["payments"].append({"payment_id": payment_id, "amount": difference})
    return {
        "reservation_id": reservation_id,
        "flights": reservation["flights"],
        "total_price": reservation["total_price"],
        "fare_difference": difference,
        "amount_charged": max(difference, 0.0),
        "amount_refunded": max(-difference, 0.0),
        "payment_id": payment_id,
    }


def update_passenger(
    database: Database, reservation_id: str, passenger_index: int, first_name: str, last_name: str
) -> dict[str, Any]:
    reservation = _changeable(database, reservation_id)
    passengers = reservation["passengers"]
    if passenger_index >= len(passengers):
        raise ToolError(
            "PassengerNotFound", f"reservation {reservation_id} has {len(passengers)} passengers (numbered from 0)"
        )
    passengers[passenger_index] = {**passengers[passenger_index], "first_name": first_name, "last_name": last_name}
    return {"reservation_id": reservation_id, "passengers": passengers}


def cancel_reservation(database: Database, reservation_id: str, reason: str) -> dict[str, Any]:
    reservation = _changeable(database, reservation_id)
    refund = 0.0 if reservation["cabin"] == "basic_economy" else reservation["total_price"]
    reservation["status"] = "cancelled"
    reservation["cancellation"] = {"reason": reason, "date": TODAY.isoformat(), "refund_amount": refund}
    if refund:
        reservation["payments"].append({"payment_id": reservation["payment_id"], "amount": -refund})
    return {
        "reservation_id": reservation_id, "status": "cancelled", "refund_amount": refund,
        "refund_to": reservation["payment_id"],
    }  # fmt: skip


_IMPLEMENTATIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "get_user": get_user,
    "get_reservation": get_reservation,
    "search_flights": search_flights,
    "get_baggage_policy": get_baggage_policy,
    "update_reservation_flights": update_reservation_flights,
    "update_passenger": update_passenger,
    "cancel_reservation": cancel_reservation,
}
