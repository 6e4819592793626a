"""The LLM labeler and discovery step against a real local OpenAI-compatible HTTP server.

The server is a FastAPI app served by uvicorn in a background thread on a free 127.0.0.1 port.
It REPLAYS RECORDED FIXTURES from tests/fixtures/llm/*.json — no model runs anywhere in these
tests. The fixtures are hand-written replies in the style of a small instruction-tuned model
(plain JSON, a ```json fence, a <think> block, prose, schema violations, an out-of-range
evidence turn, HTTP errors).

How a request picks its reply:
1. Fixture: every string in the fixture's "match" list must occur in the request's FIRST user
   message (the prompt; retries append messages after it). A fixture with a "model" key matches only
   requests for that model and wins over the others; otherwise the fixture with the most match
   strings wins, and a tie is an error (so fixtures stay unambiguous).
2. Seed: "replies" maps the request's seed (as a string) to a list of replies, "*" for other seeds.
3. Attempt: the number of assistant messages in the request (0 for the first ask, 1 after one
   corrective message, …) indexes that list; the last reply repeats beyond its end.
A reply is a string (the assistant message content) or an object: {"status", "body"} answers with
that HTTP error; {"delay_s", "content"} answers late. A request no fixture matches gets HTTP 400
naming the problem, so a test fails loudly.

The server records every request (JSON body and headers) so tests can assert on the prompt,
the temperature and the seeds.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tracefix.daemon.analysis import llm_client
from tracefix.daemon.analysis.capabilities import Judgement, Label, ToolCall, ToolSpec, Trajectory, Turn
from tracefix.daemon.analysis.discovery import DISCOVERY_SCHEMA, discover_capabilities, snake_case
from tracefix.daemon.analysis.llm_client import ChatClient, LLMOutputError, LLMUnavailable, strip_fences
from tracefix.daemon.analysis.llm_labeler import LABEL_SCHEMA, LLMLabeler, llm_capabilities
from tracefix.daemon.analysis.transcript import render_transcript
from tracefix.daemon.core.settings import ConfigError, CustomCapability, LLMSettings

FIXTURES = Path(__file__).parent / "fixtures" / "llm"


# ---------------------------------------------------------------------------------------------
# The fixture-replaying server


class FixtureServer:
    def __init__(self) -> None:
        self.fixtures = {path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))}
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> FixtureServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fixture server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def select(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        prompt = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        matching = [
            (name, fixture)
            for name, fixture in self.fixtures.items()
            if fixture.get("model", body.get("model")) == body.get("model")
            and all(marker in prompt for marker in fixture["match"])
        ]
        pinned = [item for item in matching if "model" in item[1]]
        if pinned:
            return pinned[0]
        if not matching:
            raise LookupError("no fixture matches the prompt")
        matching.sort(key=lambda item: -len(item[1]["match"]))
        if len(matching) > 1 and len(matching[0][1]["match"]) == len(matching[1][1]["match"]):
            raise LookupError(f"ambiguous fixtures: {matching[0][0]}, {matching[1][0]}")
        return matching[0]

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            self.requests.append({"body": body, "headers": dict(request.headers)})
        try:
            name, fixture = self.select(body)
        except LookupError as error:
            return JSONResponse({"error": {"message": str(error), "type": "BadRequestError"}}, status_code=400)
        replies = fixture["replies"].get(str(body.get("seed")), fixture["replies"]["*"])
        attempt = sum(1 for message in body["messages"] if message["role"] == "assistant")
        reply = replies[min(attempt, len(replies) - 1)]
        if isinstance(reply, dict) and "status" in reply:
            return JSONResponse(reply["body"], status_code=reply["status"])
        if isinstance(reply, dict):
            await asyncio.sleep(reply.get("delay_s", 0))
            reply = reply["content"]
        return JSONResponse(
            {
                "id": f"chatcmpl-{name}-{body.get('seed')}-{attempt}",
                "object": "chat.completion",
                "created": 1718000000,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop", "logprobs": None}
                ],
                "usage": {"prompt_tokens": len(str(body["messages"])) // 4, "completion_tokens": len(reply) // 4,
                          "total_tokens": (len(str(body["messages"])) + len(reply)) // 4},
            }
        )  # fmt: skip

    def prompts(self) -> list[str]:
        return [next(m["content"] for m in r["body"]["messages"] if m["role"] == "user") for r in self.requests]


@pytest.fixture(scope="module")
def _server() -> Iterator[FixtureServer]:
    server = FixtureServer().start()
    yield server
    server.stop()


@pytest.fixture
def server(_server: FixtureServer) -> FixtureServer:
    with _server.lock:
        _server.requests.clear()
    return _server


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_client, "RETRY_BACKOFF_S", 0.0)


def settings_for(server: FixtureServer, **overrides: Any) -> LLMSettings:
    return LLMSettings(base_url=server.base_url, model="qwen2.5-7b-instruct", **overrides)


def client_for(server: FixtureServer, **overrides: Any) -> ChatClient:
    return ChatClient.from_settings(settings_for(server, **overrides), environ={})


# ---------------------------------------------------------------------------------------------
# Trajectories: airline-support conversations with tool calls, built directly


AIRLINE_TOOLS = {
    "get_reservation": ToolSpec(
        "get_reservation", "Read a reservation by id: flights, passengers, fare and status.",
        {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]},
    ),
    "cancel_reservation": ToolSpec(
        "cancel_reservation", "Cancel a reservation. Non-refundable fares get no refund.",
        {"type": "object", "properties": {"reservation_id": {"type": "string"}, "reason": {"type": "string"}},
         "required": ["reservation_id"]},
    ),
    "update_reservation_flights": ToolSpec(
        "update_reservation_flights", "Move a reservation to another flight on a given date.\nCharges the fare difference.",
        {"type": "object", "properties": {"reservation_id": {"type": "string"}, "flight": {"type": "string"},
         "date": {"type": "string"}}, "required": ["reservation_id", "flight", "date"]},
    ),
    "get_policy": ToolSpec("get_policy", "Look up a policy section (baggage, refunds, changes) for a fare class.", None),
}  # fmt: skip

SYSTEM = "You are the support agent of SkyWays airline. Confirm with the user before changing a booking."


def build(trajectory_id: str, outcome: str, steps: list[tuple], tools: dict[str, ToolSpec] | None = None) -> Trajectory:
    """Steps: ("system"|"user"|"say", text) or ("call", tool, args, result, error)."""
    turns: list[Turn] = []
    calls: list[ToolCall] = []

    def add(role: str, content: str, tool_calls: list | None = None, call_id: str | None = None) -> int:
        turns.append(Turn(len(turns), role, content, tool_calls or [], call_id, f"{trajectory_id}-span{len(turns)}"))
        return len(turns) - 1

    for step in steps:
        kind = step[0]
        if kind in ("system", "user"):
            add(kind, step[1])
        elif kind == "say":
            add("assistant", step[1])
        else:
            _, tool, arguments, result, error = step
            call_id = f"call_{len(calls) + 1}"
            text_args = json.dumps(arguments)
            text_result = json.dumps(result) if not isinstance(result, str) else result
            position = add("assistant", "", [{"id": call_id, "name": tool, "arguments": text_args}])
            calls.append(
                ToolCall(len(calls), tool, call_id, text_args, text_result, error, position, f"{trajectory_id}-tool{len(calls)}")
            )
            add("tool", text_result, call_id=call_id)
    return Trajectory(trajectory_id, "skyways-agent", outcome, turns, calls, dict(AIRLINE_TOOLS if tools is None else tools))


RESERVATION = {
    "reservation_id": "R-48213", "status": "confirmed", "fare": "basic_economy", "refundable": False,
    "passengers": [{"name": "Dana Ruiz"}, {"name": "Sam Ruiz"}],
    "flights": [{"flight": "HAT170", "origin": "SFO", "destination": "JFK", "date": "2024-05-21"}],
}  # fmt: skip


def cancel_unconfirmed() -> Trajectory:
    # 0 system, 1 user, 2 → get, 3 tool, 4 → cancel, 5 tool, 6 assistant
    return build("t-cancel-unconfirmed", "failure", [
        ("system", SYSTEM),
        ("user", "Hi, our trip got moved. Please cancel reservation R-48213."),
        ("call", "get_reservation", {"reservation_id": "R-48213"}, RESERVATION, None),
        ("call", "cancel_reservation", {"reservation_id": "R-48213"}, {"reservation_id": "R-48213", "status": "cancelled", "refund": 0}, None),
        ("say", "Done — reservation R-48213 is cancelled. The fare was non-refundable, so no refund applies."),
    ])  # fmt: skip


def cancel_confirmed() -> Trajectory:
    # 0 system, 1 user, 2 → get, 3 tool, 4 ask, 5 user yes, 6 → cancel, 7 tool, 8 assistant
    return build("t-cancel-confirmed", "success", [
        ("system", SYSTEM),
        ("user", "Please cancel reservation R-48213, we can't make it."),
        ("call", "get_reservation", {"reservation_id": "R-48213"}, RESERVATION, None),
        ("say", "R-48213 (SFO→JFK on May 21, 2 passengers) is a basic economy fare and non-refundable.\nShall I cancel it anyway?"),
        ("user", "Yes, go ahead."),
        ("call", "cancel_reservation", {"reservation_id": "R-48213", "reason": "change of plans"}, {"status": "cancelled", "refund": 0}, None),
        ("say", "Reservation R-48213 is cancelled."),
    ])  # fmt: skip


def baggage_policy() -> Trajectory:
    # 0 system, 1 user, 2 → get_policy, 3 tool, 4 assistant
    return build("t-baggage-policy", "success", [
        ("system", SYSTEM),
        ("user", "How many checked bags can I bring on a basic economy fare?"),
        ("call", "get_policy", {"topic": "baggage", "fare_class": "basic_economy"}, {"checked_bags": 0, "carry_on": 1, "fee_first_bag": 35}, None),
        ("say", "Basic economy includes one carry-on and no free checked bag; the first checked bag costs $35."),
    ])  # fmt: skip


def update_error() -> Trajectory:
    # 0 system, 1 user, 2 → get, 3 tool, 4 → update, 5 tool ✗, 6 → update (same), 7 tool ✗, 8 assistant
    failing = {"reservation_id": "R-77120", "flight": "HAT999", "date": "2024-05-24"}
    error = {"error": "flight HAT999 does not operate on 2024-05-24"}
    return build("t-update-error", "failure", [
        ("system", SYSTEM),
        ("user", "Can you move R-77120 to flight HAT999 on May 24?"),
        ("call", "get_reservation", {"reservation_id": "R-77120"}, {**RESERVATION, "reservation_id": "R-77120"}, None),
        ("call", "update_reservation_flights", failing, error, "ToolError: flight not found"),
        ("call", "update_reservation_flights", failing, error, "ToolError: flight not found"),
        ("say", "All set! You are now on HAT999 on May 24."),
    ])  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Transcript rendering


def test_transcript_numbers_turns_and_shows_calls_results_errors_and_tools() -> None:
    text = render_transcript(update_error())
    assert text.startswith("Trajectory: t-update-error (service skyways-agent, 9 turns numbered [0]–[8])")
    assert "- get_reservation: Read a reservation by id: flights, passengers, fare and status." in text
    assert "- update_reservation_flights: Move a reservation to another flight on a given date." in text
    assert "Charges the fare difference" not in text  # one line per tool
    assert "[1] user: Can you move R-77120 to flight HAT999 on May 24?" in text
    assert '[2] assistant → get_reservation({"reservation_id":"R-77120"})' in text
    assert '[3] tool get_reservation ← {"reservation_id":"R-77120","status":"confirmed"' in text
    assert '[5] tool update_reservation_flights ✗ error ← {"error":"flight HAT999 does not operate on 2024-05-24"}' in text
    assert "[7] tool update_reservation_flights ✗ error" in text
    assert "[8] assistant: All set! You are now on HAT999 on May 24." in text
    assert "success" not in text and "failure" not in text  # the outcome is not shown to the labeler


def test_transcript_multiline_content_and_tool_spans_without_messages() -> None:
    trajectory = cancel_confirmed()
    assert "[4] assistant: R-48213 (SFO→JFK on May 21, 2 passengers) is a basic economy fare and non-refundable.\n    Shall I cancel it anyway?" in render_transcript(trajectory)
    # An executed tool span whose result never appeared as a tool message is shown under its turn.
    trajectory.tool_calls.append(
        ToolCall(2, "send_email", None, '{"to": "dana@example.com"}', None, "SMTP timeout", 8, "t-cancel-confirmed-tool2")
    )
    text = render_transcript(trajectory)
    assert '[8] assistant: Reservation R-48213 is cancelled.\n    ↳ send_email({"to":"dana@example.com"}) ✗ error ← SMTP timeout' in text


def test_long_transcripts_are_cut_in_the_middle() -> None:
    steps: list[tuple] = [("system", SYSTEM), ("user", "Find my reservation, I forgot the id. My name is Dana Ruiz.")]
    for index in range(60):
        steps.append(("call", "get_reservation", {"reservation_id": f"R-{10000 + index}"}, {"error": "not found"}, None))
    steps.append(("say", "I could not find a reservation under that name."))
    trajectory = build("t-long", "failure", steps)
    text = render_transcript(trajectory, 3000)
    assert len(text) <= 3000
    assert "[1] user: Find my reservation" in text
    assert "[122] assistant: I could not find a reservation under that name." in text
    assert "omitted from the middle" in text
    assert "R-10030" not in text


# ---------------------------------------------------------------------------------------------
# Labeling


def test_lacking_verdict_maps_evidence_turns_to_span_ids_and_prompt_carries_transcript(server: FixtureServer) -> None:
    settings = settings_for(server)
    description = "Before a state-changing tool call, read the entity and obtain the user's explicit confirmation."
    labeler = LLMLabeler(ChatClient.from_settings(settings, environ={}), "precondition_verification", description, settings)
    judgement = labeler.label(cancel_unconfirmed())

    assert judgement.label is Label.LACKING
    assert judgement.span_ids == ("t-cancel-unconfirmed-span3", "t-cancel-unconfirmed-span4")
    assert "without asking the user to confirm" in judgement.reason
    assert judgement.confidence == 1.0
    assert labeler.name == "llm.qwen2.5-7b-instruct"

    (request,) = server.requests
    body = request["body"]
    assert body["model"] == "qwen2.5-7b-instruct"
    assert body["temperature"] == 0.7 and body["seed"] == 0
    assert body["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    prompt = body["messages"][1]["content"]
    assert "Capability: precondition_verification" in prompt
    assert description in prompt
    assert '[4] assistant → cancel_reservation({"reservation_id":"R-48213"})' in prompt
    assert '"evidence_turns"' in prompt and '"LACKING"' in prompt
    assert "authorization" not in request["headers"]


def test_na_verdict_has_no_evidence(server: FixtureServer) -> None:
    settings = settings_for(server)
    labeler = LLMLabeler(client_for(server), "precondition_verification", "Confirm before writes.", settings)
    judgement = labeler.label(baggage_policy())
    assert judgement == Judgement(
        Label.NA, "The user only asked about the baggage policy; no state-changing tool was needed or called.", (), 1.0
    )


def test_label_runs_uses_seeds_0_to_runs_minus_1_and_accepts_fenced_json(server: FixtureServer) -> None:
    settings = settings_for(server, runs=10, temperature=0.9)
    labeler = LLMLabeler(client_for(server, runs=10), "precondition_verification", "Confirm before writes.", settings)
    judgements = labeler.label_runs(cancel_confirmed())

    assert len(judgements) == 10
    assert [r["body"]["seed"] for r in server.requests] == list(range(10))
    assert {r["body"]["temperature"] for r in server.requests} == {0.9}
    assert [j.label for j in judgements] == [Label.PRESENT] * 7 + [Label.LACKING] + [Label.PRESENT] * 2
    # Seed 3 answered inside a ```json fence: accepted, with its own evidence.
    assert judgements[3].span_ids == ("t-cancel-confirmed-span2", "t-cancel-confirmed-span5", "t-cancel-confirmed-span6")
    assert judgements[0].span_ids == tuple(f"t-cancel-confirmed-span{n}" for n in (2, 4, 5, 6))
    # Every run sends the same prompt; only the seed differs.
    assert len(set(server.prompts())) == 1


def test_invalid_output_is_retried_then_recorded_as_error(server: FixtureServer) -> None:
    settings = settings_for(server, max_retries=2)
    labeler = LLMLabeler(client_for(server), "error_recovery", "Act on tool errors.", settings)
    judgement = labeler.label(update_error())

    assert judgement.label is Label.ERROR
    assert judgement.span_ids == () and judgement.confidence == 0.0
    assert judgement.reason.startswith("invalid output: ")
    assert "evidence_turns" in judgement.reason and "after 3 attempts" in judgement.reason
    assert len(server.requests) == 1 + settings.max_retries
    # Each retry carries the invalid answer and a corrective message naming the problem.
    first_retry = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in first_retry] == ["system", "user", "assistant", "user"]
    assert first_retry[2]["content"].startswith("The agent clearly lacks error recovery")
    assert "not JSON" in first_retry[3]["content"]
    second_retry = server.requests[2]["body"]["messages"]
    assert [m["role"] for m in second_retry] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "schema violation at label" in second_retry[5]["content"]
    assert all(r["body"]["seed"] == 0 for r in server.requests)


def test_max_retries_zero_means_one_request(server: FixtureServer) -> None:
    settings = settings_for(server, max_retries=0)
    judgement = LLMLabeler(client_for(server), "error_recovery", "Act on tool errors.", settings).label(update_error())
    assert judgement.label is Label.ERROR and "not JSON" in judgement.reason
    assert len(server.requests) == 1


def test_a_corrected_answer_after_a_retry_is_accepted(server: FixtureServer) -> None:
    settings = settings_for(server)
    labeler = LLMLabeler(client_for(server), "datetime_reasoning", "Turn user dates into exact dates.", settings)
    judgement = labeler.label(update_error())
    assert judgement.label is Label.PRESENT
    assert judgement.span_ids == ("t-update-error-span1", "t-update-error-span4")
    assert len(server.requests) == 2


def test_evidence_turn_out_of_range_is_invalid(server: FixtureServer) -> None:
    settings = settings_for(server, max_retries=1)
    labeler = LLMLabeler(client_for(server), "structured_data_reasoning", "Use returned values.", settings)
    judgement = labeler.label(update_error())
    assert judgement.label is Label.ERROR
    assert "evidence turn 12 is not in the transcript (turns [0]–[8])" in judgement.reason
    assert len(server.requests) == 2
    assert "evidence turn 12" in server.requests[1]["body"]["messages"][-1]["content"]


def test_http_500_is_retried_then_error_not_raised(server: FixtureServer) -> None:
    settings = settings_for(server, max_retries=2, runs=4)
    client = client_for(server)
    with pytest.raises(LLMUnavailable) as raised:
        client.complete([{"role": "user", "content": "Capability: policy_compliance"}], 0.7, 0)
    assert str(raised.value) == f"HTTP 500 from {server.base_url}/chat/completions: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert raised.value.status == 500 and raised.value.retryable

    server.requests.clear()
    labeler = LLMLabeler(client, "policy_compliance", "Follow the fare rules.", settings)
    judgement = labeler.label(baggage_policy())
    assert judgement.label is Label.ERROR
    assert judgement.reason == f"llm unavailable: HTTP 500 from {server.base_url}/chat/completions: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert len(server.requests) == 1 + settings.max_retries

    # label_runs gives up on an unavailable endpoint after the first run's retries.
    server.requests.clear()
    judgements = labeler.label_runs(baggage_policy())
    assert [j.label for j in judgements] == [Label.ERROR] * 4
    assert len(server.requests) == 1 + settings.max_retries


def test_client_errors_are_not_retried(server: FixtureServer) -> None:
    settings = LLMSettings(base_url=server.base_url, model="no-such-model")
    judgement = LLMLabeler(ChatClient.from_settings(settings, environ={}), "x_cap", "X.", settings).label(baggage_policy())
    assert judgement.label is Label.ERROR
    assert judgement.reason == f"llm unavailable: HTTP 404 from {server.base_url}/chat/completions: The model `no-such-model` does not exist."
    assert len(server.requests) == 1


def test_connection_refused_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    settings = LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=2)
    client = ChatClient.from_settings(settings, environ={})
    with pytest.raises(LLMUnavailable) as raised:
        client.complete([{"role": "user", "content": "hi"}], 0.7, 0)
    assert str(raised.value).startswith(f"cannot reach http://127.0.0.1:{port}/v1/chat/completions: ")
    assert "refused" in str(raised.value).lower()
    judgement = LLMLabeler(client, "x_cap", "X.", settings).label(baggage_policy())
    assert judgement.label is Label.ERROR and judgement.reason.startswith("llm unavailable: cannot reach")


def test_timeout_is_a_clear_error(server: FixtureServer) -> None:
    settings = settings_for(server, timeout_s=0.2, max_retries=1)
    judgement = LLMLabeler(client_for(server, timeout_s=0.2), "slow_probe", "X.", settings).label(baggage_policy())
    assert judgement.label is Label.ERROR
    assert judgement.reason == f"llm unavailable: timeout after 0.2s: POST {server.base_url}/chat/completions"
    assert len(server.requests) == 2


def test_api_key_comes_from_the_named_environment_variable(server: FixtureServer) -> None:
    settings = settings_for(server, api_key_env="MY_LLM_KEY")
    client = ChatClient.from_settings(settings, environ={"MY_LLM_KEY": "sk-local-123"})
    LLMLabeler(client, "precondition_verification", "Confirm before writes.", settings).label(baggage_policy())
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-local-123"


def test_version_is_stable_and_changes_with_description_and_model() -> None:
    settings = LLMSettings()
    client = ChatClient("http://127.0.0.1:9/v1", "base")
    one = LLMLabeler(client, "precondition_verification", "Confirm before writes.", settings)
    same = LLMLabeler(client, "precondition_verification", "Confirm before writes.", settings)
    reworded = LLMLabeler(client, "precondition_verification", "Read the entity and confirm before writes.", settings)
    other_model = LLMLabeler(client, "precondition_verification", "Confirm before writes.", LLMSettings(model="qwen3-30b"))
    assert one.version == same.version and len(one.version) == 12
    assert reworded.version != one.version
    assert other_model.version != one.version and other_model.name == "llm.qwen3-30b"


def test_strip_fences() -> None:
    assert strip_fences('```json\n{"a": 1}\n```') == '{"a": 1}'
    assert strip_fences('Here you go:\n```\n{"a": 1}\n```\nHope it helps') == '{"a": 1}'
    assert strip_fences('<think>hmm</think>\n{"a": 1}') == '{"a": 1}'
    assert strip_fences('{"a": 1}') == '{"a": 1}'


def test_schemas_are_valid_json_schemas() -> None:
    jsonschema.Draft202012Validator.check_schema(LABEL_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(DISCOVERY_SCHEMA)
    label = jsonschema.Draft202012Validator(LABEL_SCHEMA)
    assert label.is_valid({"label": "LACKING", "reason": "no read", "evidence_turns": [3]})
    assert not label.is_valid({"label": "MAYBE", "reason": "?", "evidence_turns": []})
    discovery = jsonschema.Draft202012Validator(DISCOVERY_SCHEMA)
    assert discovery.is_valid({"capabilities": []})
    assert not discovery.is_valid({"capabilities": "none"})


# ---------------------------------------------------------------------------------------------
# Discovery


def test_discovery_returns_validated_normalised_deduplicated_capped_capabilities(server: FixtureServer) -> None:
    settings = settings_for(server)
    found = discover_capabilities(
        client_for(server), [cancel_confirmed(), baggage_policy()], [cancel_unconfirmed(), update_error()], 10, settings
    )
    names = [item["name"] for item in found]
    assert names == [
        "precondition_verification", "error_recovery", "tool_call_precision", "outcome_truthfulness",
        "argument_grounding", "multi_step_completion", "structured_data_reasoning", "datetime_reasoning",
        "policy_adherence", "user_intent_clarification",
    ]  # fmt: skip
    assert found[0]["description"].startswith("Before a state-changing call, read the entity")  # first of the duplicates
    assert all(set(item) == {"name", "description"} for item in found)

    (request,) = server.requests
    prompt = request["body"]["messages"][1]["content"]
    assert "2 FAILED and 2 SUCCESSFUL runs" in prompt
    assert "=== FAILED run 1 of 2 ===\nTrajectory: t-cancel-unconfirmed" in prompt
    assert "=== SUCCESSFUL run 2 of 2 ===\nTrajectory: t-baggage-policy" in prompt
    assert prompt.index("FAILED run 2 of 2") < prompt.index("SUCCESSFUL run 1 of 2")
    assert "up to 10 general capabilities" in prompt


def test_discovery_drops_known_capabilities_and_respects_a_smaller_cap(server: FixtureServer) -> None:
    found = discover_capabilities(
        client_for(server), [cancel_confirmed()], [cancel_unconfirmed(), update_error()], 3, settings_for(server),
        known={"tool_call_precision": "Calls match the declared tools.", "error_recovery": "Act on tool errors."},
    )  # fmt: skip
    assert [item["name"] for item in found] == ["precondition_verification", "outcome_truthfulness", "argument_grounding"]
    prompt = server.prompts()[0]
    assert "already tracked" in prompt and "- tool_call_precision: Calls match the declared tools." in prompt


def test_discovery_invalid_output_raises_after_retries(server: FixtureServer) -> None:
    settings = settings_for(server, max_retries=2)
    with pytest.raises(LLMOutputError) as raised:
        discover_capabilities(client_for(server), [cancel_confirmed()], [cancel_unconfirmed()], settings=settings)
    assert raised.value.attempts == 3
    assert raised.value.reason.startswith("not JSON")
    assert len(server.requests) == 3
    assert "schema violation at capabilities/0: 'description' is a required property" in server.requests[1]["body"]["messages"][-1]["content"]


def test_discovery_samples_a_bounded_seeded_number_of_runs(server: FixtureServer) -> None:
    failures = [cancel_unconfirmed()] + [
        build(f"t-extra-fail-{n}", "failure", [("user", f"Cancel R-{n}0001 please."), ("say", "Done.")]) for n in range(6)
    ]
    for _ in range(2):
        found = discover_capabilities(
            client_for(server), [cancel_confirmed()], failures, settings=settings_for(server), samples_per_outcome=2, seed=5
        )
        assert found == []  # the fixture's model found nothing general
    first, second = server.prompts()
    assert first == second  # the sample is seeded
    assert first.count("=== FAILED run") == 2 and "2 FAILED and 1 SUCCESSFUL runs" in first


def test_snake_case() -> None:
    assert snake_case("Tool-Calling Precision") == "tool_calling_precision"
    assert snake_case("toolCallingPrecision") == "tool_calling_precision"
    assert snake_case("HTTPErrorRecovery") == "http_error_recovery"
    assert snake_case("  __permission  error__ ") == "permission_error"


# ---------------------------------------------------------------------------------------------
# Settings and registry glue


def test_settings_defaults_and_validation() -> None:
    settings = LLMSettings()
    assert (settings.enabled, settings.runs, settings.temperature, settings.max_retries) == (False, 10, 0.7, 2)
    assert (settings.concurrency, settings.calls_per_minute) == (4, 60)
    assert settings.base_url == "http://127.0.0.1:8000/v1" and settings.model == "base"
    for model in (LLMSettings, CustomCapability):
        assert all(field.description for field in model.model_fields.values()), model
    with pytest.raises(ValidationError, match="snake_case"):
        CustomCapability(name="Permission Recovery", description="x")
    with pytest.raises(ValidationError, match="defined twice"):
        LLMSettings(custom=[{"name": "a_cap", "description": "x"}, {"name": "a_cap", "description": "y"}])
    with pytest.raises(ValidationError):
        LLMSettings(unknown_key=1)
    with pytest.raises(ValidationError):
        LLMSettings(runs=0)
    for invalid in ({"concurrency": 0}, {"concurrency": 65}, {"calls_per_minute": -1}):
        with pytest.raises(ValidationError):
            LLMSettings(**invalid)


def test_llm_capabilities_builds_custom_capabilities() -> None:
    custom = [
        {"name": "permission_error_recovery", "description": "Ask for or obtain a missing permission after a permission error."},
        {"name": "datetime_reasoning", "description": "Resolve relative dates correctly.", "environment_family": "datetime"},
    ]
    assert llm_capabilities(LLMSettings(custom=custom), {}) == []  # disabled
    settings = LLMSettings(enabled=True, custom=custom)
    capabilities = llm_capabilities(settings, {"tool_call_precision": "…"})
    assert [(c.name, c.builtin, c.environment_family) for c in capabilities] == [
        ("permission_error_recovery", False, None), ("datetime_reasoning", False, "datetime"),
    ]  # fmt: skip
    labeler = capabilities[1].labeler
    assert isinstance(labeler, LLMLabeler) and labeler.description == "Resolve relative dates correctly."
    assert hasattr(labeler, "label_runs")
    assert labeler.deferred  # judged beside the analysis pass, never inside it
    assert labeler.client.budget.calls == settings.calls_per_minute
    with pytest.raises(ConfigError, match="tool_call_precision"):
        llm_capabilities(
            LLMSettings(enabled=True, custom=[{"name": "tool_call_precision", "description": "x"}]), {"tool_call_precision": "…"}
        )



def test_custom_capabilities_with_the_llm_off_are_reported_not_dropped_silently() -> None:
    from tracefix.daemon.analysis.registry import build_registry
    from tracefix.daemon.core.settings import CapabilitySettings

    custom = [{"name": "datetime_reasoning", "description": "Resolve relative dates correctly."}]
    registry = build_registry(CapabilitySettings(), LLMSettings(custom=custom))
    assert "datetime_reasoning" not in registry
    assert any("datetime_reasoning" in error and "enabled = false" in error for error in registry.errors)
    assert build_registry(CapabilitySettings(), LLMSettings()).errors == []
