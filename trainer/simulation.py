"""The simulated backend the families share: stable seeds, schema checks of the agent's arguments,
how a backend compares values and looks up ids, and the error objects it answers with."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable
from typing import Any

import orjson
from jsonschema import FormatChecker
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from tracefix.trainer.environment import Tool
from tracefix.trainer.schema_values import id_parameters


def derive_seed(*parts: Any) -> int:
    """A stable integer from printable parts (never ``hash()``: it is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


# -- schema checks ----------------------------------------------------------------------------------

# Building a validator checks the schema, which is slow; validators are stateless, so they are shared
# by schema text (and by whether formats are checked).
_VALIDATORS: dict[tuple[bytes, bool], Any] = {}


def validator(tool: Tool, formats: bool = True) -> Any | None:
    """The cached JSON-schema validator of the tool's parameters; None when the schema is broken."""
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    try:
        key = (orjson.dumps(schema, option=orjson.OPT_SORT_KEYS), formats)
    except TypeError:
        return None
    if key not in _VALIDATORS:
        try:
            cls = validator_for(schema)
            cls.check_schema(schema)
            _VALIDATORS[key] = cls(schema, format_checker=FormatChecker() if formats else None)
        except Exception:  # noqa: BLE001 - a target's broken schema checks nothing, never crashes
            _VALIDATORS[key] = None
    return _VALIDATORS[key]


def schema_error(tool: Tool, arguments: Any, formats: bool = True) -> str | None:
    """Why ``arguments`` fail the tool's JSON schema (None when they pass); `formats` also checks ``format``."""
    if not isinstance(arguments, dict):
        kind = "invalid JSON" if arguments is None else type(arguments).__name__
        return f"arguments must be a JSON object, got {kind}"
    checker = validator(tool, formats)
    if checker is None:  # the target's own schema is broken: only the object shape can be checked
        return None
    try:
        error = best_match(checker.iter_errors(arguments))
    except Exception as exc:  # noqa: BLE001 - a validator crash is reported, not raised
        return f"arguments could not be checked: {type(exc).__name__}"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"


# -- comparing values ---------------------------------------------------------------------------------


def same(
    left: Any,
    right: Any,
    numbers: Callable[[float, float], bool] = operator.eq,
    strings: Callable[[str, str], bool] = operator.eq,
) -> bool:
    """JSON equality without Python's ``True == 1``; `numbers` and `strings` compare the leaves."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return numbers(left, right)
    if isinstance(left, str) and isinstance(right, str):
        return strings(left, right)
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key], numbers, strings) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b, numbers, strings) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


def to_the_cent(left: float, right: float) -> bool:
    """Numbers equal once rounded to money."""
    return abs(left - right) < 0.005


def within_rounding(left: float, right: float) -> bool:
    """Numbers equal up to float rounding (relative to the expected `right`)."""
    return abs(left - right) <= 1e-6 * max(1.0, abs(right))


def case_folded(left: str, right: str) -> bool:
    """Strings equal once trimmed and case-folded, as a lenient backend looks them up."""
    return left.strip().casefold() == right.strip().casefold()


def same_as_backend(left: Any, right: Any) -> bool:
    """Equality as a backend would apply it: numbers within rounding, strings trimmed and case-folded."""
    return same(left, right, within_rounding, case_folded)


def matches(arguments: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether `arguments` hold every expected value (extra arguments are allowed)."""
    return all(key in arguments and same_as_backend(arguments[key], value) for key, value in expected.items())


def unknown_id(tool: Tool, arguments: dict[str, Any], known: dict[str, Any]) -> tuple[str, Any] | None:
    """The first id argument (parameter, value) that names no entity the backend holds (`known`: the
    value each id parameter may take), or None."""
    for param in id_parameters(tool):
        if param in arguments and not (param in known and same_as_backend(arguments[param], known[param])):
            return param, arguments[param]
    return None


# -- what the backend answers -------------------------------------------------------------------------

# Statuses of a stored record no change is waiting on (``pending`` would read as a precondition).
SETTLED_STATUSES = ("active", "confirmed")


def error_result(message: str, code: str, **extra: Any) -> dict[str, Any]:
    """An error in the usual shape of a tool backend: ``{"error": ..., "code": ...}`` and any details."""
    return {"error": message, "code": code, **extra}
