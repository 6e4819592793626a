"""The six built-in capabilities of DESIGN.md section 4, as rule labelers.

Each is registered through the ``tracefix.capabilities`` entry point group like any user plugin.
The rules read only the assembled conversation, tool calls and tool definitions: fast,
deterministic, no model.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import fastjsonschema
import jsonschema
import orjson

from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, ToolCall, Trajectory
from tracefix.daemon.analysis.profile import AgentProfile, Observation
from tracefix.daemon.core.settings import CapabilitySettings

RULES_VERSION = "1"

# Identifier-like values: a letter-digit mix such as R-48213, ORD5521, a UUID; plain words,
# plain small numbers and dates are not ids.
_ID_VALUE = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_\-:.]{2,63}$|^[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}$")
# Words of tool names that say what a tool does, not what it is about (get_reservation: "reservation").
_GENERIC_VERBS = frozenset({"fetch", "find", "list", "lookup", "search", "show", "read", "check", "query", "update", "create", "delete", "send", "book", "cancel", "transfer", "make", "with", "from", "info", "details", "data"})
_DATE_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_ID_KEY = re.compile(r"(^|_)(id|ids|number|code|ref|reference)$", re.IGNORECASE)
# A stated number: not part of an id (R-48213), a date (2025-06-01), a time (06:45) or a version.
_NUMBER = re.compile(r"(?<![\w.:/-])[$€£]?\s?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\w:/-]|\.\d)")


def _words(text: str) -> list[str]:
    """Whitespace-separated words without surrounding punctuation ("ID: H9ZU1C." -> "H9ZU1C")."""
    return [word.strip(".,;:!?()[]{}\"'`*") for word in text.split()]


def _span(call_or_turn: Any) -> tuple[str, ...]:
    return (call_or_turn.span_id,) if getattr(call_or_turn, "span_id", None) else ()


def _walk(value: Any, key: str = "") -> list[tuple[str, Any]]:
    """Every scalar in a JSON value with the key it sits under (list items inherit their list's key)."""
    leaves: list[tuple[str, Any]] = []
    stack = [(key, value)]
    while stack:  # iterative: nested generators cost more than the labeling itself
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((str(inner_key), inner) for inner_key, inner in value.items())
        elif isinstance(value, list):
            stack.extend((key, inner) for inner in value)
        else:
            leaves.append((key, value))
    return leaves


def _id_values(arguments: Any) -> list[str]:
    """Argument values that identify an entity (by their shape, or by a key like `reservation_id`)."""
    found = []
    for key, value in _walk(arguments):
        if isinstance(value, int) and not isinstance(value, bool) and _ID_KEY.search(key) and value > 999:
            found.append(str(value))
        elif isinstance(value, str) and not _DATE_LIKE.match(value):
            if _ID_VALUE.match(value) or (_ID_KEY.search(key) and len(value) >= 2 and " " not in value):
                found.append(value)
    return found


def _call_key(call: ToolCall) -> tuple[str, str]:
    parsed = call.parsed_arguments()
    text = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode() if parsed is not None else (call.arguments or "")
    return call.name, text


def _turn_of(trajectory: Trajectory, call: ToolCall) -> int:
    """The conversation position a call happened at (calls without a message come last)."""
    return call.message_position if call.message_position is not None else len(trajectory.turns)


def _compile(schema: dict[str, Any]) -> Callable[[Any], tuple[str, str] | None] | None:
    """Validation for one tool schema: fastjsonschema's generated code where it supports the
    schema (most tool schemas), jsonschema otherwise; None when the schema itself is invalid."""
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    reference = cls(schema)

    def detailed(arguments: Any) -> tuple[str, str] | None:
        error = jsonschema.exceptions.best_match(reference.iter_errors(arguments))
        if error is None:
            return None
        return "/".join(str(part) for part in error.absolute_path) or "arguments", error.message

    try:
        fast = fastjsonschema.compile(schema)
    except Exception:  # a draft or keyword fastjsonschema does not support
        return detailed

    def check(arguments: Any) -> tuple[str, str] | None:
        try:
            fast(arguments)
        except fastjsonschema.JsonSchemaException:
            return detailed(arguments) or ("arguments", "invalid")
        return None

    return check


@dataclass(slots=True)
class ToolCallPrecision:
    """LACKING when a call names an unknown tool or its arguments fail the tool's JSON schema, or when
    a run that was given tools answered without calling any although the user asked about what a
    tool is named for (get_baggage_policy: "baggage")."""

    name: str = "rules.tool_call_precision"
    version: str = "3"
    # Checking a schema costs far more than validating against it; agents reuse a few schemas.
    _validators: dict[bytes, Any] = field(default_factory=dict)

    def validator(self, schema: dict[str, Any]) -> Any:
        """A compiled check for the schema: returns None or (path, message); None when the schema is invalid."""
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        if key not in self._validators:
            if len(self._validators) > 4096:
                self._validators.clear()
            self._validators[key] = _compile(schema)
        return self._validators[key]

    def label(self, trajectory: Trajectory) -> Judgement:
        if not trajectory.tool_calls:
            return self._without_calls(trajectory)
        inferred = trajectory.tools_source == "inferred"
        confidence = 0.6 if inferred else 1.0
        for call in trajectory.tool_calls:
            spec = trajectory.tools.get(call.name)
            if spec is None:
                if not trajectory.tools:
                    continue
                known = ", ".join(sorted(trajectory.tools)[:8])
                return Judgement(
                    Label.LACKING, f"call {call.position} names unknown tool {call.name!r} (known: {known})",
                    _span(call), confidence,
                )  # fmt: skip
            arguments = call.parsed_arguments()
            if arguments is None:
                return Judgement(
                    Label.LACKING, f"{call.name} called with arguments that are not JSON", _span(call), confidence
                )
            check = self.validator(spec.parameters) if spec.parameters else None
            problem = check(arguments) if check is not None else None  # None: no or broken schema
            if problem is not None:
                where, message = problem
                return Judgement(
                    Label.LACKING, f"{call.name} arguments fail its schema at {where}: {message}", _span(call), confidence
                )
        return Judgement(
            Label.PRESENT, f"all {len(trajectory.tool_calls)} calls match declared tools and schemas", (), confidence
        )


    @staticmethod
    def _without_calls(trajectory: Trajectory) -> Judgement:
        """A run offered tools that answered in prose only: LACKING with lower confidence (some
        requests need no tool; the contrast between failed and successful runs tells which)."""
        offered = trajectory.tools_source == "trajectory" and trajectory.tools
        answer = next((turn for turn in trajectory.turns if turn.role == "assistant"), None)
        if not (offered and answer is not None):
            return Judgement(Label.NA, "no tool calls")
        asked = " ".join(turn.content for turn in trajectory.turns if turn.role == "user").lower()
        words = set(re.findall(r"[a-z]+", asked))
        topics = sorted({
            word for name in trajectory.tools for word in name.lower().split("_")
            if len(word) >= 4 and word not in _GENERIC_VERBS and any(seen.startswith(word) for seen in words)
        })  # fmt: skip
        if not topics:
            return Judgement(Label.NA, "no tool calls, and nothing asked that a tool is named for")
        given = [word for turn in trajectory.turns if turn.role == "user" for word in _words(turn.content) if _ID_VALUE.match(word)]
        if not given:
            # "I don't have my reservation id": no tool could be called with what the user gave.
            return Judgement(Label.NA, f"asked about {', '.join(topics[:3])} but gave no identifier a tool could look up")
        evidence = (answer.span_id,) if answer.span_id else ()
        return Judgement(
            Label.LACKING,
            f"asked about {', '.join(topics[:3])} and answered without calling any of the {len(trajectory.tools)} tools it was given",
            evidence, 0.6,
        )  # fmt: skip


@dataclass(slots=True)
class ArgumentGrounding:
    """LACKING when an id-like argument was never seen in a user turn or an earlier tool result."""

    name: str = "rules.argument_grounding"
    version: str = "2"

    def label(self, trajectory: Trajectory) -> Judgement:
        grounded_calls = 0
        for call in trajectory.tool_calls:
            ids = _id_values(call.parsed_arguments())
            if not ids:
                continue
            position = _turn_of(trajectory, call)
            seen = [
                turn.content
                for turn in trajectory.turns[:position]
                if turn.role in ("user", "tool", "system")
            ]
            seen += [earlier.result or "" for earlier in trajectory.tool_calls[: call.position]]
            haystack = "\n".join(seen)
            for value in ids:
                # As a whole token: "t4" is not grounded by "t44", "8190333" is by "gift_card_8190333".
                if value not in haystack or not re.search(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", haystack):
                    return Judgement(
                        Label.LACKING,
                        f"{call.name} argument {value!r} appears in no user turn or tool result before it",
                        _span(call),
                    )
            grounded_calls += 1
        if not grounded_calls:
            return Judgement(Label.NA, "no call takes an identifier")
        return Judgement(Label.PRESENT, f"identifiers of {grounded_calls} calls come from the context")


def _entity(call: ToolCall) -> tuple[str, str] | None:
    """The (argument, value) naming what a state-changing call changes: the id argument named after
    the tool's object (update_reservation_flights: `reservation_id`), else its first id argument."""
    arguments = call.parsed_arguments()
    if not isinstance(arguments, dict):
        return None
    keyed = [(key, str(value)) for key, value in arguments.items() if _ID_KEY.search(key) and isinstance(value, (str, int))]
    words = set(call.name.lower().split("_")) - _GENERIC_VERBS
    for key, value in keyed:
        if key.lower().rsplit("_", 1)[0] in words:
            return key, value
    return keyed[0] if keyed else None


def _reads_entity(call: ToolCall, entity: tuple[str, str]) -> bool:
    """A call read the entity when it was asked about it or returned its record (`"reservation_id": "X"`)."""
    return any(str(found) == entity[1] for _, found in _walk(call.parsed_arguments())) or _returns_entity(call, entity)


def _returns_entity(call: ToolCall, entity: tuple[str, str]) -> bool:
    key, value = entity
    result = call.parsed_result()
    return value in (call.result or "") and any(found_key == key and str(found) == value for found_key, found in _walk(result))


# Sentences end after . ! ? or a line break; the "?" stays with its sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_NEGATED = re.compile(r"\b(?:not|don't|do not|didn't|never|no need to|can't|cannot|wouldn't|won't)\s+(?:\w+\s+){0,2}$")


def _confirms(settings: CapabilitySettings, text: str) -> bool:
    """A confirming phrase in a sentence that is no question ("How can we proceed?") and not negated."""
    for sentence in _SENTENCE_END.split(text.lower()):
        if sentence.rstrip().endswith("?"):
            continue
        for phrase in settings.confirmation_phrases:
            for match in re.finditer(rf"(?<![a-z']){re.escape(phrase)}(?![a-z])", sentence):
                if not _NEGATED.search(sentence[max(0, match.start() - 24) : match.start()]):
                    return True
    return False


def _changes_state(settings: CapabilitySettings, tool: str, profile: AgentProfile | None) -> bool:
    """Whether `tool` changes state: the agent's profile says, else [capabilities]' names and prefixes."""
    if profile is not None and profile.state_changing_tools is not None:
        return tool in profile.state_changing_tools
    return settings.changes_state(tool)


@dataclass(slots=True)
class PreconditionVerification:
    """LACKING when a state-changing call changes an entity the agent never read, or runs without the
    user's explicit confirmation given after that read — as far as the agent's policy asks for them
    (its profile, ``daemon.analysis.profile``): a rule its policy does not have is never LACKING, and
    where confirmation is not required, a change the user's own message states (the entity and the
    change: "mark t6 as done") is authorized by that message."""

    settings: CapabilitySettings
    name: str = "rules.precondition_verification"
    version: str = "4"

    def changes_state(self, tool: str, profile: AgentProfile | None = None) -> bool:
        return _changes_state(self.settings, tool, profile)

    def confirms(self, text: str) -> bool:
        """A confirming phrase in a sentence that is no question ("How can we proceed?") and not negated."""
        return _confirms(self.settings, text)

    def checks(self, trajectory: Trajectory) -> list[_WriteCheck]:
        """Each state-changing call with what came before it: a read of its entity, the user's
        confirmation after that read, the user's own statement of the change."""
        profile = trajectory.profile
        found = []
        for write in (call for call in trajectory.tool_calls if self.changes_state(call.name, profile)):
            entity = _entity(write)
            # A read of what the write changes; a change that returned the record (a booking) shows it too.
            reads = [
                call for call in trajectory.tool_calls[: write.position]
                if not call.failed and (
                    (not self.changes_state(call.name, profile) and (entity is None or _reads_entity(call, entity)))
                    or (entity is not None and self.changes_state(call.name, profile) and _returns_entity(call, entity))
                )
            ]  # fmt: skip
            # The yes must come after the agent could show what it read; one yes may approve several changes.
            since = _turn_of(trajectory, reads[0]) if reads else 0
            before_write = _turn_of(trajectory, write)
            asked = [turn for turn in trajectory.turns[:before_write] if turn.role == "user"]
            confirmed = any(self.confirms(turn.content) for turn in trajectory.turns[since:before_write] if turn.role == "user")
            found.append(_WriteCheck(write, entity, bool(reads), confirmed, _states_change(asked, write, entity), before_write))
        return found

    def observe(self, trajectory: Trajectory) -> Observation | None:
        """What a run did before its changes, for the agent's profile; None without a change."""
        checks = self.checks(trajectory)
        if not checks:
            return None
        return Observation(all(item.read for item in checks), all(item.confirmed for item in checks), all(item.requested for item in checks))

    def label(self, trajectory: Trajectory) -> Judgement:
        profile = trajectory.profile or AgentProfile(trajectory.service_name)
        checks = self.checks(trajectory)
        if not checks:
            return Judgement(Label.NA, "no state-changing tool was called")
        if profile.read_first.lacks and profile.confirmation.lacks:
            return Judgement(Label.NA, f"its policy asks neither a read nor a confirmation before a change ({profile.confirmation.evidence})")
        requested = 0
        for item in checks:
            write, entity = item.write, item.entity
            if not item.read and not profile.read_first.lacks:
                subject = f" of {entity[0]} {entity[1]}" if entity else ""
                return Judgement(Label.LACKING, f"{write.name} called without a prior read{subject}", _span(write))
            if item.confirmed or profile.confirmation.lacks:
                continue
            if item.requested and profile.authorized_by_request():
                requested += 1
                continue
            return Judgement(
                Label.LACKING, f"{write.name} called without the user's confirmation after reading (message {item.position})", _span(write)
            )  # fmt: skip
        how = [
            "read first" if not profile.read_first.lacks else "",
            "were confirmed" if not profile.confirmation.lacks else "",
        ]
        stated = f", {requested} of them as the user's own message stated" if requested else ""
        return Judgement(Label.PRESENT, f"{len(checks)} state-changing calls each {' and '.join(filter(None, how))}{stated}")


@dataclass(frozen=True, slots=True)
class _WriteCheck:
    write: ToolCall
    entity: tuple[str, str] | None
    read: bool  # its entity was read before it
    confirmed: bool  # a user turn after that read (or the start) confirms
    requested: bool  # a user turn before it states the entity and the change
    position: int  # the message it happened at


def _states_change(turns: list[Any], write: ToolCall, entity: tuple[str, str] | None) -> bool:
    """Whether one of the user's turns names the write's entity and its change: a value it writes
    ("done", "infra", "Quarterly report") or the verb of its tool ("delete", "cancel", "reset")."""
    if entity is None or not turns:
        return False
    key, value = entity
    noun = set(key.lower().split("_")) | {"id", "ids"}
    verbs = [word for word in write.name.lower().split("_") if len(word) >= 3 and word not in noun]
    written = [
        str(found).lower() for found_key, found in _walk(write.parsed_arguments())
        if found_key != key and isinstance(found, (str, int, float)) and not isinstance(found, bool) and len(str(found)) >= 2
    ]  # fmt: skip
    def said(phrase: str, text: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", text) is not None

    def verb_of(word: str, verb: str) -> bool:  # "cancel": cancel, cancels, cancelled, cancellation; "add": add, adds, added
        return word in (verb, f"{verb}s", f"{verb}ed", f"{verb}ing") or (len(verb) >= 5 and word.startswith(verb[:5]))

    for turn in turns:
        text = (turn.content or "").lower()
        if not said(value.lower(), text):
            continue
        words = re.findall(r"[a-z]+", text)
        if any(said(item, text) for item in written) or any(verb_of(word, verb) for verb in verbs for word in words):
            return True
    return False


@dataclass(slots=True)
class ErrorRecovery:
    """LACKING when a failing call is repeated unchanged, the run ends without fixing the error, or
    the error named the fix (an argument of the tool the call left out) and the tool was not called again."""

    name: str = "rules.error_recovery"
    version: str = "2"

    def label(self, trajectory: Trajectory) -> Judgement:
        calls = trajectory.tool_calls
        failures = [call for call in calls if call.failed]
        if not failures:
            return Judgement(Label.NA, "no tool call failed")
        for failed in failures:
            later = calls[failed.position + 1 :]
            repeat = next((call for call in later if _call_key(call) == _call_key(failed) and call.failed), None)
            if repeat is not None:
                return Judgement(
                    Label.LACKING, f"{failed.name} failed and was repeated unchanged (call {repeat.position})",
                    _span(repeat),
                )  # fmt: skip
            if not any(not call.failed for call in later):
                reason = (failed.error or failed.result or "error")[:80]
                return Judgement(
                    Label.LACKING, f"the run ends without a fix after {failed.name} failed: {reason}", _span(failed)
                )
            named = _fix_named(trajectory, failed)
            if named and not any(call.name == failed.name for call in later):
                return Judgement(
                    Label.LACKING, f"{failed.name} failed naming its argument {named!r} as the fix, and was not called again", _span(failed)
                )  # fmt: skip
        return Judgement(Label.PRESENT, f"recovered from {len(failures)} tool errors")


def _fix_named(trajectory: Trajectory, failed: ToolCall) -> str | None:
    """An argument of the failed tool (from its schema) that its error names and the call did not
    pass ("call delete_task with force=true"): the error said how to fix the call."""
    spec = trajectory.tools.get(failed.name)
    properties = (spec.parameters or {}).get("properties") if spec is not None else None
    if not isinstance(properties, dict):
        return None
    text = failed.error or failed.result or ""
    passed = failed.parsed_arguments()
    passed = passed if isinstance(passed, dict) else {}
    return next((name for name in properties if name not in passed and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text)), None)


@dataclass(slots=True)
class MultiStepCompletion:
    """LACKING when the run stops after a tool call without a final answer, loops, or hits the turn limit.

    A run may end on the user's turn ("thanks, that's all") or in a hand-off to a person that the
    agent's policy asks for (transfer_to_human_agents): both have ended.
    """

    settings: CapabilitySettings
    name: str = "rules.multi_step_completion"
    version: str = "6"

    def label(self, trajectory: Trajectory) -> Judgement:
        calls = trajectory.tool_calls
        repeats = self.settings.loop_repeats
        run = 1
        for previous, call in zip(calls, calls[1:]):
            run = run + 1 if _call_key(call) == _call_key(previous) else 1
            if run >= repeats:
                return Judgement(Label.LACKING, f"{call.name} called {run} times in a row with the same arguments", _span(call))
        # A loop with steps between ("think", then the same failing booking again): the same call
        # answered the same way. Reading a record again after a change gets another answer.
        answered: dict[tuple[str, str, str], int] = defaultdict(int)
        for call in calls:
            key = (*_call_key(call), call.error or call.result or "")
            answered[key] += 1
            if answered[key] >= repeats:
                return Judgement(
                    Label.LACKING, f"{call.name} called {answered[key]} times with the same arguments and the same answer",
                    _span(call),
                )  # fmt: skip
        listed = _listed_operations(trajectory)
        if len(listed) >= 2:
            touched = " ".join(f"{call.arguments or ''}" for call in calls if not call.failed)
            skipped = [item for item in listed if not any(re.search(rf"(?<![\w-]){re.escape(entity)}(?![\w-])", touched) for entity in item)]
            if skipped:
                names = ", ".join(item[0] for item in skipped[:4])
                return Judgement(
                    Label.LACKING, f"the user listed {len(listed)} operations; no call carried out the one on {names}",
                    _span(trajectory.turns[-1]) if trajectory.turns else (),
                )  # fmt: skip
        left = self._confirmed_not_done(trajectory)
        if left is not None:
            verb, tool, turn = left
            return Judgement(
                Label.LACKING, f"the agent offered to {verb} and the user confirmed; no {tool} call followed", _span(turn)
            )  # fmt: skip
        if len(calls) < 2 and len(listed) < 2:
            return Judgement(Label.NA, "fewer than two tool calls: not a multi-step task")
        assistant_turns = [turn for turn in trajectory.turns if turn.role == "assistant"]
        if self.settings.max_turns and len(assistant_turns) >= self.settings.max_turns:
            return Judgement(Label.LACKING, f"hit the turn limit of {self.settings.max_turns}", _span(assistant_turns[-1]))
        if not assistant_turns:
            return Judgement(Label.NA, "no assistant turn recorded")
        last = assistant_turns[-1]
        after = trajectory.turns[last.position + 1 :] if last.position < len(trajectory.turns) else []
        if last.tool_calls or (not last.content.strip() and any(turn.role == "tool" for turn in after)):
            final = calls[-1]
            handoff = trajectory.profile.handoff_tools if trajectory.profile else None
            if (final.name in handoff if handoff is not None else self.settings.hands_off(final.name)) and not final.failed:
                return Judgement(Label.PRESENT, f"{len(calls)} calls, then a hand-off to a person ({final.name})")
            return Judgement(
                Label.LACKING, f"the run stops after calling {final.name} without a final answer", _span(final)
            )  # fmt: skip
        if not last.content.strip():
            return Judgement(Label.LACKING, "the run ends on an empty assistant turn", _span(last))
        return Judgement(Label.PRESENT, f"{len(calls)} dependent calls ran to a final answer")


    def _confirmed_not_done(self, trajectory: Trajectory) -> tuple[str, str, Any] | None:
        """A change the agent offered and the user confirmed that no call made: (verb, tool, the offer).

        The offer is the agent's last words before a confirming user turn; a change it offers is a
        state-changing tool of the agent whose verb (the first word of its name: ``cancel`` of
        ``cancel_subscription``) the offer uses as a word, not negated. It counts only where the run
        made some change after the confirmation, but not that one: the agent carried out part of
        what was confirmed. An agent that made no change at all changed its mind or was stopped,
        which other capabilities judge."""
        profile = trajectory.profile
        handoff = profile.handoff_tools if profile else None
        verbs: dict[str, list[str]] = defaultdict(list)
        for tool in dict.fromkeys([*trajectory.tools, *(call.name for call in trajectory.tool_calls)]):
            if _changes_state(self.settings, tool, profile) and not (tool in handoff if handoff is not None else self.settings.hands_off(tool)):
                verbs[tool.split("_", 1)[0].lower()].append(tool)
        turns = trajectory.turns
        for index, turn in enumerate(turns):
            if turn.role != "user" or not _confirms(self.settings, turn.content):
                continue
            offer = next((earlier for earlier in reversed(turns[:index]) if earlier.role == "assistant" and earlier.content.strip()), None)
            if offer is None:
                continue
            text = offer.content.lower()
            offered = [
                verb for verb in verbs
                if any(not _NEGATED.search(text[max(0, match.start() - 24) : match.start()]) for match in re.finditer(rf"\b{re.escape(verb)}\b", text))
            ]  # fmt: skip
            made = {call.name for call in trajectory.tool_calls if not call.failed and _turn_of(trajectory, call) > turn.position}
            writes = made & {tool for tools in verbs.values() for tool in tools}
            undone = [verb for verb in offered if not made & set(verbs[verb])]
            if writes and undone:
                return undone[0], " or ".join(verbs[undone[0]]), offer
        return None


_LIST_ITEM = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•])\s+(.+)$", re.MULTILINE)
_ITEM_ID = re.compile(r"(?<![\w-])(?=[A-Za-z0-9_-]*\d)[A-Za-z][A-Za-z0-9_-]*\d[A-Za-z0-9_-]*(?![\w-])")


def _listed_operations(trajectory: Trajectory) -> list[tuple[str, ...]]:
    """The operations the user's first message lists, one per numbered or bulleted line, each as
    the ids it names ("1. mark t6 as done" -> ("t6",)); lines that name no id are left out."""
    first = next((turn for turn in trajectory.turns if turn.role == "user"), None)
    if first is None or not first.content:
        return []
    items = [tuple(dict.fromkeys(_ITEM_ID.findall(line))) for line in _LIST_ITEM.findall(first.content)]
    return [item for item in items if item]


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


DESCRIPTIONS = {
    "tool_call_precision": "Calls only declared tools, with arguments that satisfy each tool's JSON schema.",
    "argument_grounding": "Takes identifiers for tool arguments from the user or from earlier tool results, never invents them.",
    "precondition_verification": "Before a state-changing call, reads the entity and gets the user's explicit confirmation.",
    "error_recovery": "After a tool error, changes course (fixes the call or tries another way) instead of repeating or giving up.",
    "multi_step_completion": "Carries a chain of dependent tool calls through to the final step and answer, without looping.",
    "structured_data_reasoning": "States and writes values that agree with the JSON records the tools returned.",
}


def tool_call_precision(settings: CapabilitySettings) -> Capability:
    return Capability("tool_call_precision", DESCRIPTIONS["tool_call_precision"], ToolCallPrecision(), "tool_call_precision", True)


def argument_grounding(settings: CapabilitySettings) -> Capability:
    return Capability("argument_grounding", DESCRIPTIONS["argument_grounding"], ArgumentGrounding(), "argument_grounding", True)


def precondition_verification(settings: CapabilitySettings) -> Capability:
    return Capability(
        "precondition_verification", DESCRIPTIONS["precondition_verification"],
        PreconditionVerification(settings), "precondition_verification", True,
    )  # fmt: skip


def error_recovery(settings: CapabilitySettings) -> Capability:
    return Capability("error_recovery", DESCRIPTIONS["error_recovery"], ErrorRecovery(), "error_recovery", True)


def multi_step_completion(settings: CapabilitySettings) -> Capability:
    return Capability(
        "multi_step_completion", DESCRIPTIONS["multi_step_completion"], MultiStepCompletion(settings),
        "multi_step_completion", True,
    )  # fmt: skip


def structured_data_reasoning(settings: CapabilitySettings) -> Capability:
    return Capability(
        "structured_data_reasoning", DESCRIPTIONS["structured_data_reasoning"], StructuredDataReasoning(),
        "structured_data_reasoning", True,
    )  # fmt: skip
