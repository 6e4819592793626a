"""The JSON Schema type name of a parsed JSON value, shared by the schema inference of observed
tool calls and the result shapes learned from stored tool results."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    """``boolean``, ``integer``, ``number``, ``string``, ``array``, ``object`` or ``null``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"
