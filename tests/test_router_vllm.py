"""The router's `vllm` backend (router/vllm.py) against a stand-in for vLLM, including a vLLM that dies
and comes back having forgotten its adapters (the router loads them again).

vLLM needs a GPU and cannot run on the CPU machine these tests run on, so `FakeVllm` below stands
in for it: an HTTP server on a free loopback port that answers the endpoints the backend uses the
way vLLM's OpenAI server (``vllm serve <dir> --enable-lora --max-lora-rank 16`` with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) answers them — ``GET /v1/models``, ``POST
/v1/completions`` (streamed with continuous usage, and the classifier's one-token call with
``allowed_token_ids`` and logprobs), ``POST /v1/load_lora_adapter`` and ``POST
/v1/unload_lora_adapter`` — records every request, and writes text that names the model it was
asked for. It is not vLLM: it applies no weights. Everything on the router's side is real: the
`tracefix router` process with backend 'vllm', adapters saved and verified like trained ones, the
official openai client. bench/gpu_check.sh runs the same path against a real vLLM on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import torch  # noqa: F401  (installed by make test: never skipped)
import transformers  # noqa: F401  (installed by make test: never skipped)
import peft  # noqa: F401  (installed by make test: never skipped)
import openai

from transformers import AutoTokenizer  # noqa: E402

from tracefix.router.routing import LABELS  # noqa: E402
from tracefix.router.vllm import ADMIN_S, CONNECT_S, _error_text  # noqa: E402
from tests.conftest import REPO, free_port, wait_for  # noqa: E402
from tests.lora_support import TARGETS, make_adapter  # noqa: E402
from tracefix.trainer import adapters  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402

TOKEN = "vllm-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
HELLO = [{"role": "user", "content": "Where is my order?"}]
WORDS = 6  # the stand-in ends a choice after this many pieces with finish_reason "stop"
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "Look an order up by its id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}
TOOL_REPLY = 'Checking. <tool_call>{"name": "get_order", "arguments": {"order_id": "A1"}}</tool_call>'


class FakeVllm:
    """Stands in for a vLLM OpenAI server with runtime LoRA updating (see the module docstring)."""

    def __init__(self, model_dir: Path, tokenizer: Any, port: int, max_lora_rank: int = 16) -> None:
        self.model_dir, self.tokenizer, self.port = model_dir, tokenizer, port
        self.served = str(model_dir)  # `vllm serve <dir>` serves the model under the directory's path
        self.max_lora_rank = max_lora_rank
        self.max_model_len = 2048
        self.loras: dict[str, str] = {}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.aborted = 0  # streams whose client closed the connection before the end
        self.delay = 0.01  # seconds between streamed chunks
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeVllm:
        handler = type("Handler", (_VllmHandler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def restart(self) -> None:
        """Start again on the same port having forgotten every adapter, as a restarted vLLM has."""
        self.stop()
        self.loras.clear()
        self.start()

    def calls(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for called, body in self.requests if called == path]

    def generations(self) -> list[dict[str, Any]]:
        return [body for body in self.calls("/v1/completions") if body.get("stream")]

    def record(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append((path, body))

    # -- what vLLM answers ------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        card = {"object": "model", "created": 0, "owned_by": "vllm", "max_model_len": self.max_model_len}
        data = [{**card, "id": self.served, "root": self.served, "parent": None}]
        data += [{**card, "id": name, "root": path, "parent": self.served} for name, path in self.loras.items()]
        return {"object": "list", "data": data}

    def load(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return 400, _error("Both 'lora_name' and 'lora_path' must be provided.", "BadRequestError", 400)
        if name in self.loras:
            message = (
                f"The lora adapter '{name}' has already been loaded. "
                "If you want to load the adapter in place, set 'load_inplace' to True."
            )
            return 400, _error(message, "BadRequestError", 400)
        config = Path(path) / "adapter_config.json"
        if not config.is_file():
            return 404, _error(f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404)
        rank = json.loads(config.read_text())["r"]
        if rank > self.max_lora_rank:
            message = f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            return 500, _error(message, "InternalServerError", 500)
        self.loras[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name")
        if name not in self.loras:
            return 404, _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del self.loras[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def classify(self, body: dict[str, Any]) -> dict[str, Any]:
        """The one-token classifier call: the label whose description shares most words with the
        first user turn scores highest (a model that reads), "base" when none shares any."""
        text = self.tokenizer.decode(body["prompt"])
        user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        descriptions = dict(re.findall(r"^([A-Z]): (.*)$", text, re.MULTILINE))
        overlap = {label: len(_words(description) & _words(user)) for label, description in descriptions.items()}
        best = max(overlap, key=overlap.__getitem__) if overlap and max(overlap.values()) else "base"
        allowed = body["allowed_token_ids"]
        decoded = {token: self.tokenizer.decode([token]) for token in allowed}
        chosen = next(token for token, piece in decoded.items() if piece == best)

        def key(token: int) -> str:
            return f"token_id:{token}" if body.get("return_tokens_as_token_ids") else decoded[token]

        # As vLLM's raw logprobs: the top entries include tokens outside allowed_token_ids.
        top = {"token_id:0" if body.get("return_tokens_as_token_ids") else "<|endoftext|>": -0.01}
        top |= {key(token): (-0.5 if token == chosen else -6.0 - index / 10) for index, token in enumerate(allowed)}
        top = dict(list(top.items())[: body["logprobs"]])
        logprobs = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": [key(chosen)], "top_logprobs": [top]}
        choice = {"index": 0, "text": decoded[chosen], "logprobs": logprobs, "finish_reason": "length"}
        usage = _usage(len(body["prompt"]), 1)
        return _completion(body["model"], [choice], usage)

    def pieces(self, body: dict[str, Any], index: int) -> tuple[list[str], str]:
        """What one choice writes: its model's name then words, or a tool call when offered the tool."""
        if "get_order" in self.tokenizer.decode(body["prompt"]):
            pieces = [TOOL_REPLY[start : start + 12] for start in range(0, len(TOOL_REPLY), 12)]
        else:
            label = "base" if body["model"] == self.served else body["model"]
            pieces = [f"<{label}#{index}>"] + [f" w{word}" for word in range(1, WORDS)]
        if len(pieces) > body["max_tokens"]:
            return pieces[: body["max_tokens"]], "length"
        return pieces, "stop"


class _VllmHandler(BaseHTTPRequestHandler):
    fake: FakeVllm

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = body.encode() if isinstance(body, str) else orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._answer(200, self.fake.models())
        else:
            self._answer(404, _error("Not Found", "NotFoundError", 404))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fake = self.fake
        fake.record(self.path, body)
        if self.path == "/v1/load_lora_adapter":
            self._answer(*fake.load(body))
        elif self.path == "/v1/unload_lora_adapter":
            self._answer(*fake.unload(body))
        elif self.path != "/v1/completions":
            self._answer(404, _error("Not Found", "NotFoundError", 404))
        elif body.get("model") not in (fake.served, *fake.loras):
            self._answer(404, _error(f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404, "model"))
        elif not isinstance(body.get("prompt"), list):
            self._answer(400, _error("the router sends token ids", "BadRequestError", 400, "prompt"))
        elif not body.get("stream"):
            self._answer(200, fake.classify(body))
        else:
            self._stream(body)

    def _stream(self, body: dict[str, Any]) -> None:
        fake = self.fake
        prompt_tokens = len(body["prompt"])
        choices = [fake.pieces(body, index) for index in range(body.get("n", 1))]
        events = []
        for step in range(max(len(pieces) for pieces, _ in choices)):
            for index, (pieces, reason) in enumerate(choices):
                if step < len(pieces):
                    finish = reason if step == len(pieces) - 1 else None
                    choice = {"index": index, "text": pieces[step], "logprobs": None, "finish_reason": finish}
                    events.append(_completion(body["model"], [choice], _usage(prompt_tokens, step + 1)))
        completion = sum(len(pieces) for pieces, _ in choices)
        events.append(_completion(body["model"], [], _usage(prompt_tokens, completion)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"data: " + orjson.dumps(event) + b"\n\n")
                self.wfile.flush()
                time.sleep(fake.delay)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            with fake._lock:
                fake.aborted += 1


def _completion(model: str, choices: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": choices, "usage": usage}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _words(text: str) -> set[str]:
    return {word for word in re.findall(r"[a-z]+", text.lower()) if len(word) > 3}


# -- fixtures -------------------------------------------------------------------------------------


# As long as the router itself waits on vLLM for an adapter load or unload, and a little more: a
# real vLLM busy with 50 streams on two cores may take longer than 30 s, which the router allows
# and a test must see answered.
ADMIN_WAIT_S = ADMIN_S + CONNECT_S


class Router:
    """A `tracefix router` process with backend 'vllm' in front of the stand-in."""

    def __init__(self, directory: Path, base_dir: Path, vllm: FakeVllm) -> None:
        self.directory, self.base_dir, self.vllm = directory, base_dir, vllm
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.adapters_dir = directory / "adapters"
        self.log_path = directory / "router.log"
        config = directory / "tracefix.toml"
        config.write_text(
            f'[store]\npath = "{directory / "tracefix.duckdb"}"\n[model]\nname = "{base_dir}"\n'
            f'[router]\nport = {self.port}\ntoken = "{TOKEN}"\nbackend = "vllm"\nvllm_url = "{vllm.url}"\n'
            f'routing = "off"\nmax_context_tokens = 1024\nexport_spans = false\n'
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(config)],
            cwd=REPO, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def wait_healthy(self, timeout_s: float = 90) -> None:
        def healthy() -> bool:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout_s, 0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def client(self) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def admin(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", json=body, headers=ADMIN, timeout=ADMIN_WAIT_S)

    def adapter(self, capability: str, version: int, seed: int) -> Path:
        directory = self.adapters_dir / capability / f"v{version}"
        if not directory.exists():
            make_adapter(self.base_dir, directory, capability, version, seed)
        return directory

    def load(self, capability: str, version: int, seed: int = 0, description: str = "") -> httpx.Response:
        path = self.adapter(capability, version, seed)
        body = {"capability": capability, "version": version, "path": str(path), "description": description}
        return self.admin("POST", "/admin/adapters", body)

    def routing(self, mode: str, adapter: str | None = None) -> httpx.Response:
        return self.admin("PUT", "/admin/routing", {"mode": mode, "adapter": adapter})

    def chat(self, timeout: float = 30, **body: Any) -> httpx.Response:
        body = {"model": "base", "messages": HELLO, **body}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=timeout)

    def capabilities(self) -> dict[str, str]:
        return self.admin("GET", "/admin/routing").json()["capabilities"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def vllm(tiny_model: Path, tokenizer: Any) -> Iterator[FakeVllm]:
    fake = FakeVllm(tiny_model, tokenizer, free_port()).start()
    yield fake
    fake.stop()


def serving(directory: Path, base_dir: Path, vllm: Any) -> Iterator[Router]:
    """A healthy router in front of `vllm` (the stand-in or a real one) for a fixture's lifetime;
    after it, the router's log shows a clean stop."""
    running = Router(directory, base_dir, vllm)
    try:
        running.wait_healthy()
        yield running
    finally:
        running.stop()
    output = running.log_path.read_text()
    assert "tracefix router stopped" in output and "Traceback" not in output, output


@pytest.fixture(scope="module")
def router(tiny_model: Path, vllm: FakeVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    yield from serving(tmp_path_factory.mktemp("vllm-router"), tiny_model, vllm)


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# -- adapters -------------------------------------------------------------------------------------


def test_loading_asks_vllm_for_the_versioned_name_and_lists_the_adapter(router: Router, vllm: FakeVllm) -> None:
    response = router.load("listing", 1, seed=1)
    assert response.status_code == 200, response.text
    path = router.adapters_dir / "listing" / "v1"
    assert vllm.calls("/v1/load_lora_adapter")[-1] == {"lora_name": "listing@v1", "lora_path": str(path.resolve())}
    assert "listing@v1" in vllm.loras
    ids = [model.id for model in router.client.models.list()]
    assert ids[0] == "base" and "listing@v1" in ids
    assert router.client.models.retrieve("listing@v1").parent == "base"
    asked = len(vllm.calls("/v1/load_lora_adapter"))
    again = router.load("listing", 1)
    assert again.status_code == 409  # never reloaded under the same name, so vLLM is not asked
    assert len(vllm.calls("/v1/load_lora_adapter")) == asked
    assert router.admin("DELETE", "/admin/adapters/listing@v1").status_code == 200
    assert vllm.calls("/v1/unload_lora_adapter")[-1] == {"lora_name": "listing@v1"}
    assert "listing@v1" not in vllm.loras
    assert "listing@v1" not in [model.id for model in router.client.models.list()]


def test_a_corrupt_or_foreign_adapter_is_refused_here_and_vllm_is_never_asked(
    router: Router, vllm: FakeVllm, tmp_path: Path
) -> None:
    assert router.load("kept", 1, seed=2).status_code == 200
    damaged = tmp_path / "kept-v2"
    shutil.copytree(router.adapters_dir / "kept" / "v1", damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    (damaged / "manifest.json").write_text(json.dumps({**manifest, "version": 2}))
    weights = damaged / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    foreign_base = models.tiny_random_model(tmp_path / "other-base", vllm.tokenizer, seed=1)
    foreign = make_adapter(foreign_base, tmp_path / "foreign", "kept", 3, seed=3)
    asked = len(vllm.calls("/v1/load_lora_adapter"))
    refused = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 2, "path": str(damaged)})
    assert refused.status_code == 422 and "sha256" in refused.json()["error"]["message"]
    refused = router.admin("POST", "/admin/adapters", {"capability": "kept", "version": 3, "path": str(foreign)})
    assert refused.status_code == 422 and "base model hash" in refused.json()["error"]["message"]
    assert len(vllm.calls("/v1/load_lora_adapter")) == asked
    assert router.capabilities()["kept"] == "kept@v1"
    assert router.chat(model="kept@v1", max_tokens=2).json()["model"] == "kept@v1"
    assert router.admin("DELETE", "/admin/adapters/kept@v1").status_code == 200


def _wide_adapter(base_dir: Path, directory: Path, capability: str, version: int) -> Path:
    """A valid adapter of rank 32, above the stand-in's --max-lora-rank 16."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), LoraConfig(r=32, target_modules=TARGETS))
    manifest = {"capability": capability, "version": version, "base_model_hash": adapters.base_model_hash(base_dir)}
    adapters.save_adapter(model, directory, manifest)
    return directory


def test_an_adapter_vllm_refuses_leaves_the_previous_version_serving(router: Router, vllm: FakeVllm) -> None:
    assert router.load("ranked", 1, seed=4).status_code == 200
    wide = _wide_adapter(router.base_dir, router.adapters_dir / "ranked" / "v2", "ranked", 2)
    refused = router.admin("POST", "/admin/adapters", {"capability": "ranked", "version": 2, "path": str(wide)})
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    assert "vLLM refused to load ranked@v2" in message and "max_lora_rank 16" in message
    assert vllm.calls("/v1/load_lora_adapter")[-1]["lora_name"] == "ranked@v2"
    assert router.capabilities()["ranked"] == "ranked@v1"
    assert "ranked@v1" in vllm.loras and "ranked@v2" not in vllm.loras
    assert router.chat(model="ranked@v1", max_tokens=2).json()["model"] == "ranked@v1"
    assert router.chat(model="ranked@v2").status_code == 404
    assert router.admin("DELETE", "/admin/adapters/ranked@v1").status_code == 200


def test_a_version_vllm_kept_through_a_router_restart_is_taken_over_only_from_its_own_path(
    router: Router, vllm: FakeVllm
) -> None:
    path = router.adapter("adopted", 1, seed=6)
    vllm.loras["adopted@v1"] = str(path.resolve())  # loaded by the router's previous run
    body = {"capability": "adopted", "version": 1, "path": str(path), "description": ""}
    assert router.admin("POST", "/admin/adapters", body).status_code == 200
    assert router.chat(model="adopted@v1", max_tokens=2).json()["model"] == "adopted@v1"
    assert router.admin("DELETE", "/admin/adapters/adopted@v1").status_code == 200
    vllm.loras["adopted@v1"] = "/elsewhere/adopted-v1"  # the same name from other files: never taken over
    refused = router.admin("POST", "/admin/adapters", body)
    assert refused.status_code == 422 and "already been loaded" in refused.json()["error"]["message"]
    assert "adopted@v1" not in [model.id for model in router.client.models.list()]
    del vllm.loras["adopted@v1"]


# -- requests -------------------------------------------------------------------------------------


def test_pinned_and_base_requests_reach_vllm_with_the_right_model_and_settings(
    router: Router, vllm: FakeVllm, tokenizer: Any
) -> None:
    assert router.load("pinned", 1, seed=5).status_code == 200
    response = router.client.chat.completions.create(
        model="pinned@v1", messages=HELLO, max_tokens=4, temperature=0.5, top_p=0.9, seed=7, stop=["zz"]
    )
    sent = vllm.generations()[-1]
    assert sent["model"] == "pinned@v1" and sent["prompt"] == _prompt_ids(tokenizer, HELLO)
    sampling = (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["seed"], sent["stop"])
    assert sampling == (4, 0.5, 0.9, 7, ["zz"])
    assert response.model == "pinned@v1"
    assert response.choices[0].message.content == "<pinned@v1#0> w1 w2 w3"
    assert response.choices[0].finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(sent["prompt"]), 4)
    base = router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=50, n=2)
    assert vllm.generations()[-1]["model"] == vllm.served and vllm.generations()[-1]["n"] == 2
    assert base.model == "base"
    assert [choice.message.content for choice in base.choices] == [
        "<base#0> w1 w2 w3 w4 w5", "<base#1> w1 w2 w3 w4 w5"
    ]  # fmt: skip
    assert [choice.finish_reason for choice in base.choices] == ["stop", "stop"]
    assert base.usage.completion_tokens == 2 * WORDS
    assert router.routing("fixed", "pinned").status_code == 200
    assert router.chat(max_tokens=2).json()["model"] == "pinned@v1"
    assert vllm.generations()[-1]["model"] == "pinned@v1"
    assert router.routing("off").status_code == 200
    assert router.admin("DELETE", "/admin/adapters/pinned@v1").status_code == 200


def test_the_classifier_routes_by_the_label_vllm_scores_highest(router: Router, vllm: FakeVllm) -> None:
    descriptions = {
        "billing": "Questions about invoices, refunds and payments.",
        "shipping": "Tracking parcels and delivery dates.",
    }
    for index, (capability, description) in enumerate(descriptions.items()):
        assert router.load(capability, 1, seed=10 + index, description=description).status_code == 200
    assert router.routing("classifier").status_code == 200
    expected = {
        "My invoice shows two payments, I want refunds": "billing@v1",
        "Where are my parcels? The delivery is late": "shipping@v1",
        "Tell me a joke": "base",
    }
    for prompt, model in expected.items():
        response = router.client.chat.completions.create(
            model="base", messages=[{"role": "user", "content": prompt}], max_tokens=2
        )
        assert response.model == model, prompt
        assert vllm.generations()[-1]["model"] == (vllm.served if model == "base" else model)
        asked = [body for body in vllm.calls("/v1/completions") if not body.get("stream")][-1]
        assert asked["model"] == vllm.served and asked["max_tokens"] == 1 and asked["temperature"] == 0
        labels = [vllm.tokenizer.decode([token]) for token in asked["allowed_token_ids"]]
        assert sorted(labels) == sorted([*LABELS[:2], "base"])
    assert router.routing("off").status_code == 200
    for capability in descriptions:
        assert router.admin("DELETE", f"/admin/adapters/{capability}@v1").status_code == 200


def test_streaming_passes_through_to_the_openai_client(router: Router, vllm: FakeVllm) -> None:
    whole = router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=5)
    chunks = list(router.client.chat.completions.create(
        model="base", messages=HELLO, max_tokens=5, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    assert vllm.generations()[-1]["stream"] is True
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert len([text for text in deltas if text]) == 5  # chunk by chunk, as vLLM sent them
    assert "".join(deltas) == whole.choices[0].message.content == "<base#0> w1 w2 w3 w4"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert {chunk.model for chunk in chunks} == {"base"}
    body = {"model": "base", "messages": HELLO, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"


def test_tool_calls_in_vllm_text_come_back_as_openai_tool_calls(router: Router) -> None:
    messages = [{"role": "user", "content": "Where is order A1?"}]
    response = router.client.chat.completions.create(model="base", messages=messages, tools=[ORDER_TOOL], max_tokens=50)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_order" and json.loads(call.function.arguments) == {"order_id": "A1"}
    chunks = list(router.client.chat.completions.create(
        model="base", messages=messages, tools=[ORDER_TOOL], max_tokens=50, stream=True
    ))  # fmt: skip
    calls = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function.name == "get_order"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices).strip() == "Checking."
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"


def test_a_swap_keeps_streams_on_the_old_version_and_unloads_it_from_vllm_when_they_end(
    router: Router, vllm: FakeVllm
) -> None:
    assert router.load("swapped", 1, seed=20).status_code == 200
    assert router.routing("fixed", "swapped").status_code == 200
    vllm.delay = 0.2
    models_seen: list[set[str]] = []
    first_chunk = threading.Event()

    def stream() -> None:
        chunks = router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=WORDS, stream=True)
        seen = set()
        for chunk in chunks:
            first_chunk.set()
            seen.add(chunk.model)
        models_seen.append(seen)

    thread = threading.Thread(target=stream)
    try:
        thread.start()
        assert first_chunk.wait(30)
        swap = router.load("swapped", 2, seed=21)
        assert swap.status_code == 200 and swap.json()["replaced"] == "swapped@v1"
        during = {adapter["name"]: adapter for adapter in router.admin("GET", "/admin/routing").json()["adapters"]}
        assert during["swapped@v1"]["state"] == "retiring" and during["swapped@v1"]["in_flight"] == 1
        assert "swapped@v1" in vllm.loras  # still streaming from it
        assert router.chat(max_tokens=1).json()["model"] == "swapped@v2"
        thread.join(30)
    finally:
        vllm.delay = 0.01
    assert models_seen == [{"swapped@v1"}]
    wait_for(lambda: {"lora_name": "swapped@v1"} in vllm.calls("/v1/unload_lora_adapter"), 10, 0.05)
    assert "swapped@v1" not in vllm.loras and "swapped@v2" in vllm.loras
    assert router.chat(model="swapped@v1").status_code == 404
    assert router.routing("off").status_code == 200
    assert router.admin("DELETE", "/admin/adapters/swapped@v2").status_code == 200
    assert vllm.calls("/v1/unload_lora_adapter")[-1] == {"lora_name": "swapped@v2"}
    assert [name for name in vllm.loras if name.startswith("swapped")] == []


def test_a_client_that_leaves_mid_stream_aborts_its_vllm_request(router: Router, vllm: FakeVllm) -> None:
    assert router.load("leaver", 1, seed=30).status_code == 200
    aborted = vllm.aborted
    vllm.delay = 0.3
    try:
        body = {"model": "leaver@v1", "messages": HELLO, "max_tokens": WORDS, "stream": True}
        with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=30) as response:
            next(response.iter_lines())
        # The router sees the client gone at its next write; on a loaded 2-core machine that took over 10 s.
        wait_for(lambda: vllm.aborted > aborted, 30, 0.05)
    finally:
        vllm.delay = 0.01

    def released() -> bool:
        adapters_now = router.admin("GET", "/admin/routing").json()["adapters"]
        return next(a for a in adapters_now if a["name"] == "leaver@v1")["in_flight"] == 0

    wait_for(released, 30, 0.05)
    assert router.admin("DELETE", "/admin/adapters/leaver@v1").status_code == 200
    assert "leaver@v1" not in vllm.loras


def test_gate_mode_is_refused_because_vllm_applies_one_adapter_per_request(router: Router, tmp_path: Path) -> None:
    response = router.admin("PUT", "/admin/routing", {"mode": "gate", "gate": str(tmp_path / "gate.safetensors")})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "vLLM applies one LoRA adapter per request" in message and "embedded backend" in message
    assert router.admin("GET", "/admin/routing").json()["mode"] == "off"


def test_vllm_error_bodies_old_and_new_are_read() -> None:
    assert _error_text({"error": {"message": "no such model", "type": "NotFoundError"}}) == "no such model"
    assert _error_text({"object": "error", "message": "rank too big", "type": "BadRequestError"}) == "rank too big"


def test_vllm_down_gets_a_clear_503_and_the_router_keeps_running(router: Router, vllm: FakeVllm) -> None:
    # Last in this module: it stops the stand-in and starts it again, as a restarted vLLM.
    assert router.load("survivor", 1, seed=40).status_code == 200
    vllm.stop()

    def unhealthy() -> dict[str, Any] | None:
        response = httpx.get(f"{router.url}/healthz", timeout=5)
        return response.json() if response.status_code == 503 else None

    assert "unreachable" in wait_for(unhealthy, 10, 0.1)["status"]
    response = router.chat(max_tokens=2)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "server_error" and vllm.url in error["message"] and "unreachable" in error["message"]
    with pytest.raises(openai.InternalServerError) as streamed:
        list(router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=2, stream=True))
    assert streamed.value.status_code == 503
    load = router.load("survivor", 2, seed=41)
    assert load.status_code == 503 and "unreachable" in load.json()["error"]["message"]
    assert router.capabilities()["survivor"] == "survivor@v1"
    assert router.process.poll() is None

    # vLLM comes back having forgotten the adapters loaded at run time, and refuses survivor@v1 for
    # now (a rank it no longer allows): the router serves the base, answers 503 for survivor@v1, and
    # its health says degraded and why.
    vllm.max_lora_rank = 2
    vllm.restart()
    router.wait_healthy(10)
    assert router.chat(max_tokens=2).json()["choices"][0]["message"]["content"] == "<base#0> w1"

    def degraded() -> dict[str, Any] | None:
        body = httpx.get(f"{router.url}/healthz", timeout=5).json()
        return body if body["status"].startswith("degraded") else None

    health = wait_for(degraded, 10, 0.1)
    assert "survivor@v1" in health["status"] and "refused it again" in health["status"]
    assert router.admin("GET", "/admin/routing").json()["health"] == health["status"]
    lost = router.chat(model="survivor@v1", max_tokens=2)
    assert lost.status_code == 503 and "survivor@v1 is not served right now" in lost.json()["error"]["message"]
    # Once vLLM takes it again, the router loads it again from the same directory, and serves it: no restart of its own.
    loads = len(vllm.calls("/v1/load_lora_adapter"))
    vllm.max_lora_rank = 16
    wait_for(lambda: httpx.get(f"{router.url}/healthz", timeout=5).json()["status"] == "ok", 10, 0.1)
    assert [body["lora_name"] for body in vllm.calls("/v1/load_lora_adapter")[loads:]] == ["survivor@v1"]
    assert router.chat(model="survivor@v1", max_tokens=2).json()["model"] == "survivor@v1"
    # A restart the router has not noticed yet (its health poll comes every 2 s): the first request
    # for the adapter gets a retryable 503 and sets the loading going at once; then it is served.
    # (Should the poll land between the restart and the request, the adapter is back already.)
    vllm.restart()
    first = router.chat(model="survivor@v1", max_tokens=2)
    assert first.status_code == 200 or (first.status_code == 503 and "loading it again: retry" in first.json()["error"]["message"])
    assert wait_for(lambda: router.chat(model="survivor@v1", max_tokens=2).status_code == 200, 10, 0.1)
    assert router.process.poll() is None
    assert router.load("survivor", 2, seed=41).status_code == 200
    assert router.chat(max_tokens=2, model="survivor@v2").json()["model"] == "survivor@v2"
    assert router.admin("DELETE", "/admin/adapters/survivor@v2").status_code == 200
