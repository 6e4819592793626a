"""tool_call_precision: the instance needs exactly one correct call whose arguments come from the context.

One of the target's tools with required parameters is picked (seeded); schema-valid arguments are
generated; the user's request states every argument value in plain words. The agent must make
exactly that call; the environment answers with a simulated result and the episode ends at the
agent's plain-text answer. Difficulty 2 asks for every parameter the tool has (optional ones too)
and puts a distractor value (an older id, a value to ignore) into the request.

The helpers at the top (entity nouns, how the request states values, simulated results) are shared
with the sibling family ``argument_grounding``; wording comes from ``_shared``; seeds, schema checks
and equality come from ``simulation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from trainer.environment import Family, Message, ParsedTurn, Tool, ToolCall, assistant_call, assistant_text
from trainer.families._shared import ToolUseInstance, and_join, phrase, singular, spoken
from trainer.simulation import derive_seed, same, schema_error
from trainer.world import Values, entity_of, id_parameters, is_read, properties, required

# -- shared helpers --------------------------------------------------------------------------------


def tool_entity(tool: Tool) -> str:
    """``get_user`` → ``user``, ``search_flights`` → ``flight``, ``list_order_items`` → ``order_item``."""
    words = [word for word in tool.name.split("_") if word]
    noun = "_".join(words[1:]) if len(words) > 1 else (words[0] if words else "item")
    return singular(noun)


def call_attempts(parsed: ParsedTurn) -> int:
    """Calls in one parsed message, counting unparseable blocks (arguments that are not JSON are
    reported both as an error and as a call with ``arguments=None``: counted once)."""
    attached = sum(1 for call in parsed.calls if call.arguments is None)
    return len(parsed.calls) + max(0, len(parsed.errors) - attached)


def simulated_result(tool: Tool, arguments: dict[str, Any], values: Values) -> dict[str, Any]:
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


def state_values(values: Values, arguments: dict[str, Any], order: list[str]) -> str:
    """A sentence (varied templates) stating every argument value."""
    rng = values.random
    pairs = [(phrase(name), spoken(arguments[name])) for name in order]
    style = rng.randrange(3)
    if style == 0:
        text = and_join([f"the {name} is {value}" for name, value in pairs])
        return text[0].upper() + text[1:] + "."
    if style == 1:
        return "Details: " + "; ".join(f"{name}: {value}" for name, value in pairs) + "."
    return "Use " + and_join([f"{name} {value}" for name, value in pairs]) + "."


OPENERS = ("Hi!", "Hello.", "Hey there.", "Good morning.", "Hi, quick one.", "")


def action_phrase(tool: Tool, values: Values) -> str:
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


class ToolCallPrecisionInstance(ToolUseInstance):
    instructions = SYSTEM_INSTRUCTIONS
    max_turns = 4

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.values = Values(derive_seed("tool_call_precision", seed, difficulty))
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

    def _read(self, assistant: Message) -> ParsedTurn:
        """The turn's calls and text; the episode's first call attempt (the only one scored) gets its score here."""
        parsed = super()._read(assistant)
        attempts = call_attempts(parsed)
        if attempts and self.outcome is None:
            self.outcome = self.score(parsed.calls[0]) if parsed.calls else ToolCallPrecisionFamily.rewards["no_valid_call"]
        self.attempts += attempts
        return parsed

    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        if call.name != self.target.name:
            self.events.append(f"wrong_tool: {call.name}")
        values = Values(derive_seed("tool_call_precision.result", self.seed, self.difficulty, self.turns, index))
        return simulated_result(tool, call.arguments, values)

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

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> ToolCallPrecisionInstance:
        return ToolCallPrecisionInstance(tools, seed, max(1, min(int(difficulty), max(self.levels))))
