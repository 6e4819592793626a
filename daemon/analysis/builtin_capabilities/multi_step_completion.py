"""The built-in capability multi_step_completion: carries a chain of dependent tool calls through to
the final step and answer, without looping. Its rule labeler looks for loops, operations the user
listed that no call carried out, confirmed changes that were not made, the turn limit, and a run that
stops after a call without an answer (a hand-off to a person ends a run too)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tracefix.daemon.analysis.builtin_capabilities._shared import (
    DESCRIPTIONS, _NEGATED, _call_key, _changes_state, _confirms, _span, _turn_of,
)  # fmt: skip
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory
from tracefix.daemon.core.settings import CapabilitySettings


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


def multi_step_completion(settings: CapabilitySettings) -> Capability:
    return Capability(
        "multi_step_completion", DESCRIPTIONS["multi_step_completion"], MultiStepCompletion(settings),
        "multi_step_completion", True,
    )  # fmt: skip
