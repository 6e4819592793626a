"""What a route handler receives besides its own parameters: the daemon, the caller, page bounds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Query, Request

from tracefix.daemon.core.auth import bearer_matches

if TYPE_CHECKING:
    from tracefix.daemon.app.service import Daemon


def current_daemon(request: Request) -> Daemon:
    """The daemon whose API received the request (stored by `create_api`)."""
    return request.app.state.daemon


ACTOR_HEADER = "x-tracefix-actor"  # the person a delegate token ([api] delegates) acts for
ACTOR_LENGTH = 200


def authorized(request: Request) -> str:
    """The caller's name, for mutating calls ("admin" for the main token, else the name of the
    [api.tokens] entry, or "person (via name)" where a delegate token names the person it acts for
    in X-Tracefix-Actor); 401 without a right bearer token, 403 for a person named by a token that
    may not act for others, 422 for an unusable name."""
    header = request.headers.get("authorization", "")
    actor = request.headers.get(ACTOR_HEADER)
    name = "admin" if bearer_matches(header, request.app.state.api_token) else None
    if name is None:
        name = next(
            (named for named, token in request.app.state.named_tokens.items() if token and bearer_matches(header, token)), None
        )
    if name is None:
        raise HTTPException(401, "missing or wrong bearer token (see [api] token or <store dir>/api.token)")
    if actor is None:
        return name
    if name not in request.app.state.delegates:
        raise HTTPException(403, f"the token {name!r} may not act for someone else ({ACTOR_HEADER}); [api] delegates names those that may")
    actor = actor.strip()
    if not actor or len(actor) > ACTOR_LENGTH or not actor.isprintable():
        raise HTTPException(422, f"{ACTOR_HEADER} must name a person in 1 to {ACTOR_LENGTH} printable characters")
    return f"{actor} (via {name})"


# A string: the service imports the API, so the class is named here for type checkers only.
CurrentDaemon = Annotated["Daemon", Depends(current_daemon)]
Caller = Annotated[str, Depends(authorized)]
Limit = Annotated[int, Query(ge=1)]
Offset = Annotated[int, Query(ge=0)]
