"""`tracefix import --format messages`: runs written as OpenAI chat transcripts (what a user exports
from Langfuse, Phoenix or their own logs), sent through a real collector and read back through the API."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, RunningDaemon, make_daemon

TOOLS = [
    {"type": "function", "function": {"name": "get_order", "description": "Read an order.",
                                      "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "cancel_order", "description": "Cancel an order.",
                                      "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}},
]  # fmt: skip


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _run(run_id: str, agent: str | None, outcome: str | None, **extra: Any) -> dict[str, Any]:
    run = {
        "run_id": run_id, "outcome": outcome, "tools": TOOLS, "metadata": {"release": "2026.02"},
        "messages": [
            {"role": "system", "content": "You help customers with their orders."},
            {"role": "user", "content": "Please cancel order ORD-5521."},
            {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_order", {"order_id": "ORD-5521"})]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"order_id": "ORD-5521", "status": "shipped"}'},
            {"role": "assistant", "content": "It has shipped. Cancel anyway?"},
            {"role": "user", "content": "yes"},
            {"role": "assistant", "content": None, "tool_calls": [_call("c2", "cancel_order", {"order_id": "ORD-5521"})]},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: shipped orders cannot be cancelled",
             "error": "shipped orders cannot be cancelled"},
            {"role": "assistant", "content": "Sorry, a shipped order cannot be cancelled; you can return it instead."},
        ],
        "planted": {}, "notes": "extra keys are the file's own and are ignored",
        **extra,
    }  # fmt: skip
    if agent is not None:
        run["agent"] = agent
    return run


RUNS = [
    _run("orders-1", "orders-agent", "success"),
    _run("orders-2", "orders-agent", "failure"),
    _run("support-1", "support-agent", None),
]


def _write_lines(path: Path, runs: list[Any]) -> Path:
    path.write_text("".join(json.dumps(run) + "\n" for run in runs))
    return path


def _import(daemon: RunningDaemon, path: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "import", str(path), "--format", "messages", *arguments,
         "--config", str(daemon.config_path), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _trajectory(daemon: RunningDaemon, trajectory_id: str) -> dict[str, Any]:
    return daemon.get(f"/api/trajectories/{urllib.parse.quote(trajectory_id, safe='')}")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("import-messages")).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def imported(collector: RunningDaemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = _write_lines(tmp_path_factory.mktemp("messages") / "runs.jsonl", RUNS)
    completed = _import(collector, path)
    assert completed.returncode == 0, completed.stderr
    collector.wait_assembled()
    return json.loads(completed.stdout)


def test_every_run_arrives_as_one_trajectory_under_its_own_agent_name(
    collector: RunningDaemon, imported: dict[str, Any]
) -> None:
    # One invoke_agent root, a chat span per assistant turn (4), an execute_tool span per tool result (2).
    assert imported == {"requests": 3, "spans": 3 * 7, "logs": 0, "rejected": 0, "errors": []}
    agents = {item["service_name"]: item for item in collector.get("/api/agents")["items"]}

    assert {name: agents[name]["trajectories"] for name in ("orders-agent", "support-agent")} == {
        "orders-agent": 2, "support-agent": 1
    }  # fmt: skip
    for run in RUNS:
        trajectory = _trajectory(collector, run["run_id"])
        assert (trajectory["service_name"], trajectory["agent_name"]) == (run["agent"], run["agent"])
        assert trajectory["root_name"] == f"invoke_agent {run['agent']}"
        assert trajectory["conversation_id"] == run["run_id"]


def test_outcomes_follow_success_failure_and_null(collector: RunningDaemon, imported: dict[str, Any]) -> None:
    outcomes = {run["run_id"]: _trajectory(collector, run["run_id"]) for run in RUNS}

    assert {run_id: (t["outcome"], t["reward"]) for run_id, t in outcomes.items()} == {
        "orders-1": ("success", 1.0), "orders-2": ("failure", 0.0), "support-1": ("unknown", None)
    }  # fmt: skip
    assert outcomes["orders-1"]["outcome_source"] == "evaluation"


def test_conversation_calls_errors_and_tools_are_kept(collector: RunningDaemon, imported: dict[str, Any]) -> None:
    trajectory = _trajectory(collector, "orders-1")

    assert [(m["role"], m["content"] or "") for m in trajectory["messages"]][:2] == [
        ("system", "You help customers with their orders."), ("user", "Please cancel order ORD-5521.")
    ]  # fmt: skip
    assert len(trajectory["messages"]) == len(RUNS[0]["messages"])
    assert [(c["tool_name"], json.loads(c["arguments"]), c["error"]) for c in trajectory["tool_calls"]] == [
        ("get_order", {"order_id": "ORD-5521"}, None),
        ("cancel_order", {"order_id": "ORD-5521"}, "shipped orders cannot be cancelled"),
    ]
    assert trajectory["n_tool_errors"] == 1
    assert [tool["tool_name"] for tool in trajectory["tools"]] == ["cancel_order", "get_order"]


def test_a_json_array_of_runs_and_the_service_name_option_import_too(
    collector: RunningDaemon, imported: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([_run("array-1", "orders-agent", "success"), _run("array-2", None, "failure")]))

    completed = _import(collector, path, "--service-name", "renamed")
    collector.wait_assembled()

    assert completed.returncode == 0, completed.stderr
    assert [_trajectory(collector, run_id)["service_name"] for run_id in ("array-1", "array-2")] == ["renamed", "renamed"]
    # Without a service name, a run that names no agent is filed under the format's name.
    path = _write_lines(tmp_path / "anonymous.jsonl", [_run("anonymous-1", None, "success")])
    assert _import(collector, path).returncode == 0
    collector.wait_assembled()
    assert (_trajectory(collector, "anonymous-1")["service_name"], _trajectory(collector, "anonymous-1")["agent_name"]) == (
        "messages", "anonymous"
    )  # fmt: skip


def _without_messages() -> dict[str, Any]:
    run = _run("bad-run", "orders-agent", "success")
    del run["messages"]
    return run


def _call_without_name() -> dict[str, Any]:
    run = _run("bad-run", "orders-agent", "success")
    run["messages"][2]["tool_calls"][0]["function"].pop("name")
    return run


def _arguments_as_object() -> dict[str, Any]:
    run = _run("bad-run", "orders-agent", "success")
    run["messages"][6]["tool_calls"][0]["function"]["arguments"] = {"order_id": "ORD-5521"}
    return run


MALFORMED = {
    "without-messages": (_without_messages(), "line 2 (run 'bad-run'): no 'messages' list"),
    "tool-call-without-name": (_call_without_name(), "line 2 (run 'bad-run'), message 2: a tool call without a function name"),
    "arguments-not-a-string": (
        _arguments_as_object(), "line 2 (run 'bad-run'), message 6: the arguments of the cancel_order call are an object, not a JSON string"
    ),
    "unknown-outcome": (_run("bad-run", "orders-agent", "passed"), "line 2 (run 'bad-run'): outcome 'passed' is none of"),
    "not-json": ("{this is not json", "line 2 is not JSON"),
    "without-run-id": ({"agent": "orders-agent", "messages": []}, "line 2: no 'run_id' string"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_run_fails_the_import_with_one_line_naming_the_run_and_stores_nothing(
    collector: RunningDaemon, imported: dict[str, Any], tmp_path: Path, case: str
) -> None:
    bad, problem = MALFORMED[case]
    # A valid run first: like the benchmark formats, a file with a bad run is refused as a whole.
    path = tmp_path / f"{case}.jsonl"
    path.write_text(json.dumps(_run(f"{case}-valid", "orders-agent", "success")) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
    before = collector.wait_assembled()["counts"]

    completed = _import(collector, path)

    assert completed.returncode != 0
    message = completed.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert problem in message and path.name in message
    assert collector.wait_assembled()["counts"] == before
    assert all(item["trajectory_id"] != f"{case}-valid" for item in collector.get("/api/trajectories", limit=100)["items"])


def test_an_empty_file_is_refused_as_holding_no_runs(collector: RunningDaemon, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")

    completed = _import(collector, path)

    assert completed.returncode != 0
    assert "no runs" in completed.stderr
