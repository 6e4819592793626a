"""The built-in capability precondition_verification: before a state-changing call, reads the entity
and gets the user's explicit confirmation, as far as the agent's policy (its profile,
``daemon.analysis.profile``) asks for them. Its rule labeler finds, for each change, the entity it
changes, a read of that entity before it, the user's confirmation after the read, and the user's own
statement of the change."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tracefix.daemon.analysis.builtin_capabilities._shared import (
    DESCRIPTIONS, _GENERIC_VERBS, _ID_KEY, _changes_state, _confirms, _span, _turn_of, _walk,
)  # fmt: skip
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, ToolCall, Trajectory
from tracefix.daemon.analysis.profile import AgentProfile, Observation
from tracefix.daemon.core.settings import CapabilitySettings


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


def precondition_verification(settings: CapabilitySettings) -> Capability:
    return Capability(
        "precondition_verification", DESCRIPTIONS["precondition_verification"],
        PreconditionVerification(settings), "precondition_verification", True,
    )  # fmt: skip
