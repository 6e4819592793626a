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
    from daemon.analysis.capabilities import ToolSpec, Trajectory, Turn

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
    from daemon.analysis.builtin_capabilities import ToolCallPrecision

    judgement = ToolCallPrecision().label(_prose_only(question, ("get_baggage_policy", "get_reservation", "cancel_reservation"), source))
    assert judgement.label.value == expected, judgement.reason
    if expected == "LACKING":
        assert "without calling any of the 3 tools" in judgement.reason and judgement.span_ids == ("s1",)
        assert judgement.confidence < 1
