"""`tracefix import --format tau-bench|tau2-bench`: benchmark runs sent through a real collector as GenAI traces.

The fixtures are real GPT-4o airline runs from τ-bench (tests/fixtures/taubench) and two of them in
τ²-bench's results schema (tests/fixtures/tau2bench). What the daemon stores is read through its API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, RunningDaemon, make_daemon

from tracefix.collectors.agent_runs import RunFormatError
from tracefix.collectors.tau2_bench import read_tau2_bench

FIXTURES = Path(__file__).parent / "fixtures"
TAU_RUNS = FIXTURES / "taubench" / "gpt-4o-airline-excerpt.json"
AIRLINE_TOOLS = FIXTURES / "taubench" / "airline-tools.json"
TAU2_RESULTS = FIXTURES / "tau2bench" / "gpt-4o-airline-results.json"
AGENT_NAME = "gpt-4o-airline-agent"


@dataclass
class Expected:
    """One run as the benchmark file has it, read here independently of the importer."""

    trajectory_id: str
    reward: float
    policy: str
    messages: list[tuple[str, str]]  # (role, content or the tool call id), the system policy first
    tool_results: list[tuple[str, dict[str, Any], str, bool]]  # (name, arguments, result, failed)
    assistant_turns: int


def _tau_bench_runs() -> list[Expected]:
    expected = []
    for run in json.loads(TAU_RUNS.read_text()):
        traj = run["traj"]
        calls = {call["id"]: call["function"] for m in traj for call in m.get("tool_calls") or []}
        results = [(calls[m["tool_call_id"]], m["content"]) for m in traj if m["role"] == "tool"]
        expected.append(
            Expected(
                trajectory_id=f"{TAU_RUNS.stem}/task-{run['task_id']}/trial-{run['trial']}",
                reward=run["reward"],
                policy=traj[0]["content"],
                messages=[(m["role"], m["tool_call_id"] if m["role"] == "tool" else m["content"] or "") for m in traj],
                tool_results=[
                    (call["name"], json.loads(call["arguments"]), result, result.startswith("Error:"))
                    for call, result in results
                ],
                assistant_turns=sum(m["role"] == "assistant" for m in traj),
            )
        )
    return expected


def _tau2_bench_runs() -> list[Expected]:
    results = json.loads(TAU2_RESULTS.read_text())
    policy = results["info"]["environment_info"]["policy"]
    expected = []
    for simulation in results["simulations"]:
        messages = simulation["messages"]
        calls = {call["id"]: call for m in messages for call in m.get("tool_calls") or []}
        expected.append(
            Expected(
                trajectory_id=f"{TAU2_RESULTS.stem}/{simulation['id']}",
                reward=simulation["reward_info"]["reward"],
                policy=policy,
                messages=[("system", policy)]
                + [(m["role"], m["id"] if m["role"] == "tool" else m.get("content") or "") for m in messages],
                tool_results=[
                    (calls[m["id"]]["name"], calls[m["id"]]["arguments"], m["content"], m["error"])
                    for m in messages if m["role"] == "tool"
                ],  # fmt: skip
                assistant_turns=sum(m["role"] == "assistant" for m in messages),
            )
        )
    return expected


FORMATS = {
    "tau-bench": (TAU_RUNS, ["--tools", str(AIRLINE_TOOLS), "--agent-name", AGENT_NAME], _tau_bench_runs),
    "tau2-bench": (TAU2_RESULTS, [], _tau2_bench_runs),
}


def _cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", *arguments], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _import(daemon: RunningDaemon, path: Path, *arguments: str) -> subprocess.CompletedProcess:
    return _cli("import", str(path), *arguments, "--config", str(daemon.config_path), "--json")


def _trajectories(daemon: RunningDaemon, service: str) -> dict[str, Any]:
    return daemon.get("/api/trajectories", service=service, limit=100)


def _trajectory(daemon: RunningDaemon, trajectory_id: str) -> dict[str, Any]:
    return daemon.get(f"/api/trajectories/{urllib.parse.quote(trajectory_id, safe='')}")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = make_daemon(tmp_path_factory.mktemp("import-runs")).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def imported(collector: RunningDaemon) -> dict[str, dict[str, Any]]:
    """Both fixtures imported once; the CLI's JSON summary of each, by format."""
    summaries = {}
    for run_format, (path, arguments, _) in FORMATS.items():
        completed = _import(collector, path, "--format", run_format, *arguments)
        assert completed.returncode == 0, completed.stderr
        summaries[run_format] = json.loads(completed.stdout)
    collector.wait_assembled()
    return summaries


@pytest.fixture(params=list(FORMATS))
def run_format(request: pytest.FixtureRequest) -> str:
    return request.param


def test_import_sends_every_run_through_the_collector_as_one_trace(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    expected = FORMATS[run_format][2]()
    # One invoke_agent root, one chat span per model turn, one execute_tool span per tool result.
    spans = sum(1 + run.assistant_turns + len(run.tool_results) for run in expected)

    assert imported[run_format] == {"requests": len(expected), "spans": spans, "logs": 0, "rejected": 0, "errors": []}
    page = _trajectories(collector, run_format)
    assert page["total"] == len(expected)
    assert sorted(item["trajectory_id"] for item in page["items"]) == sorted(run.trajectory_id for run in expected)
    assert all(item["conversation_id"] == item["trajectory_id"] for item in page["items"])
    assert sum(item["n_spans"] for item in page["items"]) == spans


def test_imported_outcomes_follow_the_rewards(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    expected = FORMATS[run_format][2]()
    assert {run.reward for run in expected} == {0.0, 1.0}

    for run in expected:
        trajectory = _trajectory(collector, run.trajectory_id)

        assert trajectory["outcome"] == ("success" if run.reward == 1.0 else "failure"), run.trajectory_id
        assert trajectory["outcome_source"] == "evaluation"
        evidence = [item for item in trajectory["outcome_evidence"] if item["source"] == "evaluation"]
        assert [(item["reward"], item["detail"]) for item in evidence] == [
            (run.reward, f"{run_format} {'pass' if run.reward == 1.0 else 'fail'}")
        ]


def test_imported_conversation_keeps_the_roles_and_order_with_the_policy_first(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    for run in FORMATS[run_format][2]():
        messages = _trajectory(collector, run.trajectory_id)["messages"]
        stored = [
            (m["role"], m["tool_call_id"] if m["role"] == "tool" else m["content"] or "") for m in messages
        ]
        # The conversation is what the agent saw: it ends with its last turn (the user's closing
        # "###STOP###" reached no model call).
        last_turn = max(index for index, (role, _) in enumerate(run.messages) if role == "assistant")

        assert stored[0] == ("system", run.policy)
        assert stored == run.messages[: last_turn + 1], run.trajectory_id
        assert [m["position"] for m in messages] == list(range(len(messages)))


def test_imported_tool_calls_carry_their_arguments_results_and_the_failing_tools_error(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    runs = FORMATS[run_format][2]()
    assert any(failed for run in runs for *_, failed in run.tool_results)

    for run in runs:
        trajectory = _trajectory(collector, run.trajectory_id)
        calls = trajectory["tool_calls"]

        assert [(c["tool_name"], json.loads(c["arguments"]), c["result"]) for c in calls] == [
            (name, arguments, result) for name, arguments, result, _ in run.tool_results
        ], run.trajectory_id
        assert [bool(c["error"]) for c in calls] == [failed for *_, failed in run.tool_results]
        for call, (_, _, result, failed) in zip(calls, run.tool_results, strict=True):
            if failed:
                assert call["error"].removeprefix("Error:").strip() == result.removeprefix("Error:").strip()
        assert trajectory["n_tool_calls"] == len(run.tool_results)
        assert trajectory["n_tool_errors"] == sum(failed for *_, failed in run.tool_results)


def test_imported_runs_end_in_a_transfer_to_a_human_agent_when_the_run_did(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]]
) -> None:
    runs = _tau_bench_runs()
    transferred = [run for run in runs if run.tool_results and run.tool_results[-1][0] == "transfer_to_human_agents"]
    assert transferred

    calls = _trajectory(collector, transferred[0].trajectory_id)["tool_calls"]

    assert (calls[-1]["tool_name"], calls[-1]["result"], calls[-1]["error"]) == (
        "transfer_to_human_agents", "Transfer successful", None
    )  # fmt: skip


def test_imported_runs_offer_the_fourteen_airline_tools(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    airline = {tool["function"]["name"]: tool["function"] for tool in json.loads(AIRLINE_TOOLS.read_text())}
    assert len(airline) == 14

    for run in FORMATS[run_format][2]():
        tools = _trajectory(collector, run.trajectory_id)["tools"]

        assert [tool["tool_name"] for tool in tools] == sorted(airline)
        for tool in tools:
            function = airline[tool["tool_name"]]
            assert tool["description"] == function["description"]
            assert json.loads(tool["parameters"])["properties"] == function["parameters"]["properties"]


def test_imported_runs_name_the_agent_and_count_one_chat_span_per_assistant_turn(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    path, arguments, runs = FORMATS[run_format]
    agent_name = AGENT_NAME if "--agent-name" in arguments else path.stem  # the file's name by default

    for run in runs():
        trajectory = _trajectory(collector, run.trajectory_id)

        assert trajectory["agent_name"] == agent_name
        assert trajectory["root_name"] == f"invoke_agent {agent_name}"
        assert trajectory["n_llm_calls"] == run.assistant_turns
        assert trajectory["n_spans"] == 1 + run.assistant_turns + len(run.tool_results)


def test_importing_the_same_file_twice_stores_each_run_once(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], run_format: str
) -> None:
    path, arguments, runs = FORMATS[run_format]
    before = collector.status()["counts"]
    total = _trajectories(collector, run_format)["total"]

    completed = _import(collector, path, "--format", run_format, *arguments)
    collector.wait_assembled()

    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["requests"] == len(runs())
    assert _trajectories(collector, run_format)["total"] == total == len(runs())
    after = collector.status()["counts"]
    assert (after["spans"], after["trajectories"], after["tool_calls"]) == (
        before["spans"], before["trajectories"], before["tool_calls"]
    )  # fmt: skip


def _malformed(tmp_path: Path, name: str, document: Any) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def _tau_bench_without_traj() -> list[dict[str, Any]]:
    runs = json.loads(TAU_RUNS.read_text())[:2]
    del runs[1]["traj"]
    return runs


def _tau2_message_without_role() -> dict[str, Any]:
    results = json.loads(TAU2_RESULTS.read_text())
    del results["simulations"][1]["messages"][3]["role"]
    return results


MALFORMED = {
    "tau-bench-not-a-list": ("tau-bench", {"task_id": 0, "traj": []}, "a JSON list of runs"),
    "tau-bench-run-without-traj": ("tau-bench", _tau_bench_without_traj(), "run 1 has no 'traj'"),
    "tau2-bench-not-an-object": ("tau2-bench", [{"messages": []}], "is a JSON object"),
    "tau2-bench-without-simulations": ("tau2-bench", {"info": {}, "tasks": []}, "no 'simulations' list"),
    "tau2-bench-message-without-role": (
        "tau2-bench", _tau2_message_without_role(), "simulation 1 holds a message without a role"
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_import_of_a_malformed_file_fails_with_one_line_naming_the_problem_and_stores_nothing(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], tmp_path: Path, case: str
) -> None:
    run_format, document, problem = MALFORMED[case]
    path = _malformed(tmp_path, case, document)
    before = collector.wait_assembled()["counts"]

    completed = _import(collector, path, "--format", run_format)

    assert completed.returncode != 0
    message = completed.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert problem in message and path.name in message
    assert collector.wait_assembled()["counts"] == before
    stored = [item["trajectory_id"] for item in _trajectories(collector, run_format)["items"]]
    assert not any(trajectory_id.startswith(f"{case}/") for trajectory_id in stored)


def test_tools_with_the_otlp_format_are_refused(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]]
) -> None:
    before = collector.wait_assembled()["counts"]

    completed = _import(collector, TAU_RUNS, "--format", "otlp", "--tools", str(AIRLINE_TOOLS))

    assert completed.returncode != 0
    assert "--tools applies to --format tau-bench, tau2-bench or messages" in completed.stderr
    assert collector.wait_assembled()["counts"] == before


def test_tau2_bench_results_without_tool_definitions_take_the_tools_option(
    collector: RunningDaemon, imported: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    results = json.loads(TAU2_RESULTS.read_text())
    results["info"]["environment_info"]["tool_defs"] = None  # what τ²-bench saves by default
    path = _malformed(tmp_path, "results-without-tool-defs", results)

    completed = _import(
        collector, path, "--format", "tau2-bench", "--tools", str(AIRLINE_TOOLS), "--service-name", "tau2-tools"
    )
    collector.wait_assembled()

    assert completed.returncode == 0, completed.stderr
    page = _trajectories(collector, "tau2-tools")
    assert page["total"] == len(results["simulations"])
    names = sorted(tool["function"]["name"] for tool in json.loads(AIRLINE_TOOLS.read_text()))
    for item in page["items"]:
        assert [tool["tool_name"] for tool in _trajectory(collector, item["trajectory_id"])["tools"]] == names


# --- the τ²-bench reader on what the airline runs do not show ---------------------------------------------


def _results(tmp_path: Path, conversation: list[dict[str, Any]], **simulation: Any) -> Path:
    document = {
        "info": {"environment_info": {"domain_name": "telecom", "policy": "Help the user fix their phone."}},
        "tasks": [],
        "simulations": [{"id": "sim 1", "task_id": "7", "trial": 2, "termination_reason": "user_stop",
                         "reward_info": {"reward": 1.0}, "messages": conversation, **simulation}],
    }  # fmt: skip
    path = tmp_path / "telecom results.json"
    path.write_text(json.dumps(document))
    return path


def test_tau2_bench_user_tool_calls_stay_out_of_the_agent_transcript_in_order(tmp_path: Path) -> None:
    path = _results(
        tmp_path,
        [
            {"role": "assistant", "content": "Hi! How can I help you today?"},
            {"role": "user", "content": None, "tool_calls": [
                {"id": "u1", "name": "toggle_airplane_mode", "arguments": {}, "requestor": "user"}]},
            {"role": "tool", "id": "u1", "content": "Airplane mode off", "requestor": "user", "error": False},
            {"role": "user", "content": "My data does not work."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a1", "name": "get_customer", "arguments": {"phone": "555"}, "requestor": "assistant"},
                {"id": "a2", "name": "get_line", "arguments": {"line_id": "L9"}, "requestor": "assistant"}]},
            {"role": "tool", "tool_messages": [
                {"role": "tool", "id": "a1", "content": '{"name": "Ann"}', "requestor": "assistant", "error": False},
                {"role": "tool", "id": "a2", "content": "Error: line not found", "requestor": "assistant",
                 "error": True}]},
            {"role": "assistant", "content": "Please restart your phone."},
        ],
    )  # fmt: skip

    [run] = read_tau2_bench(path, None)

    assert [(m["role"], m.get("content")) for m in run.messages] == [
        ("system", "Help the user fix their phone."),
        ("assistant", "Hi! How can I help you today?"),
        ("user", "My data does not work."),
        ("assistant", None),
        ("tool", '{"name": "Ann"}'),
        ("tool", "Error: line not found"),
        ("assistant", "Please restart your phone."),
    ]
    assert run.messages[3]["tool_calls"][1] == {
        "id": "a2", "type": "function", "function": {"name": "get_line", "arguments": "{\"line_id\":\"L9\"}"}
    }  # fmt: skip
    assert [(m["tool_call_id"], m["name"], m.get("error")) for m in run.messages if m["role"] == "tool"] == [
        ("a1", "get_customer", None), ("a2", "get_line", "Error: line not found")
    ]  # fmt: skip
    assert run.run_id == "telecom-results/sim-1"
    assert run.attributes == {
        "tau2_bench.task_id": "7", "tau2_bench.trial": 2, "tau2_bench.termination_reason": "user_stop"
    }  # fmt: skip
    assert (run.reward, run.evaluation_name, run.tools) == (1.0, "tau2-bench", [])


def test_tau2_bench_run_without_an_id_is_named_by_task_and_trial(tmp_path: Path) -> None:
    path = _results(tmp_path, [{"role": "assistant", "content": "Hello"}], id=None, task_id="[sample]:3")

    [run] = read_tau2_bench(path, [{"type": "function", "function": {"name": "noop", "parameters": {}}}])

    assert run.run_id == "telecom-results/task--sample-:3/trial-2"
    assert [tool["function"]["name"] for tool in run.tools] == ["noop"]


def test_tau2_bench_simulation_without_messages_is_a_format_error(tmp_path: Path) -> None:
    path = _results(tmp_path, [], messages=None)

    with pytest.raises(RunFormatError, match="simulation 0 has no 'messages' list"):
        list(read_tau2_bench(path, None))
