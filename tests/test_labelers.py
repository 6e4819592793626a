"""Each built-in rule labeler on real conversations: a PRESENT, a LACKING and an NA case.

The conversations are exported with the OpenTelemetry SDK to a running daemon, which assembles
and labels them; the labels are read back through the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, make_daemon
from tests.conversations import Call, Conversation, ConversationSender, Say, User

ITEMS = [{"name": "extra bag", "price": 30.5}, {"name": "seat upgrade", "price": 19.5}]
READ = Call("get_reservation", {"reservation_id": "R-1001"}, {"reservation_id": "R-1001", "status": "confirmed"})

CASES: dict[tuple[str, str], Conversation] = {
    ("tool_call_precision", "PRESENT"): Conversation(
        [User("Can you look up reservation R-1001?"), READ, Say("R-1001 is confirmed.")]
    ),
    ("tool_call_precision", "LACKING"): Conversation(
        [
            User("Can you look up reservation R-1001?"),
            Call("get_reservation", {"reservation": "R-1001"}, None, "missing reservation_id"),
            Say("Sorry, I could not find it."),
        ]
    ),
    ("tool_call_precision", "NA"): Conversation([User("What are your opening hours?"), Say("We are open 9 to 5.")]),
    ("argument_grounding", "PRESENT"): Conversation(
        [User("Please check booking R-1001."), READ, Say("It is confirmed.")]
    ),
    ("argument_grounding", "LACKING"): Conversation(
        [
            User("Please check my booking."),
            Call("get_reservation", {"reservation_id": "R-7777"}, {"reservation_id": "R-7777", "status": "confirmed"}),
            Say("It is confirmed."),
        ]
    ),
    ("argument_grounding", "NA"): Conversation([User("Do you allow pets?"), Say("Small pets in a carrier, yes.")]),
    ("precondition_verification", "PRESENT"): Conversation(
        [
            User("Cancel reservation R-1001 please."),
            READ,
            Say("R-1001 is a confirmed flight to Oslo. Shall I cancel it?"),
            User("Yes, go ahead."),
            Call("cancel_reservation", {"reservation_id": "R-1001"}, {"status": "cancelled"}),
            Say("Done, R-1001 is cancelled."),
        ]
    ),
    ("precondition_verification", "LACKING"): Conversation(
        [
            User("Cancel reservation R-1001 please."),
            Call("cancel_reservation", {"reservation_id": "R-1001"}, {"status": "cancelled"}),
            Say("Done, R-1001 is cancelled."),
        ]
    ),
    ("precondition_verification", "NA"): Conversation(
        [User("What is the status of R-1001?"), READ, Say("It is confirmed.")]
    ),
    ("error_recovery", "PRESENT"): Conversation(
        [
            User("Check R-1001 please."),
            Call("get_reservation", {"reservation_id": "R1001"}, None, "reservation R1001 not found"),
            READ,
            Say("R-1001 is confirmed."),
        ]
    ),
    ("error_recovery", "LACKING"): Conversation(
        [
            User("Check R-1001 please."),
            Call("get_reservation", {"reservation_id": "R1001"}, None, "reservation R1001 not found"),
            Call("get_reservation", {"reservation_id": "R1001"}, None, "reservation R1001 not found"),
            Say("The system is not working."),
        ]
    ),
    ("error_recovery", "NA"): Conversation([User("Check R-1001 please."), READ, Say("It is confirmed.")]),
    ("multi_step_completion", "PRESENT"): Conversation(
        [
            User("What do the items of order O-5512 on R-1001 cost?"),
            READ,
            Call("list_items", {"order_id": "O-5512"}, ITEMS),
            Say("The extra bag costs $30.50 and the seat upgrade $19.50."),
        ]
    ),
    ("multi_step_completion", "LACKING"): Conversation(
        [
            User("Check R-1001 please."),
            READ,
            READ,
            READ,
            Say("Still checking."),
        ]
    ),
    ("multi_step_completion", "NA"): Conversation([User("Check R-1001 please."), READ, Say("It is confirmed.")]),
    ("structured_data_reasoning", "PRESENT"): Conversation(
        [User("How much is order O-5512 in total?"), Call("list_items", {"order_id": "O-5512"}, ITEMS), Say("The total is $50.00.")]
    ),
    ("structured_data_reasoning", "LACKING"): Conversation(
        [User("How much is order O-5512 in total?"), Call("list_items", {"order_id": "O-5512"}, ITEMS), Say("The total is $65.00.")]
    ),
    ("structured_data_reasoning", "NA"): Conversation(
        [User("Is R-1001 confirmed?"), READ, Say("Yes, it is confirmed.")]
    ),
}


@pytest.fixture(scope="module")
def labeled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, dict[tuple[str, str], str]]]:
    directory: Path = tmp_path_factory.mktemp("labelers")
    daemon = make_daemon(directory, analysis={"interval_s": 0.3}).start()
    sender = ConversationSender(daemon.http_url)
    trace_ids = {case: sender.send(conversation) for case, conversation in CASES.items()}
    sender.close()
    daemon.wait_assembled()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = [len(daemon.get(f"/api/trajectories/{trace}")["labels"]) == 6 for trace in trace_ids.values()]
        if all(done):
            break
        time.sleep(0.2)
    yield daemon, trace_ids
    daemon.stop()


@pytest.mark.parametrize("case", list(CASES), ids=[f"{name}-{label}" for name, label in CASES])
def test_builtin_labeler_gives_the_expected_label_with_evidence(
    labeled: tuple[RunningDaemon, dict[tuple[str, str], str]], case: tuple[str, str]
) -> None:
    daemon, trace_ids = labeled
    capability, expected = case
    trajectory = daemon.get(f"/api/trajectories/{trace_ids[case]}")
    labels = {label["capability"]: label for label in trajectory["labels"]}
    label = labels[capability]
    assert label["label"] == expected, label["reason"]
    assert label["labeler"] == f"rules.{capability}"
    assert label["reason"]
    if expected == "LACKING":
        # The evidence points at a span of this trajectory.
        spans = {call["span_id"] for call in trajectory["tool_calls"]} | {m["span_id"] for m in trajectory["messages"]}
        assert label["span_ids"] and set(label["span_ids"]) <= spans


def test_lacking_reasons_name_what_went_wrong(labeled: tuple[RunningDaemon, dict[tuple[str, str], str]]) -> None:
    daemon, trace_ids = labeled

    def reason(case: tuple[str, str]) -> str:
        labels = daemon.get(f"/api/trajectories/{trace_ids[case]}")["labels"]
        return next(label["reason"] for label in labels if label["capability"] == case[0])

    assert "reservation_id" in reason(("tool_call_precision", "LACKING"))
    assert "R-7777" in reason(("argument_grounding", "LACKING"))
    assert "cancel_reservation" in reason(("precondition_verification", "LACKING"))
    assert "repeated" in reason(("error_recovery", "LACKING"))
    assert "3 times" in reason(("multi_step_completion", "LACKING"))
    assert "65" in reason(("structured_data_reasoning", "LACKING"))


def test_trajectories_endpoint_filters_by_capability_label(labeled: tuple[RunningDaemon, dict[tuple[str, str], str]]) -> None:
    daemon, trace_ids = labeled
    page = daemon.get("/api/trajectories", capability="precondition_verification", label="LACKING")
    ids = {item["trajectory_id"] for item in page["items"]}
    assert trace_ids[("precondition_verification", "LACKING")] in ids
    assert trace_ids[("precondition_verification", "PRESENT")] not in ids
    assert all(item["label"] == "LACKING" and item["reason"] for item in page["items"])
    assert page["total"] == len(page["items"])


def _prose_only(question: str, tools: tuple[str, ...], source: str = "trajectory"):  # type: ignore[no-untyped-def]
    from tracefix.daemon.analysis.capabilities import ToolSpec, Trajectory, Turn

    turns = [Turn(0, "user", question, [], None, "s0"), Turn(1, "assistant", "Happy to help with that!", [], None, "s1")]
    specs = {name: ToolSpec(name, "", {"type": "object"}) for name in tools}
    return Trajectory("t", "airline", "failure", turns, [], specs, source)


@pytest.mark.parametrize(
    ("question", "source", "expected"),
    [
        ("How many bags can I check on reservation R-12345?", "trajectory", "LACKING"),  # get_baggage_policy, get_reservation
        ("Please cancel my reservation R-12345.", "trajectory", "LACKING"),
        ("What are your opening hours?", "trajectory", "NA"),  # nothing a tool is named for
        # τ-bench airline, GPT-4o, a successful run: no tool could be called with what the user gave.
        ("I don't have my reservation ID with me right now. Can I proceed without it?", "trajectory", "NA"),
        ("Please cancel my reservation.", "agent", "NA"),  # the run itself was not given the tools
    ],
)
def test_a_run_given_tools_that_answers_in_prose_what_a_tool_is_for_lacks_tool_calls(question: str, source: str, expected: str) -> None:
    from tracefix.daemon.analysis.builtin_capabilities import ToolCallPrecision

    judgement = ToolCallPrecision().label(_prose_only(question, ("get_baggage_policy", "get_reservation", "cancel_reservation"), source))
    assert judgement.label.value == expected, judgement.reason
    if expected == "LACKING":
        assert "without calling any of the 3 tools" in judgement.reason and judgement.span_ids == ("s1",)
        assert judgement.confidence < 1


def _run(*steps: tuple[str, str] | tuple[str, str, dict, object]):  # type: ignore[no-untyped-def]
    """A trajectory from ("user" | "assistant", text) turns and ("call", tool, arguments, result) steps,
    each call made by an assistant turn of its own and answered by a tool turn."""
    import orjson

    from tracefix.daemon.analysis.capabilities import ToolCall, ToolSpec, Trajectory, Turn

    turns, calls = [], []
    for step in steps:
        if step[0] == "call":
            _, tool, arguments, result = step  # type: ignore[misc]
            position = len(turns)
            turns.append(Turn(position, "assistant", "", [{"name": tool}], None, f"s{position}"))
            calls.append(ToolCall(len(calls), tool, f"c{position}", orjson.dumps(arguments).decode(), orjson.dumps(result).decode(),
                                  None, position, f"s{position}"))  # fmt: skip
            turns.append(Turn(position + 1, "tool", orjson.dumps(result).decode(), [], f"c{position}", f"s{position + 1}"))
        else:
            turns.append(Turn(len(turns), step[0], step[1], [], None, f"s{len(turns)}"))
    declared = ["get_account", "list_plans", "change_plan", "cancel_subscription", *(call.name for call in calls)]
    specs = {name: ToolSpec(name, "", {"type": "object"}) for name in declared}  # what the agent declared
    return Trajectory("t", "helpdesk", "failure", turns, calls, specs, "trajectory")


ACCOUNT = ("call", "get_account", {"account_id": "ACC-1"}, {"account_id": "ACC-1", "plan": "standard", "monthly_price": 12.0})
PLANS = ("call", "list_plans", {}, {"plans": [{"plan": "basic", "monthly_price": 8.0}, {"plan": "premium", "monthly_price": 24.0}]})
CHANGE = ("call", "change_plan", {"account_id": "ACC-1", "plan": "basic"}, {"plan": "basic"})
CANCEL = ("call", "cancel_subscription", {"account_id": "ACC-1", "subscription_id": "SUB-1"}, {"status": "cancelled"})


@pytest.mark.parametrize(
    ("offer", "made", "expected"),
    [
        ("I can change your plan to Basic and cancel Cloud Backup. Shall I?", [CHANGE], "LACKING"),  # one of two left undone
        ("I can change your plan to Basic and cancel Cloud Backup. Shall I?", [CHANGE, CANCEL], "PRESENT"),
        ("I can't cancel Cloud Backup today, but I can change your plan to Basic. Shall I?", [CHANGE], "PRESENT"),  # not offered
        ("I can change your plan to Basic and cancel Cloud Backup. Shall I?", [], "NA"),  # no change at all: not this capability's
    ],
)
def test_a_confirmed_offer_of_several_changes_must_all_be_made(offer: str, made: list, expected: str) -> None:
    from tracefix.daemon.analysis.builtin_capabilities import MultiStepCompletion
    from tracefix.daemon.core.settings import CapabilitySettings

    run = _run(("user", "Switch me to basic and drop Cloud Backup."), ACCOUNT, ("assistant", offer), ("user", "Yes, go ahead."), *made,
               ("assistant", "All set."))  # fmt: skip
    judgement = MultiStepCompletion(CapabilitySettings()).label(run)
    assert judgement.label.value == expected, judgement.reason
    if expected == "LACKING":
        assert judgement.reason == "the agent offered to cancel and the user confirmed; no cancel_subscription call followed"


TASKS = ("call", "list_tasks", {"status": "open"}, {"tasks": [{"id": f"t{n}", "status": "open", "points": n} for n in (1, 2, 3)]})
RESERVATION = ("call", "get_reservation", {"reservation_id": "R-1"},
               {"reservation_id": "R-1", "passengers": [{"name": "Ann"}], "price": 538, "status": "confirmed"})  # fmt: skip


@pytest.mark.parametrize(
    ("read", "answer", "expected"),
    [
        (TASKS, "Done. 3 tasks are still open.", "PRESENT"),
        (TASKS, "Done. 4 tasks are still open.", "LACKING"),  # the listing holds 3
        (TASKS, "You have 2 open tasks left.", "LACKING"),
        (TASKS, "The open tasks add up to 6 story points.", "PRESENT"),  # 1 + 2 + 3
        (TASKS, "The open tasks add up to 7 story points.", "LACKING"),
        # A record that holds a list is no listing: "2 passengers" may be of a new booking.
        (RESERVATION, "In total that is $538 for 2 passengers.", "PRESENT"),
        (RESERVATION, "That is 538 per passenger in total.", "PRESENT"),
        (ACCOUNT, "Premium costs $24.00 a month ($12.00 more).", "PRESENT"),  # a difference of two values read
    ],
)
def test_a_sum_up_of_listed_records_must_match_the_listing(read: tuple, answer: str, expected: str) -> None:
    from tracefix.daemon.analysis.builtin_capabilities import StructuredDataReasoning

    steps = [read, PLANS] if read is ACCOUNT else [read]
    judgement = StructuredDataReasoning().label(_run(("user", "How do things stand?"), *steps, ("assistant", answer)))
    assert judgement.label.value == expected, judgement.reason


def test_a_stated_difference_must_be_one_of_two_values_read() -> None:
    from tracefix.daemon.analysis.builtin_capabilities import StructuredDataReasoning

    judgement = StructuredDataReasoning().label(
        _run(("user", "Move me to premium."), ACCOUNT, PLANS, ("assistant", "Premium costs $24.00 ($17.00 more). Shall I?"))
    )
    assert judgement.label.value == "LACKING" and "a difference of $17.00" in judgement.reason, judgement.reason
