"""Bearer tokens: the one check every receiver and the API use."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from tracefix.daemon.core.settings import Settings


API_TOKEN_FILE = "api.token"
ROUTER_TOKEN_FILE = "router.token"


def bearer_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``Bearer <token>`` (compared in constant time)."""
    scheme, _, credentials = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip(), token)


def stored_token(configured: str, path: Path, create: bool = False) -> str:
    """A bearer token: the configured one, else the one kept in ``path`` (created with mode 0600 by
    the process that serves it, read by its clients); empty when neither exists and not creating."""
    if configured:
        return configured
    if path.exists():
        return path.read_text().strip()
    if not create:
        return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token


def api_token(settings: Settings, create: bool = False) -> str:
    """The daemon API's token: from config, else from <store dir>/api.token (created by the daemon, mode 0600)."""
    return stored_token(settings.api.token, settings.data_dir / API_TOKEN_FILE, create)


def router_token(settings: Settings, create: bool = False) -> str:
    """The router's admin token: from config, else from <store dir>/router.token (created by the router)."""
    return stored_token(settings.router.token, settings.data_dir / ROUTER_TOKEN_FILE, create)
