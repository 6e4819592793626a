"""Result shapes learned from stored tool results: the example airline backend's real results
(nested records, lists, id formats, dates, times, amounts, statuses, echoed arguments), generated
instances that fit the learned shape, and a score that tells a faithful result from an invented one."""

from __future__ import annotations

import random

import pytest

from examples.airline import Database
from examples.airline.tools import execute
from tracefix.trainer.result_shapes import conformance, dress, generate, learn
from tracefix.trainer.schema_values import Values


@pytest.fixture(scope="module")
def reservations() -> list[tuple[dict, dict]]:
    database = Database.generate(3)
    return [({"reservation_id": rid}, execute(database, "get_reservation", {"reservation_id": rid})) for rid in sorted(database.reservations)[:30]]


def test_a_reservations_shape_is_learned_from_its_stored_results(reservations: list[tuple[dict, dict]]) -> None:
    shape = learn(reservations)
    fields = shape["fields"]
    assert shape["type"] == "object" and set(fields) == set(reservations[0][1])
    assert fields["reservation_id"]["shape"] == {"type": "string", "format": "id", "template": "R-#####", "templates": ["R-#####"]}
    assert fields["reservation_id"]["echo"] == "reservation_id"  # the argument comes back in the result
    assert "echo" not in fields["user_id"] and fields["user_id"]["shape"]["template"] == "U-####"
    assert fields["status"]["shape"]["format"] == "enum" and set(fields["status"]["shape"]["values"]) <= {"confirmed", "cancelled"}
    assert fields["total_price"]["shape"]["type"] == "number" and fields["total_price"]["shape"]["decimals"] == 2
    flights = fields["flights"]["shape"]
    assert flights["type"] == "array" and flights["items"]["type"] == "object"
    flight = flights["items"]["fields"]
    assert flight["date"]["shape"]["format"] == "date" and flight["departure"]["shape"]["format"] == "time"
    assert flight["flight_number"]["shape"]["template"] == "BJ####"
    passengers = fields["passengers"]["shape"]
    assert passengers["length"][0] >= 1 and passengers["items"]["fields"]["date_of_birth"]["shape"]["format"] == "date"


def test_generated_results_fit_the_shape_and_carry_the_calls_arguments(reservations: list[tuple[dict, dict]]) -> None:
    shape = learn(reservations)
    rng = random.Random(7)
    for index in range(20):
        result = generate(shape, rng, {"reservation_id": f"R-{10000 + index}"})
        assert result["reservation_id"] == f"R-{10000 + index}"
        assert conformance(shape, result) == 1.0
        assert result["status"] in shape["fields"]["status"]["shape"]["values"]
        low, high = shape["fields"]["total_price"]["shape"]["low"], shape["fields"]["total_price"]["shape"]["high"]
        assert low <= result["total_price"] <= high and round(result["total_price"], 2) == result["total_price"]
    assert generate(shape, random.Random(1)) == generate(shape, random.Random(1))  # seeded


def test_conformance_tells_a_stored_result_from_an_invented_record(reservations: list[tuple[dict, dict]]) -> None:
    shape = learn(reservations[:20])
    assert all(conformance(shape, result) == 1.0 for _, result in reservations[20:])  # unseen stored results fit
    invented = Values(1).record("reservation", "R-11111", extra=4, key="reservation_id")
    assert conformance(shape, invented) < 0.2  # the generic record shares one key and none of the rest
    broken = dict(reservations[0][1], reservation_id="reservation 1", total_price="a lot")
    assert 0.8 < conformance(shape, broken) < 1.0
    missing = {key: value for key, value in reservations[0][1].items() if key != "flights"}
    assert conformance(shape, missing) < 1.0
    assert conformance(shape, ["not", "an", "object"]) == 0.0


def test_small_value_sets_become_enums_free_text_stays_text_and_nulls_are_optional() -> None:
    samples = [({}, {"state": state, "note": f"call back at {index}pm about the refund", "closed_at": None if index % 2 else "2026-01-0{}".format(index % 9 + 1)})
               for index, state in enumerate(["open", "closed", "open", "closed", "open", "open"])]  # fmt: skip
    shape = learn(samples)["fields"]
    assert shape["state"]["shape"] == {"type": "string", "format": "enum", "values": ["closed", "open"]}
    assert shape["note"]["shape"]["format"] == "text"
    assert shape["closed_at"]["shape"]["format"] == "date" and shape["closed_at"]["shape"]["nullable"] == 0.5
    with pytest.raises(ValueError, match="at least one"):
        learn([])


def test_a_simulated_result_is_dressed_in_the_agents_shape_keeping_its_facts(reservations: list[tuple[dict, dict]]) -> None:
    shape = learn(reservations)
    simulated = {"reservation_id": "R-12345", "status": "pending", "customer_name": "Ana Diaz", "amount": 120.5}
    dressed = dress(shape, simulated, random.Random(3), {"reservation_id": "R-12345"})
    assert {key: dressed[key] for key in simulated} == simulated  # the simulation's facts win
    assert set(shape["fields"]) <= set(dressed)  # every key the agent's tool returns is there
    assert dressed["flights"][0]["flight_number"].startswith("BJ") and dressed["user_id"].startswith("U-")
    assert conformance(shape, dressed) > 0.7 > 0.2 > conformance(shape, simulated)  # "pending" and two keys are not the tool's
    assert dress(shape, simulated, random.Random(3), {"reservation_id": "R-12345"}) == dressed  # seeded
    # A search's own matches are not joined by made-up lists; errors and non-objects pass through.
    matches = {"results": [{"reservation_id": "R-1"}]}
    assert all(not isinstance(value, list) or key == "results" for key, value in dress(shape, matches, random.Random(1)).items())
    error = {"error": "not_found", "message": "no such reservation"}
    assert dress(shape, error, random.Random(1)) == error and dress(shape, ["a"], random.Random(1)) == ["a"]


def test_a_simulated_key_is_renamed_to_the_agents_own_field_for_the_same_fact() -> None:
    stored = [
        ({"reservation_id": f"R-{n:05d}"}, {"reservation_id": f"R-{n:05d}", "refund_amount": 10.5 + n, "created_at": f"2025-10-{n + 1:02d}T09:00:00",
                                             "travelerName": {"first": "A", "last": "B"}})
        for n in range(6)
    ]  # fmt: skip
    shape = learn(stored)
    simulated = {"reservation_id": "R-00042", "amount": 99.95, "created": "2025-11-02T10:30:00", "traveler_name": "Ana Diaz", "note": "late"}
    dressed = dress(shape, simulated, random.Random(1), {"reservation_id": "R-00042"})
    # The same facts under the tool's own names: a word in common and a value that fits the field.
    assert dressed["refund_amount"] == 99.95 and dressed["created_at"] == "2025-11-02T10:30:00"
    assert "amount" not in dressed and "created" not in dressed
    # A string is not renamed onto an object field, and a key with no kin keeps its name; no fact is lost.
    assert dressed["traveler_name"] == "Ana Diaz" and isinstance(dressed["travelerName"], dict) and dressed["note"] == "late"
    assert set(map(str, simulated.values())) <= set(map(str, dressed.values()))
    # A value of the wrong format is not renamed: "yesterday" is no datetime.
    assert dress(shape, {"reservation_id": "R-00042", "created": "yesterday"}, random.Random(1))["created"] == "yesterday"
    # Renamed, the result fits the agent's shape better than with the simulation's names kept.
    unrenamed = {**{key: value for key, value in dressed.items() if key not in ("refund_amount", "created_at")}, "amount": 99.95, "created": "2025-11-02T10:30:00"}
    assert conformance(shape, dressed) > conformance(shape, unrenamed)
