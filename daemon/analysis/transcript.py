"""Rendering a trajectory into the numbered transcript text an LLM reads, cut in the middle when long."""

from __future__ import annotations

from typing import Any

import orjson

from tracefix.daemon.analysis.capabilities import ToolCall, Trajectory
from tracefix.daemon.analysis.llm_client import one_line


def _cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 20)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    return f"{head} … [{len(text) - len(head) - len(tail)} characters omitted] … {tail}"


def _compact_json(text: str | None) -> str:
    """JSON text without insignificant whitespace; other text unchanged."""
    if text is None:
        return ""
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            return orjson.dumps(orjson.loads(stripped)).decode()
        except orjson.JSONDecodeError:
            pass
    return stripped


def _looks_failed(content: str) -> bool:
    if content.lstrip().startswith("{"):
        try:
            value = orjson.loads(content)
        except orjson.JSONDecodeError:
            return False
        return isinstance(value, dict) and bool(value.get("error"))
    return False


def _call_text(name: str, arguments: Any, limit: int) -> str:
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode() if arguments is not None else "{}"
    return f"{name}({_cut_middle(_compact_json(arguments) or '{}', limit)})"


def _indent(text: str) -> str:
    """Multi-line content continues on indented lines, so every [n] starts a line."""
    lines = text.splitlines() or [""]
    return "\n".join([lines[0], *("    " + line for line in lines[1:])])


def _cut_lines(lines: list[str], budget: int) -> list[str]:
    """Keep the first and last lines within `budget` characters; say what was left out."""
    total = sum(len(line) + 1 for line in lines)
    if total <= budget:
        return lines
    half = max((budget - 60) // 2, 0)
    head: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > half:
            break
        head.append(line)
        used += len(line) + 1
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > half:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    omitted = lines[len(head) : len(lines) - len(tail)]
    chars = sum(len(line) + 1 for line in omitted)
    return [*head, f"… [{len(omitted)} lines, {chars} characters omitted from the middle] …", *tail]


def render_transcript(trajectory: Trajectory, max_chars: int = 12000) -> str:
    """A compact numbered rendering: the declared tools, then `[n] role: …` per turn.

    `[n]` is the turn's index in ``trajectory.turns`` (the number the model cites as evidence).
    Assistant tool calls read `→ name({args})`, tool results `tool name ← result`, failures `✗ error`.
    Executed tool calls that have no tool message are shown under their assistant turn as `↳`.
    Beyond `max_chars` the middle of the conversation is cut, keeping its start and its end.
    """
    per_turn = max(200, max_chars // 5)
    per_args = max(120, max_chars // 20)
    header = [
        f"Trajectory: {trajectory.trajectory_id} (service {trajectory.service_name}, "
        f"{len(trajectory.turns)} turns numbered [0]–[{max(len(trajectory.turns) - 1, 0)}])"
    ]
    if trajectory.tools:
        inferred = trajectory.tools_source == "inferred"
        source = " (inferred from the calls; no definitions were recorded)" if inferred else ""
        header.append(f"Tools declared by the agent{source}:")
        names = sorted(trajectory.tools)
        for name in names[:40]:
            description = one_line((trajectory.tools[name].description or "").split("\n")[0], 140)
            header.append(f"- {name}: {description}" if description else f"- {name}")
        if len(names) > 40:
            header.append(f"- … and {len(names) - 40} more")
    else:
        header.append("Tools declared by the agent: none recorded")

    # Which tool each tool message answers, and which executed calls have no message of their own.
    requested = {
        call.get("id"): call.get("name", "?")
        for turn in trajectory.turns
        for call in (turn.tool_calls or [])
        if isinstance(call, dict) and call.get("id")
    }
    by_id: dict[str, ToolCall] = {call.call_id: call for call in trajectory.tool_calls if call.call_id}
    answered = {turn.tool_call_id for turn in trajectory.turns if turn.role == "tool" and turn.tool_call_id}
    unclaimed = [call for call in trajectory.tool_calls if not call.call_id or call.call_id not in answered]
    claimed_for_turn: dict[int, ToolCall] = {}
    for index, turn in enumerate(trajectory.turns):
        if turn.role == "tool" and not turn.tool_call_id:
            # A result without a call id answers the earliest unclaimed call made before it.
            for call in unclaimed:
                before = call.message_position is None or call.message_position < index
                if before:
                    claimed_for_turn[index] = call
                    unclaimed.remove(call)
                    break
    inline: dict[int | None, list[ToolCall]] = {}
    for call in unclaimed:
        position = call.message_position
        if position is not None and not 0 <= position < len(trajectory.turns):
            position = None
        inline.setdefault(position, []).append(call)

    def executed(call: ToolCall) -> str:
        mark = " ✗ error" if call.failed else ""
        shown = call.result if call.result else (call.error or "")
        result = _cut_middle(_compact_json(shown), per_turn)
        return f"    ↳ {_call_text(call.name, call.arguments, per_args)}{mark} ← {result}"

    lines: list[str] = []
    for index, turn in enumerate(trajectory.turns):
        content = (turn.content or "").strip()
        if turn.role == "assistant":
            calls = [
                _call_text(call.get("name", "?"), call.get("arguments"), per_args)
                for call in (turn.tool_calls or [])
                if isinstance(call, dict)
            ]
            text = f"[{index}] assistant"
            if content:
                text += f": {_cut_middle(content, per_turn)}"
            if calls:
                text += " → " + "; ".join(calls)
            if not content and not calls:
                text += ": (empty)"
            lines.append(_indent(text))
        elif turn.role == "tool":
            call = by_id.get(turn.tool_call_id or "") or claimed_for_turn.get(index)
            name = requested.get(turn.tool_call_id) or (call.name if call else None) or "?"
            failed = call.failed if call is not None else _looks_failed(content)
            shown = content or (call.error if call is not None and call.error else "") or "(empty)"
            mark = " ✗ error" if failed else ""
            lines.append(_indent(f"[{index}] tool {name}{mark} ← {_cut_middle(_compact_json(shown), per_turn)}"))
        else:
            lines.append(_indent(f"[{index}] {turn.role}: {_cut_middle(content, per_turn) or '(empty)'}"))
        for call in inline.get(index, []):
            lines.append(executed(call))
    if inline.get(None):
        lines.append("Tool calls not tied to a message:")
        lines.extend(executed(call) for call in inline[None])

    header.append("Conversation:")
    head = "\n".join(header)
    body = _cut_lines("\n".join(lines).split("\n"), max(max_chars - len(head) - 1, 400))
    return head + "\n" + "\n".join(body)

