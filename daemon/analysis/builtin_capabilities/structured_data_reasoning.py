"""The built-in capability structured_data_reasoning: states and writes values that agree with the
JSON records the tools returned. Its rule labeler checks each number the agent states (not dates,
times, durations, nor numbers the instructions or the user gave) against the numbers read: a value,
a total, a simple result of two values, a difference; and each sum-up ("16 tasks are still open")
against the last list it read."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracefix.daemon.analysis.builtin_capabilities._shared import (
    DESCRIPTIONS, _SENTENCE_END, _span, _turn_of, _walk,
)  # fmt: skip
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory
from tracefix.daemon.core.settings import CapabilitySettings

# A stated number: not part of an id (R-48213), a date (2025-06-01), a time (06:45) or a version.
_NUMBER = re.compile(r"(?<![\w.:/-])[$€£]?\s?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\w:/-]|\.\d)")


_MONTH = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
# A number that is part of a date ("May 21, 2024", "21 May"), a time ("10 am") or a duration ("24 hours").
_DATE_BEFORE = re.compile(rf"\b{_MONTH}\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?$", re.IGNORECASE)
_AFTER_NUMBER = re.compile(
    rf"^(?:st|nd|rd|th)?\s*(?:,?\s*(?:of\s+)?{_MONTH}\b|[ap]\.?m\b|(?:business\s+|calendar\s+)?(?:hours?|hrs?|minutes?|mins?|days?|weeks?|months?|years?)\b)",
    re.IGNORECASE,
)


_ID_DIGITS = re.compile(r"\d{4,}")


@lru_cache(maxsize=1024)
def _numbers_in(text: str) -> tuple[float, ...]:
    """The numbers in a text; cached, since every run of an agent repeats its instructions."""
    return tuple(float(match.group(1).replace(",", "")) for match in _NUMBER.finditer(text))


def _is_date_or_time(text: str, match: re.Match[str], value: float) -> bool:
    if "." not in match.group(1) and not match.group(0).lstrip().startswith(("$", "€", "£")) and 1900 <= value <= 2100:
        return True  # a year
    return bool(_DATE_BEFORE.search(text[max(0, match.start() - 24) : match.start()])) or bool(
        _AFTER_NUMBER.match(text[match.end() : match.end() + 24])
    )


@dataclass(slots=True)
class StructuredDataReasoning:
    """LACKING when a number the agent states contradicts what it read: no tool result supports it,
    as a value, a total or a simple result of two values.

    Numbers of dates, years, times and durations are not claims about records, nor are numbers the
    instructions (the policy: "$50 per bag", "24 hours") or the user's own words gave it.
    """

    name: str = "rules.structured_data_reasoning"
    version: str = "4"

    def label(self, trajectory: Trajectory) -> Judgement:
        record_numbers: list[float] = []
        by_key: dict[str, float] = {}  # per key, over all results
        per_record: dict[str, list[float]] = defaultdict(list)  # per key, each result's total (one record's prices)
        results_at: dict[int, list[str]] = defaultdict(list)  # message position -> tool results read there
        for call in trajectory.tool_calls:
            results_at[_turn_of(trajectory, call)].append(call.result or "")
            result = call.parsed_result()
            within: dict[str, float] = {}
            for key, value in _walk(result):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    record_numbers.append(float(value))
                    by_key[key] = by_key.get(key, 0.0) + float(value)
                    within[key] = within.get(key, 0.0) + float(value)
            for key, total in within.items():
                per_record[key].append(total)
            record_numbers.extend(_numbers_in(call.result or "") if result is None or isinstance(result, (str, int, float)) else [])
        if not record_numbers:
            return Judgement(Label.NA, "no tool returned numeric records")
        miscounted, summed_up = _sum_ups(trajectory)
        if miscounted is not None:
            return miscounted
        totals: list[float] = []  # built at the first stated number: a run that states none never needs them
        from_records: _Derivable | None = None  # the records alone: most stated numbers need no more
        context: list[str] = []  # what the agent had read or been told before each turn, as text
        with_context: tuple[int, _Derivable] | None = None
        stated = summed_up
        for turn in trajectory.turns:
            if turn.role != "assistant":
                context.append(turn.content or "")
            context.extend(results_at.pop(turn.position, ()))
            if turn.role != "assistant" or not turn.content:
                continue
            for match in _NUMBER.finditer(turn.content):
                text = match.group(0)
                value = float(match.group(1).replace(",", ""))
                if not ("$" in text or "€" in text or "£" in text or "." in match.group(1) or value >= 10):
                    continue  # small bare integers are usually counts or list markers
                if _is_date_or_time(turn.content, match, value):
                    continue
                stated += 1
                if _DIFFERENCE_AFTER.match(turn.content, match.end()):
                    read = [*record_numbers, *(number for said in context for number in _numbers_in(said))]
                    if not _a_difference(value, read):
                        return Judgement(
                            Label.LACKING, f"states a difference of {text.strip()} that no two values it read differ by (message {turn.position})",
                            _span(turn),
                        )  # fmt: skip
                    continue
                if from_records is None:
                    within_records = [total for record_totals in per_record.values() for total in record_totals]
                    totals = [*by_key.values(), *within_records, *_subset_sums(per_record)]
                    from_records = _Derivable(record_numbers, totals)
                if from_records(value):
                    continue
                if with_context is None or with_context[0] != len(context):
                    known = [number for said in context for number in _numbers_in(said)]
                    # The digits of ids (gift_card_5094406 said as "gift card 5094406") name a record, they are no claim.
                    quoted = [float(digits) for call in trajectory.tool_calls for digits in _ID_DIGITS.findall(call.result or "")]
                    with_context = (len(context), _Derivable([*record_numbers, *known], totals, quoted))
                if not with_context[1](value):
                    return Judgement(
                        Label.LACKING, f"states {text.strip()} which no returned record supports (message {turn.position})",
                        _span(turn),
                    )  # fmt: skip
        if not stated:
            return Judgement(Label.NA, "no number stated from the records")
        return Judgement(Label.PRESENT, f"{stated} stated numbers match the returned records")


# A sentence that sums up ("16 tasks are still open", "25 story points remain", "3 in total").
_AGGREGATE = re.compile(
    r"\b(?:left|remain(?:s|ing)?|still|in total|total|altogether|overall|(?:add|adds|added|sum|sums|come|comes) (?:up )?to)\b",
    re.IGNORECASE,
)
_NOT_COUNTED = frozenset({"per", "each", "a", "an", "every", "of"})  # "538 per passenger" is no count of passengers
# A count and the words after it, one of which says what it counts ("11 open tasks", "25 story points").
_COUNTED = re.compile(r"(?<![\w.$€£/:-])(\d{1,6})((?:\s+[a-z-]+){1,3})", re.IGNORECASE)


def _record_lists(value: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """The list of records (JSON objects) a listing returned, with the key it sits under: the result
    itself, or its one list beside at most two scalars (``{"tasks": [...], "count": 15}``). A record
    that holds a list (a reservation's passengers) is no listing: a count said of it may be of part."""
    if isinstance(value, list):
        return [("", value)] if value and all(isinstance(entry, dict) for entry in value) else []
    if not isinstance(value, dict):
        return []
    lists = [(str(key), item) for key, item in value.items() if isinstance(item, list)]
    others = [item for item in value.values() if not isinstance(item, list)]
    if len(lists) != 1 or len(others) > 2 or any(isinstance(item, dict) for item in others):
        return []
    key, records = lists[0]
    return [(key, records)] if all(isinstance(entry, dict) for entry in records) else []


def _counted_by(noun: str, records: list[dict[str, Any]], key: str) -> float | None:
    """What a sum-up of `noun` over this list of records must say: its length where the list is of
    `noun` ("tasks"), the total of a numeric field named `noun` ("points"); None for other nouns."""
    names = {noun, noun + "s", noun.removesuffix("s")} - {""}
    if key.lower() in names:
        return float(len(records))
    fields = [record.get(name) for record in records for name in names if name in record]
    if fields and all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in fields):
        return float(sum(fields))
    return None


def _sum_ups(trajectory: Trajectory) -> tuple[Judgement | None, int]:
    """LACKING where the agent sums up records and the sum is not that of the last list it read of
    them: "16 tasks are still open" after a listing of 15 open tasks, "25 story points remain" where
    the listed tasks' points add up to 31; with how many sum-ups matched. Only sentences that sum up
    count (left, remaining, still, in total), only against the newest listing of that kind read
    before the sentence: a count of part of a list ("1 upcoming reservation") is no sum-up of it."""
    matched = 0
    calls = [(call, _turn_of(trajectory, call)) for call in trajectory.tool_calls if not call.failed]
    for turn in trajectory.turns:
        if turn.role != "assistant" or not turn.content:
            continue
        read = [lists for call, at in reversed(calls) if at < turn.position and (lists := _record_lists(call.parsed_result()))]
        if not read:
            continue
        for sentence in _SENTENCE_END.split(turn.content):
            if not _AGGREGATE.search(sentence):
                continue
            for match in _COUNTED.finditer(sentence):
                value = float(match.group(1))
                if _is_date_or_time(sentence, match, value):
                    continue
                nouns = list(itertools.takewhile(lambda word: word not in _NOT_COUNTED, match.group(2).lower().split()))
                expected = next(
                    (
                        found for noun in nouns for lists in read for key, records in lists
                        if (found := _counted_by(noun, records, key)) is not None
                    ),
                    None,
                )  # fmt: skip
                if expected is not None and abs(expected - value) > 1e-6:
                    return Judgement(
                        Label.LACKING,
                        f"says {match.group(0).strip()}; the last list it read adds up to {expected:g} (message {turn.position})",
                        _span(turn),
                    ), matched  # fmt: skip
                matched += expected is not None
    return None, matched


# "$4.00 more", "($3.50 less)", "€2 cheaper": the number is a difference of two values.
_DIFFERENCE_AFTER = re.compile(r"\s*(?:a month\s+|per month\s+|/mo\s+)?(?:more|less|cheaper|higher|lower|extra)\b", re.IGNORECASE)


def _a_difference(value: float, numbers: list[float]) -> bool:
    """Whether two of the numbers differ by `value` (in cents, a cent either way), or it is one of them."""
    cents = {round(number * 100) for number in numbers}
    target = round(value * 100)
    return any(target + step in cents for step in (-1, 0, 1)) or any(
        known + target + step in cents for known in cents for step in (-1, 0, 1)
    )


def _subset_sums(per_record: dict[str, list[float]], most: int = 12) -> set[float]:
    """Totals over any few records of one key ("the total of your other four reservations"); keys
    returned by more than `most` results are left out (2^n sums)."""
    sums: set[float] = set()
    for values in per_record.values():
        if not 2 < len(values) <= most:
            continue
        reachable = {0}
        for value in values:
            reachable |= {total + round(value * 100) for total in reachable}
        sums.update(total / 100 for total in reachable)
    return sums


class _Derivable:
    """Whether a stated value follows from the numbers read: one of them, a total, or a pairwise result.

    Values are compared in cents; pairwise sums, differences and products are found with one set
    lookup per number read instead of materialising every pair.
    """

    def __init__(self, numbers: list[float], totals: Iterable[float], quoted: Iterable[float] = ()) -> None:
        self.numbers = numbers
        self.cents = {round(value * 100) for value in numbers}
        self.direct = (
            self.cents | {round(sum(numbers) * 100), len(numbers) * 100} | {round(t * 100) for t in totals}
            | {round(q * 100) for q in quoted}
        )  # fmt: skip

    def __call__(self, value: float) -> bool:
        target = round(value * 100)
        if any(abs(target - known) <= 1 for known in (target - 1, target, target + 1) if known in self.direct):
            return True
        for number in self.numbers:
            cents = round(number * 100)
            if (target - cents) in self.cents or (cents - target) in self.cents or (target + cents) in self.cents:
                return True  # a + b, a - b
            if number and abs(number) < 1000 and round(value / number * 100) in self.cents:
                candidate = round(value / number * 100)
                if abs(candidate / 100 * number - value) < 0.011:
                    return True  # a * b
        return False


def structured_data_reasoning(settings: CapabilitySettings) -> Capability:
    return Capability(
        "structured_data_reasoning", DESCRIPTIONS["structured_data_reasoning"], StructuredDataReasoning(),
        "structured_data_reasoning", True,
    )  # fmt: skip
