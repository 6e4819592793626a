"""multi_step_completion: a chain of dependent calls that must be carried to its end.

From the target's tools a chain of 2 (difficulty 1) or 3 (difficulty 2) distinct tools is built:
every step but the last is a read of one entity (a read with a key parameter: an id, number, code,
email…); each later step needs at least one key value that only the previous step's simulated
result reveals (``get_user`` → ``reservation_id`` → ``get_reservation`` → ``flight_number`` →
``update_reservation``). The user states only the first step's arguments (and any enum/boolean
choice a later step needs); the last step is a state-changing tool when the tool set allows such a
chain, else a read. The agent must walk the whole chain in order and end with a plain-text answer
that reports the outcome: the confirmation code the final write returns (or the reference code the
final read returns).

The helpers at the top (tool nouns) are shared with the sibling family ``structured_data_reasoning``;
wording and the episode loop come from ``_shared``; seeds, schema checks and equality from ``simulation``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracefix.trainer.environment import Family, Message, Tool, ToolCall, assistant_call, assistant_text, tool_message, tools_hash
from tracefix.trainer.families._shared import PAST, AnsweringInstance, and_join, phrase, spoken
from tracefix.trainer.schema_values import Values, entity_of, is_read, is_write, key_parameters, properties, required
from tracefix.trainer.simulation import derive_seed, same, to_the_cent

# -- shared helpers ----------------------------------------------------------------------------------


def user_choice(tool: Tool, name: str) -> bool:
    """A parameter whose value the user states as a choice (an enum or a yes/no), never looked up."""
    schema = properties(tool).get(name)
    schema = schema if isinstance(schema, dict) else {}
    return bool(schema.get("enum")) or schema.get("type") == "boolean"


def tool_noun(tool: Tool) -> str:
    """``get_user`` → ``user``, ``list_order_items`` → ``order items``, ``cancel_reservation`` → ``reservation``."""
    words = [word for word in tool.name.split("_") if word]
    if len(words) > 1:
        words = words[1:]
    return " ".join(words) or tool.name


def tool_verb(tool: Tool) -> str:
    words = [word for word in tool.name.split("_") if word]
    return words[0] if len(words) > 1 else "run"


_PAST = {**PAST, "set": "set", "submit": "submitted", "approve": "approved", "reset": "reset"}


def past_tense(verb: str) -> str:
    if verb in _PAST:
        return _PAST[verb]
    return verb + "d" if verb.endswith("e") else verb + "ed"


def call_signature(call: ToolCall) -> str:
    """Canonical text of a call (name + arguments), to detect identical repeated calls."""
    try:
        arguments = orjson.dumps(call.arguments, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        arguments = repr(call.arguments)
    return f"{call.name}\x1f{arguments}"


def mentions(text: str, token: str) -> bool:
    """Whether ``token`` occurs in ``text`` as a whole word (case-insensitive)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(token)}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


# -- chains --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One tool in a chain and how each required argument gets its value."""

    tool: Tool
    fresh: tuple[str, ...]  # revealed by the previous step's result (or, for step 1, stated by the user)
    chosen: tuple[str, ...]  # choices the user states (enums, booleans)
    known: tuple[str, ...]  # values already seen earlier in the chain


def _links(path: Sequence[Tool]) -> list[Link]:
    known: set[str] = set()
    links = []
    for index, tool in enumerate(path):
        names = required(tool)
        if index == 0:
            links.append(Link(tool, tuple(names), (), ()))
            known.update(names)
            continue
        chosen = tuple(name for name in names if name not in known and user_choice(tool, name))
        fresh = tuple(name for name in names if name not in known and name not in chosen)
        links.append(Link(tool, fresh, chosen, tuple(name for name in names if name in known)))
        known.update(names)
    return links


_CHAIN_CACHE: dict[tuple[tuple[str, ...], str, int, bool, bool], list[tuple[str, ...]]] = {}


def chains(tools: Sequence[Tool], length: int, end_with_write: bool, strict: bool) -> list[tuple[str, ...]]:
    """Every chain of ``length`` distinct tools (names, in tool order) meeting the family's rules.

    Every step but the last is a read (in ``strict`` mode: a read with a key parameter); the last is
    a write (``end_with_write``) or a read; each later step has at least one required argument not
    seen before and not a user choice (in ``strict`` mode: a key parameter), so its value must come
    from the previous step's result.
    """
    # keyed by the tools' order too: the chains are listed in that order and the seed picks by index
    cache_key = (tuple(tool.name for tool in tools), tools_hash(tools), length, end_with_write, strict)
    if cache_key in _CHAIN_CACHE:
        return _CHAIN_CACHE[cache_key]
    readers = [tool for tool in tools if is_read(tool) and (key_parameters(tool) if strict else True)]
    finals = [tool for tool in tools if (is_write(tool) if end_with_write else is_read(tool))]
    found: list[tuple[str, ...]] = []

    def extend(path: list[Tool], known: set[str]) -> None:
        if len(path) == length:
            found.append(tuple(tool.name for tool in path))
            return
        pool = finals if len(path) == length - 1 else readers
        for tool in pool:
            if any(tool.name == other.name for other in path):
                continue
            if path:
                fresh = [name for name in required(tool) if name not in known and not user_choice(tool, name)]
                if strict:
                    fresh = [name for name in fresh if name in key_parameters(tool)]
                if not fresh:
                    continue
            elif strict and not key_parameters(tool):
                continue
            extend(path + [tool], known | set(required(tool)))

    extend([], set())
    if len(_CHAIN_CACHE) > 256:
        _CHAIN_CACHE.clear()
    _CHAIN_CACHE[cache_key] = found
    return found


def natural(tools: Sequence[Tool], names: Sequence[str]) -> bool:
    """Whether every middle read looks up an entity the next step then uses (``get_user`` →
    ``get_reservation`` → ``update_reservation``, not ``get_reservation`` → ``get_user`` → …)."""
    by_name = {tool.name: tool for tool in tools}
    for middle, following in zip(names[1:-1], names[2:]):
        if not set(key_parameters(by_name[middle])) & set(required(by_name[following])):
            return False
    return True


def pick_chain(tools: Sequence[Tool], length: int, rng) -> tuple[str, ...] | None:
    """The seeded chain: the wanted length first (then shorter), ending with a write when possible,
    strict links preferred, natural ones among them first."""
    for size in range(length, 1, -1):
        for end_with_write in (True, False):
            for strict in (True, False):
                found = chains(tools, size, end_with_write, strict)
                preferred = [names for names in found if natural(tools, names)]
                pool = preferred or found
                if pool:
                    return pool[rng.randrange(len(pool))]
    return None


# -- the instance ----------------------------------------------------------------------------------------

SYSTEM_INSTRUCTIONS = (
    "You are a customer support agent. Carry the user's request through to the end with the tools "
    "below: look up what you need, make the change, and then tell the user the outcome."
)


@dataclass(slots=True)
class ChainStep:
    link: Link
    arguments: dict[str, Any]
    result: dict[str, Any]


class MultiStepCompletionInstance(AnsweringInstance):
    instructions = SYSTEM_INSTRUCTIONS
    formats = False  # types and shape only, as ever

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.values = Values(derive_seed("multi_step_completion", seed, difficulty))
        rng = self.values.random
        names = pick_chain(self.tools, 3 if difficulty >= 2 else 2, rng)
        if names is None:
            raise ValueError("these tools cannot host a multi-step chain")
        path = [self.by_name[name] for name in names]
        links = _links(path)
        self.known: dict[str, list[Any]] = {}  # parameter name → values that exist in this world
        taken: set[str] = set()
        arguments_of: list[dict[str, Any]] = []
        current: dict[str, Any] = {}
        for link in links:
            arguments: dict[str, Any] = {}
            for name in required(link.tool):
                schema = properties(link.tool)[name]
                if name in link.known:
                    arguments[name] = current[name]
                elif name in link.chosen:
                    arguments[name] = self.values.value(name, schema)
                else:
                    arguments[name] = self._fresh(link.tool, name, schema, taken)
                current.setdefault(name, arguments[name])
                self.known.setdefault(name, [])
                if arguments[name] not in self.known[name]:
                    self.known[name].append(arguments[name])
            arguments_of.append(arguments)
        self.final_write = is_write(path[-1])
        self.steps: list[ChainStep] = []
        for index, link in enumerate(links):
            self.steps.append(ChainStep(link, arguments_of[index], self._result(index, links, arguments_of)))
        last = self.steps[-1]
        self.outcome_field = "confirmation" if self.final_write else "reference"
        self.outcome: str = last.result[self.outcome_field]
        self.user_text = self._request()
        self.progress = 0  # chain steps completed, in order
        self.signatures: list[str] = []
        self.looped = False
        self.wrong_write = False
        self.max_turns = len(self.steps) + 4

    # world building

    def _fresh(self, tool: Tool, name: str, schema: dict[str, Any], taken: set[str]) -> Any:
        make = self.values.key_value if name in key_parameters(tool) else self.values.value
        value = make(name, schema)
        for _ in range(8):
            text = orjson.dumps(value).decode()
            if text not in taken:
                break
            value = make(name, schema)
        taken.add(orjson.dumps(value).decode())
        return value

    def _code(self, prefix: str) -> str:
        return f"{prefix}-{self.values.random.randint(100000, 999999)}"

    def _result(self, index: int, links: list[Link], arguments_of: list[dict[str, Any]]) -> dict[str, Any]:
        link, arguments = links[index], arguments_of[index]
        tool = link.tool
        keys = key_parameters(tool) or required(tool)
        key = keys[0] if keys else None
        noun = tool_noun(tool).replace(" ", "_")
        if index == len(links) - 1 and is_write(tool):
            result: dict[str, Any] = {}
            if key is not None:
                result[key] = arguments[key]
            result["status"] = past_tense(tool_verb(tool))
            result["confirmation"] = self._code("CNF")
            return result
        facts: dict[str, Any] = {}  # what the next step needs, or the final read's reference code
        if index + 1 < len(links):
            facts.update({name: arguments_of[index + 1][name] for name in links[index + 1].fresh})
        else:
            facts["reference"] = self._code("REF")
        if key is not None:
            result = self.entities.record(entity_of(key), arguments[key], extra=3, key=key, facts=facts)
        else:
            result = self.entities.record(noun, self.values.identifier(f"{noun}_id"), extra=3, facts=facts)
        for name, value in arguments.items():
            if name in result and name != key and name not in facts:
                result[name] = value
        return result

    def _request(self) -> str:
        rng = self.values.random
        first, last = self.steps[0], self.steps[-1]
        stated = [f"my {phrase(name)} is {spoken(value)}" for name, value in first.arguments.items()]
        opener = rng.choice(("Hi!", "Hello.", "Hey there.", "Good morning."))
        parts = [opener]
        if stated:
            sentence = and_join(stated)
            parts.append(sentence[0].upper() + sentence[1:] + ".")
        source = tool_noun(self.steps[-2].link.tool)
        noun = tool_noun(last.link.tool)
        fresh = [phrase(name) for name in last.link.fresh]
        if self.final_write:
            goal = f"Please {tool_verb(last.link.tool)} the {noun}"
        else:
            goal = f"Please look up the {noun}"
        if fresh:
            goal += f", using the {and_join(fresh)} listed on the {source} record"
        choices = [(name, step.arguments[name]) for step in self.steps[1:] for name in step.link.chosen]
        if choices:
            goal += " (" + ", ".join(f"{name}: {spoken(value)}" for name, value in choices) + ")"
        parts.append(goal + ".")
        if len(self.steps) > 2:
            parts.append(f"Start from my {tool_noun(first.link.tool)} record.")
        if self.final_write:
            parts.append(rng.choice(("When it's done, tell me the confirmation code.", "Then give me the confirmation code, please.")))
        else:
            parts.append("Then tell me its reference code.")
        return " ".join(parts)

    # protocol

    def _matches(self, step: ChainStep, call: ToolCall) -> bool:
        if call.name != step.link.tool.name or not isinstance(call.arguments, dict):
            return False
        return all(name in call.arguments and same(call.arguments[name], value, to_the_cent) for name, value in step.arguments.items())

    def _off_chain(self, tool: Tool, arguments: dict[str, Any], index: int) -> dict[str, Any]:
        """Result of a schema-valid call that is not the next chain step."""
        for name in key_parameters(tool):
            value = arguments.get(name)
            if value not in self.known.get(name, []):
                self.events.append(f"unknown_id: {tool.name}.{name}={value!r:.40}")
                return {"error": f"{phrase(entity_of(name))} {value} not found"}
        if is_write(tool):
            self.wrong_write = True
            self.events.append(f"wrong_write: {tool.name}")
            keys = key_parameters(tool)
            result: dict[str, Any] = {keys[0]: arguments[keys[0]]} if keys else {}
            result["status"] = past_tense(tool_verb(tool))
            return result
        self.events.append(f"off_chain_read: {tool.name}")
        values = Values(derive_seed("multi_step_completion.read", self.seed, self.difficulty, self.turns, index))
        keys = key_parameters(tool)
        if keys:
            return self.entities.record(entity_of(keys[0]), arguments[keys[0]], extra=3, key=keys[0])
        noun = tool_noun(tool).replace(" ", "_")
        return {"results": [self.entities.record(noun, values.identifier(f"{noun}_id"), extra=2)]}

    def _tool_result(self, call: ToolCall, index: int) -> Any:
        """The backend's answer, after noting a third identical call in a row (a loop)."""
        self.signatures.append(call_signature(call))
        if len(self.signatures) >= 3 and len(set(self.signatures[-3:])) == 1:
            self.looped = True
            self.events.append(f"loop: {call.name} called 3 times in a row with the same arguments")
        return super()._tool_result(call, index)

    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        if self.progress < len(self.steps) and self._matches(self.steps[self.progress], call):
            self.progress += 1
            return self.steps[self.progress - 1].result
        for step in self.steps[: self.progress]:
            if self._matches(step, call) and is_read(step.link.tool):
                self.events.append(f"repeated_step: {call.name}")
                return step.result
        return self._off_chain(tool, call.arguments, index)

    def _answer(self, calls: list[ToolCall]) -> list[Message]:
        """The results in order, up to a loop or a wrong write: either ends the episode."""
        messages = []
        for index, call in enumerate(calls):
            messages.append(tool_message(call, self._tool_result(call, index)))
            if self.looped or self.wrong_write:
                self.done = True
                break
        return messages

    def reward(self) -> float:
        rewards = MultiStepCompletionFamily.rewards
        score = self.progress * rewards["chain_steps_total"] / len(self.steps)
        if self.progress == len(self.steps) and self.final_text and mentions(self.final_text, self.outcome):
            score += rewards["final_answer_with_outcome"]
        if self.looped:
            score = min(score, rewards["loop_cap"])
        return round(score, 4)

    def solution(self) -> list[Message]:
        messages = [assistant_call(step.link.tool.name, dict(step.arguments)) for step in self.steps]
        noun = tool_noun(self.steps[-1].link.tool)
        if self.final_write:
            status = self.steps[-1].result["status"]
            text = f"All done: the {noun} is {status}. Your confirmation code is {self.outcome}."
        else:
            text = f"I found the {noun}: its reference code is {self.outcome}."
        return messages + [assistant_text(text)]

    def hint(self) -> str:
        first = self.steps[0]
        parts = [f"call {first.link.tool.name} with {orjson.dumps(first.arguments).decode()}"]
        for step in self.steps[1:]:
            parts.append(f"then {step.link.tool.name} with the {and_join(step.link.fresh)} from the previous result")
        return (
            "Finish the whole chain: " + ", ".join(parts)
            + f"; then state the {self.outcome_field} code from the last result in your final answer."
        )


class MultiStepCompletionFamily(Family):
    """A chain of dependent calls (2 at difficulty 1, 3 at difficulty 2) that must be finished.

    Each chain step is credited when it is called (schema-valid, every required argument equal to the
    gold value) while it is the next step; calls in between are answered but earn nothing. Reward:

    ===================================================================  ==========================
    each chain step completed in order                                    0.8 / steps: 0.4 (2 steps),
                                                                          0.2667 (3 steps)
    final plain-text answer naming the last result's confirmation        + 0.2 (only once every
    (or reference) code                                                   step is done)
    every step and the final answer                                       1.0
    stopping early (plain text before the end, turn limit)                credit so far
    3 identical consecutive calls: the episode ends                        at most 0.2
    a state-changing call that is not the next step: the episode ends     credit so far
    nothing done                                                          0.0
    ===================================================================  ==========================

    Rewards are rounded to 4 decimals (2 of 3 steps: 0.5333, all 3 steps without answer: 0.8).
    Difficulty 2 falls back to a 2-step chain on tool sets that cannot form 3 steps.
    """

    name = "multi_step_completion"
    capability = "multi_step_completion"
    version = "1"
    description = "Carry a chain of dependent tool calls through to its final step and report the outcome."
    rewards = {
        "chain_steps_total": 0.8,
        "each_step_of_2_step_chain": 0.4,
        "each_step_of_3_step_chain": 0.2667,
        "final_answer_with_outcome": 0.2,
        "complete": 1.0,
        "loop_cap": 0.2,
        "nothing": 0.0,
    }
    levels = (1, 2)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if not tools:
            return "no tools"
        for end_with_write in (True, False):
            for strict in (True, False):
                if chains(tools, 2, end_with_write, strict):
                    return None
        return "no two tools form a chain where a read reveals an argument of the next call"

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> MultiStepCompletionInstance:
        return MultiStepCompletionInstance(tools, seed, difficulty)
