"""What the target's tool schemas say, and values for them: which tools read or write, which
parameters name an entity, and seeded, realistic values for every parameter (Faker, guided by
types, formats, enums and names). The world of one instance, which keeps an entity's facts the same
in every tool result, is ``trainer.world``."""

from __future__ import annotations

import datetime as _dt
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faker import Faker

from tracefix.daemon.core.settings import CapabilitySettings

if TYPE_CHECKING:  # the environment module builds each instance's World: only the type is needed here
    from tracefix.trainer.environment import Tool

READ_PREFIXES = ("get_", "list_", "search_", "find_", "lookup_", "check_", "read_", "fetch_", "show_", "query_")
# Without the daemon's settings (a tool not marked): the default [capabilities] state_changing_prefixes.
WRITE_PREFIXES = tuple(CapabilitySettings().state_changing_prefixes)
_ID_NAME = re.compile(r"(^|_)(id|number|code|ref|reference)$", re.IGNORECASE)
# Parameters that name one entity: the id names plus keys people look things up by.
_KEY_NAME = re.compile(r"(^|_)(id|number|code|ref|reference|sku|email|username|handle|key|uuid|slug)$", re.IGNORECASE)


def is_write(tool: Tool) -> bool:
    """State-changing: as the daemon's settings marked the tool, else by its name."""
    return tool.state_changing if tool.state_changing is not None else tool.name.startswith(WRITE_PREFIXES)


def is_read(tool: Tool) -> bool:
    return not is_write(tool)


def properties(tool: Tool) -> dict[str, dict[str, Any]]:
    props = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    return props if isinstance(props, dict) else {}


def required(tool: Tool) -> list[str]:
    names = tool.parameters.get("required") if isinstance(tool.parameters, dict) else None
    return [name for name in names or [] if name in properties(tool)]


def id_parameters(tool: Tool) -> list[str]:
    """String parameters that identify an entity (``reservation_id``, ``order_number``…)."""
    return [
        name
        for name, schema in properties(tool).items()
        if _ID_NAME.search(name) and schema.get("type", "string") == "string" and "enum" not in schema
    ]


def key_parameters(tool: Tool) -> list[str]:
    """Required parameters that name an entity (``reservation_id``, ``order_number``, ``email``, ``sku``)."""
    props = properties(tool)
    ids = set(id_parameters(tool))
    keys = []
    for name in required(tool):
        schema = props[name] if isinstance(props[name], dict) else {}
        if schema.get("enum") or schema.get("type", "string") != "string":
            continue
        if name in ids or _KEY_NAME.search(name) or schema.get("format") == "email":
            keys.append(name)
    return keys


def entity_of(parameter: str) -> str:
    """``reservation_id`` → ``reservation``."""
    return _ID_NAME.sub("", parameter).strip("_") or parameter


@dataclass(slots=True)
class ToolRoles:
    reads: list[Tool]
    writes: list[Tool]


def roles(tools: Sequence[Tool]) -> ToolRoles:
    return ToolRoles([tool for tool in tools if is_read(tool)], [tool for tool in tools if is_write(tool)])


# Dates are drawn around a fixed day, never the clock: the same seed is the same instance any day.
ANCHOR = _dt.date(2026, 3, 2)


class SeededFaker:
    """Faker output for one seed, as ``Faker().seed_instance(seed)`` gives it, from one shared Faker.

    Building a Faker takes milliseconds and every instance (and every simulated result) needs one;
    each call here runs the shared Faker on this object's own random stream, so values stay the
    same however the users of different seeds interleave (single-threaded use only).
    """

    _shared: Faker | None = None

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        if SeededFaker._shared is None:
            SeededFaker._shared = Faker()
        shared = SeededFaker._shared
        method = getattr(shared, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            previous = shared.random
            shared.random = self._random
            try:
                return method(*args, **kwargs)
            finally:
                shared.random = previous

        return call


class Values:
    """Seeded realistic values for schema-typed parameters."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.faker = SeededFaker(seed)

    def date(self, low: int = 1, high: int = 90) -> str:
        """A day `low`..`high` days after the anchor (negative: before it)."""
        return (ANCHOR + _dt.timedelta(days=self.random.randint(low, high))).isoformat()

    def datetime(self, low: int = 1, high: int = 90) -> str:
        """A moment on a day `low`..`high` days after the anchor."""
        moment = _dt.datetime(ANCHOR.year, ANCHOR.month, ANCHOR.day) + _dt.timedelta(
            days=self.random.randint(low, high), minutes=self.random.randint(0, 24 * 60 - 1)
        )
        return moment.isoformat()

    def identifier(self, parameter: str, schema: dict[str, Any] | None = None) -> str:
        """An id like ``R-12345`` for `parameter` (matching the schema's pattern when it has one)."""
        pattern = (schema or {}).get("pattern")
        entity = entity_of(parameter)
        prefix = "".join(part[0] for part in entity.split("_") if part).upper() or "X"
        value = f"{prefix}-{self.random.randint(10000, 99999)}"
        if pattern and not re.fullmatch(pattern, value):
            value = self._matching(pattern) or value
        return value

    def _matching(self, pattern: str) -> str | None:
        """A string matching a simple pattern (literals, classes, \\d, \\w, {n,m} ? +), or None."""
        token = re.compile(r"\[(\^?[^\]]+)\]|\\([dwsDW.\\\-])|([^\\^$\[\]{}()*+?|])|\{(\d+)(?:,(\d*))?\}|([?+*])")
        body = pattern.removeprefix("^").removesuffix("$")
        pieces: list[list[str]] = []  # alphabets, one per position before quantifiers
        for match in token.finditer(body):
            klass, escape, literal, low, high, short = match.groups()
            if klass is not None:
                if klass.startswith("^"):
                    return None
                alphabet = []
                for part in re.finditer(r"(.)-(.)|(.)", klass):
                    start, end = (part.group(1), part.group(2)) if part.group(1) else (part.group(3), part.group(3))
                    alphabet.extend(chr(code) for code in range(ord(start), ord(end) + 1))
                pieces.append([alphabet or ["x"], 1, 1])
            elif escape is not None:
                alphabet = {"d": "0123456789", "w": "abcdefghijklmnopqrstuvwxyz0123456789"}.get(escape, escape)
                pieces.append([list(alphabet), 1, 1])
            elif literal is not None:
                pieces.append([[literal], 1, 1])
            elif low is not None and pieces:
                pieces[-1][1] = int(low)
                pieces[-1][2] = int(high) if high else (int(low) if high is None else int(low) + 3)
            elif short and pieces:
                pieces[-1][1], pieces[-1][2] = {"?": (0, 1), "+": (1, 3), "*": (0, 3)}[short]
        value = "".join(
            "".join(self.random.choice(alphabet) for _ in range(self.random.randint(low, high)))
            for alphabet, low, high in pieces
        )
        return value if re.fullmatch(pattern, value) else None

    def value(self, name: str, schema: dict[str, Any]) -> Any:
        """A value for parameter `name` that satisfies `schema` (type, enum, format, bounds)."""
        schema = schema if isinstance(schema, dict) else {}  # a target's odd schema still gets a value
        if "enum" in schema and schema["enum"]:
            return self.random.choice(schema["enum"])
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        lowered = name.lower()
        if kind == "integer":
            low, high = int(schema.get("minimum", 1)), int(schema.get("maximum", max(int(schema.get("minimum", 1)) + 8, 9)))
            return self.random.randint(low, high)
        if kind == "number":
            low, high = float(schema.get("minimum", 5)), float(schema.get("maximum", 900))
            return round(self.random.uniform(low, high), 2)
        if kind == "boolean":
            return self.random.random() < 0.5
        if kind == "array":
            item = schema.get("items", {"type": "string"})
            return [self.value(name.rstrip("s"), item) for _ in range(max(1, int(schema.get("minItems", 1))))]
        if kind == "object":
            return {key: self.value(key, sub) for key, sub in (schema.get("properties") or {}).items()}
        pattern = schema.get("pattern")
        if pattern:
            return self._matching(pattern) or self.faker.word()
        fmt = schema.get("format")
        if fmt == "date-time":  # before the name: a ``start_date`` declared as date-time wants a time too
            return self.datetime()
        if fmt == "date" or lowered.endswith("date") or lowered == "day":
            return self.date()
        if lowered == "sku" or lowered.endswith("_sku"):
            return f"SKU-{self.random.randint(100000, 999999)}"
        if fmt == "email" or "email" in lowered:
            return self.faker.email()
        if _ID_NAME.search(lowered):
            return self.identifier(name, schema)
        if "name" in lowered:
            return self.faker.name()
        if "city" in lowered or lowered in ("origin", "destination"):
            return self.faker.city()
        if "reason" in lowered or "note" in lowered or "message" in lowered:
            return self.faker.sentence(nb_words=6).rstrip(".")
        return self.faker.word()

    def key_value(self, name: str, schema: dict[str, Any]) -> Any:
        """A value for a key parameter: an id for any key name (``sku``…) unless typed, enumerated or an email."""
        schema = schema if isinstance(schema, dict) else {}
        if schema.get("enum") or schema.get("format") or "email" in name.lower() or schema.get("type", "string") != "string":
            return self.value(name, schema)
        return self.identifier(name, schema)

    def arguments(self, tool: Tool, optional_share: float = 0.0) -> dict[str, Any]:
        """Arguments for `tool`: every required parameter, and some optional ones."""
        chosen = required(tool)
        for name in properties(tool):
            if name not in chosen and self.random.random() < optional_share:
                chosen.append(name)
        return {name: self.value(name, properties(tool)[name]) for name in chosen}

    def record(
        self,
        entity: str,
        identifier: Any,
        extra: int = 3,
        key: str | None = None,
        statuses: Sequence[str] = ("active", "confirmed", "pending"),
    ) -> dict[str, Any]:
        """A plausible stored record for an entity, as a read tool would return it (id under `key`);
        an instance's records come from `World.record`, which keeps them alike in every result."""
        record: dict[str, Any] = {key or f"{entity}_id": identifier, "status": self.random.choice(list(statuses))}
        fields = [
            ("customer_name", self.faker.name),
            ("created", lambda: self.date(-90, -1)),
            ("amount", lambda: round(self.random.uniform(20, 900), 2)),
            ("email", self.faker.email),
        ]
        for field_name, make in fields[:extra]:
            if field_name not in record:  # the key itself (an ``email`` lookup) keeps the looked-up value
                record[field_name] = make()
        return record
