"""argument_grounding: the needed ids are spread over user text and tool results.

The user identifies themselves (an email, an id: whatever the first tool needs) and asks about an
entity whose id they do not state. A first call returns a record that carries the needed id of
another entity; the agent must then call a second tool with that exact id, copied from the result,
not invented. The chain is taken from the target's own tools: two read tools linked by an id
parameter when the tool set has them (``get_user(user_id)`` → the user's record lists a
reservation id → ``get_reservation(reservation_id)``), otherwise any first tool whose result is
made to carry the id the second tool's id parameter needs. Difficulty 2 lists several candidate
ids (the user picks one by an attribute) and has the user misremember the id (an id that does not
exist; it must not be used).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracefix.trainer.environment import Family, Message, Tool, ToolCall, assistant_call, assistant_text, tool_message
from tracefix.trainer.families._shared import ToolUseInstance, phrase, plural, shown, spoken
from tracefix.trainer.families.tool_call_precision import OPENERS, SYSTEM_INSTRUCTIONS, action_phrase, simulated_result, state_values, tool_entity
from tracefix.trainer.schema_values import Values, entity_of, id_parameters, is_read, properties, required
from tracefix.trainer.simulation import derive_seed, same, schema_error

_PEOPLE = ("user", "customer", "account", "member", "person", "passenger", "client", "guest", "patient")
_IDENTIFYING = ("email", "phone", "user", "username", "account", "customer", "name", "login")


@dataclass(frozen=True, slots=True)
class Chain:
    """First tool ``first`` (inputs from the user) → its result carries ``parameter`` of ``second``."""

    tier: int  # 0: natural (identifying input, two reads), 1: two reads, 2: any two tools
    first: Tool
    second: Tool
    parameter: str


def _identifying(tool: Tool) -> bool:
    ids = set(id_parameters(tool))
    return any(name in ids or any(word in name.lower() for word in _IDENTIFYING) for name in required(tool))


def chains(tools: Sequence[Tool]) -> list[Chain]:
    """Every usable (first, second, id parameter) chain over the tools, in the tools' order."""
    found: list[Chain] = []
    for second in tools:
        for parameter in id_parameters(second):
            if parameter not in required(second):
                continue
            for first in tools:
                if first.name == second.name or parameter in required(first):
                    continue
                tier = 2
                if is_read(first) and is_read(second):
                    tier = 1
                    if _identifying(first) and required(second) == [parameter] and parameter not in properties(first):
                        tier = 0
                found.append(Chain(tier, first, second, parameter))
    return found


class ArgumentGroundingInstance(ToolUseInstance):
    instructions = SYSTEM_INSTRUCTIONS
    max_turns = 6

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.values = values = Values(derive_seed("argument_grounding", seed, difficulty))
        rng = values.random
        options = chains(self.tools)
        best = min(chain.tier for chain in options)
        chain = rng.choice([option for option in options if option.tier == best])
        self.chain = chain
        self.first, self.second, self.parameter = chain.first, chain.second, chain.parameter
        self.entity = entity_of(self.parameter)
        p_schema = properties(self.second)[self.parameter]

        # The first call: every required argument comes from the user.
        self.gold_first: dict[str, Any] = {
            name: values.value(name, properties(self.first)[name]) for name in required(self.first)
        }
        own_ids = [name for name in required(self.first) if name in id_parameters(self.first)]
        if own_ids:
            self.first_key, self.first_entity = own_ids[0], entity_of(own_ids[0])
            first_id = self.gold_first[own_ids[0]]
        else:
            self.first_entity = tool_entity(self.first)
            self.first_key = f"{self.first_entity}_id"
            first_id = values.identifier(self.first_key, p_schema if self.first_key == self.parameter else None)
        used: set[str] = {str(value) for value in self.gold_first.values()} | {str(first_id)}

        def fresh_id() -> str:
            for _ in range(50):
                candidate = values.identifier(self.parameter, p_schema)
                if candidate not in used:
                    used.add(candidate)
                    return candidate
            raise RuntimeError("could not draw a fresh id")  # pragma: no cover - 90,000 ids per prefix

        # The record the first call returns, carrying the needed id.
        gold = {name: value for name, value in self.gold_first.items() if not isinstance(value, bool)}
        record = self.entities.record(self.first_entity, first_id, extra=2, key=self.first_key, facts=gold)
        self.world: dict[str, dict[str, Any]] = {}  # second entity's records by id
        self.selector = ""
        if self.first_key == self.parameter:
            self.style = "own"
            self.target = first_id
            self.world[first_id] = self.entities.record(self.entity, first_id, key=self.parameter)
        elif difficulty >= 2:
            self.style = "choice"
            items = []
            for _ in range(3):
                for _ in range(20):  # attributes that tell the items apart (each entity has its own, drawn once)
                    identifier = fresh_id()
                    stored = self.entities.record(self.entity, identifier, key=self.parameter)
                    if all(stored["created"] != item["created"] and stored["amount"] != item["amount"] for item in items):
                        break
                self.world[identifier] = stored
                items.append({key: stored[key] for key in (self.parameter, "status", "created", "amount")})
            chosen = rng.randrange(len(items))
            self.target = items[chosen][self.parameter]
            attribute = rng.choice(("created", "amount"))
            self.selector = (
                f"the one created on {items[chosen]['created']}"
                if attribute == "created"
                else f"the one for {spoken(items[chosen]['amount'])}"
            )
            record[plural(self.entity)] = items
        else:
            self.style = rng.choice(("single", "list"))
            self.target = fresh_id()
            self.world[self.target] = self.entities.record(self.entity, self.target, key=self.parameter)
            if self.style == "single":
                record[self.parameter] = self.target
            else:
                record[plural(self.entity)] = [self.target]
        self.first_record = record  # the second entity's records belong to its person: the world shows them with that name

        # The second call: the grounded id, plus any other required value (stated by the user).
        self.gold_second: dict[str, Any] = {self.parameter: self.target}
        for name in required(self.second):
            if name != self.parameter:
                self.gold_second[name] = values.value(name, properties(self.second)[name])
        self.misremembered = fresh_id() if difficulty >= 2 else None
        self.user_text = self._user_text()
        assert self.target not in self.user_text
        # The solution's answer tells the status the second read shows (none where the agent's records of it have none).
        status = self.world[self.target].get("status", "on file")
        if is_read(self.second):
            self.present(self.first, self.gold_first, copy.deepcopy(self.first_record))
            status = self.present(self.second, self.gold_second, copy.deepcopy(self.world[self.target])).get("status")
        noun = phrase(self.entity)
        self.answer = f"Your {noun} {self.target} is {status}." if isinstance(status, str) else f"I found your {noun} {self.target}."

        self.calls: list[tuple[str, Any]] = []
        self.seen = self.user_text  # everything the agent has been shown, to flag invented ids

    # -- the opening -------------------------------------------------------------------------------

    def _user_text(self) -> str:
        rng = self.values.random
        noun = phrase(self.entity)
        if self.entity in _PEOPLE:
            noun += " profile"
        parts = [rng.choice(OPENERS)]
        for name, value in self.gold_first.items():
            templates = ["My {p} is {v}.", "For reference, {p}: {v}."]
            if any(word in name.lower() for word in _IDENTIFYING):
                templates.append("You can find me under {p} {v}.")
            parts.append(rng.choice(templates).format(p=phrase(name), v=spoken(value)))
        target = f"my {noun}" + (f", {self.selector}" if self.selector else "")
        others = [name for name in self.gold_second if name != self.parameter]
        if is_read(self.second) and not others:
            parts.append(
                rng.choice(
                    (
                        "Could you pull up {t}?",
                        "What is the status of {t}?",
                        "I need the details of {t}.",
                        "Can you check on {t}?",
                    )
                ).format(t=target)
            )
        else:
            parts.append(f"Please {action_phrase(self.second, self.values)} for {target}.")
            if others:
                parts.append(state_values(self.values, self.gold_second, others))
        if self.misremembered is not None:
            parts.append(
                rng.choice(
                    (
                        "I think the {p} was {v}, but I'm not sure.",
                        "It might be {v}? I may be misremembering the {p}.",
                    )
                ).format(p=phrase(self.parameter), v=self.misremembered)
            )
        elif rng.random() < 0.5:
            parts.append(f"I don't have the {phrase(self.parameter)} at hand; please look it up.")
        return " ".join(part for part in parts if part)

    # -- the world ---------------------------------------------------------------------------------

    def _first_right(self, arguments: Any) -> bool:
        return (
            isinstance(arguments, dict)
            and schema_error(self.first, arguments) is None
            and all(name in arguments and same(arguments[name], value) for name, value in self.gold_first.items())
        )

    def _second_right(self, arguments: Any) -> bool:
        return (
            isinstance(arguments, dict)
            and schema_error(self.second, arguments) is None
            and all(name in arguments and same(arguments[name], value) for name, value in self.gold_second.items())
        )

    def _not_found(self, entity: str, value: Any) -> dict[str, str]:
        return {"error": f"{phrase(entity)} {shown(value)} not found"}

    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        arguments: dict[str, Any] = call.arguments
        if tool.name == self.first.name:
            if self._first_right(arguments):
                return copy.deepcopy(self.first_record)
            wrong = next((name for name, value in self.gold_first.items() if not same(arguments.get(name), value)), None)
            return self._not_found(self.first_entity, arguments.get(wrong) if wrong else arguments)
        if tool.name == self.second.name:
            value = arguments.get(self.parameter)
            if isinstance(value, str) and value not in self.seen:
                self.events.append(f"ungrounded_id: {self.parameter}={value}")
            if not isinstance(value, str) or value not in self.world:
                return self._not_found(self.entity, value)
            if is_read(tool):
                return copy.deepcopy(self.world[value])
            return {"status": "success", **arguments}
        # Any other declared tool: ids known to this world resolve, others are not found.
        for name in id_parameters(tool):
            value = arguments.get(name)
            if not isinstance(value, str):
                continue
            if name == self.parameter and value in self.world:
                if is_read(tool):
                    return copy.deepcopy(self.world[value])
                return simulated_result(tool, arguments, self._result_values(index), self.entities)
            if name == self.first_key and value == self.first_record.get(self.first_key):
                return copy.deepcopy(self.first_record)
            return self._not_found(entity_of(name), value)
        return simulated_result(tool, arguments, self._result_values(index), self.entities)

    def _result_values(self, index: int) -> Values:
        return Values(derive_seed("argument_grounding.result", self.seed, self.difficulty, self.turns, index))

    def _answer(self, calls: list[ToolCall]) -> list[Message]:
        """The results in order, each recorded for scoring and as shown to the agent."""
        messages = []
        for index, call in enumerate(calls):
            message = tool_message(call, self._tool_result(call, index))
            self.calls.append((call.name, call.arguments))
            self.seen += "\n" + message["content"]
            messages.append(message)
        return messages

    # -- scoring -----------------------------------------------------------------------------------

    def reward(self) -> float:
        rewards = ArgumentGroundingFamily.rewards
        first = next((i for i, (name, args) in enumerate(self.calls) if name == self.first.name and self._first_right(args)), None)
        if first is None:
            return rewards["no_right_first_call"]
        second = next((i for i, (name, _) in enumerate(self.calls) if name == self.second.name), None)
        if second is None or second < first:
            return rewards["first_call_only"]
        if self._second_right(self.calls[second][1]):
            return rewards["both_calls_grounded"]
        return rewards["second_call_id_not_grounded"]

    def solution(self) -> list[Message]:
        return [
            assistant_call(self.first.name, dict(self.gold_first)),
            assistant_call(self.second.name, dict(self.gold_second)),
            assistant_text(self.answer),
        ]

    def hint(self) -> str:
        which = f" (the one {self.selector.removeprefix('the one ')})" if self.selector else ""
        return (
            f"First call {self.first.name} with {orjson.dumps(self.gold_first).decode()}; then call "
            f"{self.second.name} with the {self.parameter} copied exactly from that result{which}."
        )


class ArgumentGroundingFamily(Family):
    """A second call whose id must be copied from the first call's result.

    Reward of the episode (only the first call to the second tool counts):

    ===========================================================  ======
    first call right, then second call with the grounded id        1.0
    first call right, second call's id invented/altered/wrong      0.5
    first call right only (second tool never called, or only
    called before the first call was right)                        0.25
    first call never right (incl. no call, malformed output)       0.0
    ===========================================================  ======

    "Right" means the right tool, schema-valid arguments and the gold values (the user's stated
    values for the first call; the grounded id and any user-stated value for the second).
    """

    name = "argument_grounding"
    capability = "argument_grounding"
    version = "1"
    description = "Copy the id a first tool result returns into the next call instead of inventing it."
    rewards = {
        "both_calls_grounded": 1.0,
        "second_call_id_not_grounded": 0.5,
        "first_call_only": 0.25,
        "no_right_first_call": 0.0,
    }
    levels = (1, 2)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if len(tools) < 2:
            return "needs at least two tools"
        if not chains(tools):
            return "no tool has a required id parameter that another tool's result could supply"
        return None

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> ArgumentGroundingInstance:
        return ArgumentGroundingInstance(tools, seed, max(1, min(int(difficulty), max(self.levels))))
