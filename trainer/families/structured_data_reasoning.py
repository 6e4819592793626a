"""structured_data_reasoning: the answer must be computed from the JSON records a read returns.

One of the target's read tools (seeded) returns a list of records with numeric fields, named after
the tool's entity: items with ``unit_price`` and ``quantity`` for an order, flights with ``price``
and ``seats_left`` for a flight search, bags with ``fee`` and ``weight_kg`` for a reservation,
reservations or orders for a user/customer, generic records otherwise. The user states the read's
arguments and asks a question whose answer must be computed from the records:

- difficulty 1: the total of one field, or the highest/lowest price;
- difficulty 2: the sum of price × quantity (where that product means something), or a count of
  records meeting a condition (price above a threshold, quantity at least a threshold).

Gold: call the read tool with the stated arguments, then answer in plain text with the exact number.
Money is generated in whole cents and compared to the cent; counts exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from tracefix.trainer.environment import Family, Message, Tool, ToolCall, assistant_call, assistant_text
from tracefix.trainer.families._shared import AnsweringInstance, and_join, phrase, plural, singular, spoken
from tracefix.trainer.families.multi_step_completion import tool_noun
from tracefix.trainer.schema_values import Values, entity_of, is_read, is_write, key_parameters, properties, required
from tracefix.trainer.simulation import derive_seed, same, to_the_cent

# -- what the records look like ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scheme:
    """The records one read returns: an id, a label, a money field and a whole-number field."""

    list_key: str
    noun: str
    id_field: str
    label_field: str
    label: str  # how the label is made: "product", "time", "name", "route", "date", "word"
    price_field: str
    price_range: tuple[int, int]  # in cents
    count_field: str
    count_range: tuple[int, int]
    product: str | None  # what price × count means ("total cost"), None when it means nothing


ITEMS = Scheme("items", "item", "sku", "name", "product", "unit_price", (499, 29999), "quantity", (1, 5), "total cost")
FLIGHTS = Scheme("flights", "flight", "flight_number", "departure", "time", "price", (7900, 120000), "seats_left", (1, 9), None)
BAGS = Scheme("bags", "bag", "bag_id", "owner", "name", "fee", (2500, 15000), "weight_kg", (8, 32), None)
RESERVATIONS = Scheme(
    "reservations", "reservation", "reservation_id", "route", "route", "price_per_passenger", (9900, 89900), "passengers", (1, 4), "total cost"
)
ORDERS = Scheme("orders", "order", "order_number", "placed", "date", "total", (1500, 60000), "item_count", (1, 8), None)


def scheme_for(tool: Tool, tools: Sequence[Tool]) -> Scheme:
    """The records this read plausibly returns, from its name first, then its description."""
    mentions_reservations = any(
        "reservation" in name or "booking" in name for other in tools for name in [other.name, *properties(other)]
    )
    for text in (tool_noun(tool), tool.description.lower()):
        words = {singular(word) for word in re.findall(r"[a-z]+", text.lower())}
        if "flight" in words:
            return FLIGHTS
        if words & {"item", "product", "cart", "line", "order", "basket", "purchase"}:
            return ITEMS
        if words & {"reservation", "booking", "trip", "ticket"}:
            return BAGS
        if words & {"user", "customer", "account", "profile", "member", "client"}:
            return RESERVATIONS if mentions_reservations else ORDERS
    noun = singular(tool_noun(tool).split(" ")[-1]) or "record"
    return Scheme(plural(noun), noun, f"{noun}_id", "name", "word", "amount", (500, 90000), "quantity", (1, 9), "total value")


PRODUCTS = (
    "Backpack", "Coffee Mug", "Desk Lamp", "Water Bottle", "Headphones", "Notebook", "Phone Case", "T-Shirt",
    "Sneakers", "Throw Pillow", "Wall Clock", "Yoga Mat", "Umbrella", "Keyboard", "Sunglasses", "Scarf",
)


def article(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def money(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}${cents // 100:,}.{cents % 100:02d}"


# -- reading numbers out of an answer ------------------------------------------------------------------

_CURRENCY_CODES = re.compile(r"\b(?:USD|EUR|GBP|CAD|AUD|CHF|JPY|INR|dollars?|euros?)\b\.?", re.IGNORECASE)
_DATES = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?")
_TIMES = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")
_IDS = re.compile(r"\b[A-Za-z]+[-_]?\d[\w-]*")  # O-12345, SW1234, CNF-100200: identifiers, not quantities
_NUMBER = re.compile(r"(?<![\w.])([-\u2212]?)(?:[$\u20ac\u00a3\u00a5]\s?)?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!\w|\.\d)")


def numbers_in(text: str) -> list[Decimal]:
    """The quantities a text states, in order: currency symbols/codes and thousands separators are
    understood; dates, times and identifiers (``O-12345``, ``SW1234``) are not quantities."""
    text = text or ""
    for pattern in (_DATES, _TIMES, _IDS, _CURRENCY_CODES):
        text = pattern.sub(" ", text)
    found = []
    for sign, whole, fraction in _NUMBER.findall(text):
        try:
            value = Decimal(whole.replace(",", "") + (fraction or ""))
        except InvalidOperation:
            continue
        found.append(-value if sign else value)
    return found


# -- the instance ----------------------------------------------------------------------------------------

SYSTEM_INSTRUCTIONS = (
    "You are a customer support agent. Use the tools below to look up the data the user asks about, "
    "and answer with the exact value computed from the tool results."
)

QUESTIONS_1 = ("sum_price", "sum_count", "max_price", "min_price")


class StructuredDataReasoningInstance(AnsweringInstance):
    instructions = SYSTEM_INSTRUCTIONS
    formats = False  # types and shape only, as ever
    max_turns = 5

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        super().__init__(tools, seed, difficulty)
        self.values = Values(derive_seed("structured_data_reasoning", seed, difficulty))
        rng = self.values.random
        reads = [tool for tool in self.tools if is_read(tool)]
        candidates = [tool for tool in reads if required(tool)] or reads
        if not candidates:
            raise ValueError("these tools have no read tool")
        self.target = candidates[rng.randrange(len(candidates))]
        self.scheme = scheme_for(self.target, self.tools)
        self.arguments = {name: self._argument(name) for name in required(self.target)}
        self.records = self._records(rng.randint(4, 7) if difficulty >= 2 else rng.randint(3, 5))
        if difficulty >= 2:
            kinds = ["count_price_above", "count_count_at_least"]
            if self.scheme.product:
                kinds += ["product", "product"]
        else:
            kinds = list(QUESTIONS_1)
        self.kind = kinds[rng.randrange(len(kinds))]
        self.gold, self.is_money, self.threshold = self._gold()
        self.result = {**self.arguments, self.scheme.list_key: self.records}
        self.user_text = self._question()
        self.question_numbers = numbers_in(self.user_text)
        self.read_ok = False

    # world building

    def _argument(self, name: str) -> Any:
        schema = properties(self.target)[name]
        if name in key_parameters(self.target):
            return self.values.key_value(name, schema)
        return self.values.value(name, schema)

    def _id_schema(self) -> dict[str, Any]:
        for tool in self.tools:
            schema = properties(tool).get(self.scheme.id_field)
            if isinstance(schema, dict):
                return schema
        return {}

    def _label(self) -> str:
        faker, rng = self.values.faker, self.values.random
        kind = self.scheme.label
        if kind == "product":
            return f"{faker.color_name()} {rng.choice(PRODUCTS)}"
        if kind == "time":
            return f"{rng.randint(5, 22):02d}:{rng.choice((0, 15, 30, 45)):02d}"
        if kind == "name":
            return faker.name()
        if kind == "route":
            letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            return "-".join("".join(rng.choice(letters) for _ in range(3)) for _ in range(2))
        if kind == "date":
            return self.values.date(-120, -1)
        return faker.word()

    def _records(self, count: int) -> list[dict[str, Any]]:
        rng, scheme = self.values.random, self.scheme
        id_schema = self._id_schema()
        prices: list[int] = []
        while len(prices) < count:  # distinct by at least a dollar, so max/min and thresholds are clear
            cents = rng.randint(*scheme.price_range)
            if all(abs(cents - other) >= 100 for other in prices):
                prices.append(cents)
        counts = [rng.randint(*scheme.count_range) for _ in range(count)]
        if len(set(counts)) == 1:
            counts[rng.randrange(count)] = scheme.count_range[0] if counts[0] != scheme.count_range[0] else scheme.count_range[1]
        ids: list[str] = []
        for _ in range(count):
            identifier = self.values.identifier(scheme.id_field, id_schema)
            for _ in range(8):
                if identifier not in ids:
                    break
                identifier = self.values.identifier(scheme.id_field, id_schema)
            ids.append(identifier)
        self.prices, self.counts = prices, counts
        return [
            {scheme.id_field: ids[i], scheme.label_field: self._label(), scheme.price_field: prices[i] / 100, scheme.count_field: counts[i]}
            for i in range(count)
        ]

    def _gold(self) -> tuple[Decimal, bool, int | None]:
        prices, counts, rng = self.prices, self.counts, self.values.random
        if self.kind == "sum_price":
            return Decimal(sum(prices)) / 100, True, None
        if self.kind == "sum_count":
            return Decimal(sum(counts)), False, None
        if self.kind == "max_price":
            return Decimal(max(prices)) / 100, True, None
        if self.kind == "min_price":
            return Decimal(min(prices)) / 100, True, None
        if self.kind == "product":
            return Decimal(sum(p * c for p, c in zip(prices, counts))) / 100, True, None
        if self.kind == "count_price_above":
            ordered = sorted(prices)
            index = rng.randint(1, len(ordered) - 1)
            low, high = ordered[index - 1], ordered[index]
            threshold = (low + high) // 2 // 100 * 100
            if not low < threshold < high:
                threshold = (low + high) // 2
            return Decimal(sum(1 for p in prices if p > threshold)), False, threshold
        levels = sorted(set(counts))[1:]
        threshold = levels[rng.randrange(len(levels))]
        return Decimal(sum(1 for c in counts if c >= threshold)), False, threshold

    def _question(self) -> str:
        rng, scheme = self.values.random, self.scheme
        plural = scheme.list_key
        price, count = phrase(scheme.price_field), phrase(scheme.count_field)
        context = and_join([f"{phrase(name)} {spoken(value)}" for name, value in self.arguments.items()])
        where = f" for {context}" if context else ""
        if self.kind == "sum_price":
            question = f"What is the sum of the {price} of all the {plural}{where}?"
        elif self.kind == "sum_count":
            question = f"What is the total {count} across all the {plural}{where}?"
        elif self.kind == "max_price":
            question = f"What is the highest {price} among the {plural}{where}?"
        elif self.kind == "min_price":
            question = f"What is the lowest {price} among the {plural}{where}?"
        elif self.kind == "product":
            question = (
                f"What is the {scheme.product} of all the {plural}{where}, "
                f"i.e. the sum of {price} \u00d7 {count} over every {scheme.noun}?"
            )
        elif self.kind == "count_price_above":
            assert self.threshold is not None
            shown = f"${self.threshold // 100:,}" if self.threshold % 100 == 0 else money(self.threshold)
            question = f"How many of the {plural}{where} have {article(price)} above {shown}?"
        else:
            question = f"How many of the {plural}{where} have {article(count)} of at least {self.threshold}?"
        opener = rng.choice(("Hi!", "Hello.", "Quick question.", "Hey there."))
        return f"{opener} {question} Please give me the exact number."

    def answer_text(self) -> str:
        if self.is_money:
            return money(int(self.gold * 100))
        return str(int(self.gold))

    # protocol

    def _execute(self, call: ToolCall, tool: Tool, index: int) -> Any:
        arguments: dict[str, Any] = call.arguments
        for name in key_parameters(tool):
            known = [self.arguments[name]] if name in self.arguments else []
            if name == self.scheme.id_field:
                known += [record[name] for record in self.records]
            if not any(same(arguments.get(name), value, to_the_cent) for value in known):
                self.events.append(f"unknown_id: {tool.name}.{name}={arguments.get(name)!r:.40}")
                return {"error": f"{phrase(entity_of(name))} {arguments.get(name)} not found"}
        if tool.name == self.target.name:
            if all(name in arguments and same(arguments[name], value, to_the_cent) for name, value in self.arguments.items()):
                self.read_ok = True
                return self.result
            self.events.append(f"wrong_arguments: {tool.name}")
            return {**{name: arguments.get(name) for name in self.arguments}, self.scheme.list_key: []}
        if is_write(tool):
            self.events.append(f"unrequested_write: {tool.name}")
            return {"error": f"{tool.name} was not carried out: the user did not ask for a change"}
        self.events.append(f"other_read: {tool.name}")
        values = Values(derive_seed("structured_data_reasoning.read", self.seed, self.difficulty, call.name, self.turns))
        keys = key_parameters(tool)
        if keys:
            return self.entities.record(entity_of(keys[0]), arguments[keys[0]], extra=2, key=keys[0])
        return {"results": []}

    def stated(self) -> list[Decimal]:
        """The numbers the final answer states; numbers merely repeated from the question (a
        threshold) are left out unless nothing else is stated."""
        found = numbers_in(self.final_text or "")
        own = [value for value in found if value == self.gold or value not in self.question_numbers]
        return own or found

    def reward(self) -> float:
        rewards = StructuredDataReasoningFamily.rewards
        if not self.read_ok:
            return rewards["no_correct_read"]
        stated = self.stated()
        if not stated:
            return rewards["read_right_no_number"]
        # the value the answer gives is the number it leads with or the one it ends on
        if any(abs(value - self.gold) < Decimal("0.005") for value in (stated[0], stated[-1])):
            return rewards["correct_value"]
        return rewards["read_right_wrong_value"]

    def solution(self) -> list[Message]:
        return [
            assistant_call(self.target.name, dict(self.arguments)),
            assistant_text(f"The answer is {self.answer_text()}."),
        ]

    def hint(self) -> str:
        scheme = self.scheme
        price, count = scheme.price_field, scheme.count_field
        what = {
            "sum_price": f"add up {price} over all {scheme.list_key}",
            "sum_count": f"add up {count} over all {scheme.list_key}",
            "max_price": f"take the largest {price}",
            "min_price": f"take the smallest {price}",
            "product": f"add up {price} * {count} over all {scheme.list_key}",
            "count_price_above": f"count the {scheme.list_key} whose {price} is above the threshold",
            "count_count_at_least": f"count the {scheme.list_key} whose {count} is at least the threshold",
        }[self.kind]
        exact = "that exact amount, to the cent," if self.is_money else "that exact number"
        return (
            f"Call {self.target.name} with {orjson.dumps(self.arguments).decode()}, then {what} in the result "
            f"and state {exact} in your final answer."
        )


class StructuredDataReasoningFamily(Family):
    """A question whose answer must be computed from the records one read returns.

    Reward of the episode (only the final plain-text answer is read for the value; the stated value
    is the number the answer leads with or ends on, with currency signs/codes and thousands
    separators understood, dates, times and ids ignored, a number repeated from the question ignored
    when the answer states another one):

    ================================================================  ======
    read called with the stated arguments, exact value (to the cent)    1.0
    read called right, the stated value is wrong                        0.5
    read called right, no number stated (or no final answer)            0.3
    no correct read call (whatever is answered)                         0.0
    ================================================================  ======
    """

    name = "structured_data_reasoning"
    capability = "structured_data_reasoning"
    version = "1"
    description = "Answer with a value computed exactly from the JSON records a tool returned."
    rewards = {
        "correct_value": 1.0,
        "read_right_wrong_value": 0.5,
        "read_right_no_number": 0.3,
        "no_correct_read": 0.0,
    }
    levels = (1, 2)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if not tools:
            return "no tools"
        if not any(is_read(tool) for tool in tools):
            return "no read tool to return records"
        return None

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> StructuredDataReasoningInstance:
        return StructuredDataReasoningInstance(tools, seed, difficulty)
