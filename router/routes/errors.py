"""OpenAI-shaped errors: the exception handlers that answer every failure in that shape, so clients
report the reason instead of a parse failure, and the errors more than one route raises."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from tracefix.router.backend import BackendUnavailable, Failed
from tracefix.router.protocol import ApiError

log = logging.getLogger(__name__)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")


def unavailable(error: BackendUnavailable) -> ApiError:
    return ApiError(error.status, str(error), kind="server_error")


def failure(event: Failed) -> ApiError:
    kind = "server_error" if event.status >= 500 else "invalid_request_error"
    return ApiError(event.status, event.message, kind=kind)


async def api_error(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status)


async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
    issue = error.errors()[0]
    location = ".".join(str(part) for part in issue["loc"] if part != "body") or None
    return JSONResponse(ApiError(400, f"{issue['msg']} (at {location or 'body'})", param=location).body(), 400)


async def http_error(request: Request, error: HTTPException) -> JSONResponse:
    code = "not_found" if error.status_code == 404 else None
    return JSONResponse(ApiError(error.status_code, str(error.detail), code=code).body(), error.status_code)


async def server_error(request: Request, error: Exception) -> JSONResponse:
    log.exception("unexpected error serving %s", request.url.path)
    return JSONResponse(ApiError(500, f"internal error: {error}", kind="server_error").body(), 500)


HANDLERS = {ApiError: api_error, RequestValidationError: invalid, HTTPException: http_error, Exception: server_error}
