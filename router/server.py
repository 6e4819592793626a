"""The router's HTTP server on :8000: OpenAI's chat completions and models API, health and metrics,
and the admin API through which the daemon loads adapter versions and sets the routing mode.

Completions and reads are open, as on vLLM's server (the router binds to loopback by default);
every /admin call needs `Authorization: Bearer <token>`. Every answer that is not a success is an
OpenAI-shaped error, so clients report the reason instead of a parse failure.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from daemon.core.auth import bearer_matches, router_token
from daemon.core.settings import CAPABILITY_NAME, ConfigError, Settings
from daemon.core.sockets import bind
from router import metrics, protocol
from router.backend import (
    AdapterConflict,
    Backend,
    BackendUnavailable,
    Delta,
    EmbeddedBackend,
    Event,
    Failed,
    Finished,
    Generation,
)
from router.protocol import ApiError, ChatRequest
from router.routing import Lease, RoutingError, RoutingTable, UnknownAdapter
from router.telemetry import Telemetry, spans_endpoint
from trainer.adapters import AdapterRejected

log = logging.getLogger(__name__)

VERSION = "0.1.0"
MAX_BODY_BYTES = 8 * 1024 * 1024  # far above max_context_tokens of text; stops a runaway client early


class BodyLimit:
    """Refuses request bodies over `limit` bytes with a 413 before the application reads them."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        size = int(declared) if declared.isdigit() else 0
        chunks: list[bytes] = []
        while size <= self.limit:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size = sum(map(len, chunks))
            if not message.get("more_body"):
                break
        if size > self.limit:
            error = ApiError(413, f"the request body is larger than {self.limit} bytes", code="request_too_large")
            await JSONResponse(error.body(), error.status)(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect a streaming response waits for
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


class AdapterLoad(BaseModel):
    capability: str = Field(pattern=CAPABILITY_NAME.pattern)
    version: int = Field(ge=1)
    path: str = Field(min_length=1)
    description: str = Field("", max_length=2000, description="What the capability is; the classifier reads it.")
    canary: float | None = Field(
        None, gt=0, lt=1, description="Load as a canary taking this share of the capability's traffic until promoted."
    )


class RoutingChange(BaseModel):
    mode: str
    adapter: str | None = Field(None, description="With mode 'fixed': a live adapter, its capability, or 'base'.")
    gate: str | None = Field(None, description="With mode 'gate': the gate weights trained for live adapters.")


def authorized(request: Request) -> None:
    if not bearer_matches(request.headers.get("authorization", ""), request.app.state.token):
        raise ApiError(
            401,
            "missing or wrong bearer token (see [router] token or <store dir>/router.token)",
            code="invalid_api_key",
            kind="authentication_error",
        )


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")


def unavailable(error: BackendUnavailable) -> ApiError:
    return ApiError(error.status, str(error), kind="server_error")


def failure(event: Failed) -> ApiError:
    kind = "server_error" if event.status >= 500 else "invalid_request_error"
    return ApiError(event.status, event.message, kind=kind)


class _Call:
    """One chat completion from arrival to its span: what every way out of it must close once."""

    def __init__(self, table: RoutingTable, telemetry: Telemetry, request: Request) -> None:
        self.table, self.telemetry, self.headers = table, telemetry, request.headers
        self.start_ns = time.time_ns()
        self.attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "tracefix"}
        self.lease: Lease | None = None
        self.generation: Generation | None = None
        self.expert = "none"
        self.closed = False
        self.shares: list[tuple[dict[str, float], int]] = []  # gate-routed choices: (expert weights, tokens)

    def finished(self, event: Finished) -> None:
        if event.shares:
            self.shares.append((event.shares, event.tokens))

    def _share_attributes(self) -> dict[str, float]:
        """The gate's mean expert weights over all generated tokens, one attribute per expert."""
        tokens = sum(count for _, count in self.shares)
        if not tokens:
            return {}
        experts = {name for shares, _ in self.shares for name in shares}
        mean = {name: sum(shares.get(name, 0.0) * count for shares, count in self.shares) / tokens for name in experts}
        for name, share in mean.items():
            metrics.GATE_TOKENS.labels(name).inc(share * tokens)
        return {f"tracefix.router.share.{name}": round(share, 4) for name, share in sorted(mean.items())}

    def describe(self, chat: ChatRequest) -> None:
        sampling = chat.sampling(0)
        self.attributes.update({
            "gen_ai.request.model": chat.model,
            "gen_ai.request.max_tokens": chat.requested_tokens,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.seed": chat.seed,
            "gen_ai.request.stop_sequences": list(sampling.stop) or None,
            "gen_ai.request.choice.count": chat.n if chat.n != 1 else None,
        })  # fmt: skip

    def routed(self, lease: Lease, expert: str, completion_id: str) -> None:
        self.lease, self.expert = lease, expert
        metrics.IN_FLIGHT.inc()
        self.attributes.update({
            "gen_ai.response.model": expert,
            "gen_ai.response.id": completion_id,
            "tracefix.router.adapter": expert,
            "tracefix.router.reason": lease.reason,
            "tracefix.router.experts": list(lease.experts) or None,
            "tracefix.router.capability": lease.capability,
            "tracefix.router.arm": lease.arm,
        })  # fmt: skip

    def close(
        self, error: str | None, prompt_tokens: int = 0, completion_tokens: int = 0, reasons: list[str] | None = None
    ) -> None:
        """Release the lease, count the request and record its span; `error` is its error code."""
        if self.closed:
            return
        self.closed = True
        if self.generation is not None:
            self.generation.cancelled.set()  # no-op when it finished; frees its batch rows when not
        if self.lease is not None:
            metrics.IN_FLIGHT.dec()
            self.table.release(self.lease)
        metrics.REQUESTS.labels(self.expert, error or "ok").inc()
        if error is None:
            metrics.TOKENS.labels(self.expert, "prompt").inc(prompt_tokens)
            metrics.TOKENS.labels(self.expert, "completion").inc(completion_tokens)
            self.attributes.update({
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens,
                "gen_ai.response.finish_reasons": reasons,
                **self._share_attributes(),
            })  # fmt: skip
        self.telemetry.record(self.headers, self.start_ns, time.time_ns(), self.attributes, error)


def create_app(settings: Settings, backend: Backend) -> FastAPI:
    """The FastAPI application serving `backend` with the routing of `settings.router`."""
    router_settings = settings.router
    base_name = router_settings.model_name
    telemetry = Telemetry(router_settings, spans_endpoint(settings))
    table = RoutingTable(backend, router_settings.routing, router_settings.fixed_adapter)
    started = int(time.time())
    app = FastAPI(title="tracefix router", version=VERSION)
    app.state.token = router_token(settings, create=True)
    app.state.table, app.state.backend, app.state.telemetry = table, backend, telemetry
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        issue = error.errors()[0]
        location = ".".join(str(part) for part in issue["loc"] if part != "body") or None
        return JSONResponse(ApiError(400, f"{issue['msg']} (at {location or 'body'})", param=location).body(), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        code = "not_found" if error.status_code == 404 else None
        return JSONResponse(ApiError(error.status_code, str(error.detail), code=code).body(), error.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path)
        return JSONResponse(ApiError(500, f"internal error: {error}", kind="server_error").body(), 500)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        healthy = backend.alive
        body = {"status": backend.health, "model": base_name, "adapters": len(table.live())}
        return JSONResponse(body, 200 if healthy else 503)

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    def model_card(name: str, created: int, root: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": name, "object": "model", "created": created, "owned_by": "tracefix", "root": root, "parent": parent,
        }  # fmt: skip

    def model_cards() -> list[dict[str, Any]]:
        cards = [model_card(base_name, started, str(backend.model_dir), None)]
        cards += [model_card(a.name, int(a.loaded_at), a.path, base_name) for a in table.live()]
        return cards

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": model_cards()}

    @app.get("/v1/models/{name}")
    def get_model(name: str) -> dict[str, Any]:
        card = next((card for card in model_cards() if card["id"] == name), None)
        if card is None:
            raise model_not_found(name)
        return card

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        call = _Call(table, telemetry, request)
        try:
            chat = protocol.parse_request(await request.body())
            call.describe(chat)
            pinned = None if chat.model == base_name else chat.model
            if pinned is not None and pinned not in {adapter.name for adapter in table.live()}:
                raise model_not_found(chat.model)
            if chat.n > backend.max_batch:
                raise ApiError(400, f"n is at most {backend.max_batch} here ([router] max_batch)", param="n")
            messages = protocol.prompt_messages(chat)
            try:
                prompt = await run_in_threadpool(backend.encode_chat, messages)
            except ValueError as error:
                raise ApiError(400, str(error), param="messages") from None
            max_tokens = completion_budget(len(prompt), chat.requested_tokens)
            try:
                lease = await run_in_threadpool(table.acquire, pinned, chat.first_user_turn())
            except UnknownAdapter:  # retired between the check and the lease
                raise model_not_found(chat.model) from None
            except BackendUnavailable as error:  # the classifier could not ask the model
                raise unavailable(error) from None
            completion_id = f"chatcmpl-{uuid.uuid4().hex}"
            expert = lease.adapter or base_name
            call.routed(lease, expert, completion_id)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue[Event] = asyncio.Queue()
            call.generation = Generation(
                prompt=prompt,
                adapter=None if lease.gate else lease.adapter,
                sampling=chat.sampling(max_tokens),
                n=chat.n,
                emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                gate=lease.gate,
            )
            try:
                backend.submit(call.generation)
            except RuntimeError as error:
                raise ApiError(503, str(error), kind="server_error") from None
        except ApiError as error:
            call.close(error.code or error.kind)
            return JSONResponse(error.body(), error.status)
        except BaseException:
            call.close("server_error")
            raise
        created = int(time.time())
        if chat.stream:
            stream = streamed(call, chat, events, len(prompt), completion_id, created, expert)
            return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            finished: dict[int, Finished] = {}
            while len(finished) < chat.n:
                event = await events.get()
                if isinstance(event, Failed):
                    raise failure(event)
                if isinstance(event, Finished):
                    finished[event.choice] = event
                    call.finished(event)
        except ApiError as error:
            call.close(error.code or error.kind)
            return JSONResponse(error.body(), error.status)
        except BaseException:
            call.close("cancelled")  # the client went away
            raise
        choices = [protocol.choice(i, finished[i].text, finished[i].reason, chat.uses_tools) for i in range(chat.n)]
        completion_tokens = sum(event.tokens for event in finished.values())
        call.close(None, len(prompt), completion_tokens, [choice["finish_reason"] for choice in choices])
        body = protocol.completion(completion_id, created, expert, choices, len(prompt), completion_tokens)
        return JSONResponse(body)

    def completion_budget(prompt_tokens: int, requested: int | None) -> int:
        """max_tokens for this prompt: as requested if it fits the context, else up to what is left."""
        limit = backend.context_tokens
        if prompt_tokens >= limit or (requested is not None and prompt_tokens + requested > limit):
            asked = f"{prompt_tokens} in the messages" + (f", {requested} in the completion" if requested else "")
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + (requested or 0)} tokens ({asked}). "
                "Please reduce the length of the messages or completion.",
                code="context_length_exceeded",
                param="messages",
            )
        return requested or min(router_settings.max_new_tokens, limit - prompt_tokens)

    @app.post("/admin/adapters", dependencies=[Depends(authorized)])
    def load_adapter(body: AdapterLoad) -> dict[str, Any]:
        try:
            return table.add(body.capability, body.version, Path(body.path), body.description, body.canary)
        except AdapterRejected as error:
            raise ApiError(422, str(error), code="adapter_rejected", param="path") from None
        except AdapterConflict as error:
            raise ApiError(409, str(error), code="adapter_exists") from None
        except BackendUnavailable as error:
            raise unavailable(error) from None

    @app.post("/admin/adapters/{name}/promote", dependencies=[Depends(authorized)])
    def promote_adapter(name: str) -> dict[str, Any]:
        try:
            return table.promote(name)
        except UnknownAdapter:
            raise ApiError(404, f"no live adapter named {name!r}", code="adapter_not_found") from None
        except RoutingError as error:
            raise ApiError(409, str(error), code="not_a_canary") from None

    @app.delete("/admin/adapters/{name}", dependencies=[Depends(authorized)])
    def remove_adapter(name: str) -> dict[str, Any]:
        try:
            return table.remove(name)
        except UnknownAdapter:
            raise ApiError(404, f"no live adapter named {name!r}", code="adapter_not_found") from None

    @app.put("/admin/routing", dependencies=[Depends(authorized)])
    def change_routing(body: RoutingChange) -> dict[str, Any]:
        try:
            return table.set_mode(body.mode, body.adapter, body.gate)
        except RoutingError as error:
            raise ApiError(400, str(error), param="mode") from None

    @app.get("/admin/routing", dependencies=[Depends(authorized)])
    def routing() -> dict[str, Any]:
        return table.snapshot()

    return app


async def streamed(
    call: _Call,
    chat: ChatRequest,
    events: asyncio.Queue[Event],
    prompt_tokens: int,
    completion_id: str,
    created: int,
    model: str,
) -> Any:
    """The server-sent events of a streamed completion: a role chunk, content (or tool call) deltas,
    a finish chunk per choice, the usage chunk when asked for, then ``[DONE]``."""
    streams = [protocol.ChoiceStream(chat.uses_tools) for _ in range(chat.n)]
    reasons: dict[int, str] = {}
    completion_tokens = 0

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        return protocol.chunk(completion_id, created, model, choices, usage)

    try:
        yield chunk([protocol.delta(index, {"role": "assistant", "content": ""}) for index in range(chat.n)])
        while len(reasons) < chat.n:
            event = await events.get()
            if isinstance(event, Failed):
                error = failure(event)
                yield b"data: " + orjson.dumps(error.body()) + b"\n\n"
                call.close(error.kind)
                return
            if isinstance(event, Delta):
                text = streams[event.choice].feed(event.text)
                if text:
                    yield chunk([protocol.delta(event.choice, {"content": text})])
                continue
            rest, calls = streams[event.choice].finish()
            if rest:
                yield chunk([protocol.delta(event.choice, {"content": rest})])
            if calls:
                indexed = [{"index": index, **tool_call} for index, tool_call in enumerate(calls)]
                yield chunk([protocol.delta(event.choice, {"tool_calls": indexed})])
            reasons[event.choice] = "tool_calls" if calls else event.reason
            completion_tokens += event.tokens
            call.finished(event)
            yield chunk([protocol.delta(event.choice, {}, reasons[event.choice])])
        if chat.stream_options is not None and chat.stream_options.include_usage:
            yield chunk([], protocol.usage(prompt_tokens, completion_tokens))
        yield b"data: [DONE]\n\n"
        call.close(None, prompt_tokens, completion_tokens, [reasons[index] for index in range(chat.n)])
    finally:
        call.close("cancelled")  # the client went away mid-stream


def serve(settings: Settings) -> None:
    """Run the router until SIGINT/SIGTERM, then finish the running batch and flush spans."""
    backend: Backend
    if settings.router.backend == "embedded":
        backend = EmbeddedBackend.from_settings(settings)
    elif settings.router.backend == "vllm":
        from router.vllm import VllmBackend

        backend = VllmBackend.from_settings(settings)
    else:
        raise ConfigError(f"[router] backend is 'embedded' or 'vllm', not {settings.router.backend!r}")
    app = None
    try:
        app = create_app(settings, backend)
        # uvicorn re-raises the signal it caught once it has stopped serving; with these handlers in
        # place that is a no-op, so the cleanup below always runs.
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, _stop_requested)
        host = settings.router.host
        listening = bind(host, settings.router.port, "router")
        # Keep-alive well above the 5 s that HTTP clients (httpx, so the openai client) keep idle
        # connections: with equal timeouts a request can be sent on a connection the server is closing.
        config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=10, timeout_keep_alive=75
        )
        served = backend.model_dir if settings.router.backend == "embedded" else settings.router.vllm_url
        log.info("tracefix router serving %s at http://%s:%d", served, host, listening.getsockname()[1])
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        backend.stop()
        if app is not None:
            app.state.table.close()
            app.state.telemetry.shutdown()
        log.info("tracefix router stopped")


def _stop_requested(signum: int, frame: Any) -> None:
    log.info("received %s; stopping", signal.Signals(signum).name)
