"""tool_call_precision: the instance needs exactly one correct call whose arguments come from the context.

One of the target's tools with required parameters is picked (seeded); schema-valid arguments are
generated; the user's request states every argument value in plain words. The agent must make
exactly that call; the environment answers with a simulated result and the episode ends at the
agent's plain-text answer. Difficulty 2 asks for every parameter the tool has (optional ones too)
and puts a distractor value (an older id, a value to ignore) into the request.

The helpers at the top (seeded values without a clock, schema checks, strict JSON equality, how
values are spoken) are shared with the sibling family ``argument_grounding``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Sequence
from typing import Any

import orjson
from jsonschema import FormatChecker, SchemaError
from jsonschema.validators import validator_for

from trainer.environment import (
    Family,
    Instance,
    Message,
    ParsedTurn,
    StepResult,
    Tool,
    ToolCall,
    assistant_call,
    assistant_text,
    parse_assistant,
    render_system_prompt,
    tool_message,
)
from trainer.world import Values, entity_of, id_parameters, is_read, properties, required

# -- shared helpers --------------------------------------------------------------------------------

# A fixed "today" for every generated date: ``Values`` asks Faker for dates relative to the clock,
# which would make an instance depend on the day it is built.
ANCHOR = _dt.date(2026, 3, 2)


def derive_seed(*parts: Any) -> int:
    """A stable integer from any printable parts (no ``hash()``: it is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class SeededValues(Values):
    """``Values`` whose dates come from a fixed anchor, never from the clock."""

    def value(self, name: str, schema: dict[str, Any]) -> Any:
        schema = schema if isinstance(schema, dict) else {}
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if kind == "string" and not schema.get("enum") and not schema.get("pattern"):
            fmt, lowered = schema.get("format"), name.lower()
            if fmt == "date-time":
                return self.datetime()
            if fmt == "date" or lowered.endswith("date") or lowered == "day":
                return self.date()
        return super().value(name, schema)

    def date(self, low: int = 1, high: int = 90) -> str:
        return (ANCHOR + _dt.timedelta(days=self.random.randint(low, high))).isoformat()

    def datetime(self) -> str:
        moment = _dt.datetime(ANCHOR.year, ANCHOR.month, ANCHOR.day) + _dt.timedelta(
            days=self.random.randint(1, 90), minutes=self.random.randint(0, 24 * 60 - 1)
        )
        return moment.isoformat()

    def record(self, entity: str, identifier: str, extra: int = 3, key: str | None = None) -> dict[str, Any]:
        """A plausible stored record (like ``Values.record``), keyed by ``key`` (default ``<entity>_id``)."""
        record: dict[str, Any] = {key or f"{entity}_id": identifier}
        record["status"] = self.random.choice(["active", "confirmed", "pending"])
        fields = [
            ("customer_name", self.faker.name),
            ("created", lambda: self.date(-90, -1)),
            ("amount", lambda: round(self.random.uniform(20, 900), 2)),
            ("email", self.faker.email),
        ]
        for field_name, make in fields[:extra]:
            record[field_name] = make()
        return record


def tool_entity(tool: Tool) -> str:
    """``get_user`` → ``user``, ``search_flights`` → ``flight``, ``list_order_items`` → ``order_item``."""
    words = [word for word in tool.name.split("_") if word]
    noun = "_".join(words[1:]) if len(words) > 1 else (words[0] if words else "item")
    return singular(noun)


def singular(noun: str) -> str:
    if noun.endswith("ies") and len(noun) > 4:
        return noun[:-3] + "y"
    if noun.endswith("s") and not noun.endswith("ss") and len(noun) > 3:
        return noun[:-1]
    return noun


def plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def phrase(name: str) -> str:
    """How a person names a parameter: ``reservation_id`` → ``reservation id``."""
    return name.replace("_", " ").replace("-", " ").strip() or name


def spoken(value: Any) -> str:
    """A value as the user writes it; strings with spaces or commas are quoted so their ends are clear."""
    if isinstance(value, str):
        return f'"{value}"' if (not value or any(ch in value for ch in " ,;:\"'")) else value
    return orjson.dumps(value).decode()


def same(left: Any, right: Any) -> bool:
    """JSON equality without Python's ``True == 1``; ints and floats compare by value."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


def schema_error(tool: Tool, arguments: Any) -> str | None:
    """Why ``arguments`` fail the tool's JSON schema (None when they pass)."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__ if arguments is not None else 'invalid JSON'}"
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    try:
        validator = validator_for(schema)(schema, format_checker=FormatChecker())
        error = next(iter(sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))), None)
    except SchemaError:  # the target's own schema is broken: only the object shape can be checked
        return None
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"


def call_attempts(parsed: Any) -> int:
    """Calls in one parsed message, counting unparseable blocks (arguments that are not JSON are
    reported both as an error and as a call with ``arguments=None``: counted once)."""
    attached = sum(1 for call in parsed.calls if call.arguments is None)
    return len(parsed.calls) + max(0, len(parsed.errors) - attached)


def simulated_result(tool: Tool, arguments: dict[str, Any], values: SeededValues) -> dict[str, Any]:
    """What a declared tool plausibly returns for schema-valid arguments."""
    ids = [name for name in id_parameters(tool) if isinstance(arguments.get(name), str)]
    if not is_read(tool):
        result: dict[str, Any] = {"status": "success", "confirmation": values.identifier("confirmation_code")}
        result.update(arguments)
        return result
    if ids:
        record = values.record(entity_of(ids[0]), arguments[ids[0]], key=ids[0])
        record.update({name: value for name, value in arguments.items() if isinstance(value, str)})
        return record
    entity = tool_entity(tool)
    results = []
    for _ in range(2):
        record = values.record(entity, values.identifier(f"{entity}_id"), extra=0)
        record.update({name: value for name, value in arguments.items() if isinstance(value, str)})
        record["price"] = round(values.random.uniform(20, 900), 2)
        results.append(record)
    return {"results": results}


def state_values(values: SeededValues, arguments: dict[str, Any], order: list[str]) -> str:
    """A sentence (varied templates) stating every argument value."""
    rng = values.random
    pairs = [(phrase(name), spoken(arguments[name])) for name in order]
    style = rng.randrange(3)
    if style == 0:
        clauses = [f"the {name} is {value}" for name, value in pairs]
        text = clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
        return text[0].upper() + text[1:] + "."
    if style == 1:
        return "Details: " + "; ".join(f"{name}: {value}" for name, value in pairs) + "."
    clauses = [f"{name} {value}" for name, value in pairs]
    return "Use " + (clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]) + "."


OPENERS = ("Hi!", "Hello.", "Hey there.", "Good morning.", "Hi, quick one.", "")


def action_phrase(tool: Tool, values: SeededValues) -> str:
    """What the user asks for, from the tool's description or its name."""
    description = tool.description.strip().rstrip(".").strip()
    if description and values.random.random() < 0.5:
        return description[0].lower() + description[1:]
    words = [word for word in tool.name.split("_") if word]
    if len(words) == 1:
        return words[0]
    return f"{words[0]} the {' '.join(words[1:])}"


SYSTEM_INSTRUCTIONS = (
    "You are a customer support agent. Help the user with the tools below. Take every argument "
    "value from the conversation exactly as given; never invent values."
)


# -- the family ------------------------------------------------------------------------------------


class ToolCallPrecisionInstance(Instance):
    max_turns = 4

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.by_name = {tool.name: tool for tool in self.tools}
        self.values = SeededValues(derive_seed("tool_call_precision", seed, difficulty))
        rng = self.values.random
        candidates = [tool for tool in self.tools if required(tool)]
        if difficulty >= 2:
            richer = [tool for tool in candidates if len(properties(tool)) >= 2]
            candidates = richer or candidates
        self.target = rng.choice(candidates)
        names = list(properties(self.target)) if difficulty >= 2 else required(self.target)
        self.gold: dict[str, Any] = {}
        for name in names:
            self.gold[name] = self.values.value(name, properties(self.target)[name])
        order = list(self.gold)
        rng.shuffle(order)
        request = rng.choice(
            (
                "Could you {action} for me?",
                "I need you to {action}.",
                "Please {action}.",
                "Can you {action}?",
                "I'd like you to {action}.",
            )
        ).format(action=action_phrase(self.target, self.values))
        parts = [rng.choice(OPENERS), request, state_values(self.values, self.gold, order)]
        self.distractor: tuple[str, Any] | None = None
        if difficulty >= 2:
            self.distractor = self._distractor()
            if self.distractor is not None:
                name, value = self.distractor
                sentence = rng.choice(
                    (
                        "Earlier I gave you the {p} {v} by mistake; ignore that one.",
                        "(My previous {p} was {v}, but that is outdated.)",
                        "A colleague mentioned the {p} {v}, but that is not the one I mean.",
                        "Not {v} as the {p}, please; that was another request.",
                    )
                ).format(p=phrase(name), v=spoken(value))
                parts.insert(rng.choice((1, 3)), sentence)
        self.user_text = " ".join(part for part in parts if part)
        self.outcome: float | None = None  # the score of the first call attempt
        self.attempts = 0
        self.turns = 0
        self.done = False

    def _distractor(self) -> tuple[str, Any] | None:
        """A second value for one of the gold parameters (ids first) that must not be used."""
        schema_of = properties(self.target)
        ids = [name for name in id_parameters(self.target) if name in self.gold]
        others = [
            name
            for name, value in self.gold.items()
            if name not in ids
            and not isinstance(value, bool)
            and isinstance(value, (str, int, float))
            and len(schema_of[name].get("enum") or [None, None]) > 1
        ]
        pool = ids or others
        if not pool:
            return None
        name = self.values.random.choice(pool)
        for _ in range(12):
            value = self.values.value(name, schema_of[name])
            if not same(value, self.gold[name]) and spoken(value) not in spoken(self.gold[name]):
                return name, value
        return None

    def reset(self) -> list[Message]:
        return [
            {"role": "system", "content": render_system_prompt(SYSTEM_INSTRUCTIONS, self.tools)},
            {"role": "user", "content": self.user_text},
        ]

    def score(self, call: ToolCall) -> float:
        rewards = ToolCallPrecisionFamily.rewards
        if call.name not in self.by_name:
            return rewards["undeclared_tool"]
        if call.name != self.target.name:
            return rewards["other_declared_tool"] if isinstance(call.arguments, dict) else rewards["no_valid_call"]
        if schema_error(self.target, call.arguments) is not None:
            return rewards["right_tool_invalid_arguments"]
        if not same(call.arguments, self.gold):
            return rewards["right_tool_wrong_value"]
        return rewards["exact_call"]

    def _execute(self, call: ToolCall, index: int) -> Any:
        tool = self.by_name.get(call.name)
        if tool is None:
            self.events.append(f"unknown_tool: {call.name}")
            return {"error": f"unknown tool {call.name}"}
        problem = schema_error(tool, call.arguments)
        if problem is not None:
            self.events.append(f"schema_violation: {call.name}: {problem}")
            return {"error": f"invalid arguments for {call.name}: {problem}"}
        if call.name != self.target.name:
            self.events.append(f"wrong_tool: {call.name}")
        values = SeededValues(derive_seed("tool_call_precision.result", self.seed, self.difficulty, self.turns, index))
        return simulated_result(tool, call.arguments, values)

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult([], True)
        self.turns += 1
        try:
            parsed = parse_assistant(assistant if isinstance(assistant, dict) else {})
        except Exception as error:  # a message shape the parser does not expect: malformed output
            parsed = ParsedTurn("", [], [f"unparseable message ({type(error).__name__})"])
        for error in parsed.errors:
            self.events.append(f"parse_error: {error}")
        attempts = call_attempts(parsed)
        if attempts and self.outcome is None:
            self.outcome = self.score(parsed.calls[0]) if parsed.calls else ToolCallPrecisionFamily.rewards["no_valid_call"]
        self.attempts += attempts
        if not parsed.calls:
            self.done = True
            return StepResult([], True)
        messages = [tool_message(call, self._execute(call, index)) for index, call in enumerate(parsed.calls)]
        self.done = self.turns >= self.max_turns
        return StepResult(messages, self.done)

    def reward(self) -> float:
        rewards = ToolCallPrecisionFamily.rewards
        if self.outcome is None:
            return rewards["no_valid_call"]
        if self.outcome == rewards["exact_call"] and self.attempts > 1:
            return rewards["exact_call_then_extra_calls"]
        return self.outcome

    def solution(self) -> list[Message]:
        return [
            assistant_call(self.target.name, dict(self.gold)),
            assistant_text(f"Done: I called {self.target.name} with the details you gave."),
        ]

    def hint(self) -> str:
        arguments = orjson.dumps(self.gold).decode()
        return f"Call {self.target.name} once with exactly these arguments: {arguments}; then answer in plain text."


class ToolCallPrecisionFamily(Family):
    """One exact tool call whose arguments are all stated in the user's request.

    Reward of the episode (only the first call attempt is scored):

    ========================================================  ======
    exact call: right tool, schema-valid, arguments == gold     1.0
    exact first call, but more calls followed (not exactly 1)   0.6
    right tool, schema-valid, some value wrong/missing/extra    0.6
    right tool, arguments invalid for the schema or not JSON    0.3
    well-formed call (object arguments) to another declared     0.1
    no parseable call, undeclared tool, plain text only         0.0
    ========================================================  ======
    """

    name = "tool_call_precision"
    capability = "tool_call_precision"
    version = "1"
    description = "Make exactly one call to the right tool with the argument values the user stated."
    rewards = {
        "exact_call": 1.0,
        "exact_call_then_extra_calls": 0.6,
        "right_tool_wrong_value": 0.6,
        "right_tool_invalid_arguments": 0.3,
        "other_declared_tool": 0.1,
        "undeclared_tool": 0.0,
        "no_valid_call": 0.0,
    }
    levels = (1, 2)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if not tools:
            return "no tools"
        if not any(required(tool) for tool in tools):
            return "no tool has a required parameter"
        return None

    def instance(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> ToolCallPrecisionInstance:
        reason = self.unusable(tools)
        if reason:
            raise ValueError(f"{self.name} cannot use these tools: {reason}")
        return ToolCallPrecisionInstance(tools, seed, max(1, min(int(difficulty), max(self.levels))))
