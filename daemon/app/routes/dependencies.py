"""What a route handler receives besides its own parameters: the daemon, the caller, page bounds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Query, Request

from daemon.core.auth import bearer_matches

if TYPE_CHECKING:
    from daemon.app.service import Daemon


def current_daemon(request: Request) -> Daemon:
    """The daemon whose API received the request (stored by `create_api`)."""
    return request.app.state.daemon


def authorized(request: Request) -> str:
    """The caller's name, for mutating calls ("admin" for the main token, else the name of the
    [api.tokens] entry); 401 without a right bearer token."""
    header = request.headers.get("authorization", "")
    if bearer_matches(header, request.app.state.api_token):
        return "admin"
    for name, token in request.app.state.named_tokens.items():
        if token and bearer_matches(header, token):
            return name
    raise HTTPException(401, "missing or wrong bearer token (see [api] token or <store dir>/api.token)")


# A string: the service imports the API, so the class is named here for type checkers only.
CurrentDaemon = Annotated["Daemon", Depends(current_daemon)]
Caller = Annotated[str, Depends(authorized)]
Limit = Annotated[int, Query(ge=1)]
Offset = Annotated[int, Query(ge=0)]
