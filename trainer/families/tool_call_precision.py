"""tool_call_precision: the instance needs correct calls whose arguments come from the context.

One of the target's tools with required parameters is picked (seeded): a read wherever the tool
set has one (``targets``; a state change is asked for, read and confirmed in
``precondition_verification``). Schema-valid arguments are generated. Two kinds of instance, drawn
per seed:

- *stated*: the user's request states every argument value in plain words. The agent must make
  exactly that call; the environment answers with a simulated result and the episode ends at the
  agent's plain-text answer.
- *lookup* (``LOOKUP_SHARE`` of the seeds, where the tools allow it): the request holds back some
  required values and states only the id a read tool takes (``get_user`` with the user id the
  customer gave). A call to the target made now could only fail its schema or carry made-up
  values; the right first call is that read, whose record carries the held-back values, and then
  the target with the stated values and the record's. This is what real openings look like ("I'm
  U-1029, how many bags can I bring?"), and where an agent that only learned to copy stated values
  calls the request's tool with arguments it cannot know.

Difficulty 2 asks for every parameter the tool has (optional ones too) and puts a distractor value
(an older id, a value to ignore) into the request; a lookup instance's distractor is an id for the
read.

The helpers at the top (entity nouns, how the request states values, simulated results) are shared
with the sibling family ``argument_grounding``; wording comes from ``_shared``; seeds, schema checks
and equality come from ``simulation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tracefix.trainer.environment import Family, Message, ParsedTurn, Tool, ToolCall, assistant_call, assistant_text
from tracefix.trainer.families._shared import ToolUseInstance, and_join, phrase, singular, spoken
from tracefix.trainer.schema_values import Values, entity_of, id_parameters, is_read, properties, required
from tracefix.trainer.simulation import derive_seed, same, schema_error
from tracefix.trainer.world import World

LOOKUP_SHARE = 0.5  # share of the seeds that hold values back behind a read, where the tools allow it

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


def simulated_result(tool: Tool, arguments: dict[str, Any], values: Values, world: World) -> dict[str, Any]:
    """What a declared tool plausibly returns for schema-valid arguments (the records it names as `world` holds them)."""
    ids = [name for name in id_parameters(tool) if isinstance(arguments.get(name), str)]
    if not is_read(tool):
        result: dict[str, Any] = {"status": "success", "confirmation": values.identifier("confirmation_code")}
        result.update(arguments)
        return result
    if ids:
        stated = {name: value for name, value in arguments.items() if isinstance(value, str)}
        return world.record(entity_of(ids[0]), arguments[ids[0]], key=ids[0], facts=stated)
    entity = tool_entity(tool)
    results = []
    for _ in range(2):
        record = world.record(entity, values.identifier(f"{entity}_id"), extra=0)
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


def lookup_reads(tools: Sequence[Tool]) -> list[Tool]:
    """Read tools that take only ids, all of them required (``get_user(user_id)``)."""
    return [tool for tool in tools if is_read(tool) and required(tool) and set(required(tool)) <= set(id_parameters(tool))]


def targets(tools: Sequence[Tool]) -> list[Tool]:
    """The tools an instance may ask for: those with a required parameter, and of them the reads
    wherever the tool set has any. A state-changing call asked for in one line and rewarded when made
    at once teaches an agent to change state without reading it first and confirming with the user:
    that sequence is ``precondition_verification``'s to train, and agents' policies ask for it."""
    candidates = [tool for tool in tools if required(tool)]
    return [tool for tool in candidates if is_read(tool)] or candidates


def lookup_pairs(tools: Sequence[Tool]) -> list[tuple[Tool, Tool]]:
    """Every (read, target) pair for a lookup instance: the read takes only ids, and the target (one
    of `targets`) has a required parameter the read does not take."""
    reads = lookup_reads(tools)
    return [
        (read, target)
        for read in reads
        for target in targets(tools)
        if target.name != read.name and any(name not in required(read) for name in required(target))
    ]


# -- the family ------------------------------------------------------------------------------------


class ToolCallPrecisionInstance(ToolUseInstance):
    instructions = SYSTEM_INSTRUCTIONS
    max_turns = 4

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.values = Values(derive_seed("tool_call_precision", seed, difficulty))
        rng = self.values.random
        # The kind of instance comes from its own stream, so a stated instance is the same as before lookups existed.
        pairs = lookup_pairs(self.tools)
        kind = Values(derive_seed("tool_call_precision.kind", seed, difficulty)).random
        self.lookup: Tool | None = None
        self.lookup_gold: dict[str, Any] = {}
        self.record: dict[str, Any] = {}  # what the read returns, held-back values included
        self.held: list[str] = []
        self.reads: list[Tool] = []  # the reads the request supports (the lookup and any taking the same ids)
        if pairs and kind.random() < LOOKUP_SHARE:
            self.lookup, self.target = kind.choice(pairs)
        else:
            candidates = targets(self.tools)
            if difficulty >= 2:
                richer = [tool for tool in candidates if len(properties(tool)) >= 2]
                candidates = richer or candidates
            self.target = rng.choice(candidates)
        names = list(properties(self.target)) if difficulty >= 2 and self.lookup is None else required(self.target)
        self.gold: dict[str, Any] = {}
        for name in names:
            self.gold[name] = self.values.value(name, properties(self.target)[name])
        stated = dict(self.gold)
        if self.lookup is not None:
            stated = self._hold_back(self.lookup)
        order = list(stated)
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
        parts = [rng.choice(OPENERS), request, state_values(self.values, stated, order)]
        self.distractor: tuple[str, Any] | None = None
        if difficulty >= 2:
            self.distractor = self._distractor(*((self.lookup, self.lookup_gold) if self.lookup else (self.target, self.gold)))
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
        self.calls: list[ToolCall | None] = []  # every call attempt in order (None: unreadable)

    def _hold_back(self, lookup: Tool) -> dict[str, Any]:
        """Draw the read's ids, put at least one of the target's other required values into the read's
        record instead of the request, and return what the request states."""
        rng = self.values.random
        for name in required(lookup):
            shared = name in self.gold
            self.lookup_gold[name] = self.gold[name] if shared else self.values.identifier(name, properties(lookup)[name])
        own = [name for name in self.gold if name not in self.lookup_gold]
        self.held = [name for name in own if rng.random() < 0.5] or [rng.choice(own)]
        reads = lookup_reads(self.tools)
        # Only one read may be supported by the request: ids another read takes go into the record too.
        for other in reads:
            needs = required(other)
            if other.name != lookup.name and all(name in self.gold and name not in self.held for name in needs):
                self.held += [name for name in needs if name in own and name not in self.held]
        # Reads taking the same ids (``find_order`` and ``list_order_items`` by order number) serve as well.
        self.reads = [read for read in reads if set(required(read)) <= set(self.lookup_gold)]
        key = required(lookup)[0]
        facts = dict(self.lookup_gold)
        if is_read(self.target):  # what the customer says of themselves is what their record says (a write's values are new ones)
            fields = (lookup.result_shape or {}).get("fields") or {}
            facts.update({name: value for name, value in self.gold.items() if name in fields and name not in self.held})
        facts.update({name: self.gold[name] for name in self.held})
        self.record = self.entities.record(entity_of(key), self.lookup_gold[key], extra=2, key=key, facts=facts)
        stated = dict(self.lookup_gold)
        stated.update({name: value for name, value in self.gold.items() if name not in self.held})
        return stated

    def _distractor(self, tool: Tool, gold: dict[str, Any]) -> tuple[str, Any] | None:
        """A second value for one of the `gold` parameters of `tool` (ids first) that must not be used."""
        schema_of = properties(tool)
        ids = [name for name in id_parameters(tool) if name in gold]
        others = [
            name
            for name, value in gold.items()
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
            if not same(value, gold[name]) and spoken(value) not in spoken(gold[name]):
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
        """The turn's calls and text; every call attempt is kept in order for the reward."""
        parsed = super()._read(assistant)
        self.calls.extend([*parsed.calls, *[None] * (call_attempts(parsed) - len(parsed.calls))])
        return parsed

    @property
    def kind(self) -> str:
        """``stated`` or ``lookup``: which of the family's two kinds of instance this is."""
        return "stated" if self.lookup is None else "lookup"

    def reads_record(self, call: ToolCall) -> bool:
        """Whether `call` is a read the request supports, with its ids as given (optional arguments
        its schema allows may come along)."""
        read = next((tool for tool in self.reads if tool.name == call.name), None)
        return (
            read is not None and isinstance(call.arguments, dict) and schema_error(read, call.arguments) is None
            and all(same(call.arguments.get(name), self.lookup_gold[name]) for name in required(read))
        )  # fmt: skip

    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        if self.reads_record(call):
            return dict(self.record)
        if call.name != self.target.name and all(call.name != read.name for read in self.reads):
            self.events.append(f"wrong_tool: {call.name}")
        values = Values(derive_seed("tool_call_precision.result", self.seed, self.difficulty, self.turns, index))
        return simulated_result(tool, call.arguments, values, self.entities)

    def reward(self) -> float:
        rewards = ToolCallPrecisionFamily.rewards
        if self.lookup is not None:
            return self._lookup_reward()
        first = self.calls[0] if self.calls else None
        outcome = self.score(first) if first is not None else rewards["no_valid_call"]
        if outcome == rewards["exact_call"] and len(self.calls) > 1:
            return rewards["exact_call_then_extra_calls"]
        return outcome

    def _lookup_reward(self) -> float:
        """The read first, exactly; then the first call after it, scored like a stated instance's call."""
        rewards = ToolCallPrecisionFamily.rewards
        assert self.lookup is not None
        first = self.calls[0] if self.calls else None
        if first is None or first.name not in self.by_name:
            return rewards["no_valid_call"]
        read = self.by_name[first.name]
        if read not in self.reads:
            return rewards["target_before_read"] if isinstance(first.arguments, dict) else rewards["no_valid_call"]
        if schema_error(read, first.arguments) is not None:
            return rewards["read_with_invalid_arguments"]
        if not self.reads_record(first):
            return rewards["read_with_wrong_value"]
        rest = self.calls[1:]
        score = self.score(rest[0]) if rest and rest[0] is not None and rest[0].name == self.target.name else 0.0
        if score == rewards["exact_call"] and len(rest) > 1:
            return rewards["exact_call_then_extra_calls"]
        return max(score, rewards["read_then_no_valid_target_call"])

    def solution(self) -> list[Message]:
        reads = [assistant_call(self.lookup.name, dict(self.lookup_gold))] if self.lookup is not None else []
        return [
            *reads,
            assistant_call(self.target.name, dict(self.gold)),
            assistant_text(f"Done: I called {self.target.name} with the details you gave."),
        ]

    def hint(self) -> str:
        arguments = orjson.dumps(self.gold).decode()
        call = f"Call {self.target.name} once with exactly these arguments: {arguments}; then answer in plain text."
        if self.lookup is None:
            return call
        read = orjson.dumps(self.lookup_gold).decode()
        return f"First call {self.lookup.name} with {read}: its result holds the {and_join([phrase(n) for n in self.held])}. Then {call[0].lower()}{call[1:]}"


class ToolCallPrecisionFamily(Family):
    """One exact tool call whose arguments come from the user's request, or from a read the request
    supports when it holds values back.

    Reward of a stated instance (only the first call attempt is scored):

    ========================================================  ======
    exact call: right tool, schema-valid, arguments == gold     1.0
    exact first call, but more calls followed (not exactly 1)   0.6
    right tool, schema-valid, some value wrong/missing/extra    0.6
    right tool, arguments invalid for the schema or not JSON    0.3
    well-formed call (object arguments) to another declared     0.1
    no parseable call, undeclared tool, plain text only         0.0
    ========================================================  ======

    Reward of a lookup instance (the first call attempt, then the first one after it):

    ========================================================  ======
    the read exactly, then the exact target call                1.0
      (the read: one the request supports, with the ids given;
      optional arguments its schema allows may come along)
    the read, the exact target call, then more calls            0.6
    the read, then the target schema-valid with a wrong value   0.6
    the read, then no schema-valid target call                  0.4
    the read with a wrong value (schema-valid)                  0.2
    the read with arguments invalid for its schema              0.1
    another declared tool first (the target skipping the read)  0.1
    no parseable call, undeclared tool, plain text only         0.0
    ========================================================  ======
    """

    name = "tool_call_precision"
    capability = "tool_call_precision"
    version = "3"
    description = "Make the right tool call with argument values the user stated or a read returned."
    rewards = {
        "exact_call": 1.0,
        "exact_call_then_extra_calls": 0.6,
        "right_tool_wrong_value": 0.6,
        "right_tool_invalid_arguments": 0.3,
        "other_declared_tool": 0.1,
        "undeclared_tool": 0.0,
        "no_valid_call": 0.0,
        "read_then_no_valid_target_call": 0.4,
        "read_with_wrong_value": 0.2,
        "read_with_invalid_arguments": 0.1,
        "target_before_read": 0.1,
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
