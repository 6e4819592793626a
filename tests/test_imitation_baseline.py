"""The imitation baseline (trainer/imitation.py, bench/imitation_baseline.py): stored conversations
rendered as the router renders a request, loss on the agent's own tokens only, and an adapter trained
on a real daemon's successful trajectories that goes through the same panel evaluation as the
capability-targeted adapters, served by a real router."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracefix.router.protocol import ChatRequest, prompt_messages, stored_prompt_messages
from tests.conftest import REPO, make_daemon, wait_for

SCHEMA = {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}
TOOLS = [{"tool_name": "get_user", "description": "Look a customer up.", "parameters": json.dumps(SCHEMA)}]
ROWS: list[dict[str, Any]] = [
    {"role": "system", "content": "You help customers.", "tool_calls": "[]"},
    {"role": "user", "content": "I am U-1, please look me up.", "tool_calls": "[]"},
    {"role": "assistant", "content": "", "tool_calls": json.dumps([{"id": "c1", "name": "get_user", "arguments": '{"user_id":"U-1"}'}])},
    {"role": "tool", "content": '{"user_id":"U-1","name":"Ada"}', "tool_calls": "[]", "tool_call_id": "c1", "name": "get_user"},
    {"role": "assistant", "content": "Found you, Ada.", "tool_calls": "[]"},
    {"role": "user", "content": "Thanks, bye.", "tool_calls": "[]"},
    {"role": "assistant", "content": "Goodbye!", "tool_calls": "[]"},
]


def test_stored_rows_render_as_the_router_renders_the_same_request() -> None:
    messages = stored_prompt_messages(ROWS, TOOLS)
    request = ChatRequest(
        model="base",
        messages=[
            {"role": "system", "content": "You help customers."},
            {"role": "user", "content": "I am U-1, please look me up."},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_user", "arguments": '{"user_id":"U-1"}'}}]},
            {"role": "tool", "content": '{"user_id":"U-1","name":"Ada"}', "tool_call_id": "c1"},
            {"role": "assistant", "content": "Found you, Ada."},
            {"role": "user", "content": "Thanks, bye."},
            {"role": "assistant", "content": "Goodbye!"},
        ],
        tools=[{"type": "function", "function": {"name": "get_user", "description": "Look a customer up.", "parameters": SCHEMA}}],
    )  # fmt: skip
    assert messages == prompt_messages(request)
    assert messages[2]["content"] == '<tool_call>{"name":"get_user","arguments":{"user_id":"U-1"}}</tool_call>'
    assert '"name":"get_user"' in messages[0]["content"] and messages[0]["content"].startswith("You help customers.")
    # Arguments stored as an object (not a JSON string) read the same.
    as_object = [dict(row) for row in ROWS]
    as_object[2]["tool_calls"] = json.dumps([{"id": "c1", "name": "get_user", "arguments": {"user_id": "U-1"}}])
    assert stored_prompt_messages(as_object, TOOLS) == messages


@pytest.mark.parametrize(
    "change",
    [
        {"index": 1, "row": {"role": "robot", "content": "hi", "tool_calls": "[]"}},
        {"index": 3, "row": {"role": "tool", "content": None, "tool_calls": "[]"}},
        {"index": 2, "row": {"role": "assistant", "content": "", "tool_calls": "[{not json"}},
        {"index": 1, "row": {"content": "no role", "tool_calls": "[]"}},
    ],
    ids=["unknown role", "tool without content", "calls not JSON", "no role"],
)
def test_rows_that_are_not_a_conversation_are_refused_with_the_reason(change: dict[str, Any]) -> None:
    rows = [dict(row) for row in ROWS]
    rows[change["index"]] = change["row"]
    with pytest.raises(ValueError, match="not a conversation the router would take"):
        stored_prompt_messages(rows, TOOLS)


def test_only_the_agents_turns_carry_loss(smollm2_tokenizer: Any) -> None:
    from tracefix.trainer.conversations import conversation_sequence

    messages = stored_prompt_messages(ROWS, TOOLS)
    ids, mask = conversation_sequence(smollm2_tokenizer, messages, 4096)
    assert len(ids) == len(mask) and 0 < sum(mask) < len(ids)
    trained = smollm2_tokenizer.decode([token for token, kept in zip(ids, mask, strict=True) if kept])
    untrained = smollm2_tokenizer.decode([token for token, kept in zip(ids, mask, strict=True) if not kept])
    for turn in ('<tool_call>{"name":"get_user","arguments":{"user_id":"U-1"}}</tool_call>', "Found you, Ada.", "Goodbye!"):
        assert turn in trained and turn not in untrained
    for other in ("You help customers.", "please look me up", '"name":"Ada"', "Thanks, bye."):
        assert other in untrained and other not in trained
    # The whole sequence is the chat template's rendering of the conversation.
    rendered = smollm2_tokenizer.apply_chat_template(messages, tokenize=False)
    assert smollm2_tokenizer.decode(ids).strip() == rendered.strip()
    # A conversation longer than max_length keeps the turns that fit, never a cut turn.
    short_ids, short_mask = conversation_sequence(smollm2_tokenizer, messages, len(ids) - 5)
    assert len(short_ids) < len(ids) and sum(short_mask) < sum(mask)
    assert "Goodbye!" not in smollm2_tokenizer.decode([token for token, kept in zip(short_ids, short_mask, strict=True) if kept])


def test_a_conversation_to_imitate_needs_a_user_turn_and_an_agent_turn() -> None:
    from tracefix.trainer.conversations import RecordedConversation

    with pytest.raises(ValueError, match="assistant turn"):
        RecordedConversation([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(ValueError, match="user turn"):
        RecordedConversation([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}])


def test_the_imitation_adapter_trains_on_a_daemons_successful_runs_and_goes_through_the_panel(tmp_path: Path, tiny_model: Path) -> None:
    """A real daemon stores the scripted flows' successful conversations; the bench trains the
    imitation adapter on them with the tiny model, starts its own router, loads the demo's live
    adapter, and runs the model-driven agent over a panel batch for each arm."""
    import peft  # noqa: F401  (installed by make test: never skipped)
    from tracefix.daemon.core.settings import StoreSettings
    from tracefix.daemon.store.store import Store
    from examples.airline.runner import run_conversations
    from tests.lora_support import make_adapter, register_candidate
    from tracefix.trainer.adapters import verify_adapter

    (tmp_path / "daemon").mkdir()
    daemon = make_daemon(tmp_path / "daemon").start()
    try:
        outcomes = run_conversations(policy="scripted", conversations=4, seed=3, collector=daemon.http_url, service_name="airline-scripted-flows")
        assert all(outcome.success for outcome in outcomes)
        wait_for(lambda: daemon.get("/api/trajectories", outcome="success")["total"] >= 4, timeout_s=60)
    finally:
        daemon.stop()
    store = Store(StoreSettings(path=daemon.db_path))
    live = make_adapter(tiny_model, tmp_path / "adapters" / "tool_call_precision-v1", "tool_call_precision", 1, 7)
    adapter_id = register_candidate(store, "tool_call_precision", 1, live, run_id=1)
    store.query("UPDATE adapters SET state = 'live' WHERE adapter_id = ?", [adapter_id])
    store.close()

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "demo.toml").write_text(
        f'[store]\npath = "{daemon.db_path}"\n'
        f'[model]\nname = "{tiny_model}"\ncache_dir = "{tmp_path / "models"}"\nmax_new_tokens = 8\n'
        "[training]\nmax_length = 2048\n"
    )
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "bench/imitation_baseline.py", "--demo", str(demo), "--examples", "6", "--batches", "1", "--json", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    # Six conversations to imitate, drawn from the four stored ones (two of them twice).
    assert report["data"] == {"successful": 4, "usable": 4, "used": 6, "distinct": 4}
    assert report["targeted"] == ["tool_call_precision@v1"] and report["states"] == {"tool_call_precision@v1": "live"}
    manifest = verify_adapter(demo / "imitation-baseline" / "adapter")
    assert manifest["capability"] == "imitation_baseline" and manifest["recipe"] == "imitation"
    assert manifest["metrics"]["imitation"]["examples"] == 6 and manifest["metrics"]["imitation"]["policy_tokens"] > 0
    # Each arm served the same panel batch: four conversations, counted, with their goal steps.
    assert [arm["arm"] for arm in report["arms"]] == ["base", "targeted", "imitation"]
    assert [arm["model"] for arm in report["arms"]] == ["base", "base", "imitation_baseline@v1"]
    for arm in report["arms"]:
        assert arm["conversations"] == 4 and 0 <= arm["successes"] <= 4
        assert sum(row["conversations"] for row in arm["goal_steps"]) == 4
    assert "| imitation | one adapter trained by imitation on 6 successful conversations (4 distinct) |" in done.stdout
