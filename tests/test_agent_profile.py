"""Agent profiles (daemon/analysis/profile.py): what an agent's policy requires before a change,
read from its instructions, its observed successful runs and its [[capabilities.agents]] entry,
each rule with its evidence; the precondition labeler consulting it (a rule the policy does not
have is NA, never LACKING; the user's own request authorizes a change unless confirmation is
required even so); and, end to end, a real daemon deriving each agent's profile from the runs it
received over OTLP, serving it (API, `tracefix agents show`) and labeling again when it changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tracefix.daemon.analysis.builtin_capabilities import PreconditionVerification
from tracefix.daemon.analysis.capabilities import Label
from tracefix.daemon.analysis.profile import UNDECIDED, AgentProfile, Observation, Rule, derive, from_instructions, from_observations, unknown_agents
from tracefix.daemon.core.settings import AgentSettings, CapabilitySettings, ConfigError, load_settings
from tests.conftest import RunningDaemon, make_daemon, wait_for
from tests.conversations import Call, Conversation, ConversationSender, Say, User
from tests.test_labels_on_real_runs import Call as RunCall
from tests.test_labels_on_real_runs import Say as RunSay
from tests.test_labels_on_real_runs import User as RunUser
from tests.test_labels_on_real_runs import run

AIRLINE_CONFIRMATION = (
    "Before taking any actions that update the booking database (booking, modifying flights, editing baggage, upgrading cabin class, "
    "or updating passenger information), you must list the action details and obtain explicit user confirmation (yes) to proceed."
)
AIRLINE_READ = "The API does not check these for the agent, so the agent must make sure the rules apply before calling the API!"
TODO = "You manage the user's todo ledger. Perform every operation the user asks for, without asking back. Be brief."
HELPDESK = "You are the IT helpdesk. Before any change, look up the account and ask the user to confirm explicitly."
LABELER = PreconditionVerification(CapabilitySettings())


def test_instructions_state_rules_with_their_sentence() -> None:
    airline = from_instructions(f"# Airline Agent Policy\n\n- {AIRLINE_CONFIRMATION}\n- {AIRLINE_READ}")
    assert airline["confirmation"] == Rule(True, "instructions", AIRLINE_CONFIRMATION)
    assert airline["read_first"] == Rule(True, "instructions", AIRLINE_READ)
    assert "request_authorizes" not in airline
    todo = from_instructions(TODO)
    sentence = "Perform every operation the user asks for, without asking back."
    assert todo["confirmation"] == Rule(False, "instructions", sentence) and todo["request_authorizes"] == Rule(True, "instructions", sentence)
    assert "read_first" not in todo  # nothing said about reading first
    helpdesk = from_instructions(HELPDESK)
    assert helpdesk["confirmation"].value is True and helpdesk["read_first"].value is True
    assert from_instructions("Do not ask the user for confirmation; act at once.")["confirmation"].value is False
    # A negated "without" is a requirement, not its absence.
    for required in ("Never change a booking without the user's explicit confirmation.", "Do not act without asking the user first."):
        assert from_instructions(required)["confirmation"] == Rule(True, "instructions", required), required
    assert from_instructions("You are a helpful assistant. Answer in English.") == {}
    # Saying nothing leaves every rule undecided, shown so.
    quiet = derive("quiet", "You are a helpful assistant.", [], None, [])
    assert quiet.confirmation == quiet.read_first == quiet.request_authorizes == UNDECIDED


def test_observed_successful_runs_decide_what_the_instructions_leave_open() -> None:
    few = [Observation(False, False, True)] * 9
    assert from_observations(few) == {}  # too few to tell
    runs = [Observation(True, False, True)] * 9 + [Observation(False, False, False)]
    rules = from_observations(runs)
    assert rules["read_first"] == Rule(True, "observed", "read the entity before changing it in 9 of 10 successful runs that changed state (90%)")
    assert rules["confirmation"].value is False and "0 of 10" in rules["confirmation"].evidence
    assert rules["request_authorizes"].value is True and "9 of 10" in rules["request_authorizes"].evidence
    # The instructions' sentence beats the observed share.
    profile = derive("helpdesk", HELPDESK, runs, None, [])
    assert (profile.confirmation.value, profile.confirmation.source, profile.observed_runs) == (True, "instructions", 10)


def test_the_configuration_decides_first_and_an_override_naming_an_unknown_tool_or_agent_is_refused_with_the_name() -> None:
    override = AgentSettings(name="todo", read_first=False, state_changing_tools=["update_task", "archive_task"], handoff_tools=["escalate"])
    profile = derive("todo", HELPDESK, [], override, ["get_task", "update_task", "escalate"])
    assert profile.read_first == Rule(False, "config", "[[capabilities.agents]] name = 'todo': read_first = false")
    assert profile.confirmation.source == "instructions"  # not overridden
    assert profile.state_changing_tools is None and profile.handoff_tools == ("escalate",)
    assert len(profile.refused) == 1 and "'archive_task'" in profile.refused[0] and "not applied" in profile.refused[0]
    assert unknown_agents([override, AgentSettings(name="todo-agnet")], ["todo"]) == [
        "[[capabilities.agents]] names 'todo-agnet', which no agent that has sent runs is called (agents: todo); not applied"
    ]
    with pytest.raises(ConfigError, match="capabilities.agents"):
        load_settings(environ={"TRACEFIX_CAPABILITIES_AGENTS": '[{"name": "a"}, {"name": "a"}]'})
    with pytest.raises(ConfigError, match="confirmation"):
        load_settings(environ={"TRACEFIX_CAPABILITIES_AGENTS": '[{"name": "a", "confirmation": "sometimes"}]'})


def _todo_run(user: str, *steps: RunCall | RunSay, system: str = TODO):  # type: ignore[no-untyped-def]
    return run(RunUser(user), *steps, system=system)


UPDATE = RunCall("update_task", {"task_id": "t6", "status": "done"}, {"task_id": "t6", "status": "done"})
READ = RunCall("get_task", {"task_id": "t6"}, {"task_id": "t6", "title": "Tax return", "status": "open"})


def _profiled(trajectory, profile: AgentProfile):  # type: ignore[no-untyped-def]
    trajectory.profile = profile
    return trajectory


def test_a_rule_the_agents_policy_does_not_have_is_na_never_lacking() -> None:
    unread = _todo_run("Please mark t6 as done.", UPDATE, RunSay("Done: t6 is marked done."))
    neither = AgentProfile("todo", Rule(False, "instructions", TODO), Rule(False, "observed", "0 of 12"))
    judged = LABELER.label(_profiled(unread, neither))
    assert judged.label == Label.NA and "neither a read nor a confirmation" in judged.reason
    # Undecided, the read is asked for (the capability's definition): without one, LACKING.
    assert LABELER.label(_profiled(unread, AgentProfile("todo"))).label == Label.LACKING
    # No confirmation in its policy, a read in it: the read decides.
    reads_only = AgentProfile("todo", Rule(False, "instructions", TODO), Rule(True, "observed", "12 of 12"))
    assert LABELER.label(_profiled(unread, reads_only)).label == Label.LACKING
    read = _todo_run("Please mark t6 as done.", READ, UPDATE, RunSay("Done."))
    judged = LABELER.label(_profiled(read, reads_only))
    assert judged.label == Label.PRESENT and judged.reason == "1 state-changing calls each read first"


def test_the_users_own_request_authorizes_a_change_unless_confirmation_is_required() -> None:
    undecided = AgentProfile("todo")
    stated = LABELER.label(_profiled(_todo_run("Please mark t6 as done.", READ, UPDATE, RunSay("Done.")), undecided))
    assert stated.label == Label.PRESENT and "1 of them as the user's own message stated" in stated.reason
    # Not this change, not this task, or a word that only begins like the change ("add" in "address").
    for user in ("Tell me about t6.", "Please mark t7 as done.", "Is t16 done?", "What is undone in t6?"):
        judged = LABELER.label(_profiled(_todo_run(user, READ, UPDATE, RunSay("Done.")), undecided))
        assert judged.label == Label.LACKING and "without the user's confirmation" in judged.reason, user
    tagged = RunCall("add_tag", {"task_id": "t12", "tag": "infra"}, {"task_id": "t12", "tags": ["infra"]})
    read12 = RunCall("get_task", {"task_id": "t12"}, {"task_id": "t12", "tags": []})
    assert LABELER.label(_profiled(_todo_run("Add the tag infra to t12.", read12, tagged, RunSay("Tagged.")), undecided)).label == Label.PRESENT
    tag_only = RunCall("add_tag", {"task_id": "t12"}, {"task_id": "t12"})
    assert LABELER.label(_profiled(_todo_run("Update the address on t12.", read12, tag_only, RunSay("Done.")), undecided)).label == Label.LACKING
    # A policy that requires confirmation is not satisfied by the request: it wants the yes after the read.
    required = AgentProfile("airline", Rule(True, "instructions", AIRLINE_CONFIRMATION))
    judged = LABELER.label(_profiled(_todo_run("Please mark t6 as done.", READ, UPDATE, RunSay("Done.")), required))
    assert judged.label == Label.LACKING
    confirmed = _todo_run("Please mark t6 as done.", READ, RunSay("Mark t6 'Tax return' as done?"), RunUser("Yes."), UPDATE, RunSay("Done."))
    assert LABELER.label(_profiled(confirmed, required)).label == Label.PRESENT


# -- end to end: a real daemon, runs over OTLP -------------------------------------------------------

TODO_TOOLS = [
    {"type": "function", "name": name, "description": description, "parameters": {
        "type": "object", "properties": {"task_id": {"type": "string"}, "status": {"type": "string"}}, "required": ["task_id"]}}
    for name, description in (("get_task", "Read a task."), ("update_task", "Change a task."))
]  # fmt: skip


def _todo(index: int, read: bool, system: str | None = TODO, outcome: str = "success") -> Conversation:
    steps: list[User | Say | Call] = [User(f"Please mark t{index} as done.")]
    if read:
        steps.append(Call("get_task", {"task_id": f"t{index}"}, {"task_id": f"t{index}", "status": "open"}))
    steps += [Call("update_task", {"task_id": f"t{index}", "status": "done"}, {"task_id": f"t{index}", "status": "done"}), Say("Done.")]
    return Conversation(steps, outcome, tools=TODO_TOOLS, conversation_id=f"todo-{index}-{read}-{outcome}", system=system)


def _label(daemon: RunningDaemon, conversation_id: str) -> dict:  # type: ignore[type-arg]
    items = daemon.get("/api/trajectories", capability="precondition_verification", limit=200)["items"]
    return next((item for item in items if item["trajectory_id"] == conversation_id), {})


@pytest.fixture
def profiled_daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    overrides = [{"name": "todo-agent", "handoff_tools": ["page_a_human"]}, {"name": "no-such-agent", "confirmation": False}]
    running = make_daemon(
        tmp_path, analysis={"interval_s": 0.3, "profile_refresh_s": 0.2}, capabilities={"agents": overrides}
    ).start()  # fmt: skip
    yield running
    running.stop()


def test_a_daemon_derives_each_agents_profile_serves_it_and_labels_again_when_it_changes(profiled_daemon: RunningDaemon) -> None:
    daemon = profiled_daemon
    todo, support, quiet = (ConversationSender(daemon.http_url, name) for name in ("todo-agent", "support-agent", "quiet-agent"))
    try:
        todo.send(_todo(1, read=True))
        support.send(Conversation([
            User("Cancel reservation R-48213."), Call("get_reservation", {"reservation_id": "R-48213"}, {"reservation_id": "R-48213"}),
            Call("cancel_reservation", {"reservation_id": "R-48213"}, {"status": "cancelled"}), Say("Cancelled."),
        ], "failure", conversation_id="support-1"))  # fmt: skip
        quiet.send(_todo(100, read=False, system=None, outcome="failure"))
        # The todo agent's instructions say it acts without asking: its read-first change is PRESENT;
        # the support agent's say to confirm first: the same change without a yes is LACKING.
        assert wait_for(lambda: _label(daemon, "todo-1-True-success").get("label")) == "PRESENT"
        assert wait_for(lambda: _label(daemon, "support-1").get("label")) == "LACKING"
        profile = daemon.get("/api/agents/todo-agent/profile")
        assert profile["rules"]["confirmation"] == {
            "value": False, "source": "instructions", "evidence": "Perform every operation the user asks for, without asking back."
        }  # fmt: skip
        assert profile["rules"]["read_first"]["value"] is None and profile["rules"]["read_first"]["source"] == "none"
        assert "'page_a_human'" in profile["refused"][0]  # the override names a tool the agent never had
        assert daemon.get("/api/agents/support-agent/profile")["rules"]["confirmation"]["value"] is True
        refused = daemon.get("/api/agents")["refused"]
        assert any("'no-such-agent'" in reason for reason in refused)
        with pytest.raises(httpx.HTTPStatusError, match="404"):
            daemon.get("/api/agents/nobody/profile")
        # The quiet agent says nothing; its one run wrote without a read, which the undecided rule asks for.
        assert wait_for(lambda: _label(daemon, "todo-100-False-failure").get("label")) == "LACKING"
        # Then its successful runs show it never reads first: the rule is not its policy's, and its run is labeled again.
        for index in range(10):
            quiet.send(_todo(index + 10, read=False, system=None))
        assert wait_for(lambda: daemon.get("/api/agents/quiet-agent/profile")["rules"]["read_first"]["value"] is False, timeout_s=60)
        assert wait_for(lambda: _label(daemon, "todo-100-False-failure").get("label") == "NA", timeout_s=60)
        assert "neither a read nor a confirmation" in _label(daemon, "todo-100-False-failure")["reason"]
        shown = subprocess.run(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "agents", "show", "quiet-agent", "--config", str(daemon.config_path)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "read_first: no  (observed: read the entity before changing it in 0 of 10 successful runs" in shown
        assert "confirmation: no  (observed:" in shown
    finally:
        for sender in (todo, support, quiet):
            sender.close()


def test_an_error_that_names_the_fix_and_a_tool_never_called_again_is_lacking_error_recovery() -> None:
    from tracefix.daemon.analysis.builtin_capabilities import ErrorRecovery
    from tracefix.daemon.analysis.capabilities import ToolSpec

    blocked = "Error: t19 blocks other tasks; call delete_task with force=true to delete it anyway"
    schema = {"type": "object", "properties": {"task_id": {"type": "string"}, "force": {"type": "boolean"}}, "required": ["task_id"]}

    def judged(*steps: RunCall | RunSay):  # type: ignore[no-untyped-def]
        trajectory = run(RunUser("1. delete t19\n2. list what is open"), *steps, system=TODO)
        trajectory.tools["delete_task"] = ToolSpec("delete_task", "", schema)
        return ErrorRecovery().label(trajectory)

    listing = RunCall("list_tasks", {"status": "open"}, {"tasks": []})
    gave_up = judged(RunCall("delete_task", {"task_id": "t19"}, blocked), listing, RunSay("I couldn't delete t19."))
    assert gave_up.label == Label.LACKING and "naming its argument 'force' as the fix" in gave_up.reason
    forced = RunCall("delete_task", {"task_id": "t19", "force": True}, {"deleted": "t19"})
    assert judged(RunCall("delete_task", {"task_id": "t19"}, blocked), forced, listing, RunSay("Deleted t19.")).label == Label.PRESENT
    # An error that names no argument of the tool, followed by other work, is no such case.
    refused = "Error: the ledger is read-only today"
    assert judged(RunCall("delete_task", {"task_id": "t19"}, refused), listing, RunSay("The ledger is read-only.")).label == Label.PRESENT
