"""The router's HTTP server on :8000: OpenAI's chat completions and models API, health and metrics,
and the admin API through which the daemon loads adapter versions and sets the routing mode.

Completions and reads are open, as on vLLM's server (the router binds to loopback by default);
every /admin call needs `Authorization: Bearer <token>`. Every answer that is not a success is an
OpenAI-shaped error, so clients report the reason instead of a parse failure. The endpoints live in
`router.routes`, one module per group; this module composes them and runs the server.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from tracefix.daemon.core.auth import router_token
from tracefix.daemon.core.settings import ConfigError, Settings
from tracefix.daemon.core.sockets import bind
from tracefix.router.backend import Backend
from tracefix.router.embedded import EmbeddedBackend
from tracefix.router.protocol import ApiError
from tracefix.router.routes import admin, chat, errors, health, models
from tracefix.router.routing import RoutingTable
from tracefix.router.telemetry import Telemetry, spans_endpoint

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


ROUTERS = (health.router, models.router, chat.router, admin.router)


def create_app(settings: Settings, backend: Backend) -> FastAPI:
    """The FastAPI application serving `backend` with the routing of `settings.router`.

    The routes reach the backend, its routing table, the telemetry and the settings on `app.state`.
    """
    telemetry = Telemetry(settings.router, spans_endpoint(settings))
    table = RoutingTable(backend, settings.router.routing, settings.router.fixed_adapter, settings.router.hold_conversations)
    app = FastAPI(title="tracefix router", version=VERSION)
    app.state.settings, app.state.started = settings.router, int(time.time())
    app.state.token = router_token(settings, create=True)
    app.state.table, app.state.backend, app.state.telemetry = table, backend, telemetry
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    for error, handler in errors.HANDLERS.items():
        app.add_exception_handler(error, handler)
    for routes in ROUTERS:
        app.include_router(routes)
    return app


def serve(settings: Settings) -> None:
    """Run the router until SIGINT/SIGTERM, then finish the running batch and flush spans."""
    backend: Backend
    if settings.router.backend == "embedded":
        backend = EmbeddedBackend.from_settings(settings)
    elif settings.router.backend == "vllm":
        from tracefix.router.vllm import VllmBackend

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
