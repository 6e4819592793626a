"""What an agent's tools return, learned from the results stored in its own traces, so that the
synthetic worlds a training environment builds return records of the same shape: the same keys and
nesting, the same types, ids in the same format (``R-48213``, ``U-1042``), dates and amounts as the
tool writes them, the few values a status field takes, and the arguments that come back in the
result (``get_reservation(reservation_id)`` returns that ``reservation_id``).

A shape is plain JSON (it travels in the environment's tool definitions, under ``result_shape``):

- ``{"type": "object", "fields": {key: {"shape": …, "presence": share of results with the key}}}``
- ``{"type": "array", "items": …, "length": [shortest, longest]}``
- ``{"type": "string", "format": "id" | "date" | "datetime" | "time" | "email" | "enum" | "text", …}``
  with ``template`` for ids (letters and separators kept, each digit ``#``), ``values`` for enums
  (the strings seen, when few repeat), ``examples`` for free text;
- ``{"type": "number" | "integer", "low": …, "high": …, "decimals": …}``, ``{"type": "boolean"}``,
  ``{"type": "null"}``;
- ``"echo": argument name`` on any field whose value was that argument's in every sample.

``generate`` draws a result from a shape; ``conformance`` scores how well a result fits one (the
share of its leaves that have the shape's type and format, with missing and extra keys counted).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from tracefix.daemon.core.json_types import json_type

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
_TIME = re.compile(r"^\d{2}:\d{2}(:\d{2})?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
# An id: letters, digits and separators only, with at least two digits and no spaces (``R-48213``, ``PM-2024``, ``BJ1032``).
_ID = re.compile(r"^(?=(?:.*\d){2})[A-Za-z0-9][A-Za-z0-9_\-]*$")
_ENUM_MAX = 8  # at most this many distinct strings, each seen at least twice on average, make an enum
_EXAMPLES = 5


def learn(samples: Sequence[tuple[Mapping[str, Any], Any]]) -> dict[str, Any]:
    """The shape of a tool's results from (arguments, result) samples of its successful calls."""
    if not samples:
        raise ValueError("learning a result shape needs at least one stored result")
    shape = _learn([result for _, result in samples])
    _mark_echoes(shape, samples, ())
    return shape


def _learn(values: list[Any]) -> dict[str, Any]:
    kinds = Counter(json_type(value) for value in values)
    nulls = kinds.pop("null", 0)
    if set(kinds) == {"integer", "number"}:  # 12 and 12.5 in one field: a number
        kinds = Counter({"number": kinds.total()})
    kind = kinds.most_common(1)[0][0] if kinds else "null"
    present = [value for value in values if json_type(value) == kind or (kind == "number" and json_type(value) == "integer")]
    shape: dict[str, Any] = {"type": kind}
    if nulls and kind != "null":
        shape["nullable"] = round(nulls / len(values), 3)
    if kind == "object":
        keys = list(dict.fromkeys(key for value in present for key in value))
        shape["fields"] = {
            key: {"shape": _learn([value[key] for value in present if key in value]), "presence": round(sum(key in value for value in present) / len(present), 3)}
            for key in keys
        }  # fmt: skip
    elif kind == "array":
        shape["length"] = [min(len(value) for value in present), max(len(value) for value in present)]
        items = [item for value in present for item in value]
        if items:
            shape["items"] = _learn(items)
    elif kind in ("number", "integer"):
        shape["low"], shape["high"] = min(present), max(present)
        if kind == "number":
            shape["decimals"] = max(_decimals(value) for value in present)
    elif kind == "string":
        shape.update(_string_shape(present))
    return shape


def _decimals(value: float) -> int:
    text = repr(float(value))
    return min(len(text.partition(".")[2].rstrip("0")), 6) if "e" not in text else 6


def _string_shape(values: list[str]) -> dict[str, Any]:
    for name, pattern in (("date", _DATE), ("datetime", _DATETIME), ("time", _TIME), ("email", _EMAIL)):
        if all(pattern.match(value) for value in values):
            return {"format": name, **({"low": min(values), "high": max(values)} if name in ("date", "datetime", "time") else {})}
    distinct = sorted(set(values))
    if all(_ID.match(value) for value in values):
        templates = Counter(_template(value) for value in values)
        return {"format": "id", "template": templates.most_common(1)[0][0], "templates": sorted(templates)}
    if len(distinct) <= _ENUM_MAX and len(values) >= 2 * len(distinct):
        return {"format": "enum", "values": distinct}
    return {"format": "text", "examples": distinct[:_EXAMPLES]}


def _template(value: str) -> str:
    return re.sub(r"\d", "#", value)


def _mark_echoes(shape: dict[str, Any], samples: Sequence[tuple[Mapping[str, Any], Any]], path: tuple[str, ...]) -> None:
    """Mark the object fields (top level and nested objects, not inside arrays) whose value was one
    argument's in every sample that has both."""
    for key, field in (shape.get("fields") or {}).items():
        where = (*path, key)
        pairs = [(arguments, found) for arguments, result in samples if (found := _at(result, where)) is not _MISSING]
        for name in sorted({name for arguments, _ in pairs for name in arguments}):
            compared = [(arguments[name], found) for arguments, found in pairs if name in arguments]
            if compared and all(argument == found for argument, found in compared) and len(compared) == len(pairs):
                field["echo"] = name
                break
        if field["shape"]["type"] == "object":
            _mark_echoes(field["shape"], samples, where)


_MISSING = object()


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


# -- generating ----------------------------------------------------------------------------------


def generate(shape: Mapping[str, Any], rng: random.Random, arguments: Mapping[str, Any] | None = None) -> Any:
    """A result drawn from `shape`; echo fields carry the call's `arguments`."""
    arguments = arguments or {}
    nullable = shape.get("nullable", 0.0)
    if nullable and rng.random() < nullable:
        return None
    kind = shape["type"]
    if kind == "object":
        result = {}
        for key, field in shape.get("fields", {}).items():
            if field.get("echo") in arguments:
                result[key] = arguments[field["echo"]]
            elif field.get("presence", 1.0) >= 1.0 or rng.random() < field["presence"]:
                result[key] = generate(field["shape"], rng, arguments)
        return result
    if kind == "array":
        low, high = shape.get("length", [0, 0])
        return [generate(shape["items"], rng, arguments) for _ in range(rng.randint(low, high))] if "items" in shape else []
    if kind == "integer":
        return rng.randint(int(shape["low"]), int(shape["high"]))
    if kind == "number":
        return round(rng.uniform(float(shape["low"]), float(shape["high"])), int(shape.get("decimals", 2)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(shape, rng)


def _string(shape: Mapping[str, Any], rng: random.Random) -> str:
    form = shape.get("format", "text")
    if form == "id":
        return re.sub("#", lambda _: str(rng.randint(0, 9)), rng.choice(shape.get("templates") or [shape["template"]]))
    if form == "enum":
        return rng.choice(shape["values"])
    if form == "date":
        low, high = date.fromisoformat(shape["low"]), date.fromisoformat(shape["high"])
        return (low + timedelta(days=rng.randint(0, max(0, (high - low).days)))).isoformat()
    if form == "datetime":
        low, high = (datetime.fromisoformat(shape[end].replace("Z", "+00:00")) for end in ("low", "high"))
        moment = low + timedelta(seconds=rng.randint(0, max(0, int((high - low).total_seconds()))))
        return moment.isoformat().replace("+00:00", "Z") if shape["low"].endswith("Z") else moment.isoformat()
    if form == "time":
        return f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}" + (":00" if shape["low"].count(":") == 2 else "")
    if form == "email":
        return f"{rng.choice(('alex', 'sam', 'kim', 'lee', 'rio'))}.{rng.randint(10, 99)}@example.com"
    return rng.choice(shape.get("examples") or ["text"])


def dress(
    shape: Mapping[str, Any],
    result: Any,
    rng: random.Random,
    arguments: Mapping[str, Any] | None = None,
    known: Mapping[str, Any] | None = None,
) -> Any:
    """A simulated result in the agent's own shape: the fields the simulation decided (the task's
    facts) kept as they are, the learned fields it lacks added as the tool returns them: those in
    `known` (what the instance's world already holds of the record: a user's name, a reservation's
    user) with that value, the others drawn. Drawn lists are added only when the result has none of
    its own (a search's matches are the simulation's), and anything but an object result (an
    error, a list, text) is returned as it is."""
    if shape.get("type") != "object" or not isinstance(result, dict) or "error" in result:
        return result
    fields = shape.get("fields", {})
    result = _renamed(fields, result)
    has_list = any(isinstance(value, list) for value in result.values())
    learned = generate(shape, rng, {**(arguments or {}), **{key: value for key, value in result.items() if not isinstance(value, dict | list)}})
    known = {key: value for key, value in (known or {}).items() if key in fields and key not in result}
    extra = {
        key: known[key] if key in known else learned[key]
        for key in fields
        if key not in result and (key in known or (key in learned and not (has_list and isinstance(learned[key], list))))
    }
    return {**result, **extra}


def _renamed(fields: Mapping[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The result with each key the agent's tool never returns renamed to a learned field the
    result lacks, whose name shares a word with the key and whose shape the value fits (``amount`` →
    ``refund_amount``, ``created`` → ``created_at``); the closest name wins, and a key with no such
    field keeps its name. Values are never changed: they are the simulation's facts."""
    free = [name for name in fields if name not in result]
    renamed: dict[str, Any] = {}
    for key, value in result.items():
        words = _words(key)
        candidates = [
            (len(words & _words(name)) / len(words | _words(name)), name)
            for name in free
            if words & _words(name) and _fits_whole(fields[name]["shape"], value)
        ]
        if key in fields or not candidates:
            renamed[key] = value
            continue
        name = max(candidates, key=lambda item: item[0])[1]
        free.remove(name)
        renamed[name] = value
    return renamed


def _words(name: str) -> set[str]:
    return {word for word in re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()) if word}


def _fits_whole(shape: Mapping[str, Any], value: Any) -> bool:
    """A scalar that fits the shape's type and format, or a container of the shape's type."""
    if isinstance(value, dict | list):
        return json_type(value) == shape["type"]
    return value is not None and conformance(shape, value) >= 1.0


# -- conformance ---------------------------------------------------------------------------------


def conformance(shape: Mapping[str, Any], value: Any) -> float:
    """How well `value` fits `shape`, 0–1: the share of the shape's leaves (and of the value's own
    extra keys) that are present with the shape's type and format."""
    fitting, total = _fit(shape, value)
    return fitting / total if total else 1.0


def _fit(shape: Mapping[str, Any], value: Any) -> tuple[float, int]:
    if value is None:
        return (1.0 if shape.get("nullable") or shape["type"] == "null" else 0.0), 1
    kind = shape["type"]
    if json_type(value) != kind and not (kind == "number" and json_type(value) == "integer"):
        return 0.0, max(1, _leaves(shape))
    if kind == "object":
        fitting, total = 0.0, 0
        fields = shape.get("fields", {})
        for key, field in fields.items():
            if key in value:
                got, count = _fit(field["shape"], value[key])
                fitting, total = fitting + got, total + count
            elif field.get("presence", 1.0) >= 1.0:
                total += _leaves(field["shape"])  # a key every stored result has is missing
        total += sum(1 for key in value if key not in fields)  # keys the agent's tool never returns
        return fitting, total
    if kind == "array":
        if "items" not in shape or not value:
            return 1.0, 1
        scores = [_fit(shape["items"], item) for item in value]
        return sum(got / count for got, count in scores) / len(scores), 1
    if kind == "string":
        return (1.0 if _string_fits(shape, value) else 0.0), 1
    return 1.0, 1


def _leaves(shape: Mapping[str, Any]) -> int:
    if shape["type"] == "object":
        return sum(_leaves(field["shape"]) for field in shape.get("fields", {}).values()) or 1
    return 1


def _string_fits(shape: Mapping[str, Any], value: str) -> bool:
    form = shape.get("format", "text")
    if form == "id":
        return _template(value) in (shape.get("templates") or [shape["template"]])
    if form == "enum":
        return value in shape["values"]
    pattern = {"date": _DATE, "datetime": _DATETIME, "time": _TIME, "email": _EMAIL}.get(form)
    return bool(pattern.match(value)) if pattern else True
