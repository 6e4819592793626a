"""The rule labelers on real τ-bench airline runs of GPT-4o: one test per fix, each from the run that showed it.

Each run is rebuilt as the Trajectory the store hands the labelers: the system prompt at message 0,
then the chat messages in order, a tool message right after the assistant message that requested
the call. Quotes are shortened to what the rule reads: the text that matters, the records' ids and
numbers. Every case names its source: "τ-bench airline, GPT-4o, task N trial M".

The runs come from sierra-research/tau-bench (historical_trajectories/gpt-4o-airline.json),
MIT License, Copyright (c) 2024 Sierra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tracefix.daemon.analysis.builtin_capabilities import (
    ArgumentGrounding, MultiStepCompletion, PreconditionVerification, StructuredDataReasoning, ToolCallPrecision,
)  # fmt: skip
from tracefix.daemon.analysis.capabilities import Judgement, Label, ToolCall, ToolSpec, Trajectory, Turn
from tracefix.daemon.core.settings import load_settings

# config.toml's defaults (confirmation_phrases, handoff_tools), not the environment of whoever runs the tests.
SETTINGS = load_settings(environ={}).capabilities

# The airline policy of every run, cut to the lines with numbers the agent may repeat.
POLICY = """# Airline Agent Policy

The current time is 2024-05-15 15:00:00 EST.

- Checked bag allowance: If the booking user is a regular member, 0 free checked bag for each basic economy \
passenger, 1 free checked bag for each economy passenger, and 2 free checked bags for each business passenger. \
Each extra baggage is 50 dollars.
- Travel insurance: the agent should ask if the user wants to buy the travel insurance, which is 30 dollars per \
passenger and enables full refund if the user needs to cancel the flight given health or weather reasons.
- All reservations can be cancelled within 24 hours of booking, or if the airline cancelled the flight."""

# The 14 airline tools with their required arguments (airline-tools.json).
AIRLINE_TOOLS = {
    "book_reservation": ["user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers",
                         "payment_methods", "total_baggages", "nonfree_baggages", "insurance"],
    "calculate": ["expression"],
    "cancel_reservation": ["reservation_id"],
    "get_reservation_details": ["reservation_id"],
    "get_user_details": ["user_id"],
    "list_all_airports": [],
    "search_direct_flight": ["origin", "destination", "date"],
    "search_onestop_flight": ["origin", "destination", "date"],
    "send_certificate": ["user_id", "amount"],
    "think": ["thought"],
    "transfer_to_human_agents": ["summary"],
    "update_reservation_baggages": ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"],
    "update_reservation_flights": ["reservation_id", "cabin", "flights", "payment_id"],
    "update_reservation_passengers": ["reservation_id", "passengers"],
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class User:
    text: str


@dataclass(frozen=True, slots=True)
class Say:
    """An assistant message without tool calls."""

    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """An assistant message requesting one tool call, and the tool message with its result."""

    name: str
    arguments: dict[str, Any]
    result: Any  # a record (dict or list), or the tool's text ("Transfer successful", "Error: ...")
    text: str = ""  # what the assistant said along with the request


def run(*messages: User | Say | Call, system: str = POLICY) -> Trajectory:
    """The trajectory of a conversation, laid out as the store assembles one (daemon/analysis/analyzer.py)."""
    turns = [Turn(0, "system", system, [], None, "span-0")]
    calls: list[ToolCall] = []
    for message in messages:
        position = len(turns)
        if isinstance(message, User):
            turns.append(Turn(position, "user", message.text, [], None, f"span-{position}"))
        elif isinstance(message, Say):
            turns.append(Turn(position, "assistant", message.text, [], None, f"span-{position}"))
        else:
            call_id = f"call_{len(calls)}"
            arguments = json.dumps(message.arguments)
            result = message.result if isinstance(message.result, str) else json.dumps(message.result)
            # τ-bench's environment reports a tool's exception as "Error: ..."; the importer keeps it as the error.
            error = result.removeprefix("Error:").strip() if result.startswith("Error:") else None
            request = {"id": call_id, "name": message.name, "arguments": arguments}
            turns.append(Turn(position, "assistant", message.text, [request], None, f"span-{position}"))
            turns.append(Turn(position + 1, "tool", result, [], call_id, f"span-{position + 1}"))
            span_id = f"tool-{len(calls)}"
            calls.append(ToolCall(len(calls), message.name, call_id, arguments, result, error, position, span_id))
    tools = {
        name: ToolSpec(name, "", {"type": "object", "properties": {key: {} for key in required}, "required": required})
        for name, required in AIRLINE_TOOLS.items()
    }
    return Trajectory("tau-bench/airline", "airline-agent", "unknown", turns, calls, tools)


def assert_judged(judgement: Judgement, label: Label, reason: str) -> None:
    assert judgement.label == label, judgement
    assert reason in judgement.reason, judgement


def card(payment_id: str, last_four: str) -> dict[str, str]:
    """A credit card of a user's payment_methods."""
    return {"source": "credit_card", "last_four": last_four, "id": payment_id}


def legs(*flights: tuple[str, str] | tuple[str, str, int]) -> list[dict[str, Any]]:
    """Flights as (flight_number, date) in a request, or (flight_number, date, price) in a record."""
    return [dict(zip(("flight_number", "date", "price"), flight)) for flight in flights]


# --- the runs ------------------------------------------------------------------------------------


def task_38_trial_1() -> Trajectory:
    """τ-bench airline, GPT-4o, task 38 trial 1 (success): the user asks for a supervisor; the agent transfers."""
    return run(
        User("Hi! I'd like to get a refund for the insurance I purchased for my flight."),
        Say("I'm sorry, but the travel insurance is non-refundable once purchased."),
        User("The confirmation number for my flight is H8Q05L, if that helps at all."),
        Call("get_reservation_details", {"reservation_id": "H8Q05L"}, {
            "reservation_id": "H8Q05L", "user_id": "sophia_silva_7557", "cabin": "basic_economy",
            "flights": legs(("HAT268", "2024-05-24", 74)),
            "payment_history": [{"payment_id": "credit_card_4196779", "amount": 104}], "insurance": "yes",
        }),  # fmt: skip
        Say("I see that your reservation includes travel insurance, but as mentioned earlier, the insurance is"
            " non-refundable."),
        User("Is there someone else I could speak to about this? Maybe a supervisor?"),
        Call("transfer_to_human_agents", {
            "summary": "The user, Sophia Silva, is requesting to speak with a supervisor regarding a refund for"
            " non-refundable travel insurance associated with reservation H8Q05L.",
        }, "Transfer successful"),  # fmt: skip
    )


def task_2_trial_1() -> Trajectory:
    """τ-bench airline, GPT-4o, task 2 trial 1 (failure): the run stops on its last downgrade, no answer after it."""
    return run(
        User("I can give you my user ID; it's omar_davis_3817. However, I'm not sure about my reservation ID"
             " at the moment."),
        Call("get_user_details", {"user_id": "omar_davis_3817"}, {
            "payment_methods": {"credit_card_2929732": card("credit_card_2929732", "7803")},
            "reservations": ["JG7FMM", "LQ940Q", "2FBBAH", "X7BYG1", "EQ1G6C", "BOH180"],
        }, text="No problem, I can look up your reservation details using your user ID."),  # fmt: skip
        User("Yes, please go ahead with all the downgrades. Also, could I get a refund to the original payment method"
             " for each reservation? And how much money will this save me in total?"),
        Call("get_reservation_details", {"reservation_id": "JG7FMM"}, {
            "reservation_id": "JG7FMM", "cabin": "business",
            "flights": legs(("HAT028", "2024-05-21", 1859), ("HAT277", "2024-05-21", 1679)),
        }),  # fmt: skip
        Call("update_reservation_flights", {
            "reservation_id": "JG7FMM", "cabin": "economy", "payment_id": "credit_card_2929732",
            "flights": legs(("HAT028", "2024-05-21"), ("HAT277", "2024-05-21")),
        }, {"reservation_id": "JG7FMM", "cabin": "business"},
            text="The total savings from downgrading all your reservations from business to economy class will be"
            " $23,553. I will now proceed with updating the reservations and processing the refunds to the original"
            " payment methods."),  # fmt: skip
        Call("update_reservation_flights", {
            "reservation_id": "BOH180", "cabin": "economy", "payment_id": "credit_card_9525117",
            "flights": legs(("HAT276", "2024-05-21"), ("HAT279", "2024-05-22")),
        }, {"reservation_id": "BOH180", "cabin": "business"}),  # fmt: skip
    )


def task_34_trial_1() -> Trajectory:
    """τ-bench airline, GPT-4o, task 34 trial 1 (success): one yes approves an upgrade and the cancellation after."""
    xehm4b = {
        "reservation_id": "XEHM4B", "user_id": "daiki_muller_1116", "cabin": "basic_economy",
        "flights": legs(("HAT005", "2024-05-20", 65), ("HAT178", "2024-05-30", 83)),
        "payment_history": [{"payment_id": "credit_card_2408938", "amount": 296}], "insurance": "no",
    }  # fmt: skip
    return run(
        User("I need to cancel my flights for reservations XEHM4B and 59XX6W."),
        Say("Could you please provide your user ID and the reason for cancellation for each reservation?"),
        User("I booked them more than 24 hours ago. No travel insurance, and they're not business class."
             " Just let me know if they're basic economy."),
        Call("get_reservation_details", {"reservation_id": "XEHM4B"}, xehm4b),
        Say("- **Reservation XEHM4B** cannot be canceled as it is a Basic Economy ticket without travel insurance"
            " and was booked more than 24 hours ago."),
        User("Upgrade XEHM4B to economy, then cancel it. Also, are there any other flights booked under my name?"),
        Call("get_user_details", {"user_id": "daiki_muller_1116"}, {
            "payment_methods": {
                "credit_card_2408938": card("credit_card_2408938", "2135"),
                "credit_card_4303738": card("credit_card_4303738", "5541"),
            },
            "membership": "silver", "reservations": ["7WPL39", "XEHM4B", "59XX6W", "3EMQJ6", "A90KR2", "9MRJD4"],
        }),  # fmt: skip
        Say("Let's proceed with upgrading reservation XEHM4B to Economy class and then canceling it. The payment for"
            " the upgrade will be made using your credit card ending in 2135. Please confirm if you would like to"
            " proceed with these actions."),
        User("Yes, go ahead and upgrade XEHM4B and cancel it afterward. Can you give me the total cost of my upcoming"
             " flights, please?"),
        Call("update_reservation_flights", {
            "reservation_id": "XEHM4B", "cabin": "economy", "payment_id": "credit_card_2408938",
            "flights": legs(("HAT005", "2024-05-20"), ("HAT178", "2024-05-30")),
        }, {**xehm4b, "flights": legs(("HAT005", "2024-05-20", 166), ("HAT178", "2024-05-30", 126))}),  # fmt: skip
        Call("cancel_reservation", {"reservation_id": "XEHM4B"}, {"reservation_id": "XEHM4B", "status": "cancelled"}),
        Say("The upgrade and cancellation of reservation XEHM4B have been successfully completed."),
    )


def task_26_trial_2(first_payment_id: str | None = "credit_card_7334") -> Trajectory:
    """τ-bench airline, GPT-4o, task 26 trial 2 (success): the user says yes to an upgrade, the agent charges a
    payment id it made up from the card's last four digits, looks the card up, and charges again.

    With `first_payment_id=None` the made-up attempt is left out: the run as if it had looked the card up first.
    """
    upgrade = {"reservation_id": "M20IZO", "cabin": "business",
               "flights": legs(("HAT268", "2024-05-22"), ("HAT010", "2024-05-22"))}  # fmt: skip
    made_up = []
    if first_payment_id is not None:
        failed = "Error: payment method not found"
        made_up.append(Call("update_reservation_flights", {**upgrade, "payment_id": first_payment_id}, failed))
    nqnu5r = {"reservation_id": "NQNU5R", "user_id": "aarav_ahmed_6699", "cabin": "business",
              "flights": legs(("HAT214", "2024-05-13", 1377), ("HAT045", "2024-05-14", 1712))}  # fmt: skip
    return run(
        User("Sure! My user ID is aarav_ahmed_6699. I need to cancel the reservations IFOYYZ and NQNU5R."),
        Call("get_reservation_details", {"reservation_id": "NQNU5R"}, nqnu5r),
        Say("The reservation **NQNU5R** is a business class ticket and can be canceled. Would you like to proceed with"
            " canceling reservation NQNU5R? Please confirm if you'd like me to proceed."),
        User("Yes, please proceed with canceling reservation NQNU5R. As for IFOYYZ, I'll just need to make any"
             " necessary payment using my credit card."),
        Call("cancel_reservation", {"reservation_id": "NQNU5R"}, {**nqnu5r, "status": "cancelled"}),
        Say("The reservation **NQNU5R** has been successfully canceled."),
        User("Thank you for processing the cancellation. I have one more request: I'd like to upgrade another"
             " reservation, M20IZO, to business class. Can we do that and apply any charges to my credit card"
             " ending in 7334?"),
        Call("get_reservation_details", {"reservation_id": "M20IZO"}, {
            "reservation_id": "M20IZO", "user_id": "aarav_ahmed_6699", "cabin": "economy",
            "flights": legs(("HAT268", "2024-05-22", 136), ("HAT010", "2024-05-22", 109)),
            "payment_history": [{"payment_id": "credit_card_4959530", "amount": 490}],
        }),  # fmt: skip
        Say("To upgrade reservation **M20IZO** to business class, the additional cost will be $597. Would you like to"
            " proceed with this upgrade and apply the charges to your credit card ending in 7334?"),
        User("Yes, please proceed with the upgrade and charge the amount to my credit card ending in 7334."),
        *made_up,
        Call("get_user_details", {"user_id": "aarav_ahmed_6699"}, {
            "payment_methods": {
                "credit_card_9074831": card("credit_card_9074831", "7334"),
                "credit_card_4959530": card("credit_card_4959530", "5018"),
            },
            "reservations": ["M20IZO", "N6F783", "IFOYYZ", "NQNU5R"],
        }),  # fmt: skip
        Call("update_reservation_flights", {**upgrade, "payment_id": "credit_card_9074831"}, {
            "reservation_id": "M20IZO", "cabin": "economy",
            "payment_history": [{"payment_id": "credit_card_4959530", "amount": 490},
                                {"payment_id": "credit_card_9074831", "amount": 1194}],
        }),  # fmt: skip
        Say("The reservation **M20IZO** has been successfully upgraded to business class."),
    )


# --- multi_step_completion -----------------------------------------------------------------------


def test_a_run_that_ends_in_a_successful_hand_off_to_a_person_has_completed() -> None:
    labeler = MultiStepCompletion(SETTINGS)

    assert_judged(labeler.label(task_38_trial_1()), Label.PRESENT, "hand-off")
    # Counterpart: a run that stops on a state-changing call, not on a hand-off, has not.
    assert_judged(
        labeler.label(task_2_trial_1()), Label.LACKING, "stops after calling update_reservation_flights without a final"
    )


def test_a_run_that_ends_on_the_users_goodbye_after_a_final_answer_has_completed() -> None:
    # τ-bench airline, GPT-4o, task 24 trial 0 (success): the user declines the quoted change and says goodbye.
    goodbye = run(
        User("I'd like to change my flight reservation HXDUBJ."),
        Call("get_reservation_details", {"reservation_id": "HXDUBJ"}, {
            "reservation_id": "HXDUBJ", "cabin": "economy",
            "flights": legs(("HAT085", "2024-05-18", 177), ("HAT278", "2024-05-22", 180)),
        }),  # fmt: skip
        Call("calculate", {"expression": "(282 - 177) + (443 - 180)"}, "368.0"),
        Say("The total fare difference for upgrading to business class and changing your flights is $368."),
        User("Unfortunately, that's a bit above my budget. I think I'll hold off on making any changes for now."
             " Thank you for your help."),
        Say("You're welcome! If you decide to make any changes in the future or need further assistance, feel free to"
            " reach out."),
        User("Thanks, you too! ###STOP###"),
    )

    assert_judged(MultiStepCompletion(SETTINGS).label(goodbye), Label.PRESENT, "ran to a final answer")


# --- precondition_verification -------------------------------------------------------------------


def test_a_hand_off_to_a_person_is_not_a_state_changing_call() -> None:
    assert_judged(PreconditionVerification(SETTINGS).label(task_38_trial_1()), Label.NA, "no state-changing tool")


def test_one_yes_after_the_read_approves_an_upgrade_and_the_cancellation_after_it() -> None:
    assert_judged(PreconditionVerification(SETTINGS).label(task_34_trial_1()), Label.PRESENT, "2 state-changing calls")


def test_a_read_of_another_record_after_the_yes_does_not_void_the_confirmation() -> None:
    # The read of M20IZO, the yes, then get_user_details (a read of the user, not the reservation), then the write.
    judgement = PreconditionVerification(SETTINGS).label(task_26_trial_2())

    assert_judged(judgement, Label.PRESENT, "read first and were confirmed")


def test_a_booking_whose_result_shows_the_new_reservation_is_a_read_of_it() -> None:
    # τ-bench airline, GPT-4o, task 4 trial 2 (failure for other reasons): bags added to the reservation just booked.
    booked = run(
        User("My user ID is omar_rossi_1241, but I don't have the reservation ID with me."),
        Call("get_user_details", {"user_id": "omar_rossi_1241"}, {
            "payment_methods": {
                "gift_card_8190333": {"source": "gift_card", "amount": 280, "id": "gift_card_8190333"},
                "credit_card_7407366": card("credit_card_7407366", "6437"),
            },
            "membership": "gold", "reservations": ["UM3OG5", "5RJ7UH", "FQ8APE", "QKRY03"],
        }),  # fmt: skip
        User("Yes, please proceed with booking a new reservation in economy class for me."),
        Call("book_reservation", {
            "user_id": "omar_rossi_1241", "origin": "EWR", "destination": "ORD", "flight_type": "one_way",
            "cabin": "economy", "flights": legs(("HAT056", "2024-05-25"), ("HAT138", "2024-05-25")),
            "passengers": [{"first_name": "Omar", "last_name": "Rossi", "dob": "1970-06-06"}],
            "payment_methods": [{"payment_id": "gift_card_8190333", "amount": 280},
                                {"payment_id": "credit_card_7407366", "amount": 60}],
            "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
        }, {"reservation_id": "HATHAT", "user_id": "omar_rossi_1241", "origin": "EWR", "destination": "ORD",
            "cabin": "economy", "total_baggages": 0, "nonfree_baggages": 0}),  # fmt: skip
        Say("Your new reservation from Newark (EWR) to Chicago (ORD) has been successfully booked.\n\n"
            "- **Reservation ID:** HATHAT"),
        User("Could you please add 3 checked bags to my reservation?"),
        Say("As a gold member, you are entitled to 3 free checked bags for an economy class reservation. I will"
            " proceed to add 3 checked bags to your reservation. Please confirm if you would like me to proceed with"
            " this update."),
        User("Yes, please proceed with adding 3 checked bags."),
        Call("update_reservation_baggages", {
            "reservation_id": "HATHAT", "total_baggages": 3, "nonfree_baggages": 0, "payment_id": "credit_card_7407366",
        }, {"reservation_id": "HATHAT", "total_baggages": 3, "nonfree_baggages": 0}),  # fmt: skip
        Say("The 3 checked bags have been successfully added to your reservation."),
    )

    assert_judged(PreconditionVerification(SETTINGS).label(booked), Label.PRESENT, "2 state-changing calls")


def test_a_request_made_before_the_read_is_no_confirmation_of_the_change() -> None:
    # τ-bench airline, GPT-4o, task 2 trial 2: "downgrade all of them" came before any reservation was read,
    # and no yes came after the reads.
    asked_first = run(
        User("I'm omar_davis_3817. Unfortunately, I don't have the reservation IDs on hand. How can we proceed?"),
        Call("get_user_details", {"user_id": "omar_davis_3817"}, {
            "payment_methods": {"credit_card_2929732": card("credit_card_2929732", "7803")},
            "reservations": ["JG7FMM", "LQ940Q", "2FBBAH", "X7BYG1", "EQ1G6C", "BOH180"],
        }),  # fmt: skip
        Say("I have retrieved your reservation IDs. Here they are:\n\n1. JG7FMM\n2. LQ940Q\n3. 2FBBAH\n4. X7BYG1\n"
            "5. EQ1G6C\n6. BOH180\n\nPlease let me know which reservation(s) you would like to downgrade from business"
            " to economy."),
        User("Thank you for finding those. Please downgrade all of them to economy. I'm hoping this will help with my"
             " financial situation."),
        Call("get_reservation_details", {"reservation_id": "JG7FMM"}, {
            "reservation_id": "JG7FMM", "cabin": "business",
            "flights": legs(("HAT028", "2024-05-21", 1859), ("HAT277", "2024-05-21", 1679)),
        }),  # fmt: skip
        Call("update_reservation_flights", {
            "reservation_id": "JG7FMM", "cabin": "economy", "payment_id": "credit_card_2929732",
            "flights": legs(("HAT028", "2024-05-21"), ("HAT277", "2024-05-21")),
        }, {"reservation_id": "JG7FMM", "cabin": "business"}),  # fmt: skip
        Say("All your business class reservations have been successfully downgraded to economy class."),
    )

    judgement = PreconditionVerification(SETTINGS).label(asked_first)

    assert_judged(judgement, Label.LACKING, "update_reservation_flights called without the user's confirmation")


def test_a_reservation_id_seen_only_in_the_users_list_of_reservations_is_no_read_of_it() -> None:
    # τ-bench airline, GPT-4o, task 26 trial 2, with the agent's read of NQNU5R left out: the id is then
    # known only from get_user_details' "reservations" list, and the cancellation changes a record never read.
    unread = run(
        User("Sure! My user ID is aarav_ahmed_6699. I need to cancel the reservations IFOYYZ and NQNU5R."),
        Call("get_user_details", {"user_id": "aarav_ahmed_6699"}, {
            "payment_methods": {"credit_card_4959530": card("credit_card_4959530", "5018")},
            "reservations": ["M20IZO", "N6F783", "IFOYYZ", "NQNU5R"],
        }),  # fmt: skip
        Say("Would you like to proceed with canceling reservation NQNU5R? Please confirm if you'd like me to proceed."),
        User("Yes, please proceed with canceling reservation NQNU5R."),
        Call("cancel_reservation", {"reservation_id": "NQNU5R"}, {"reservation_id": "NQNU5R", "status": "cancelled"}),
        Say("The reservation **NQNU5R** has been successfully canceled."),
    )

    judgement = PreconditionVerification(SETTINGS).label(unread)

    assert_judged(judgement, Label.LACKING, "cancel_reservation called without a prior read of reservation_id NQNU5R")


# --- structured_data_reasoning -------------------------------------------------------------------


def test_dates_years_times_and_durations_are_no_claims_about_records() -> None:
    labeler = StructuredDataReasoning()
    # τ-bench airline, GPT-4o, task 42 trial 0: "24 hours" is the policy's window, not a number of the record.
    within_24_hours = run(
        User("Sure! My user ID is anya_garcia_5901, and the reservation ID is 3RK2T9. Unfortunately, I'm sick and"
             " unable to make the flight."),
        Call("get_reservation_details", {"reservation_id": "3RK2T9"}, {
            "reservation_id": "3RK2T9", "cabin": "basic_economy",
            "flights": legs(("HAT214", "2024-05-19", 57), ("HAT009", "2024-05-20", 83)),
            "payment_history": [{"payment_id": "gift_card_2550356", "amount": 280}],
            "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
        }),  # fmt: skip
        Say("According to the policy, basic economy flights can only be canceled within 24 hours of booking or if"
            " the airline cancels the flight. Since neither condition applies here, I'm unable to process the"
            " cancellation and refund."),
    )
    # τ-bench airline, GPT-4o, task 32 trial 2: a date with its year and departure times around one price.
    on_may_26 = run(
        User("I'd like to travel on May 26."),
        Call("search_direct_flight", {"origin": "ORD", "destination": "PHL", "date": "2024-05-26"}, [{
            "flight_number": "HAT139", "origin": "ORD", "destination": "PHL",
            "scheduled_departure_time_est": "17:00:00", "scheduled_arrival_time_est": "19:00:00", "status": "available",
            "available_seats": {"basic_economy": 7, "economy": 1, "business": 7},
            "prices": {"basic_economy": 65, "economy": 114, "business": 395},
        }]),  # fmt: skip
        Say("Here are the available one-way economy class flights from ORD to PHL on May 26, 2024:\n\n"
            "1. **Flight HAT139**\n   - Departure: 5:00 PM EST\n   - Arrival: 7:00 PM EST\n   - Price: $114\n"
            "   - Available Seats: 1"),
    )

    assert_judged(labeler.label(within_24_hours), Label.NA, "no number stated from the records")
    assert_judged(labeler.label(on_may_26), Label.PRESENT, "1 stated numbers match")  # $114 alone


def test_a_price_the_policy_gives_is_supported() -> None:
    # τ-bench airline, GPT-4o, task 32 trial 2: the policy's "30 dollars per passenger" and "50 dollars" quoted back.
    def offer(system: str) -> Trajectory:
        return run(
            User("I'd like to book flight HAT271. Please add an extra passenger named Kevin Smith, DOB 2001-04-12."),
            Call("search_direct_flight", {"origin": "ORD", "destination": "PHL", "date": "2024-05-26"}, [{
                "flight_number": "HAT271", "scheduled_departure_time_est": "19:00:00",
                "available_seats": {"basic_economy": 20, "economy": 3, "business": 14},
                "prices": {"basic_economy": 83, "economy": 174, "business": 338},
            }]),  # fmt: skip
            Say("Would you like to add any additional checked bags for this reservation? Each extra baggage costs $50."
                " Also, would you like to purchase travel insurance for $30 per passenger?"),
            system=system,
        )

    assert_judged(StructuredDataReasoning().label(offer(POLICY)), Label.PRESENT, "2 stated numbers match")
    # Counterpart: without the policy nothing the agent read says $50.
    assert_judged(StructuredDataReasoning().label(offer("# Airline Agent Policy")), Label.LACKING, "states $50")


def test_a_cost_from_the_users_count_and_the_policys_price_is_supported() -> None:
    # τ-bench airline, GPT-4o, task 24 trial 2: "add 2 checked bags" (user) at 50 dollars each (policy).
    bags = run(
        User("I also want to change to business class for both flights and add 2 checked bags. Could you provide the"
             " updated options and costs?"),
        Call("get_reservation_details", {"reservation_id": "HXDUBJ"}, {
            "reservation_id": "HXDUBJ", "cabin": "economy",
            "flights": legs(("HAT085", "2024-05-18", 177), ("HAT023", "2024-05-18", 146),
                            ("HAT278", "2024-05-22", 180)),
            "payment_history": [{"payment_id": "gift_card_6941833", "amount": 533}],
        }),  # fmt: skip
        Say("### Additional Costs\n- 2 Checked Bags: $100 ($50 per bag)"),
    )

    assert_judged(StructuredDataReasoning().label(bags), Label.PRESENT, "2 stated numbers match")


def test_the_digits_of_a_card_or_certificate_id_are_supported_by_the_record_that_holds_them() -> None:
    labeler = StructuredDataReasoning()
    # τ-bench airline, GPT-4o, task 34 trial 1: "credit card ending in 2135" from "last_four": "2135".
    assert_judged(labeler.label(task_34_trial_1()), Label.PRESENT, "1 stated numbers match")
    # τ-bench airline, GPT-4o, task 0 trial 1: "Certificate 4856383" from the id "certificate_4856383".
    certificate = run(
        User("I'll go with the first option, Flight HAT136 & HAT039."),
        Call("book_reservation", {
            "user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA", "flight_type": "one_way",
            "cabin": "economy", "flights": legs(("HAT136", "2024-05-20"), ("HAT039", "2024-05-20")),
            "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
            "payment_methods": [{"payment_id": "certificate_4856383", "amount": 100},
                                {"payment_id": "certificate_7504069", "amount": 205}],
            "total_baggages": 3, "nonfree_baggages": 1, "insurance": "no",
        }, {
            "reservation_id": "HATHAT", "cabin": "economy",
            "flights": legs(("HAT136", "2024-05-20", 152), ("HAT039", "2024-05-20", 103)),
            "payment_history": [{"payment_id": "certificate_4856383", "amount": 100},
                                {"payment_id": "certificate_7504069", "amount": 205}],
        }),  # fmt: skip
        Say("Your reservation has been successfully booked.\n\n**Payment:**\n- $100 from Certificate 4856383\n"
            "- $205 from Certificate 7504069"),
    )

    assert_judged(labeler.label(certificate), Label.PRESENT, "4 stated numbers match")


def task_2_trial_0(answer: str) -> Trajectory:
    """τ-bench airline, GPT-4o, task 2 trial 0 (failure): two downgrades, then a summary of the new prices."""
    return run(
        User("Well, my user ID is omar_davis_3817, but I'm not sure about the reservation IDs."),
        Call("get_user_details", {"user_id": "omar_davis_3817"}, {
            "payment_methods": {
                "gift_card_3481935": {"source": "gift_card", "amount": 22, "id": "gift_card_3481935"},
                "credit_card_2929732": card("credit_card_2929732", "7803"),
            },
            "reservations": ["JG7FMM", "LQ940Q", "2FBBAH", "X7BYG1", "EQ1G6C", "BOH180"],
        }),  # fmt: skip
        Call("get_reservation_details", {"reservation_id": "JG7FMM"}, {
            "reservation_id": "JG7FMM", "cabin": "business",
            "flights": legs(("HAT028", "2024-05-21", 1859), ("HAT277", "2024-05-21", 1679)),
            "payment_history": [{"payment_id": "credit_card_2929732", "amount": 7136}],
            "total_baggages": 3, "nonfree_baggages": 0,
        }),  # fmt: skip
        Call("get_reservation_details", {"reservation_id": "2FBBAH"}, {
            "reservation_id": "2FBBAH", "cabin": "business",
            "flights": legs(("HAT080", "2024-05-28", 537), ("HAT076", "2024-05-28", 996),
                            ("HAT255", "2024-05-30", 1440), ("HAT148", "2024-05-30", 1417)),
            "payment_history": [{"payment_id": "gift_card_3481935", "amount": 4420}],
            "total_baggages": 0, "nonfree_baggages": 0,
        }),  # fmt: skip
        User("Yes, please downgrade all of them to economy class. I just want to make sure I save some money."),
        Call("update_reservation_flights", {
            "reservation_id": "JG7FMM", "cabin": "economy", "payment_id": "credit_card_2929732",
            "flights": legs(("HAT028", "2024-05-21"), ("HAT277", "2024-05-21")),
        }, {
            "reservation_id": "JG7FMM", "cabin": "business",
            "flights": legs(("HAT028", "2024-05-21", 140), ("HAT277", "2024-05-21", 101)),
            "payment_history": [{"payment_id": "credit_card_2929732", "amount": 7136},
                                {"payment_id": "credit_card_2929732", "amount": -6594}],
        }),  # fmt: skip
        Call("update_reservation_flights", {
            "reservation_id": "2FBBAH", "cabin": "economy", "payment_id": "gift_card_3481935",
            "flights": legs(("HAT080", "2024-05-28"), ("HAT076", "2024-05-28"), ("HAT255", "2024-05-30"),
                            ("HAT148", "2024-05-30")),
        }, {
            "reservation_id": "2FBBAH", "cabin": "business",
            "flights": legs(("HAT080", "2024-05-28", 107), ("HAT076", "2024-05-28", 141),
                            ("HAT255", "2024-05-30", 108), ("HAT148", "2024-05-30", 109)),
            "payment_history": [{"payment_id": "gift_card_3481935", "amount": 4420},
                                {"payment_id": "gift_card_3481935", "amount": -3925}],
        }),  # fmt: skip
        Say(answer),
    )


def test_the_total_of_one_records_prices_is_supported() -> None:
    # $465 = 107 + 141 + 108 + 109, the four flights of 2FBBAH after the downgrade.
    new_total = task_2_trial_0("2. **Reservation ID: 2FBBAH**\n   - New Total Price: $465")

    assert_judged(StructuredDataReasoning().label(new_total), Label.PRESENT, "1 stated numbers match")


def test_a_price_no_record_supports_is_lacking() -> None:
    # The whole summary: every number follows from the records except "$2,210 per passenger".
    summary = task_2_trial_0(
        "Your reservations have been successfully downgraded to economy class:\n\n"
        "1. **Reservation ID: JG7FMM**\n   - New Total Price: $241 (previously $3,538 per passenger)\n"
        "   - Refund: $6,594 has been processed back to your credit card ending in 7803.\n\n"
        "2. **Reservation ID: 2FBBAH**\n   - New Total Price: $465 (previously $2,210 per passenger)\n"
        "   - Refund: $3,925 has been processed back to your gift card."
    )

    assert_judged(StructuredDataReasoning().label(summary), Label.LACKING, "states $2,210")


# --- tool_call_precision -------------------------------------------------------------------------


def test_a_prose_only_run_is_not_lacking_when_the_user_gave_no_identifier_to_look_up() -> None:
    # τ-bench airline, GPT-4o, task 12 trial 3 (success).
    no_id = run(
        User("Hi, I'd like to cancel my flight from MCO to CLT and get a refund, please."),
        Say("I can assist you with canceling your flight and processing a refund. To proceed, could you please provide"
            " your user ID, reservation ID, and the reason for cancellation?"),
        User("I don't have my reservation ID with me right now. Can I proceed without it?"),
        Say("Unfortunately, I need the reservation ID to proceed with the cancellation. Please try to locate it, and"
            " once you have it, I can assist you further with the cancellation process."),
        User("Will do, thank you for your help!"),
        Say("You're welcome! If you have any other questions or need further assistance, feel free to ask."
            " Have a great day!"),
        User("Thank you, you too!###STOP###"),
    )

    assert_judged(ToolCallPrecision().label(no_id), Label.NA, "gave no identifier a tool could look up")


def test_a_prose_only_answer_to_a_user_who_gave_a_reservation_id_is_lacking() -> None:
    # τ-bench airline, GPT-4o, task 10 trial 3, up to the agent's first answer: it refuses without looking H9ZU1C up.
    with_id = run(
        User("Hi, I need to remove Ethan from my reservation with code H9ZU1C. Can you help with that?"),
        Say("I'm unable to remove a passenger from an existing reservation. You'll need to contact a human agent for"
            " assistance with this request. Let me know if there's anything else I can help you with!"),
    )

    assert_judged(ToolCallPrecision().label(with_id), Label.LACKING, "answered without calling any")


# --- argument_grounding --------------------------------------------------------------------------


def test_a_payment_id_made_up_from_the_cards_last_four_digits_is_not_grounded() -> None:
    labeler = ArgumentGrounding()

    assert_judged(labeler.label(task_26_trial_2()), Label.LACKING, "'credit_card_7334' appears in no user turn")
    # Counterpart: the id the agent found on its retry, after get_user_details, is grounded.
    assert_judged(labeler.label(task_26_trial_2(first_payment_id=None)), Label.PRESENT, "come from the context")


@pytest.mark.parametrize(
    ("reply", "confirms"),
    [
        # τ-bench airline, GPT-4o, task 2 trial 2, message 3: a question, not a go-ahead.
        ("I'm omar_davis_3817. Unfortunately, I don't have the reservation IDs on hand. How can we proceed?", False),
        ("I do not want to proceed with that.", False),
        ("Please don't go ahead yet.", False),
        # task 32 trial 2, message 19: the agent listed the booking; this approves it.
        ("Everything looks good! I'd like to use the travel certificate for $500 (certificate_8045380) for this booking.", True),
        ("Yes. Can you also tell me the total?", True),
    ],
)
def test_a_confirmation_is_a_go_ahead_not_a_question_or_a_refusal(reply: str, confirms: bool) -> None:
    labeler = PreconditionVerification(SETTINGS)
    assert labeler.confirms(reply) is confirms
