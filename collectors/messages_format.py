"""Runs written as OpenAI chat transcripts (`--format messages`): what a user exports from Langfuse,
Phoenix or their own logs.

A file holds one run per line (JSON lines) or a JSON array of runs. Each run is

    {"run_id": "...", "agent": "...", "outcome": "success" | "failure" | null,
     "messages": [OpenAI chat messages], "tools": [OpenAI function tools], "metadata": {...}}

Assistant messages may carry `tool_calls` (`{"id", "type": "function", "function": {"name",
"arguments": "<JSON string>"}}`); tool messages carry `tool_call_id` and, when the tool failed,
`"error": "<text>"`. `agent` becomes the run's service.name and gen_ai.agent.name; `metadata`
(scalar values) goes onto the run's root span. Other keys are ignored, so a file may keep its own
annotations next to each run. A run that breaks these rules stops the import before anything is
sent, with the line (or array position) and run id that broke it, like the other formats.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from tracefix.collectors.agent_runs import AgentRun, RunFormatError

ROLES = ("system", "user", "assistant", "tool")
REWARDS = {"success": 1.0, "failure": 0.0, None: None}


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """Each run's JSON value with where it sits ("line 3", or "run 3" of an array)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise RunFormatError(f"no such file: {path}") from None
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        yield from ((f"run {number}", run) for number, run in enumerate(whole, start=1))
        return
    if isinstance(whole, dict):  # a JSON-lines file of one run
        yield "line 1", whole
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise RunFormatError(f"{path}: line {number} is not JSON ({error})") from None


def _tool_call(call: Any, where: str) -> str:
    """The name of a well-formed OpenAI tool call; RunFormatError saying what is wrong otherwise."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise RunFormatError(f"{where}: a tool call without a function name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        found = {dict: "an object", list: "an array", type(None): "missing"}.get(type(arguments), f"a {type(arguments).__name__}")
        raise RunFormatError(
            f"{where}: the arguments of the {function['name']} call are {found}, not a JSON string "
            "(write them as the model did: the object serialised as text)"
        )
    return function["name"]


def _messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """The chat messages, checked, each tool message named after the call it answers."""
    if not isinstance(messages, list) or not messages:
        raise RunFormatError(f"{where}: no 'messages' list of chat messages")
    checked: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for number, message in enumerate(messages):
        here = f"{where}, message {number}"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else None
            raise RunFormatError(f"{here}: role {role!r} is none of {', '.join(ROLES)}")
        message = dict(message)
        if message["role"] == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise RunFormatError(f"{here}: 'tool_calls' is not a list")
            for call in calls:
                name = _tool_call(call, here)
                names[str(call.get("id"))] = name
        elif message["role"] == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise RunFormatError(f"{here}: a tool message without the 'tool_call_id' it answers")
            if message.get("error") is not None and not isinstance(message["error"], str):
                raise RunFormatError(f"{here}: 'error' is the failing tool's message as text, or absent")
            message.setdefault("name", names.get(message["tool_call_id"]))
        checked.append(message)
    return checked


def _tools(tools: Any, where: str) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RunFormatError(f"{where}: 'tools' is not a list of OpenAI function tools")
    return tools


def _metadata(metadata: Any, where: str) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(value, (str, int, float, bool)) for value in metadata.values()):
        raise RunFormatError(f"{where}: 'metadata' is not an object of string (or scalar) values")
    return metadata


def read_messages(path: Path, tools: list[dict[str, Any]] | None = None) -> Iterator[AgentRun]:
    """The runs of a `messages` file; `tools` for runs that carry none."""
    found = False
    for where, run in _documents(path):
        where = f"{path}: {where}"
        if not isinstance(run, dict):
            raise RunFormatError(f"{where}: a run is a JSON object, found {type(run).__name__}")
        run_id = run.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise RunFormatError(f"{where}: no 'run_id' string")
        where = f"{where} (run {run_id!r})"
        agent = run.get("agent")
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise RunFormatError(f"{where}: 'agent' is not a name")
        outcome = run.get("outcome")
        if outcome not in REWARDS:
            raise RunFormatError(f"{where}: outcome {outcome!r} is none of \"success\", \"failure\", null")
        found = True
        yield AgentRun(
            run_id=run_id,
            messages=_messages(run.get("messages"), where),
            tools=_tools(run.get("tools"), where) or tools or [],
            reward=REWARDS[outcome],
            evaluation_name="outcome",
            attributes=_metadata(run.get("metadata"), where),
            agent=agent,
        )
    if not found:
        raise RunFormatError(f"{path}: no runs (expected one JSON object per line, or a JSON array of runs)")
