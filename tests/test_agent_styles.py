"""The generated agents of tests/fixtures/agents (bench/agent_styles.py): the same seed writes the same
bytes, the committed files are what the generator writes, each planted defect is really in its run and
the successful runs are clean of those checked here, and a subset imports and gets labeled by a real daemon."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import REPO, make_daemon

from bench.agent_styles import FILES, FIXTURES, HELPDESK_AGENT, TODO_AGENT, render, runs
from tracefix.collectors.messages_format import read_messages

CAPABILITIES = {
    "tool_call_precision", "argument_grounding", "precondition_verification", "error_recovery", "multi_step_completion",
    "structured_data_reasoning",
}  # fmt: skip
ID_KEYS = ("task_id", "account_id", "subscription_id")
WRITES = {"update_task", "add_tag", "delete_task", "reset_password", "unlock_account", "change_plan", "cancel_subscription"}


def _records(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def _calls(run: dict[str, Any]) -> list[tuple[int, str, dict[str, Any] | None, str | None]]:
    """(message position, tool, arguments, error) of each call, the error from the tool message answering it."""
    errors = {m["tool_call_id"]: m.get("error") for m in run["messages"] if m["role"] == "tool"}
    calls = []
    for position, message in enumerate(run["messages"]):
        for call in message.get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"])
            except json.JSONDecodeError:
                arguments = None
            calls.append((position, call["function"]["name"], arguments, errors.get(call["id"])))
    return calls


def _imprecise(run: dict[str, Any]) -> list[str]:
    """The calls naming an undeclared tool or failing the tool's schema."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in run["tools"]}
    found = []
    for _, name, arguments, _ in _calls(run):
        if name not in schemas or arguments is None or not jsonschema.Draft202012Validator(schemas[name]).is_valid(arguments):
            found.append(name)
    return found


def _ungrounded(run: dict[str, Any]) -> list[str]:
    """Id arguments that appear as no token anywhere before their call."""
    found = []
    for position, _, arguments, _ in _calls(run):
        for key in ID_KEYS:
            value = (arguments or {}).get(key)
            if value is None:
                continue
            before = run["messages"][:position]
            texts = [m.get("content") or "" for m in before]
            texts += [call["function"]["arguments"] for m in before for call in m.get("tool_calls") or []]
            if not any(re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) for text in texts):
                found.append(value)
    return found


def _unfixed_errors(run: dict[str, Any]) -> list[str]:
    """Failed calls never followed by a successful call of the same tool on the same target, or repeated unchanged."""
    calls = _calls(run)
    found = []
    for index, (_, name, arguments, error) in enumerate(calls):
        if error is None:
            continue
        target = [(arguments or {}).get(key) for key in ID_KEYS]
        later = calls[index + 1 :]
        fixed = any(n == name and [(a or {}).get(key) for key in ID_KEYS] == target and e is None for _, n, a, e in later)
        repeated = any(n == name and a == arguments and e is not None for _, n, a, e in later)
        if not fixed or repeated:
            found.append(name)
    return found


def _unconfirmed_writes(run: dict[str, Any]) -> list[str]:
    """Helpdesk writes without a get_account of that account before them, or without a user's yes between read and write."""
    calls = _calls(run)
    found = []
    for position, name, arguments, _ in calls:
        if name not in WRITES:
            continue
        account = (arguments or {}).get("account_id")
        reads = [p for p, n, a, e in calls if n == "get_account" and p < position and e is None]
        read_at = reads[0] if reads else None
        answered = read_at is not None and account in (run["messages"][read_at + 1].get("content") or "")
        yes = read_at is not None and any(
            m["role"] == "user" and re.match(r"(yes|yep|sure|please do|absolutely)\b", m["content"].lower())
            for m in run["messages"][read_at:position]
        )  # fmt: skip
        if not (answered and yes):
            found.append(name)
    return found


@pytest.mark.parametrize("agent", [TODO_AGENT, HELPDESK_AGENT])
def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_runs(agent: str) -> None:
    first, second = render(runs(agent, 7, count=20)), render(runs(agent, 7, count=20))

    assert first == second
    assert render(runs(agent, 8, count=20)) != first


@pytest.mark.parametrize(("agent", "name", "seed"), FILES)
def test_committed_fixtures_are_what_the_generator_writes(agent: str, name: str, seed: int) -> None:
    split = "kept-back" if "kept-back" in name else "dev"

    assert (FIXTURES / name).read_bytes() == render(runs(agent, seed, 100, split))


@pytest.mark.parametrize(("agent", "name", "seed"), FILES)
def test_each_file_has_60_clean_successes_and_40_failures_with_one_planted_defect(agent: str, name: str, seed: int) -> None:
    records = _records(name)
    imported = list(read_messages(FIXTURES / name))

    assert [run.run_id for run in imported] == [record["run_id"] for record in records]
    assert {run.agent for run in imported} == {agent}
    successes = [record for record in records if record["outcome"] == "success"]
    failures = [record for record in records if record["outcome"] == "failure"]
    assert (len(successes), len(failures)) == (60, 40)
    assert all(record["planted"] == {} for record in successes)
    assert all(len(record["planted"]) == 1 and set(record["planted"].values()) == {"LACKING"} for record in failures)
    planted = {capability for record in failures for capability in record["planted"]}
    assert planted == (CAPABILITIES - {"precondition_verification"} if agent == TODO_AGENT else CAPABILITIES)
    for record in successes:
        assert not _imprecise(record), record["run_id"]
        assert not _ungrounded(record), record["run_id"]
        assert not _unfixed_errors(record), record["run_id"]
        assert record["messages"][-1]["role"] == "assistant" and record["messages"][-1]["content"], record["run_id"]
        if agent == HELPDESK_AGENT:
            assert not _unconfirmed_writes(record), record["run_id"]


@pytest.mark.parametrize(("agent", "name", "seed"), FILES)
def test_each_planted_defect_is_in_its_run(agent: str, name: str, seed: int) -> None:
    checks = {
        "tool_call_precision": _imprecise, "argument_grounding": _ungrounded, "error_recovery": _unfixed_errors,
        "precondition_verification": _unconfirmed_writes,
    }  # fmt: skip
    for record in _records(name):
        for capability in record["planted"]:
            if capability in checks:
                assert checks[capability](record), (record["run_id"], capability)
            elif capability == "multi_step_completion" and "stops" in record["defect"]:
                assert record["messages"][-1]["role"] == "tool", record["run_id"]
            elif capability == "multi_step_completion":  # skips: fewer writes than the user asked for
                assert record["messages"][-1]["role"] == "assistant", record["run_id"]
                assert not _imprecise(record) and not _unfixed_errors(record), record["run_id"]


def test_a_subset_of_both_agents_imports_and_gets_every_capability_labeled(tmp_path: Path) -> None:
    subset = tmp_path / "agents.jsonl"
    picked = [record for name in ("todo-instructed.jsonl", "helpdesk-confirming.jsonl") for record in _records(name)[:6]]
    subset.write_text("".join(json.dumps(record) + "\n" for record in picked))
    (tmp_path / "daemon").mkdir()
    daemon = make_daemon(tmp_path / "daemon", analysis={"interval_s": 0.5}).start()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "import", str(subset), "--format", "messages", "--json",
             "--config", str(daemon.config_path)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        daemon.wait_analyzed(60)
        trajectories = {
            record["run_id"]: daemon.get(f"/api/trajectories/{urllib.parse.quote(record['run_id'], safe='')}")
            for record in picked
        }
    finally:
        daemon.stop()

    for record in picked:
        trajectory = trajectories[record["run_id"]]
        assert trajectory["service_name"] == record["agent"]
        assert trajectory["outcome"] == record["outcome"]
        assert {label["capability"] for label in trajectory["labels"]} >= CAPABILITIES, record["run_id"]


def test_the_labelers_meet_their_targets_on_both_development_files(tmp_path: Path) -> None:
    """Every built-in labeler on the two agents of other styles, imported whole into one real daemon:
    LACKING on at most 15 % of the successful runs that need it (where at least 10 do), and every
    planted defect found at least 90 % of the time (bench/label_audit.py prints the same per file)."""
    from bench.label_audit import fetch_all, import_runs, planted_scores, read_planted, run_labels, wait_labeled

    both = tmp_path / "both.jsonl"
    both.write_text("".join((FIXTURES / name).read_text() for name in ("todo-instructed.jsonl", "helpdesk-confirming.jsonl")))
    planted = read_planted(both)
    (tmp_path / "daemon").mkdir()
    daemon = make_daemon(tmp_path / "daemon", analysis={"interval_s": 1.0}).start()
    try:
        report = import_runs(daemon, both, None, "messages")
        wait_labeled(daemon, report["requests"], len(CAPABILITIES), timeout_s=300)
        by_agent = {agent: fetch_all(daemon, agent) for agent in (TODO_AGENT, HELPDESK_AGENT)}
    finally:
        daemon.stop()
    for agent, trajectories in by_agent.items():
        assert len(trajectories) == 100, agent
        scores = planted_scores(
            (trajectory["outcome"], planted.get(trajectory["conversation_id"], {}), run_labels(trajectory)) for trajectory in trajectories
        )
        missed = {name: score for name, score in scores.items() if score["precision_ok"] is False or score["recall_ok"] is False}
        assert not missed, (agent, missed)
        assert sum(score["planted"] for score in scores.values()) == 40, agent  # every failed run's defect was scored
