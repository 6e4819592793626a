"""Replay of real failures: a model's first turn on a failed trajectory's opening is judged by the
capability's own rule labeler, as it would judge the agent."""

from __future__ import annotations

import json
from pathlib import Path

from daemon.capabilities import load_registry
from daemon.settings import CapabilitySettings
from trainer.environment import assistant_call, assistant_text, load_tools
from trainer.replay import _trajectory

TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "airline.json").read_text()))
CASE = {"trajectory_id": "t1", "system": "You are an airline agent.", "user": "Cancel reservation R-12345 please."}


def _judge(capability: str, answer: dict) -> str:
    labeler = load_registry(CapabilitySettings())[capability].labeler
    return labeler.label(_trajectory(CASE, answer, TOOLS)).label.value


def test_a_write_before_any_read_is_lacking_precondition_verification() -> None:
    assert _judge("precondition_verification", assistant_call("cancel_reservation", {"reservation_id": "R-12345"})) == "LACKING"
    assert _judge("precondition_verification", assistant_call("get_reservation", {"reservation_id": "R-12345"})) != "LACKING"


def test_a_call_that_fails_its_schema_is_lacking_tool_call_precision() -> None:
    assert _judge("tool_call_precision", assistant_call("get_reservation", {"reservation": 5})) == "LACKING"
    assert _judge("tool_call_precision", assistant_call("get_reservation", {"reservation_id": "R-12345"})) == "PRESENT"
    # Asked to cancel a reservation and answering in prose is no call at all: lacking too.
    assert _judge("tool_call_precision", assistant_text("Sure, one moment.")) == "LACKING"
