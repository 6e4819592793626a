"""The router on a real uvicorn server: a tiny random Llama with SmolLM2's tokenizer, real LoRA
adapters saved and verified like trained ones, the official `openai` client, and a real OTLP/HTTP
receiver for its spans. The routing table, hot swaps, errors and the `tracefix router` process are
exercised over HTTP; the tool-call parsing, which a random model never triggers, on given text."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import torch
import transformers  # noqa: F401  (installed by make test: never skipped)
import peft  # noqa: F401  (installed by make test: never skipped)
import openai

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from tracefix.router import protocol  # noqa: E402
from tracefix.router.backend import held_back  # noqa: E402
from tracefix.router.embedded import EmbeddedBackend  # noqa: E402
from tracefix.router.routing import LABELS, classifier_messages  # noqa: E402
from tests.conftest import REPO, free_port, serving_router, wait_for  # noqa: E402
from tests.lora_support import TARGETS, make_adapter  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer import precision  # noqa: E402
from tracefix.trainer.environment import Tool, render_system_prompt  # noqa: E402

TOKEN = "router-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
HELLO = [{"role": "user", "content": "Where is my order?"}]
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "Look an order up by its id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}


class _Receiver(BaseHTTPRequestHandler):
    requests: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            self.requests.append(ExportTraceServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Router:
    url: str
    app: Any
    base_dir: Path
    adapters_dir: Path
    tokenizer: Any
    spans: list[ExportTraceServiceRequest]

    @property
    def client(self) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def admin(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
        headers = ADMIN if headers is None else headers
        return httpx.request(method, f"{self.url}{path}", json=body, headers=headers, timeout=30)

    def load(self, capability: str, version: int, seed: int, description: str = "") -> httpx.Response:
        directory = self.adapters_dir / capability / f"v{version}"
        if not directory.exists():
            make_adapter(self.base_dir, directory, capability, version, seed)
        body = {"capability": capability, "version": version, "path": str(directory), "description": description}
        return self.admin("POST", "/admin/adapters", body)

    def routing(self, mode: str, adapter: str | None = None) -> httpx.Response:
        return self.admin("PUT", "/admin/routing", {"mode": mode, "adapter": adapter})

    def chat(self, **body: Any) -> httpx.Response:
        body = {"model": "base", "messages": HELLO, **body}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)


@pytest.fixture(scope="module")
def base_dir(wide_tiny_model: Path) -> Path:
    return wide_tiny_model


@pytest.fixture(scope="module")
def router(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    _Receiver.requests = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    directory = tmp_path_factory.mktemp("router")
    config = directory / "tracefix.toml"
    config.write_text(
        f'[store]\npath = "{directory / "tracefix.duckdb"}"\n'
        f'[model]\nname = "{base_dir}"\n'
        f'[router]\ntoken = "{TOKEN}"\nrouting = "off"\nmax_batch = 8\nmax_context_tokens = 1024\n'
        f'export_spans = true\notlp_endpoint = "http://127.0.0.1:{receiver.server_address[1]}"\n'
    )
    with serving_router(config) as (url, app, backend):
        yield Router(url, app, base_dir, directory / "adapters", backend.tokenizer, _Receiver.requests)
    receiver.shutdown()


def _prompt_tokens(tokenizer: Any, messages: list[dict[str, Any]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _greedy(router: Router, model: str, **body: Any) -> str:
    response = router.client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=8, temperature=0, seed=3, **body
    )
    return response.choices[0].message.content


# -- the OpenAI API -------------------------------------------------------------------------------


def test_the_official_client_completes_and_streams_the_same_text(router: Router) -> None:
    client = router.client
    response = client.chat.completions.create(model="base", messages=HELLO, max_tokens=6, temperature=0)
    assert response.object == "chat.completion" and response.model == "base"
    assert response.choices[0].finish_reason == "length"
    prompt_tokens = _prompt_tokens(router.tokenizer, HELLO)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_tokens, 6)
    assert response.usage.total_tokens == prompt_tokens + 6
    chunks = list(client.chat.completions.create(
        model="base", messages=HELLO, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert len([text for text in deltas if text]) >= 2  # token by token, not one block
    assert "".join(deltas) == response.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []


def test_the_stream_ends_with_done_after_server_sent_events(router: Router) -> None:
    body = {"model": "base", "messages": HELLO, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: {") for event in events[:-1])


def test_models_lists_the_base_and_each_live_adapter(router: Router) -> None:
    assert router.load("listing", 1, seed=1).status_code == 200
    ids = [model.id for model in router.client.models.list()]
    assert ids[0] == "base" and "listing@v1" in ids
    assert router.client.models.retrieve("listing@v1").id == "listing@v1"
    assert router.admin("DELETE", "/admin/adapters/listing@v1").status_code == 200
    assert "listing@v1" not in [model.id for model in router.client.models.list()]


def test_a_pinned_adapter_answers_differently_from_the_base_for_the_same_seed(router: Router) -> None:
    assert router.load("pinned", 1, seed=2).status_code == 200
    base, adapted = _greedy(router, "base"), _greedy(router, "pinned@v1")
    assert adapted != base
    assert _greedy(router, "pinned@v1") == adapted and _greedy(router, "base") == base
    response = router.client.chat.completions.create(model="pinned@v1", messages=HELLO, max_tokens=2)
    assert response.model == "pinned@v1"


def test_stop_sequences_cut_the_text_before_them(router: Router) -> None:
    text = router.chat(max_tokens=12, temperature=0).json()["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    cut = router.chat(max_tokens=12, temperature=0, stop=[stop]).json()["choices"][0]
    assert cut["message"]["content"] == text[: text.index(stop)]
    assert cut["finish_reason"] == "stop"
    streamed = router.client.chat.completions.create(
        model="base", messages=HELLO, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    joined = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert joined == text[: text.index(stop)]


def test_seeded_sampling_repeats_and_n_gives_distinct_choices(router: Router) -> None:
    first = router.chat(max_tokens=8, temperature=1.0, seed=11, n=3).json()
    again = router.chat(max_tokens=8, temperature=1.0, seed=11, n=3).json()
    texts = [choice["message"]["content"] for choice in first["choices"]]
    assert [choice["index"] for choice in first["choices"]] == [0, 1, 2]
    assert texts == [choice["message"]["content"] for choice in again["choices"]]
    assert len(set(texts)) == 3
    assert first["usage"]["completion_tokens"] == 24
    other = router.chat(max_tokens=8, temperature=1.0, seed=12).json()["choices"][0]["message"]["content"]
    assert other != texts[0]


# -- tool calls -----------------------------------------------------------------------------------


def test_a_tool_call_in_the_model_text_becomes_openai_tool_calls() -> None:
    text = 'Let me look. <tool_call>{"name": "get_order", "arguments": {"order_id": "A-17"}}</tool_call>'
    built = protocol.completion("chatcmpl-1", 1, "base", [protocol.choice(0, text, "stop", tools=True)], 10, 5)
    parsed = openai.types.chat.ChatCompletion.model_validate(built)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_order" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"order_id": "A-17"}
    bare = protocol.choice(0, '{"name": "get_order", "arguments": {"order_id": "B-2"}}', "stop", tools=True)
    assert bare["message"]["content"] is None and bare["message"]["tool_calls"][0]["function"]["name"] == "get_order"
    # Without tools in the request the same text is only text.
    assert protocol.choice(0, text, "stop", tools=False)["message"] == {"role": "assistant", "content": text}
    broken = protocol.choice(0, '<tool_call>{"name": "get_order", "arguments": </tool_call>', "stop", tools=True)
    assert "tool_calls" not in broken["message"] and broken["finish_reason"] == "stop"


def test_streamed_text_that_becomes_a_tool_call_is_held_back_and_sent_as_tool_calls() -> None:
    stream = protocol.ChoiceStream(tools=True)
    pieces = ["Checking", " now. <to", 'ol_call>{"name": "get_order", ', '"arguments": {"order_id": "A1"}}</tool_call>']
    sent = [stream.feed(piece) for piece in pieces]
    assert "".join(sent) == "Checking now. "
    assert sent[1] == " now. "  # "<to" might start a tag: held until it does
    rest, calls = stream.finish()
    assert rest == "" and calls[0]["function"] == {"name": "get_order", "arguments": '{"order_id":"A1"}'}
    prose = protocol.ChoiceStream(tools=True)
    assert prose.feed("a <toy") == "a <toy" and prose.finish() == ("", [])
    plain = protocol.ChoiceStream(tools=False)
    assert plain.feed("<tool_call>{}") == "<tool_call>{}"
    event = protocol.chunk("c", 1, "base", [protocol.delta(0, {"tool_calls": [{"index": 0, **calls[0]}]})])
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    parsed = openai.types.chat.ChatCompletionChunk.model_validate(json.loads(event[len(b"data: ") :]))
    assert parsed.choices[0].delta.tool_calls[0].function.name == "get_order"


def test_tools_and_tool_history_are_rendered_into_the_prompt(router: Router) -> None:
    history = [
        {"role": "system", "content": "You are a shop assistant."},
        {"role": "user", "content": "Where is order A1?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "A1"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    ]  # fmt: skip
    response = router.client.chat.completions.create(
        model="base", messages=history, tools=[ORDER_TOOL], tool_choice="auto", max_tokens=4
    )
    system = render_system_prompt("You are a shop assistant.", [Tool.from_definition(ORDER_TOOL)])
    expected = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Where is order A1?"},
        {"role": "assistant", "content": '<tool_call>{"name":"get_order","arguments":{"order_id":"A1"}}</tool_call>'},
        {"role": "tool", "content": '{"status": "shipped"}'},
    ]
    assert response.usage.prompt_tokens == _prompt_tokens(router.tokenizer, expected)
    assert response.choices[0].finish_reason in ("length", "stop", "tool_calls")
    without = router.client.chat.completions.create(
        model="base", messages=history, tools=[ORDER_TOOL], tool_choice="none", max_tokens=1
    )
    assert without.usage.prompt_tokens < response.usage.prompt_tokens
    streamed = list(router.client.chat.completions.create(
        model="base", messages=history, tools=[ORDER_TOOL], max_tokens=4, stream=True
    ))  # fmt: skip
    assert streamed[-1].choices[0].finish_reason in ("length", "stop", "tool_calls")


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "no-such-model"}, 404, "model_not_found", "model"),
        ({"messages": []}, 400, None, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, None, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, 400, None, "messages[0]"),
        ({"messages": "hello"}, 400, None, "messages"),
        ({"temperature": "hot"}, 400, None, "temperature"),
        ({"max_tokens": "5"}, 400, None, "max_tokens"),
        ({"temperature": 3}, 400, None, "temperature"),
        ({"n": 99}, 400, None, "n"),
        ({"metadata": {"conversation_id": 7}}, 400, None, "metadata.conversation_id"),
        ({"metadata": {f"key{index}": "value" for index in range(17)}}, 400, None, "metadata"),
        ({"metadata": {"conversation_id": "c" * 513}}, 400, None, "metadata"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [ORDER_TOOL]}, 400, None, None),
        ({"max_tokens": 100_000}, 400, "context_length_exceeded", "messages"),
        ({"messages": [{"role": "user", "content": "word " * 2000}]}, 400, "context_length_exceeded", "messages"),
    ],
)
def test_bad_requests_get_openai_errors(
    router: Router, body: dict[str, Any], status: int, code: str | None, param: str | None
) -> None:
    response = router.chat(**body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


def test_the_client_raises_typed_errors_and_the_server_keeps_serving(router: Router) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        router.client.chat.completions.create(model="gpt-none", messages=HELLO)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        image = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
        router.client.chat.completions.create(model="base", messages=[{"role": "user", "content": image}])
    invalid = httpx.post(f"{router.url}/v1/chat/completions", content=b"{not json", timeout=10)
    assert invalid.status_code == 400 and "JSON" in invalid.json()["error"]["message"]
    huge = httpx.post(f"{router.url}/v1/chat/completions", content=b"x" * (9 * 1024 * 1024), timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
    unknown = httpx.get(f"{router.url}/v2/nothing", timeout=10)
    assert unknown.status_code == 404 and "error" in unknown.json()
    assert router.chat(max_tokens=1).status_code == 200
    assert httpx.get(f"{router.url}/healthz").json()["status"] == "ok"


# -- admin, routing and hot swaps -----------------------------------------------------------------


def test_admin_calls_without_the_token_are_refused(router: Router) -> None:
    calls = [
        ("POST", "/admin/adapters", {"capability": "x", "version": 1, "path": "/tmp", "description": ""}),
        ("DELETE", "/admin/adapters/x@v1", None),
        ("PUT", "/admin/routing", {"mode": "off"}),
        ("GET", "/admin/routing", None),
    ]
    for method, path, body in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = router.admin(method, path, body, headers=headers)
            assert response.status_code == 401, (method, path)
            assert response.json()["error"]["type"] == "authentication_error"
    assert router.admin("GET", "/admin/routing").status_code == 200


def test_routing_modes_off_fixed_and_their_refusals(router: Router) -> None:
    assert router.load("fixedcap", 1, seed=3).status_code == 200
    assert router.routing("fixed", "fixedcap").json()["fixed"] == "fixedcap"
    assert router.chat(max_tokens=1).json()["model"] == "fixedcap@v1"
    assert router.routing("fixed", "base").status_code == 200
    assert router.chat(max_tokens=1).json()["model"] == "base"
    assert router.routing("fixed", "fixedcap@v1").status_code == 200
    assert router.chat(max_tokens=1).json()["model"] == "fixedcap@v1"
    assert router.routing("off").json()["mode"] == "off"
    assert router.chat(max_tokens=1).json()["model"] == "base"
    for body, fragment in [
        ({"mode": "sideways"}, "unknown routing mode"),
        ({"mode": "fixed"}, "needs 'adapter'"),
        ({"mode": "fixed", "adapter": "ghost"}, "not a live or canary adapter"),
        ({"mode": "off", "adapter": "fixedcap"}, "applies to mode 'fixed' only"),
    ]:
        response = router.admin("PUT", "/admin/routing", body)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], body
    assert router.admin("GET", "/admin/routing").json()["mode"] == "off"
    assert router.admin("DELETE", "/admin/adapters/fixedcap@v1").status_code == 200
    assert router.admin("DELETE", "/admin/adapters/fixedcap@v1").status_code == 404
    assert router.chat(model="fixedcap@v1").status_code == 404


def test_a_canary_splits_conversations_by_their_id_and_keeps_each_on_its_arm(router: Router) -> None:
    """With `metadata.conversation_id` the canary's share is a share of conversations, whatever
    their words (permuted blocks: exactly half of 40 at 0.5); without it, a conversation's first
    user turn decides its arm, so conversations that open alike all land on one arm."""
    directory = router.adapters_dir / "split" / "v1"
    make_adapter(router.base_dir, directory, "split", 1, 7)
    body = {"capability": "split", "version": 1, "path": str(directory), "canary": 0.5}
    assert router.admin("POST", "/admin/adapters", body).status_code == 200
    assert router.routing("fixed", "split").status_code == 200

    def served(conversation: str | None) -> str:
        metadata = {"metadata": {"conversation_id": conversation}} if conversation else {}
        response = router.chat(max_tokens=1, **metadata)
        assert response.status_code == 200, response.text
        return response.json()["model"]

    arms = {f"c-{index}": served(f"c-{index}") for index in range(40)}  # the same words, 40 conversations
    assert list(arms.values()).count("split@v1") == 20 and set(arms.values()) == {"split@v1", "base"}
    assert all(served(conversation) == arm for conversation, arm in list(arms.items())[:10])  # each keeps its arm
    assert len({served(None) for _ in range(6)}) == 1  # without an id: one arm for the same first turn
    router.routing("off")
    assert router.admin("DELETE", "/admin/adapters/split@v1").status_code == 200


def test_gate_mode_needs_the_gate_module_and_a_gate_for_live_adapters(
    router: Router, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tracefix.trainer.gate", None)  # as if trainer.gate were not installed
    refused = router.admin("PUT", "/admin/routing", {"mode": "gate", "gate": str(tmp_path / "gate.safetensors")})
    assert refused.status_code == 400 and "tracefix.trainer.gate" in refused.json()["error"]["message"]
    monkeypatch.undo()
    from tracefix.trainer.gate import GatedExperts

    names = ["gatea@v1", "gateb@v1"]
    for index, name in enumerate(names):
        assert router.load(name.split("@")[0], 1, seed=20 + index).status_code == 200
    config = LoraConfig(r=4, target_modules=TARGETS)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(router.base_dir), config, adapter_name=names[0])
    model.add_adapter(names[1], config)
    GatedExperts(model, names).save(tmp_path / "gate.safetensors")
    strangers = get_peft_model(AutoModelForCausalLM.from_pretrained(router.base_dir), config, adapter_name="ghost@v1")
    GatedExperts(strangers, ["ghost@v1"]).save(tmp_path / "ghost.safetensors")
    missing = router.admin("PUT", "/admin/routing", {"mode": "gate", "gate": str(tmp_path / "ghost.safetensors")})
    assert missing.status_code == 400 and "ghost@v1" in missing.json()["error"]["message"]
    accepted = router.admin("PUT", "/admin/routing", {"mode": "gate", "gate": str(tmp_path / "gate.safetensors")})
    assert accepted.status_code == 200 and accepted.json()["gate"]["adapters"] == names
    from prometheus_client import REGISTRY

    def gate_tokens() -> float:
        return sum(REGISTRY.get_sample_value("tracefix_router_gate_tokens_total", {"expert": name}) or 0.0 for name in ["base", *names])

    before = gate_tokens()
    response = router.chat(max_tokens=3)
    assert response.status_code == 200 and response.json()["model"] == "gate"
    # The gate's per-token expert weights share out exactly the completion's tokens.
    assert gate_tokens() - before == pytest.approx(response.json()["usage"]["completion_tokens"], abs=1e-3)
    assert router.chat(model="gatea@v1", max_tokens=2).json()["model"] == "gatea@v1"  # pinning still works
    # Replacing a version the gate was trained with falls back to classifier routing.
    assert router.load("gatea", 2, seed=30).status_code == 200
    assert router.admin("GET", "/admin/routing").json()["mode"] == "classifier"
    for name in ("gatea@v2", "gateb@v1"):
        assert router.admin("DELETE", f"/admin/adapters/{name}").status_code == 200
    assert router.routing("off").status_code == 200


def test_the_classifier_picks_the_label_with_the_highest_base_logit(router: Router) -> None:
    descriptions = {
        "billing": "Questions about invoices, refunds and payments.",
        "shipping": "Tracking parcels and delivery dates.",
        "returns": "Sending items back and exchanges.",
    }
    for index, (capability, description) in enumerate(descriptions.items()):
        assert router.load(capability, 1, seed=40 + index, description=description).status_code == 200
    assert router.routing("classifier").status_code == 200
    table = router.admin("GET", "/admin/routing").json()
    live = sorted(table["capabilities"].items())
    by_name = {adapter["name"]: adapter["description"] for adapter in table["adapters"]}
    options = [(LABELS[index], by_name[name]) for index, (_, name) in enumerate(live)]
    label_ids = [router.tokenizer(label, add_special_tokens=False)["input_ids"][0] for label, _ in options]
    label_ids.append(router.tokenizer("base", add_special_tokens=False)["input_ids"][0])
    # A copy independent of the router's, in the dtype it serves in (bfloat16 where the CPU has it),
    # multiplying as the router's does: some of the labels' logits are near ties.
    dtype = precision.torch_dtype(precision.resolve("auto", "cpu"))
    base = AutoModelForCausalLM.from_pretrained(router.base_dir, dtype=dtype).eval()
    models.prepare_products(base)
    expected_by_prompt = {}
    for prompt in [f"Request {index}: " + word for index, word in enumerate(
        ["my invoice is wrong", "where is my parcel", "I want to send it back", "hello", "refund please",
         "delivery date?", "exchange size", "what is two plus two", "cancel everything", "is it raining"]
    )]:  # fmt: skip
        messages = classifier_messages(prompt, options)
        text = router.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = router.tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = base(torch.tensor([ids])).logits[0, -1]
        best = int(torch.argmax(logits[label_ids]))
        expected_by_prompt[prompt] = live[best][1] if best < len(live) else "base"
    assert len(set(expected_by_prompt.values())) >= 2, expected_by_prompt  # the check can tell choices apart
    for prompt, expected in expected_by_prompt.items():
        messages = [{"role": "user", "content": prompt}]
        response = router.client.chat.completions.create(model="base", messages=messages, max_tokens=1)
        assert response.model == expected, prompt
    assert router.routing("off").status_code == 200
    for capability in descriptions:
        router.admin("DELETE", f"/admin/adapters/{capability}@v1")


def test_a_swap_under_concurrent_streams_fails_no_request_and_retires_the_old_version(router: Router) -> None:
    assert router.load("swapped", 1, seed=50).status_code == 200
    assert router.routing("fixed", "swapped").status_code == 200
    results: dict[int, Any] = {}
    first_chunk = threading.Event()

    def stream(index: int) -> None:
        try:
            chunks = router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=48, stream=True)
            models, text = set(), ""
            for chunk in chunks:
                first_chunk.set()
                models.add(chunk.model)
                text += "".join(choice.delta.content or "" for choice in chunk.choices)
            results[index] = (models, text)
        except Exception as error:  # recorded: the assertion below names it
            results[index] = error

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(24)]
    for thread in threads:
        thread.start()
    assert first_chunk.wait(30)

    def leases() -> int:
        adapters = router.admin("GET", "/admin/routing").json()["adapters"]
        return next(adapter["in_flight"] for adapter in adapters if adapter["name"] == "swapped@v1")

    wait_for(lambda: leases() + len(results) == 24, timeout_s=30)  # every request arrived: holds v1 or finished on it
    swap = router.load("swapped", 2, seed=51)
    assert swap.status_code == 200 and swap.json()["replaced"] == "swapped@v1"
    during = {adapter["name"]: adapter for adapter in router.admin("GET", "/admin/routing").json()["adapters"]}
    assert during["swapped@v1"]["state"] == "retiring" and during["swapped@v1"]["in_flight"] > 0
    after = [router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=2).model for _ in range(3)]
    for thread in threads:
        thread.join(60)
    failures = {index: result for index, result in results.items() if isinstance(result, Exception)}
    assert not failures and len(results) == 24
    assert all(result[0] == {"swapped@v1"} and result[1] for result in results.values())  # kept their version
    assert after == ["swapped@v2"] * 3
    deadline = time.monotonic() + 10
    while "swapped@v1" in router.app.state.backend.loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "swapped@v1" not in router.app.state.backend.loaded
    assert "swapped@v1" not in [adapter["name"] for adapter in router.admin("GET", "/admin/routing").json()["adapters"]]
    assert [model.id for model in router.client.models.list() if model.id.startswith("swapped")] == ["swapped@v2"]
    assert router.routing("off").status_code == 200


def test_a_client_that_leaves_mid_stream_releases_its_adapter_version(router: Router) -> None:
    assert router.load("leaver", 1, seed=60).status_code == 200
    body = {"model": "leaver@v1", "messages": HELLO, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=30) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        adapters_now = router.admin("GET", "/admin/routing").json()["adapters"]
        if next(a for a in adapters_now if a["name"] == "leaver@v1")["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert router.admin("DELETE", "/admin/adapters/leaver@v1").json()["in_flight"] == 0
    assert "leaver@v1" not in router.app.state.backend.loaded


def test_a_damaged_or_foreign_adapter_is_refused_and_the_old_version_keeps_serving(
    router: Router, tmp_path: Path
) -> None:
    assert router.load("kept", 1, seed=70).status_code == 200
    good = router.adapters_dir / "kept" / "v1"
    damaged = tmp_path / "kept-v2"
    shutil.copytree(good, damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    (damaged / "manifest.json").write_text(json.dumps({**manifest, "version": 2}))
    weights = damaged / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    refused = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 2, "path": str(damaged)})
    assert refused.status_code == 422 and "sha256" in refused.json()["error"]["message"]
    foreign_base = models.tiny_random_model(tmp_path / "other-base", router.tokenizer, seed=1)
    foreign = make_adapter(foreign_base, tmp_path / "foreign", "kept", 3, seed=71)
    refused = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 3, "path": str(foreign)})
    assert refused.status_code == 422 and "base model hash" in refused.json()["error"]["message"]
    mislabeled = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 4, "path": str(good)})
    assert mislabeled.status_code == 422 and "not 'kept' v4" in mislabeled.json()["error"]["message"]
    again = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 1, "path": str(good)})
    assert again.status_code == 409
    assert router.admin("GET", "/admin/routing").json()["capabilities"]["kept"] == "kept@v1"
    assert [name for name in router.app.state.backend.loaded if name.startswith("kept@")] == ["kept@v1"]
    assert router.chat(model="kept@v1", max_tokens=2).json()["model"] == "kept@v1"
    router.admin("DELETE", "/admin/adapters/kept@v1")


# -- spans and metrics ----------------------------------------------------------------------------


def test_each_request_exports_a_genai_span_naming_its_adapter(router: Router) -> None:
    assert router.load("traced", 1, seed=80).status_code == 200
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={"model": "traced@v1", "messages": HELLO, "max_tokens": 3, "metadata": {"conversation_id": "c-traced"}},
        headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        timeout=30,
    ).json()
    assert router.chat(model="nobody").status_code == 404
    router.app.state.telemetry.flush()
    spans = [span for request in router.spans for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans]  # fmt: skip
    attributes = {
        span.span_id: {item.key: item.value for item in span.attributes} for span in spans
    }
    ours = next(span for span in spans if span.trace_id.hex() == trace_id)
    values = attributes[ours.span_id]
    assert ours.name == "chat traced@v1" and ours.kind == ours.SPAN_KIND_SERVER
    assert values["gen_ai.operation.name"].string_value == "chat"
    assert values["gen_ai.request.model"].string_value == "traced@v1"
    assert values["gen_ai.response.model"].string_value == "traced@v1"
    assert values["tracefix.router.adapter"].string_value == "traced@v1"
    assert values["gen_ai.conversation.id"].string_value == "c-traced"
    assert values["gen_ai.usage.input_tokens"].int_value == response["usage"]["prompt_tokens"]
    assert values["gen_ai.usage.output_tokens"].int_value == 3
    assert values["gen_ai.response.id"].string_value == response["id"]
    failed = [span for span in spans if span.name == "chat nobody"]
    assert len(failed) == 1 and attributes[failed[0].span_id]["error.type"].string_value == "model_not_found"
    resource = {item.key: item.value.string_value for item in router.spans[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "tracefix-router"
    router.admin("DELETE", "/admin/adapters/traced@v1")


def _metric(text: str, line_start: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def test_metrics_count_requests_tokens_swaps_and_routing_time(router: Router) -> None:
    before = httpx.get(f"{router.url}/metrics").text
    assert router.load("metered", 1, seed=90).status_code == 200
    assert router.chat(model="metered@v1", max_tokens=4).status_code == 200
    assert router.chat(model="metered@v9").status_code == 404
    after = httpx.get(f"{router.url}/metrics").text
    served = 'tracefix_router_requests_total{expert="metered@v1",status="ok"}'
    assert _metric(after, served) == _metric(before, served) + 1
    tokens = 'tracefix_router_tokens_total{expert="metered@v1",kind="completion"}'
    assert _metric(after, tokens) == _metric(before, tokens) + 4
    missing = 'tracefix_router_requests_total{expert="none",status="model_not_found"}'
    assert _metric(after, missing) == _metric(before, missing) + 1
    loaded = 'tracefix_router_swaps_total{outcome="loaded"}'
    assert _metric(after, loaded) == _metric(before, loaded) + 1
    swap_seconds = "tracefix_router_swap_seconds_count"
    assert _metric(after, swap_seconds) == _metric(before, swap_seconds) + 1
    pinned = 'tracefix_router_routing_seconds_count{reason="pinned"}'
    assert _metric(after, pinned) == _metric(before, pinned) + 1
    assert _metric(after, "tracefix_router_in_flight ") == 0
    router.admin("DELETE", "/admin/adapters/metered@v1")


def test_held_back_text_waits_for_a_stop_string_or_a_whole_character() -> None:
    assert held_back("hello wor", ("world!",)) == 3
    assert held_back("hello", ("xyz",)) == 0
    assert held_back("caf\ufffd", ()) == 1


# -- the process ----------------------------------------------------------------------------------


def test_tracefix_router_serves_until_sigterm_then_stops_cleanly(base_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "router.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "tracefix.duckdb"}"\n[model]\nname = "{base_dir}"\n'
        f"[router]\nport = {port}\nexport_spans = false\n"
    )
    log = (tmp_path / "router.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(config)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "router.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        token = (tmp_path / "router.token").read_text().strip()
        assert (tmp_path / "router.token").stat().st_mode & 0o777 == 0o600
        routing = httpx.get(f"http://127.0.0.1:{port}/admin/routing", headers={"Authorization": f"Bearer {token}"})
        assert routing.status_code == 200 and routing.json()["mode"] == "classifier"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = (tmp_path / "router.log").read_text()
    assert "tracefix router stopped" in output and "Traceback" not in output
