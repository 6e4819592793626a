"""One rule finds an environment family, and one function builds an environment from what the daemon
stores (an environment record, a job request): the CLI, the synthesizer, the jobs and the API share them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.families import UnknownFamily, build_environment, find_family, load_families

AIRLINE = Path(__file__).resolve().parent / "fixtures" / "tools" / "airline.json"


def test_a_name_picks_the_family_else_the_capability_it_trains() -> None:
    families = load_families()
    assert find_family(families, "error_recovery").name == "error_recovery"
    # A capability configured with another family (environment_family) trains on that one.
    assert find_family(families, "datetime_reasoning", "tool_call_precision").name == "tool_call_precision"


def test_an_unknown_family_is_named_with_the_known_ones() -> None:
    families = load_families()
    with pytest.raises(UnknownFamily, match=r"unknown environment family 'juggling'; known: .*error_recovery"):
        find_family(families, "error_recovery", "juggling")
    with pytest.raises(UnknownFamily, match=r"no environment family trains 'datetime_reasoning'; known: .*tool_call_precision"):
        find_family(families, "datetime_reasoning")


def test_a_stored_environment_builds_the_environment_it_describes() -> None:
    definitions = json.loads(AIRLINE.read_text())
    family = load_families()["precondition_verification"]
    built = build_environment({"family": "precondition_verification", "difficulty": 2, "tools": definitions})
    assert built.spec() == Environment(family, load_tools(definitions), 2).spec()
    assert build_environment({"family": "precondition_verification", "tools": definitions}).difficulty == 1
    with pytest.raises(ValueError, match="unknown environment family 'juggling'"):
        build_environment({"family": "juggling", "tools": definitions})
