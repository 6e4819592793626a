"""τ²-bench simulation results (sierra-research/tau2-bench `Results`) read as :class:`AgentRun` s.

A results file is one JSON document: `info.environment_info` holds the domain's `policy` (the
agent's instructions) and, when the run saved them, its `tool_defs`; each of `simulations` holds
one conversation (`messages`: system, user, assistant and tool messages in τ²'s own shape), its
`reward_info` and `termination_reason`. Only what the agent saw is kept: the user's own tool
calls (τ²'s telecom domain lets the simulated user act on their phone) and their results stay
out of the agent's transcript.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from tracefix.collectors.agent_runs import AgentRun, RunFormatError, load_json

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_./:-]+")
# ToolSignature.doc is the tool rendered as Python source: `def name(...):\n    """docstring"""`.
_DOCSTRING = re.compile(r'"""(.*)"""', re.DOTALL)


def _openai_tool(tool: Any, where: str) -> dict[str, Any]:
    """A τ² ToolSignature ({name, doc, params, returns}) as an OpenAI function definition."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
        return tool
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise RunFormatError(f"{where}: info.environment_info.tool_defs holds a tool without a name")
    if "parameters" in tool:
        return {"type": "function", "function": tool}
    doc = tool.get("doc") or ""
    docstring = _DOCSTRING.search(doc)
    function = {
        "name": tool["name"],
        "description": (docstring.group(1) if docstring else doc).strip(),
        "parameters": tool.get("params") or {"type": "object", "properties": {}},
    }
    return {"type": "function", "function": function}


def _tools(environment: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    definitions = environment.get("tool_defs")
    if isinstance(definitions, dict):
        definitions = list(definitions.values())
    if not definitions:
        return None
    if not isinstance(definitions, list):
        raise RunFormatError(f"{where}: info.environment_info.tool_defs is neither a mapping nor a list of tools")
    return [_openai_tool(tool, where) for tool in definitions]


def _call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return {"id": call.get("id"), "type": "function", "function": {"name": call.get("name"), "arguments": text}}


def _chat_messages(messages: list[Any], where: str) -> list[dict[str, Any]]:
    """τ² messages in OpenAI chat shape, without the user's tool calls and their results."""
    chat: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RunFormatError(f"{where} holds a message without a role")
        # A MultiToolMessage wraps the results of several calls made in one turn.
        for part in message.get("tool_messages") or [message]:
            role = part.get("role") if isinstance(part, dict) else None
            if role == "tool":
                if part.get("requestor") == "user":
                    continue
                converted = {"role": "tool", "tool_call_id": part.get("id"), "name": names.get(part.get("id")),
                             "content": part.get("content")}  # fmt: skip
                if part.get("error"):
                    converted["error"] = part.get("content") or "the tool failed"
            elif role == "user":
                # A user's tool calls act on the user's own device; the agent never sees them.
                if not part.get("content"):
                    continue
                converted = {"role": "user", "content": part["content"]}
            elif role in ("system", "assistant"):
                converted = {"role": role, "content": part.get("content")}
                calls = [call for call in part.get("tool_calls") or [] if isinstance(call, dict)]
                if calls:
                    converted["tool_calls"] = [_call(call) for call in calls]
                    names.update((call.get("id"), call.get("name")) for call in calls)
            else:
                raise RunFormatError(f"{where} holds a message with the unknown role {role!r}")
            chat.append(converted)
    return chat


def read_tau2_bench(path: Path, tools: list[dict[str, Any]] | None = None) -> Iterator[AgentRun]:
    """The simulations of a τ²-bench results file, the domain policy first as the system message."""
    results = load_json(path, "a τ²-bench results document")
    if not isinstance(results, dict):
        raise RunFormatError(f"{path}: a τ²-bench results file is a JSON object, found {type(results).__name__}")
    simulations = results.get("simulations")
    if not isinstance(simulations, list):
        raise RunFormatError(f"{path}: no 'simulations' list; is this a τ²-bench results file?")
    info = results.get("info") if isinstance(results.get("info"), dict) else {}
    environment = info.get("environment_info") if isinstance(info.get("environment_info"), dict) else {}
    offered = _tools(environment, str(path)) or tools or []
    for number, simulation in enumerate(simulations):
        if not isinstance(simulation, dict) or not isinstance(simulation.get("messages"), list):
            raise RunFormatError(f"{path}: simulation {number} has no 'messages' list")
        task_id, trial = simulation.get("task_id", number), simulation.get("trial") or 0
        messages = _chat_messages(simulation["messages"], f"{path}: simulation {number}")
        policy = simulation.get("policy") or environment.get("policy")
        if policy and not any(message["role"] == "system" for message in messages):
            messages.insert(0, {"role": "system", "content": policy})
        reward_info = simulation.get("reward_info") if isinstance(simulation.get("reward_info"), dict) else {}
        reward = reward_info.get("reward")
        identity = simulation.get("id") or f"task-{task_id}/trial-{trial}"
        yield AgentRun(
            run_id=_UNSAFE_ID.sub("-", f"{path.stem}/{identity}"),
            messages=messages,
            tools=offered,
            reward=float(reward) if isinstance(reward, (int, float)) else None,
            evaluation_name="tau2-bench",
            attributes={
                "tau2_bench.task_id": str(task_id),
                "tau2_bench.trial": trial if isinstance(trial, int) else 0,
                "tau2_bench.termination_reason": simulation.get("termination_reason"),
            },
        )
