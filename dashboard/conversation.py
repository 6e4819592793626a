"""A trajectory as a readable conversation: user and assistant turns, each tool call with its
arguments, each tool result, and the evidence a label points at (its spans) marked with the reason.

Two sources share one shape: trajectories from the API (messages plus tool-call records that carry
span ids) and environment instances (OpenAI-style messages whose calls are `<tool_call>` text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

_TAGGED_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
MAX_RESULT_CHARS = 2000
AVATARS = {"user": ":material/person:", "assistant": ":material/smart_toy:", "tool": ":material/build:"}


@dataclass(slots=True)
class Call:
    """One tool call an assistant turn made."""

    name: str
    arguments: str
    evidence: bool = False
    error: str | None = None


@dataclass(slots=True)
class Turn:
    """One message: who said it, its text, the calls it made, and whether it is labelled evidence."""

    role: str
    text: str
    calls: list[Call] = field(default_factory=list)
    tool_name: str | None = None
    evidence: bool = False
    error: str | None = None


def _pretty(arguments: Any) -> str:
    """Arguments as indented JSON when they parse, else as sent (malformed arguments are evidence too)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _declared_calls(raw: Any) -> list[dict[str, Any]]:
    """The `tool_calls` of a stored message: a JSON list of {id, name, arguments}."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    return [call for call in raw or [] if isinstance(call, dict)]


def _tagged_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Calls written as `<tool_call>{json}</tool_call>` in the text (the embedded model's format)."""
    calls = []
    for match in _TAGGED_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except ValueError:
            body = {"name": "(unparsable call)", "arguments": match.group(1)}
        if isinstance(body, dict):
            calls.append({"name": body.get("name", "?"), "arguments": body.get("arguments", {})})
    return _TAGGED_CALL.sub("", text).strip(), calls


def trajectory_turns(trajectory: Mapping[str, Any], evidence_span_ids: Iterable[str] = ()) -> list[Turn]:
    """The turns of a trajectory from GET /api/trajectories/{id}; calls, results and assistant turns
    whose span is among `evidence_span_ids` are marked."""
    evidence = set(evidence_span_ids)
    records = trajectory.get("tool_calls") or []
    by_call_id = {record["call_id"]: record for record in records if record.get("call_id")}
    by_position: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_position.setdefault(record.get("message_position", -1), []).append(record)
    turns = []
    for message in trajectory.get("messages") or []:
        role = message.get("role") or "assistant"
        text, tagged = _tagged_calls(message.get("content") or "")
        if role == "tool":
            record = by_call_id.get(message.get("tool_call_id") or "") or {}
            turns.append(
                Turn(
                    role, text, tool_name=record.get("tool_name") or message.get("name"),
                    evidence=record.get("span_id") in evidence, error=record.get("error"),
                )
            )  # fmt: skip
            continue
        calls = []
        unmatched = list(by_position.get(message.get("position", -2), []))
        for declared in _declared_calls(message.get("tool_calls")) + tagged:
            record = by_call_id.get(declared.get("id") or "")
            if record is None:
                record = next((item for item in unmatched if item.get("tool_name") == declared.get("name")), None)
            if record is not None and record in unmatched:
                unmatched.remove(record)
            record = record or {}
            calls.append(
                Call(
                    declared.get("name") or record.get("tool_name") or "?",
                    _pretty(declared.get("arguments", record.get("arguments", {}))),
                    evidence=record.get("span_id") in evidence,
                    error=record.get("error"),
                )
            )
        own_evidence = role == "assistant" and message.get("span_id") in evidence and not any(call.evidence for call in calls)
        turns.append(Turn(role, text, calls, evidence=own_evidence))
    return turns


def instance_turns(messages: Iterable[Mapping[str, Any]]) -> list[Turn]:
    """The turns of an environment episode (system, user, assistant with `<tool_call>` text, tool)."""
    turns = []
    for message in messages:
        role = message.get("role") or "assistant"
        text, tagged = _tagged_calls(str(message.get("content") or ""))
        calls = [Call(call["name"], _pretty(call["arguments"])) for call in tagged]
        turns.append(Turn(role, text, calls, tool_name=message.get("name") if role == "tool" else None))
    return turns


def _result_text(text: str) -> str:
    """A tool result on as few lines as it takes: results are long, the conversation is what matters."""
    shown = text
    if text[:1] in "[{":
        try:
            shown = json.dumps(json.loads(text), ensure_ascii=False, separators=(", ", ": "))
        except ValueError:
            pass
    return shown if len(shown) <= MAX_RESULT_CHARS else shown[:MAX_RESULT_CHARS] + " … (truncated)"


def render(turns: list[Turn], evidence_reason: str | None = None) -> None:
    """Draw the turns as chat messages; evidence is flagged in place with the label's reason."""
    marked = False
    for turn in turns:
        if turn.role == "system":
            with st.expander("System prompt"):
                st.text(turn.text)
            continue
        with st.chat_message(turn.role, avatar=AVATARS.get(turn.role)):
            if turn.role == "tool":
                # A result shares its call's span: the call carries the flag, the result a note.
                note = " · :orange[evidence span]" if turn.evidence and evidence_reason else ""
                st.caption(f"result of `{turn.tool_name or 'tool'}`" + (" — error" if turn.error else "") + note)
                st.code(_result_text(turn.text), language="json" if turn.text[:1] in "[{" else None, wrap_lines=True)
                continue
            if turn.evidence and evidence_reason:
                st.warning(f"Evidence: {evidence_reason}", icon=":material/flag:")
                marked = True
            if turn.text:
                st.markdown(turn.text)
            for call in turn.calls:
                if call.evidence and evidence_reason:
                    st.warning(f"Evidence: {evidence_reason}", icon=":material/flag:")
                    marked = True
                st.markdown(f"**tool call** `{call.name}`" + (" :red[failed]" if call.error else ""))
                st.code(call.arguments, language="json", wrap_lines=True)
    if evidence_reason and not marked:
        # The label's spans are not a message or a call (e.g. the whole run): the reason still shows.
        st.warning(f"Evidence (whole run): {evidence_reason}", icon=":material/flag:")
