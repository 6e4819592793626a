"""Bearer tokens: the one check every receiver and the API use."""

from __future__ import annotations

import hmac


def bearer_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``Bearer <token>`` (compared in constant time)."""
    scheme, _, credentials = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip(), token)
