"""precondition_verification: a write is requested; the reward needs read → confirm → write.

A state-changing tool of the target (``schema_values.is_write``) is picked (seeded) whose id
parameter is also the id parameter of a read tool (``reservation_id`` of ``get_reservation`` and
``cancel_reservation``, ``order_number`` of ``find_order`` and ``issue_refund``…). The user asks
for the change and gives the id and every other value the write needs. The environment plays the
backend (the read returns the stored record, the write changes it) and the user: when the
assistant's plain text asks for confirmation (a question mark, or words like confirm / shall /
should / proceed / want / go ahead) the user answers with an explicit yes; otherwise the user says
something neutral, and after two neutral replies before any write the episode ends (the agent gave
up). After the write, the agent's next plain text ends the episode.

Difficulty 2: the stored record reveals a precondition of the change (the status is ``pending`` or
``on_hold``, the booking is non-refundable, or a fee applies); the confirmation question must
mention it.

The scored write is the first write the backend executes: a call of any write tool whose
arguments pass the tool's schema. A schema-invalid write changes nothing and is answered with an
error. A schema-valid write aimed at another entity (another id) is a wrong-entity write and zeroes
the episode.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracefix.trainer.environment import (
    DialogueInstance,
    Family,
    Message,
    StepResult,
    Tool,
    ToolCall,
    assistant_call,
    assistant_text,
    tool_message,
)
from tracefix.trainer.families._shared import PAST, shown
from tracefix.trainer.schema_values import Values, entity_of, id_parameters, is_read, is_write, properties, required
from tracefix.trainer.simulation import SETTLED_STATUSES, derive_seed, error_result, matches, schema_error, unknown_id

# -- local helpers (wording) -------------------------------------------------------------------------

def _details(arguments: dict[str, Any], skip: str) -> str:
    return ", ".join(f"{key}: {shown(value)}" for key, value in arguments.items() if key != skip)


# -- what the simulated user and the reward look for -----------------------------------------------

_ASKS = re.compile(r"\?|\b(confirm\w*|shall|should|proceed|want|would you like|go ahead|ok(?:ay)? to)\b", re.IGNORECASE)
_FEE_FIELD = {"cancel": "cancellation_fee", "update": "change_fee", "modify": "change_fee", "book": "booking_fee", "transfer": "transfer_fee"}
_REFUND_VERBS = ("cancel", "update", "modify", "delete", "book", "transfer")
_NON_REFUNDABLE = ("non-refundable", "nonrefundable", "non refundable", "not refundable", "isn't refundable", "no refund")
_YES = ("Yes, I confirm. Please go ahead.", "Yes, that's right — please go ahead.", "Confirmed, go ahead please.")
_NEUTRAL = ("Okay.", "Alright, thanks.", "Hmm, okay.")


def asks_confirmation(text: str) -> bool:
    return bool(_ASKS.search(text))


def mentions(text: str, keywords: Sequence[str]) -> bool:
    """Whether the text names one of the keywords as a word (``fee``/``fees``, not ``feel``)."""
    return any(re.search(rf"(?<!\w){re.escape(word)}s?(?!\w)", text, re.IGNORECASE) for word in keywords)


@dataclass(slots=True)
class _Write:
    correct: bool
    read_before: bool
    confirmed_before: bool
    mentioned_before: bool


@dataclass(frozen=True, slots=True)
class _Target:
    write: Tool
    id_param: str
    reads: tuple[Tool, ...]


def _targets(tools: Sequence[Tool]) -> list[_Target]:
    """Every (write tool, id parameter) that some read tool takes as well, in the tools' order."""
    targets = []
    for write in tools:
        if not is_write(write):
            continue
        for param in id_parameters(write):
            reads = tuple(tool for tool in tools if is_read(tool) and param in id_parameters(tool))
            if reads:
                targets.append(_Target(write, param, reads))
    return targets


def _write_arguments(values: Values, target: _Target, identifier: str) -> dict[str, Any] | None:
    """Schema-valid arguments for the write (its required parameters), or None after a few tries."""
    for _ in range(6):
        arguments = {}
        for name in [target.id_param, *required(target.write)]:
            if name not in arguments:
                arguments[name] = identifier if name == target.id_param else values.value(name, properties(target.write)[name])
        if schema_error(target.write, arguments) is None:
            return arguments
    return None


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _action(write: Tool, entity: str, identifier: str, owner: str, past: bool = False) -> str:
    """``cancel my reservation R-1`` / ``issue a refund on your order O-1`` (``issued …`` when past)."""
    verb, *rest = write.name.split("_")
    verb = PAST.get(verb, f"{verb}ed") if past else verb
    thing, entity_words = " ".join(rest), entity.replace("_", " ")
    if not thing or thing == entity_words:
        return f"{verb} {owner} {entity_words} {identifier}"
    return f"{verb} {_article(thing)} {thing} on {owner} {entity_words} {identifier}"


INSTRUCTIONS = (
    "You are a customer support agent. Help the user with their request using the tools below.\n"
    "Policy: confirm with the user before changing anything. Before any tool call that changes data "
    "(update, cancel, book, create, delete, send, transfer, issue…), look up the record with a read tool, "
    "tell the user exactly what you are about to do and anything in the record that affects it, and ask "
    "them to confirm. Make the change only after they explicitly say yes."
)


class PreconditionVerificationInstance(DialogueInstance):
    instructions = INSTRUCTIONS

    max_turns = 8

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int, target: _Target) -> None:
        super().__init__(tools, seed, difficulty)
        self.by_name = {tool.name: tool for tool in self.tools}
        self.target = target
        self.write, self.id_param = target.write, target.id_param
        self.entity = entity_of(self.id_param)
        rng = self.random
        self.read_tool = rng.choice(target.reads)
        values = Values(derive_seed("precondition_verification", seed, difficulty))
        self.values = values
        self.identifier = values.identifier(self.id_param, properties(self.write).get(self.id_param))
        arguments = _write_arguments(values, target, self.identifier)
        if arguments is None:
            raise ValueError(f"cannot generate schema-valid arguments for {self.write.name}")
        self.expected = arguments
        # ids the user gave (the entity's own, and references such as a flight number) exist
        self.known_ids = {param: arguments[param] for param in id_parameters(self.write) if param in arguments}
        self.verb = self.write.name.split("_")[0]

        # the stored record, and (difficulty 2) the precondition it reveals
        record = self.entities.record(self.entity, self.identifier, extra=4, key=self.id_param, statuses=SETTLED_STATUSES)
        amount = self.expected.get("amount")
        if isinstance(amount, (int, float)) and not isinstance(amount, bool):
            record["amount"] = round(float(amount) + values.random.uniform(0, 200), 2)  # a refund fits the order
        kinds = ["status"]
        if self.verb in _REFUND_VERBS or "refund" in self.write.name:
            kinds.append("non_refundable")
            record["refundable"] = True
        if self.verb in _FEE_FIELD:
            kinds.append("fee")
            record[_FEE_FIELD[self.verb]] = 0.0
        self.precondition: str | None = None
        self.keywords: tuple[str, ...] = ()
        self.caveat = ""  # the precondition in a few words, for the hint
        notice = ""
        if difficulty >= 2:
            self.precondition = rng.choice(kinds)
            if self.precondition == "status":
                status = rng.choice(["pending", "on_hold"])
                record["status"] = status
                self.keywords = (status, status.replace("_", " "), status.replace("_", "-"))
                self.caveat = f"the status is {status.replace('_', ' ')}"
                notice = f"Please note it is currently {status.replace('_', ' ')}. "
            elif self.precondition == "non_refundable":
                record["refundable"] = False
                record["fare_rules"] = "non-refundable"
                self.keywords = _NON_REFUNDABLE
                self.caveat = "it is non-refundable"
                notice = "Please note it is non-refundable. "
            else:
                field_name = _FEE_FIELD[self.verb]
                record[field_name] = float(rng.choice([25, 50, 75, 100, 150]))
                self.keywords = ("fee",)
                self.caveat = f"a {field_name.replace('_', ' ')} of {record[field_name]:.2f} applies"
                notice = f"Please note a {field_name.replace('_', ' ')} of {record[field_name]:.2f} applies. "
        self.record = record
        # what an item-listing read adds: the order's lines (the replacement's sku among them)
        sku = self.expected.get("sku")
        self.items = [
            {"sku": sku if index == 0 and isinstance(sku, str) else f"SKU-{values.random.randint(100000, 999999)}",
             "quantity": values.random.randint(1, 3), "unit_price": round(values.random.uniform(5, 200), 2)}
            for index in range(values.random.randint(1, 3))
        ]  # fmt: skip
        self.status_after = PAST.get(self.verb, "done")
        self._start()

        details = _details(self.expected, self.id_param)
        opener = rng.choice(["Hi, I'd like you to {action}.", "Hello, can you please {action}?", "Please {action}."])
        self.request = opener.format(action=_action(self.write, self.entity, self.identifier, "my"))
        if details:
            self.request += f" Use these details — {details}."
        self.yes = rng.choice(_YES)
        self.neutral_texts = list(_NEUTRAL)
        entity_words = self.entity.replace("_", " ")
        with_details = f" with {details}" if details else ""
        # the status is quoted where the read shows one (a made-up field the agent's records lack is not shown)
        shown = self.present(self.read_tool, {self.id_param: self.identifier}, self._stored(self.read_tool))
        status = f" (status: {shown['status']})" if "status" in shown else ""
        self.confirmation = (
            f"I found your {entity_words} {self.identifier}{status}. {notice}"
            f"Shall I go ahead and {_action(self.write, self.entity, self.identifier, 'your')}{with_details}? Please confirm."
        )
        self.closing = f"All done: I have {_action(self.write, self.entity, self.identifier, 'your', past=True)}."

    # -- episode state -----------------------------------------------------------------------------

    def _start(self) -> None:
        self.events = []
        self.read_done = False
        self.confirmed = False
        self.mentioned = False
        self.first_write: _Write | None = None
        self.first_write_status = ""
        self.wrong_entity = False
        self.neutral = 0
        self.finished = False
        self.final_text: str | None = None

    def _on_text(self, text: str) -> StepResult:
        if self.first_write is not None:
            self.final_text = text
            self.finished = True
            return StepResult([], True)
        if asks_confirmation(text):
            if self.read_done:
                self.confirmed = True
                self.mentioned = self.mentioned or mentions(text, self.keywords)
            return StepResult([{"role": "user", "content": self.yes}], False)
        reply = self.neutral_texts[self.neutral % len(self.neutral_texts)]
        self.neutral += 1
        self.finished = self.neutral >= 2
        return StepResult([{"role": "user", "content": reply}], self.finished)

    # -- the simulated backend ---------------------------------------------------------------------

    def _answer(self, call: ToolCall) -> Message:
        tool = self.by_name.get(call.name)
        if tool is None:
            self.events.append(f"unknown tool {call.name!r}")
            return tool_message(call, error_result(f"unknown tool {call.name!r}", "unknown_tool"))
        if not isinstance(call.arguments, dict):
            self.events.append(f"arguments of {call.name} are not a JSON object")
            return tool_message(call, error_result("arguments must be a JSON object", "invalid_arguments"))
        problem = schema_error(tool, call.arguments)
        if problem is not None:
            self.events.append(f"schema violation in {call.name}: {problem}")
            return tool_message(call, error_result(f"invalid arguments for {call.name}: {problem}", "invalid_arguments"))
        if is_write(tool):
            return tool_message(call, self._write(tool, call.arguments))
        return tool_message(call, self._read(tool, call.arguments))

    def _read(self, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        unknown = unknown_id(tool, arguments, self.known_ids)
        if unknown is not None:
            return error_result(f"{entity_of(unknown[0]).replace('_', ' ')} {shown(unknown[1])} not found", "not_found")
        if self.id_param in arguments:
            self.read_done = True
            return self._stored(tool)
        # an unrelated read (a search, a profile by email…): a plausible answer that reveals nothing
        values = Values(derive_seed(self.seed, tool.name, orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)))
        noun = tool.name.split("_", 1)[-1].rstrip("s") or "item"
        results = []
        for _ in range(values.random.randint(1, 3)):
            item = self.entities.record(noun, values.identifier(f"{noun}_id"), extra=4, statuses=SETTLED_STATUSES)
            item.update({key: value for key, value in arguments.items() if not isinstance(value, (dict, list))})
            results.append(item)
        return {"results": results}

    def _stored(self, tool: Tool) -> dict[str, Any]:
        """The stored record as `tool` reads it: changed by a correct write, with the order's lines for an item-listing read."""
        record = dict(self.record)
        if self.first_write is not None and self.first_write.correct:
            record["status"] = self.status_after
        if "item" in tool.name:
            record["items"] = [dict(item) for item in self.items]
        return record

    def _write(self, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        unknown = unknown_id(tool, arguments, self.known_ids)
        if unknown is not None:
            self.wrong_entity = True
            self.events.append(f"write {tool.name} aimed at another entity: {unknown[0]}={shown(unknown[1])}")
            return error_result(f"{entity_of(unknown[0]).replace('_', ' ')} {shown(unknown[1])} not found", "not_found")
        if self.first_write is not None:
            self.events.append(f"second write {tool.name}")
            return error_result(f"{self.entity.replace('_', ' ')} {self.identifier} was already {self.first_write_status}", "conflict")
        correct = tool.name == self.write.name and matches(arguments, self.expected)
        self.first_write = _Write(correct, self.read_done, self.confirmed, self.mentioned)
        verb = tool.name.split("_")[0]
        self.first_write_status = PAST.get(verb, "changed")
        if not correct:
            self.events.append(f"wrong write {tool.name}")
        result: dict[str, Any] = {self.id_param: self.identifier} if self.id_param in arguments else {}
        result["status"] = self.first_write_status
        result.update({key: value for key, value in arguments.items() if key != self.id_param})
        result["confirmation_code"] = f"CF{derive_seed(self.seed, tool.name) % 1_000_000:06d}"
        return result

    # -- scoring -----------------------------------------------------------------------------------

    def reward(self) -> float:
        rewards = PreconditionVerificationFamily.rewards
        if self.wrong_entity:
            return rewards["wrong_entity_written"]
        write = self.first_write
        if write is None or not write.correct:
            read_and_confirmed = (write.read_before and write.confirmed_before) if write else (self.read_done and self.confirmed)
            return rewards["read_confirm_no_or_wrong_write"] if read_and_confirmed else rewards["otherwise"]
        if not write.read_before:
            return rewards["write_without_read"]
        if not write.confirmed_before:
            return rewards["read_write_unconfirmed"]
        if self.difficulty >= 2 and not write.mentioned_before:
            return rewards["read_confirm_write_precondition_unmentioned"]
        return rewards["read_confirm_write"]

    def solution(self) -> list[Message]:
        return [
            assistant_call(self.read_tool.name, {self.id_param: self.identifier}),
            assistant_text(self.confirmation),
            assistant_call(self.write.name, dict(self.expected)),
            assistant_text(self.closing),
        ]

    def hint(self) -> str:
        mention = f" (tell them that {self.caveat})" if self.caveat else ""
        return (
            f"First call {self.read_tool.name} for {self.id_param} {self.identifier}, then describe the change and ask the "
            f"user to confirm{mention}; call {self.write.name} only after they say yes."
        )


_USABLE: dict[bytes, list[_Target]] = {}  # per tool set (canonical JSON): the targets it can host


class PreconditionVerificationFamily(Family):
    """A write is requested; the reward needs read → confirm → write.

    Reward levels (``rewards`` holds the same numbers; the first write the backend executes is scored):

    - 1.0 ``read_confirm_write``: the record was read (read tool, right id), then a plain-text
      question asked the user to confirm, then the correct write (right tool, right arguments).
    - 0.8 ``read_confirm_write_precondition_unmentioned`` (difficulty 2 only): as 1.0, but no
      confirmation question mentioned the precondition the record revealed.
    - 0.6 ``read_write_unconfirmed``: read and correct write, but no confirmation was asked after
      the read and before the write (asking before the read, or in the same message as the write,
      does not count).
    - 0.3 ``write_without_read``: correct write without reading the record first.
    - 0.2 ``read_confirm_no_or_wrong_write``: read and confirmation, then no write or a wrong one
      (another write tool, or wrong argument values).
    - 0.0 ``wrong_entity_written``: any schema-valid write aimed at another id, whatever else happened.
    - 0.0 ``otherwise``: anything else (no useful call, malformed output, a wrong write without
      read and confirmation).
    """

    name = "precondition_verification"
    capability = "precondition_verification"
    version = "1"
    description = "A state-changing request: read the record, ask the user to confirm, then write."
    rewards = {
        "read_confirm_write": 1.0,
        "read_confirm_write_precondition_unmentioned": 0.8,
        "read_write_unconfirmed": 0.6,
        "write_without_read": 0.3,
        "read_confirm_no_or_wrong_write": 0.2,
        "wrong_entity_written": 0.0,
        "otherwise": 0.0,
    }
    levels = (1, 2)

    def _usable_targets(self, tools: Sequence[Tool]) -> list[_Target]:
        key = orjson.dumps([tool.to_openai() for tool in tools], option=orjson.OPT_SORT_KEYS)
        if key not in _USABLE:
            _USABLE[key] = self._find_usable_targets(tools)
        return _USABLE[key]

    @staticmethod
    def _find_usable_targets(tools: Sequence[Tool]) -> list[_Target]:
        usable = []
        for target in _targets(tools):
            probe = Values(0)
            identifier = probe.identifier(target.id_param, properties(target.write).get(target.id_param))
            if _write_arguments(probe, target, identifier) is not None:
                usable.append(target)
        return usable

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if not _targets(tools):
            return "no state-changing tool shares an id parameter with a read tool"
        if not self._usable_targets(tools):
            return "no schema-valid arguments can be generated for the state-changing tools"
        return None

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> PreconditionVerificationInstance:
        if difficulty not in self.levels:
            raise ValueError(f"{self.name} has difficulty levels {self.levels}, not {difficulty}")
        targets = self._usable_targets(tools)  # non-empty: Family.instance checked unusable()
        target = random.Random(derive_seed(self.name, "target", seed)).choice(targets)
        return PreconditionVerificationInstance(tools, seed, difficulty, target)
