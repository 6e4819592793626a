"""The vLLM backend: the router in front of a vLLM OpenAI server started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which generates while the router keeps everything else.

The router still renders the chat template (with the tokenizer of the model directory vLLM serves),
puts tools into the system prompt and parses tool calls back, routes, holds leases, swaps versions
and records spans, exactly as with the embedded backend. Each request goes to vLLM's
``/v1/completions`` as token ids, with ``model`` set to the adapter's versioned name or the base
model's served name, and vLLM's stream comes back as the same `Delta`/`Finished` events the
embedded backend emits, so the server serves both alike.

Adapters are verified here (manifest, sha256 of every file, base model hash) before vLLM is asked
to load them with ``/v1/load_lora_adapter``; retired versions go with ``/v1/unload_lora_adapter``.
vLLM applies one LoRA per request, so the token-level gate is refused. The classifier's label
scores come from a one-token greedy completion restricted to the label tokens, with logprobs.

A vLLM that dies (out of memory, a driver fault, an upgrade) fails the requests streaming from it
with a retryable 503 and `/healthz` says so. When it answers again it has forgotten every adapter
loaded at run time: the router loads the versions it had loaded (live ones and canaries) again,
from the same verified directories, before it sends them requests; meanwhile a request for one
gets a 503 saying it is being loaded again, and `/healthz` says "degraded" and which.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from tracefix.daemon.core.settings import Settings
from tracefix.router.backend import (
    AdapterConflict,
    BackendUnavailable,
    Delta,
    Event,
    Failed,
    Finished,
    GateSpec,
    Generation,
    chat_token_ids,
    first_token_id,
)
from tracefix.trainer import adapters
from tracefix.trainer import model as models

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often vLLM's /v1/models is read: health, base model name, max_model_len
CONNECT_S = 5.0
ADMIN_S = 120.0  # loading an adapter reads its weights onto the GPU
CHUNK_S = 600.0  # longest wait for the next streamed chunk (a request may queue inside vLLM)
TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
GATE_REFUSED = "vLLM applies one LoRA adapter per request; the token-level gate needs the embedded backend"


class VllmBackend:
    """A running vLLM server, the adapters loaded into it, and the streams of requests it serves."""

    supports_gate = False

    def __init__(
        self, url: str, model: str, cache_dir: Path, max_batch: int = 8, max_context_tokens: int = 8192
    ) -> None:
        self.url = url.rstrip("/")
        # The directory vLLM serves: its tokenizer renders prompts, its weights' hash checks adapters.
        self.model_dir = models.resolve(model, Path(cache_dir))
        self.base_hash = adapters.base_model_hash(self.model_dir)
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise models.ModelUnavailable(
                "backend 'vllm' renders prompts with the model's tokenizer: pip install 'tracefix[vllm]'"
            ) from None
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.max_batch = max_batch
        self.max_context_tokens = max_context_tokens
        self.loaded: dict[str, Path] = {}
        self.served_name: str | None = None  # the base model's name in vLLM (`vllm serve <dir>`: the dir)
        self.max_model_len: int | None = None
        self._problem: str | None = f"vLLM at {self.url} has not answered yet"
        self._missing: dict[str, str] = {}  # loaded here, absent in vLLM (it restarted) -> why it is not back yet
        self._refresh_now = threading.Event()  # a request found an adapter gone: look (and load it again) at once
        # httpx logs every request at INFO: a line per health poll and per completion would bury the router's own.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._client = httpx.Client(timeout=httpx.Timeout(ADMIN_S, connect=CONNECT_S))
        self._stopping = threading.Event()
        self._running: dict[Generation, asyncio.Task[None]] = {}
        self._loop = asyncio.new_event_loop()
        self._streams: httpx.AsyncClient | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="vllm-streams", daemon=True)
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(self._open_streams(), self._loop).result()
        self._refresh()
        if self._problem is not None:
            log.warning("%s; the router answers 503 until it does", self._problem)
        self._poller = threading.Thread(target=self._poll, name="vllm-health", daemon=True)
        self._poller.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmBackend:
        """The backend for a tracefix configuration: [router] vllm_url, and [model] for the tokenizer."""
        cache_dir = settings.model_cache_dir
        router = settings.router
        return cls(router.vllm_url, settings.model.name, cache_dir, router.max_batch, router.max_context_tokens)

    @property
    def context_tokens(self) -> int:
        return min(self.max_context_tokens, self.max_model_len or self.max_context_tokens)

    @property
    def alive(self) -> bool:
        return self._problem is None and self._loop_thread.is_alive()

    @property
    def health(self) -> str:
        if self._problem or not self._loop_thread.is_alive():
            return self._problem or "the stream loop stopped"
        missing = dict(self._missing)
        if missing:
            return "degraded: " + "; ".join(f"{name}: {why}" for name, why in sorted(missing.items()))
        return "ok"

    # -- vLLM's state -----------------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stopping.is_set():
            self._refresh_now.wait(POLL_S)
            self._refresh_now.clear()
            if not self._stopping.is_set():
                self._refresh()

    def _refresh(self) -> None:
        """Read vLLM's /v1/models: whether it answers, the base model's served name and its context."""
        known = set(self.loaded)  # before asking: a load finishing meanwhile is not "missing"
        try:
            response = self._client.get(f"{self.url}/v1/models", timeout=CONNECT_S)
            response.raise_for_status()
            cards = response.json()["data"]
            base = cards[0]  # vLLM lists its base models first, then the adapters
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            if self._problem is None:
                log.warning("vLLM at %s stopped answering: %s", self.url, error)
            self._problem = f"vLLM at {self.url} is unreachable: {error}"
            return
        if self._problem is not None:
            log.info("vLLM at %s serves %s", self.url, base["id"])
        self.served_name, self.max_model_len = base["id"], base.get("max_model_len")
        self._problem = None
        served = {card["id"] for card in cards}
        for name in sorted((known & set(self.loaded)) - served):
            self._load_again(name)

    def _load_again(self, name: str) -> None:
        """A restarted vLLM has forgotten the runtime-loaded `name`: load it again from its verified
        directory; until that works, requests for it get a 503 and the health says degraded."""
        directory = self.loaded.get(name)
        if directory is None:
            return
        if name not in self._missing:
            log.warning("vLLM no longer serves %s (it restarted?): loading it again", name)
        try:
            response = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(directory).resolve())})
        except BackendUnavailable as error:
            self._missing[name] = f"vLLM restarted without it; loading it again failed: {error}"
            return
        if response.is_success or self._already_serving(name, str(Path(directory).resolve()), response):
            self._missing.pop(name, None)
            if name in self.loaded:
                log.info("vLLM serves %s again", name)
            else:  # retired while it was being loaded again: drop it there too
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
            return
        self._missing[name] = f"vLLM restarted without it and refused it again ({response.status_code}): {_message(response)}"

    def _base_name(self) -> str:
        if self.served_name is None:
            self._refresh()
        if self.served_name is None:
            raise BackendUnavailable(self._problem or f"vLLM at {self.url} is unreachable")
        return self.served_name

    def _post(self, path: str, body: dict[str, Any], timeout: float = ADMIN_S) -> httpx.Response:
        try:
            return self._client.post(f"{self.url}{path}", json=body, timeout=timeout)
        except httpx.HTTPError as error:
            raise BackendUnavailable(f"vLLM at {self.url} is unreachable: {error}") from None

    # -- adapters ---------------------------------------------------------------------------------

    def load(self, name: str, directory: Path) -> None:
        """Verify the adapter here, then have vLLM load it as `name`. A damaged or foreign adapter,
        or one vLLM refuses, raises `AdapterRejected`; vLLM down raises `BackendUnavailable`."""
        if name in self.loaded:
            raise AdapterConflict(f"{name} is already loaded; load the new weights under a new version")
        adapters.verify_adapter(directory, self.base_hash)  # vLLM is never asked to load what fails here
        path = str(Path(directory).resolve())
        response = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if not response.is_success and not self._already_serving(name, path, response):
            refusal = f"vLLM refused to load {name} ({response.status_code}): {_message(response)}"
            raise adapters.AdapterRejected(refusal)
        self.loaded[name] = Path(directory)
        self._missing.pop(name, None)

    def _already_serving(self, name: str, path: str, refusal: httpx.Response) -> bool:
        """vLLM kept `name` from `path` while the router restarted: the same immutable version, taken
        over instead of reloaded. From any other path the name is refused, never reloaded."""
        if refusal.status_code != 400 or "already been loaded" not in _message(refusal):
            return False
        try:
            cards = self._client.get(f"{self.url}/v1/models", timeout=CONNECT_S).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return False
        roots = {card.get("root") for card in cards if card.get("id") == name}
        if path in roots:
            log.info("vLLM already serves %s from %s; taken over", name, path)
            return True
        return False

    def unload(self, name: str) -> None:
        """Have vLLM drop an adapter; the caller guarantees no request is using it. A vLLM that
        cannot be reached keeps it loaded (it costs memory, not correctness: names are never reused)."""
        if self.loaded.pop(name, None) is None:
            return
        self._missing.pop(name, None)
        try:
            response = self._post("/v1/unload_lora_adapter", {"lora_name": name})
        except BackendUnavailable as error:
            log.warning("could not unload %s: %s", name, error)
            return
        if not response.is_success and response.status_code != 404:  # 404: vLLM no longer had it
            log.warning("vLLM did not unload %s (%d): %s", name, response.status_code, _message(response))

    def check_gate(self, gate: GateSpec) -> None:
        raise ValueError(GATE_REFUSED)

    # -- prompts ----------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a conversation in the model's chat template, ending with the assistant prompt."""
        return chat_token_ids(self.tokenizer, messages)

    def token_id(self, text: str) -> int:
        """The first token of `text`, as the model would write it at the start of its answer."""
        return first_token_id(self.tokenizer, text)

    def next_token_scores(self, prompt: list[int], token_ids: Sequence[int]) -> list[float]:
        """The base model's next-token logprobs after `prompt` of `token_ids`, in their order; tokens
        vLLM did not report score -inf. The greedy token is drawn from `token_ids` only, so the
        highest-scoring of them is always reported, whatever else ranks above it."""
        body = {
            "model": self._base_name(),
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": min(len(token_ids), TOP_LOGPROBS),
            "allowed_token_ids": sorted(set(token_ids)),
            "return_tokens_as_token_ids": True,
        }
        response = self._post("/v1/completions", body, timeout=CHUNK_S)
        if not response.is_success:
            answer = f"vLLM answered {response.status_code} to the classifier: {_message(response)}"
            raise BackendUnavailable(answer, 502)
        try:
            logprobs = response.json()["choices"][0]["logprobs"]
            reported = dict(logprobs["top_logprobs"][0] or {})
            reported[logprobs["tokens"][0]] = logprobs["token_logprobs"][0]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise BackendUnavailable(f"vLLM's classifier answer has no logprobs: {error}", 502) from None
        scores: dict[int, float] = {}
        # Keys are "token_id:N"; a vLLM that ignores return_tokens_as_token_ids sends the token's text.
        texts = {self.tokenizer.decode([token]): token for token in token_ids}
        for key, value in reported.items():
            token = int(key[len("token_id:") :]) if key.startswith("token_id:") else texts.get(key)
            if token is not None and value is not None:
                scores[token] = max(scores.get(token, float("-inf")), float(value))
        return [scores.get(token, float("-inf")) for token in token_ids]

    # -- generation -------------------------------------------------------------------------------

    def submit(self, generation: Generation) -> None:
        """Send a request to vLLM; its events arrive through ``generation.emit`` from the stream loop."""
        if generation.n > self.max_batch:
            raise ValueError(f"n={generation.n} is more than the {self.max_batch} sequences of a batch")
        if self._stopping.is_set():
            raise RuntimeError("the router is shutting down")
        if self._problem is not None:
            raise BackendUnavailable(self._problem)
        if generation.adapter is not None and (why := self._missing.get(generation.adapter)):
            raise BackendUnavailable(f"{generation.adapter} is not served right now: {why}")
        model = generation.adapter or self._base_name()
        self._loop.call_soon_threadsafe(self._start, generation, model)

    def _start(self, generation: Generation, model: str) -> None:
        task = self._loop.create_task(self._stream(generation, model))
        self._running[generation] = task
        task.add_done_callback(lambda _: self._running.pop(generation, None))

    async def _open_streams(self) -> None:
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        self._streams = httpx.AsyncClient(timeout=httpx.Timeout(CHUNK_S, connect=CONNECT_S), limits=limits)
        self._reaper = self._loop.create_task(self._reap())

    async def _reap(self) -> None:
        """Cancel the vLLM request of every client that went away: closing its stream aborts it there."""
        while True:
            await asyncio.sleep(0.2)
            for generation, task in list(self._running.items()):
                if generation.cancelled.is_set():
                    task.cancel()

    async def _stream(self, generation: Generation, model: str) -> None:
        """One request's completion stream from vLLM, as Delta and Finished events."""
        sampling = generation.sampling
        body: dict[str, Any] = {
            "model": model,
            "prompt": generation.prompt,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": generation.n,
            "stream": True,
            # continuous_usage_stats: each chunk carries its choice's completion tokens so far.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        texts, tokens, finished = [""] * generation.n, [0] * generation.n, set()
        assert self._streams is not None
        try:
            async with self._streams.stream("POST", f"{self.url}/v1/completions", json=body) as response:
                if not response.is_success:
                    await response.aread()
                    if response.status_code == 404 and model in self.loaded:  # vLLM restarted and forgot it
                        self._missing.setdefault(model, "vLLM restarted without it; loading it again")
                        self._refresh_now.set()
                        _emit(generation, Failed(f"vLLM no longer serves {model} (it restarted); the router is loading it again: retry", 503))
                        return
                    _emit(generation, _refusal(model, response))
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        break
                    chunk = orjson.loads(data)
                    if "error" in chunk or chunk.get("object") == "error":
                        _emit(generation, Failed(f"vLLM failed the request: {_error_text(chunk)}", 502))
                        return
                    usage = chunk.get("usage")
                    for choice in chunk.get("choices") or []:
                        index = choice["index"]
                        if index in finished or not 0 <= index < generation.n:
                            continue
                        tokens[index] = usage["completion_tokens"] if usage else tokens[index] + 1
                        if text := choice.get("text"):
                            texts[index] += text
                            _emit(generation, Delta(index, text))
                        if reason := choice.get("finish_reason"):
                            finished.add(index)
                            reason = "length" if reason == "length" else "stop"
                            _emit(generation, Finished(index, reason, texts[index], tokens[index]))
            if len(finished) < generation.n:
                _emit(generation, Failed("vLLM ended the stream before every choice finished", 502))
        except asyncio.CancelledError:
            if not generation.cancelled.is_set():  # not the client leaving: the router stopping
                _emit(generation, Failed("the router is shutting down", 503))
            raise
        except httpx.TransportError as error:  # refused, reset or timed out
            _emit(generation, Failed(f"vLLM at {self.url} is unreachable: {error!r}", 503))
        except Exception as error:  # a malformed chunk fails its request, never the loop
            log.exception("vLLM stream failed")
            _emit(generation, Failed(f"vLLM's stream could not be read: {error}", 502))

    def stop(self) -> None:
        """Fail the requests still streaming and close the connections to vLLM."""
        self._stopping.set()
        self._refresh_now.set()

        async def shutdown() -> None:
            tasks = [*self._running.values(), *([self._reaper] if self._reaper else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._streams is not None:
                await self._streams.aclose()

        if self._loop_thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=30)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop_thread.join(timeout=10)
        self._poller.join(timeout=POLL_S + CONNECT_S)
        self._client.close()


def _error_text(body: Any) -> str:
    """The message of a vLLM error body: ``{"error": {"message"}}`` now, ``{"message"}`` before."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return str(body)[:300]


def _message(response: httpx.Response) -> str:
    try:
        return _error_text(response.json())
    except ValueError:
        return response.text[:300] or response.reason_phrase


def _refusal(model: str, response: httpx.Response) -> Failed:
    """vLLM's refusal of a completion as the router's answer: the client's own mistakes (400) stay
    400; a model vLLM does not know (404) that the router did not load is the router's fault."""
    message = _message(response)
    if response.status_code == 404:
        return Failed(f"vLLM does not serve {model} ({message})", 502)
    if response.status_code in (400, 422):
        return Failed(f"vLLM refused the request: {message}", 400)
    return Failed(f"vLLM answered {response.status_code}: {message}", 502)


def _emit(generation: Generation, event: Event) -> None:
    try:
        generation.emit(event)
    except Exception:  # a sink whose client is gone must not stop the stream loop
        log.debug("dropped an event for a request that went away", exc_info=True)
