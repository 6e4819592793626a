"""Attribute values as they come off the network: decoded and typed defensively, never trusted."""

from __future__ import annotations

from typing import Any

import orjson

_ROLES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system role
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "chatbot": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}


_UNPARSEABLE = object()  # what _decode returns for text that is not JSON


def _decode(value: Any) -> Any:
    """JSON text parsed, structured values as they are, `_UNPARSEABLE` for text that is not JSON."""
    if isinstance(value, (str, bytes, bytearray)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return _UNPARSEABLE
    return value


def _text(value: Any) -> str:
    """Any attribute value as text: strings as they are, structures as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return _dumps(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None or value == "" else _text(value)


def _unquoted(value: Any) -> str:
    # A function that returned a string is recorded as a JSON string literal.
    data = _decode(value)
    return data if isinstance(data, str) else _text(value)


def _arguments(value: Any) -> str:
    # Nothing recorded means a call without arguments, which is what "{}" says.
    return "{}" if value is None else _text(value)


def _schema(value: Any) -> dict | None:
    data = _decode(value)
    return data if isinstance(data, dict) else None


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, default=_text_fallback, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        # Nested too deep, or an integer beyond 64 bits.
        try:
            return str(value)
        except RecursionError:
            return ""


def _text_fallback(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _role(value: Any, default: str) -> str:
    if not isinstance(value, str) or not value:
        return default
    role = value.lower()
    return _ROLES.get(role, role)


def _first_text(attributes: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = _optional_text(attributes.get(key))
        if value is not None:
            return value
    return None
