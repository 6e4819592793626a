"""Environments faithful to the agent: the example airline agent's traces go to a real daemon over
OTLP; from the stored tool results the synthesizer learns each tool's result shape, attaches it to
the environment's tool definitions, and the environment's simulated reads come back in that shape
(the simulation's facts kept), which the environment check measures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracefix.daemon.core.settings import CapabilitySettings, StoreSettings
from tracefix.daemon.pipeline.synthesis import MIN_RESULTS, stored_definitions
from tracefix.daemon.store.store import AnalysisStore, Store
from examples.airline import run_conversations
from examples.airline.instructions import SERVICE_NAME
from tests.conftest import make_daemon
from tracefix.trainer.checks import check
from tracefix.trainer.environment import Environment, load_tools, rollout, solution_policy
from tracefix.trainer.families import load_families
from tracefix.trainer.result_shapes import conformance


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnalysisStore]:
    """The database a daemon wrote from 16 scripted airline conversations, opened after it stopped."""
    directory: Path = tmp_path_factory.mktemp("shapes")
    daemon = make_daemon(directory, analysis={"interval_s": 0.5}).start()
    try:
        outcomes = run_conversations(conversations=16, policy="scripted", collector=daemon.http_url, seed=4)
        assert outcomes.failed_spans == 0
        daemon.wait_assembled()
    finally:
        daemon.stop()
    store = Store(StoreSettings(path=directory / "tracefix.duckdb"))
    yield AnalysisStore(store)
    store.close()


def test_each_tools_stored_results_are_read_back_with_their_arguments(stored: AnalysisStore) -> None:
    results = stored.tool_results(SERVICE_NAME)
    assert {"get_user", "get_reservation"} <= set(results)
    arguments, result = results["get_reservation"][0]
    assert set(arguments) == {"reservation_id"} and result["reservation_id"] == arguments["reservation_id"]
    assert stored.tool_results("another-agent") == {}
    assert len(stored.tool_results(SERVICE_NAME, per_tool=2)["get_user"]) == 2


def test_the_environments_tools_carry_the_shape_learned_from_their_results(stored: AnalysisStore) -> None:
    results = stored.tool_results(SERVICE_NAME)
    definitions = {item["name"]: item for item in stored_definitions(stored.tool_definitions(SERVICE_NAME), CapabilitySettings(), results)}
    for name, definition in definitions.items():
        assert ("result_shape" in definition) == (len(results.get(name, [])) >= MIN_RESULTS), name
    reservation = definitions["get_reservation"]["result_shape"]
    assert reservation["fields"]["reservation_id"]["echo"] == "reservation_id"
    assert reservation["fields"]["flights"]["shape"]["items"]["fields"]["date"]["shape"]["format"] == "date"
    assert all(conformance(reservation, result) == 1.0 for _, result in results["get_reservation"])
    assert "result_shape" not in stored_definitions(stored.tool_definitions(SERVICE_NAME), CapabilitySettings())[0]


def test_environments_on_shaped_tools_still_check_and_their_reads_come_back_in_the_agents_shape(stored: AnalysisStore) -> None:
    definitions = stored_definitions(stored.tool_definitions(SERVICE_NAME), CapabilitySettings(), stored.tool_results(SERVICE_NAME))
    tools = load_tools(definitions)
    assert next(tool for tool in tools if tool.name == "get_reservation").result_shape is not None
    assert "result_shape" not in json.dumps([tool.to_openai() for tool in tools])  # the model sees the tools as declared
    dressed_somewhere = False
    for name, family in load_families().items():
        report = check(Environment(family, tools, family.levels[0]), seeds=8)
        assert report.passed, (name, report.to_dict())  # the ground truth still solves every seed
        assert report.to_dict()["result_shapes"], name  # every family's reads and writes are dressed
        for tool, fit in report.to_dict()["result_shapes"].items():
            assert fit["results"] > 0 and 0.0 <= fit["fit_simulated"] <= fit["fit_dressed"] <= 1.0, (name, tool, fit)
            dressed_somewhere |= fit["fit_dressed"] > fit["fit_simulated"]
    assert dressed_somewhere
    # The same seed, the same dressed results.
    family = load_families()["precondition_verification"]
    first, second = (rollout(instance, solution_policy(instance)).messages for instance in (Environment(family, tools, 1).instance(3), Environment(family, tools, 1).instance(3)))
    assert first == second and any('"user_id"' in str(message.get("content")) for message in first if message["role"] == "tool")
