"""The airline's records: customers, their reservations and the flight schedule, seeded with Faker.

The same seed always gives the same records. Every conversation works on its own copy of the
database, so a task starts from the same state however many conversations ran before it. The
schedule never changes (no tool writes to it), so copies share it.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from faker import Faker

AIRLINE = "Bluejay Air"
TODAY = date(2025, 10, 1)  # "today" inside the simulated airline, so records and tasks stay reproducible
SCHEDULE_DAYS = 30  # flights exist from tomorrow for this many days

AIRPORTS = {
    "BOS": "Boston", "ORD": "Chicago", "DEN": "Denver", "SEA": "Seattle", "SFO": "San Francisco", "ATL": "Atlanta",
}  # fmt: skip
CABINS = ("basic_economy", "economy", "business")
MEMBERSHIPS = ("regular", "silver", "gold")
CARD_BRANDS = ("visa", "mastercard", "amex")
# Checked bags free of charge per passenger: the cabin's allowance plus the membership's.
FREE_BAGS_BY_CABIN = {"basic_economy": 0, "economy": 1, "business": 2}
FREE_BAGS_BY_MEMBERSHIP = {"regular": 0, "silver": 1, "gold": 2}
EXTRA_BAG_FEE = {"basic_economy": 60.0, "economy": 50.0, "business": 35.0}
_CABIN_FACTOR = {"basic_economy": 0.7, "economy": 1.0, "business": 2.8}


def money(value: float) -> float:
    """An amount in dollars, rounded to cents."""
    return round(value + 1e-9, 2)


@dataclass
class Database:
    """Users and reservations (what tools change) and the flight schedule (read only)."""

    users: dict[str, dict[str, Any]]
    reservations: dict[str, dict[str, Any]]
    # (flight_number, date) -> one departure; shared between copies, never written.
    flights: dict[tuple[str, str], dict[str, Any]] = field(repr=False)
    # Passenger first names booked with a typo: reservation id -> (passenger index, the right spelling).
    # Known to the customers, not to the agent; not part of the state.
    misspellings: dict[str, tuple[int, str]] = field(default_factory=dict, repr=False)

    def copy(self) -> Database:
        """An independent copy of the changeable records; the schedule is shared."""
        return Database(copy.deepcopy(self.users), copy.deepcopy(self.reservations), self.flights, self.misspellings)

    def state(self) -> dict[str, Any]:
        """Everything a tool can change, for comparing two databases."""
        return {"users": self.users, "reservations": self.reservations}

    def departures(self, origin: str, destination: str, day: str) -> list[dict[str, Any]]:
        """The flights of one route on one day, earliest first."""
        found = [
            flight
            for (_, flight_date), flight in self.flights.items()
            if flight_date == day and flight["origin"] == origin and flight["destination"] == destination
        ]
        return sorted(found, key=lambda flight: flight["departure"])

    @classmethod
    def generate(cls, seed: int = 0, users: int = 40) -> Database:
        """A reproducible database: `users` customers with one to three reservations each."""
        rng = random.Random(seed)
        fake = Faker("en_US")
        fake.seed_instance(seed)
        flights = _schedule(rng)
        taken: set[str] = set()

        def new_id(prefix: str, digits: int) -> str:
            while True:
                value = f"{prefix}{rng.randrange(10 ** (digits - 1), 10**digits)}"
                if value not in taken:
                    taken.add(value)
                    return value

        user_records: dict[str, dict[str, Any]] = {}
        reservation_records: dict[str, dict[str, Any]] = {}
        misspellings: dict[str, tuple[int, str]] = {}
        for _ in range(users):
            first, last = fake.first_name(), fake.last_name()
            user_id = new_id("U-", 4)
            methods = []
            for _ in range(rng.choice((1, 1, 2))):
                methods.append({
                    "payment_id": new_id("PM-", 4), "type": "credit_card",
                    "brand": rng.choice(CARD_BRANDS), "last_four": f"{rng.randrange(10000):04d}",
                })  # fmt: skip
            if rng.random() < 0.3:
                methods.append({"payment_id": new_id("PM-", 4), "type": "gift_card", "balance": money(rng.uniform(20, 300))})
            user = {
                "user_id": user_id,
                "name": {"first_name": first, "last_name": last},
                "email": f"{first}.{last}{rng.randrange(10, 99)}@example.com".lower().replace(" ", "").replace("'", ""),
                "phone": f"+1-{rng.randrange(200, 999)}-555-{rng.randrange(10000):04d}",
                "membership": rng.choices(MEMBERSHIPS, weights=(5, 3, 2))[0],
                "date_of_birth": fake.date_of_birth(minimum_age=18, maximum_age=80).isoformat(),
                "payment_methods": methods,
                "reservations": [],
            }
            user_records[user_id] = user
            for _ in range(rng.randint(1, 3)):
                reservation = _reservation(rng, fake, user, new_id("R-", 5), flights)
                reservation_records[reservation["reservation_id"]] = reservation
                user["reservations"].append(reservation["reservation_id"])
                if rng.random() < 0.25:
                    index = rng.randrange(len(reservation["passengers"]))
                    passenger = reservation["passengers"][index]
                    misspellings[reservation["reservation_id"]] = (index, passenger["first_name"])
                    passenger["first_name"] = misspell(passenger["first_name"], rng)
        return cls(user_records, reservation_records, flights, misspellings)


def misspell(name: str, rng: random.Random) -> str:
    """A plausible typo of `name`: two neighbouring letters swapped, or one letter doubled."""
    letters = list(name)
    swaps = [
        i for i in range(1, len(letters) - 1)
        if letters[i].isalpha() and letters[i + 1].isalpha() and letters[i] != letters[i + 1]
    ]  # fmt: skip
    if swaps and rng.random() < 0.6:
        i = rng.choice(swaps)
        letters[i], letters[i + 1] = letters[i + 1], letters[i]
    else:
        i = rng.randrange(1, len(letters)) if len(letters) > 1 else 0
        letters.insert(i, letters[i].lower())
    return "".join(letters)


def _schedule(rng: random.Random) -> dict[tuple[str, str], dict[str, Any]]:
    """Three daily departures on every route between the airports, for the next SCHEDULE_DAYS days."""
    flights: dict[tuple[str, str], dict[str, Any]] = {}
    codes = sorted(AIRPORTS)
    routes = [(origin, destination) for origin in codes for destination in codes if origin != destination]
    for index, (origin, destination) in enumerate(routes):
        hours = rng.randint(1, 5)
        minutes = rng.choice((0, 15, 30, 45))
        base_fare = rng.uniform(120, 320)
        for slot, earliest in enumerate((6, 11, 17)):
            number = f"BJ{1000 + index * 10 + slot}"
            departure = datetime(2000, 1, 1, earliest + rng.randint(0, 3), rng.choice((0, 10, 25, 40, 55)))
            arrival = departure + timedelta(hours=hours, minutes=minutes)
            for offset in range(1, SCHEDULE_DAYS + 1):
                day = (TODAY + timedelta(days=offset)).isoformat()
                swing = rng.uniform(0.8, 1.4)
                flights[(number, day)] = {
                    "flight_number": number,
                    "origin": origin,
                    "destination": destination,
                    "date": day,
                    "departure": departure.strftime("%H:%M"),
                    "arrival": arrival.strftime("%H:%M"),
                    "prices": {cabin: money(base_fare * swing * _CABIN_FACTOR[cabin]) for cabin in CABINS},
                    "seats_left": rng.randint(1, 9),
                }
    return flights


def _reservation(
    rng: random.Random, fake: Faker, user: dict[str, Any], reservation_id: str, flights: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, Any]:
    number, day = rng.choice(sorted(flights))
    flight = flights[(number, day)]
    cabin = rng.choices(CABINS, weights=(3, 5, 2))[0]
    passengers = [{
        "first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"],
        "date_of_birth": user["date_of_birth"],
    }]  # fmt: skip
    for _ in range(rng.choice((0, 0, 1, 2))):
        passengers.append({
            "first_name": fake.first_name(), "last_name": rng.choice((user["name"]["last_name"], fake.last_name())),
            "date_of_birth": fake.date_of_birth(minimum_age=2, maximum_age=80).isoformat(),
        })  # fmt: skip
    price = flight["prices"][cabin]
    total = money(price * len(passengers))
    payment = next(method for method in user["payment_methods"] if method["type"] == "credit_card")
    booked = TODAY - timedelta(days=rng.randint(2, 60))
    return {
        "reservation_id": reservation_id,
        "user_id": user["user_id"],
        "status": "cancelled" if rng.random() < 0.1 else "confirmed",
        "origin": flight["origin"],
        "destination": flight["destination"],
        "cabin": cabin,
        "flights": [{key: flight[key] for key in ("flight_number", "date", "departure", "arrival")} | {"price": price}],
        "passengers": passengers,
        "payment_id": payment["payment_id"],
        "total_price": total,
        "payments": [{"payment_id": payment["payment_id"], "amount": total}],
        "booked_on": booked.isoformat(),
    }
