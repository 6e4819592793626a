"""Every registered family, on two quite different tool sets, through `tracefix envs check`; and the
protocol's parsing of the target's message formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracefix.trainer.environment import Environment, load_tools, parse_assistant, rollout, solution_policy
from tracefix.trainer.families import load_families

REPO = Path(__file__).resolve().parent.parent
TOOL_SETS = {name: REPO / "tests" / "fixtures" / "tools" / f"{name}.json" for name in ("airline", "retail")}
CAPABILITIES = [
    "tool_call_precision", "argument_grounding", "precondition_verification",
    "error_recovery", "multi_step_completion", "structured_data_reasoning",
]  # fmt: skip


def test_all_six_families_are_registered_as_plugins() -> None:
    families = load_families()
    assert sorted(family.capability for family in families.values()) == sorted(CAPABILITIES)
    for family in families.values():
        assert family.rewards and max(family.rewards.values()) == 1.0, family.name


@pytest.mark.parametrize("tool_set", sorted(TOOL_SETS))
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_envs_check_passes_on_both_tool_sets(capability: str, tool_set: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "envs", "check", capability, "--seeds", "30",
         "--tools", str(TOOL_SETS[tool_set]), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["solution"]["min"] == 1.0
    assert report["noop_mean"] < 0.3 and report["random_mean"] < 0.3


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_instances_speak_the_target_tools_only(capability: str) -> None:
    family = next(f for f in load_families().values() if f.capability == capability)
    for name, path in TOOL_SETS.items():
        tools = load_tools(json.loads(path.read_text()))
        other = load_tools(json.loads(TOOL_SETS["retail" if name == "airline" else "airline"].read_text()))
        system = Environment(family, tools).instance(3).reset()[0]["content"]
        assert all(f'"name":"{tool.name}"' in system for tool in tools)
        assert not any(f'"name":"{tool.name}"' in system for tool in other)


def test_envs_sample_prints_an_instance_with_its_solution() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "envs", "sample", "precondition_verification", "--seed", "5",
         "--tools", str(TOOL_SETS["retail"]), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    sample = json.loads(result.stdout)
    assert sample["reward"] == 1.0 and sample["spec"]["family"] == "precondition_verification"
    assert sample["messages"][0]["role"] == "system" and sample["messages"][1]["role"] == "user"


def test_envs_check_reports_bad_tool_files_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "envs", "check", "tool_call_precision", "--tools", str(bad)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0 and "not JSON" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("message", "names", "errors"),
    [
        ({"role": "assistant", "content": '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'}, ["a"], 0),
        ({"role": "assistant", "content": '{"name": "b", "arguments": "{\\"y\\": 2}"}'}, ["b"], 0),
        (
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "c", "arguments": "{}"}}]},
            ["c"], 0,
        ),
        ({"role": "assistant", "content": "<tool_call>{broken</tool_call>"}, [], 1),
        ({"role": "assistant", "content": "plain answer"}, [], 0),
        ({"role": "assistant"}, [], 0),
    ],
)  # fmt: skip
def test_tool_calls_are_parsed_from_every_format(message: dict, names: list[str], errors: int) -> None:
    parsed = parse_assistant(message)
    assert [call.name for call in parsed.calls] == names
    assert len(parsed.errors) == errors


def test_rollout_marks_which_messages_the_policy_wrote() -> None:
    family = next(f for f in load_families().values() if f.capability == "error_recovery")
    instance = Environment(family, load_tools(json.loads(TOOL_SETS["airline"].read_text()))).instance(1)
    replay = rollout(instance, solution_policy(instance))
    assert replay.reward == 1.0
    assert [m["role"] == "assistant" for m in replay.messages] == replay.from_policy


def test_the_settings_decide_which_tools_change_state_for_the_environments_too(tmp_path: Path) -> None:
    """A write whose name no default prefix matches (resolve_ticket) is unknown until [capabilities]
    state_changing_tools names it; then precondition_verification builds on it, as its labeler judges it."""
    from tracefix.daemon.core.settings import CapabilitySettings
    from tracefix.trainer import schema_values

    tools = [
        {"name": "get_ticket", "description": "Fetch a ticket.",
         "parameters": {"type": "object", "properties": {"ticket_id": {"type": "string"}}, "required": ["ticket_id"]}},
        {"name": "resolve_ticket", "description": "Resolve a ticket.",
         "parameters": {"type": "object", "properties": {"ticket_id": {"type": "string"}}, "required": ["ticket_id"]}},
    ]  # fmt: skip
    path = tmp_path / "tickets.json"
    path.write_text(json.dumps(tools))
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "envs", "check", "precondition_verification", "--seeds", "20", "--tools", str(path)]
    unmarked = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert unmarked.returncode != 0 and "state-changing" in unmarked.stdout + unmarked.stderr
    config = tmp_path / "tickets.toml"
    config.write_text('[capabilities]\nstate_changing_tools = ["resolve_ticket"]\n')
    marked = subprocess.run([*command, "--config", str(config)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert marked.returncode == 0, marked.stdout + marked.stderr
    # With no settings at all, names decide, by the same prefixes the settings default to.
    assert tuple(CapabilitySettings().state_changing_prefixes) == schema_values.WRITE_PREFIXES
