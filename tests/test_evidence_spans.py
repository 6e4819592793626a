"""Evidence names one turn: each message of a run points at the span that recorded it.

An instrumented agent resends the whole history with every model call; assembly reads that history
from the last call only. Without attribution every message would carry the last call's span, and a
label's evidence (or the dashboard's marked turn) would name the whole run.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import httpx
import orjson

from tracefix.collectors.agent_runs import AgentRun, trace_request
from tests.conftest import make_daemon

TOOLS = [
    {"type": "function", "function": {"name": "get_reservation", "description": "Read a reservation.",
     "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}},
    {"type": "function", "function": {"name": "cancel_reservation", "description": "Cancel a reservation.",
     "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}},
]  # fmt: skip


def _call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"reservation_id": "R-1001"}'}}


MESSAGES = [
    {"role": "system", "content": "You are an airline agent. Confirm before any change."},
    {"role": "user", "content": "Please cancel reservation R-1001."},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_reservation")]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_reservation", "content": '{"reservation_id": "R-1001", "status": "confirmed"}'},
    {"role": "assistant", "content": "R-1001 is a confirmed flight to Oslo. Shall I cancel it?"},
    {"role": "user", "content": "Yes, go ahead."},
    {"role": "assistant", "content": None, "tool_calls": [_call("c2", "cancel_reservation")]},
    {"role": "tool", "tool_call_id": "c2", "name": "cancel_reservation", "content": '{"status": "cancelled"}'},
    {"role": "assistant", "content": "Done: R-1001 is cancelled."},
]  # fmt: skip


def test_each_message_points_at_the_span_that_recorded_it(tmp_path: Path) -> None:
    run = AgentRun("evidence/run-1", MESSAGES, TOOLS, 1.0, "check")
    request, _ = trace_request(run, 1_700_000_000_000_000_000, "evidence-agent", "evidence-agent")
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    chats = [span["spanId"] for span in spans if span["name"].startswith("chat")]
    tools = [span["spanId"] for span in spans if span["name"].startswith("execute_tool")]
    assert len(chats) == 4 and len(tools) == 2

    daemon = make_daemon(tmp_path, analysis={"interval_s": 0.5}).start()
    try:
        response = httpx.post(f"{daemon.http_url}/v1/traces", content=orjson.dumps(request),
                              headers={"Content-Type": "application/json"}, timeout=10)  # fmt: skip
        assert response.status_code == 200, response.text
        daemon.wait_analyzed()
        trajectory = daemon.get(f"/api/trajectories/{quote(run.run_id, safe='')}")
    finally:
        daemon.stop()

    by_position = {message["position"]: message["span_id"] for message in trajectory["messages"]}
    assert [message["role"] for message in trajectory["messages"]] == [m["role"] for m in MESSAGES]
    expected = {
        1: chats[0],  # the user's request: first read by the first call
        2: chats[0],  # the read it asked for
        3: tools[0],  # the read's result: its tool span
        4: chats[1],  # the proposal
        5: chats[2],  # the user's yes: first read by the third call
        6: chats[2],
        7: tools[1],
        8: chats[3],
    }
    assert {position: by_position[position] for position in expected} == expected
    labels = {label["capability"]: label for label in trajectory["labels"]}
    assert labels["precondition_verification"]["label"] == "PRESENT"
    assert labels["multi_step_completion"]["label"] == "PRESENT"
