"""The environment protocol: seeded, verifiable training instances in the target agent's own language.

An environment is a family (how instances of one capability are built and scored) bound to the
target agent's tool definitions and a difficulty. ``instance(seed)`` builds one instance
deterministically: ``reset()`` gives the opening messages (a system prompt rendering the target's
tools, the first user turn), ``step(assistant_message)`` returns what the environment says next
(tool results, user turns) and whether the episode is over, ``reward()`` scores the episode by
code. Messages are OpenAI chat messages; every message a rollout records is marked as produced by
the policy (``assistant``) or by the environment, so the trainer can mask the latter from the loss.
"""

from __future__ import annotations

import hashlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracefix.trainer.result_shapes import conformance
from tracefix.trainer.world import World

Message = dict[str, Any]
Policy = Callable[[list[Message]], Message]


@dataclass(frozen=True, slots=True)
class Tool:
    """One of the target agent's tools, exactly as it declared it."""

    name: str
    description: str
    parameters: dict[str, Any]
    # Whether calling it changes state, as the daemon's settings say (None: judged by its name).
    state_changing: bool | None = None
    # What it returns, learned from the agent's stored results (trainer.result_shapes); None: unknown.
    result_shape: dict[str, Any] | None = None

    @classmethod
    def from_definition(cls, definition: dict[str, Any]) -> Tool:
        """Accepts the OpenAI shape (``{"type": "function", "function": {...}}``) or a flat one; a
        ``state_changing`` key next to the name marks a tool the settings call state-changing (or not)."""
        body = definition.get("function", definition) if isinstance(definition, dict) else {}
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool definition without a name: {definition!r:.120}")
        parameters = body.get("parameters") or body.get("input_schema") or {"type": "object", "properties": {}}
        state_changing = body.get("state_changing", definition.get("state_changing"))
        shape = body.get("result_shape", definition.get("result_shape"))
        return cls(
            name, str(body.get("description") or ""), parameters, state_changing if isinstance(state_changing, bool) else None,
            shape if isinstance(shape, dict) and "type" in shape else None,
        )  # fmt: skip

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def load_tools(definitions: Sequence[dict[str, Any]]) -> list[Tool]:
    """Tools from definitions (a list, or ``{"tools": [...]}`` already unwrapped by the caller)."""
    tools = [Tool.from_definition(definition) for definition in definitions]
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names repeat: {sorted(names)}")
    return tools


def tools_hash(tools: Sequence[Tool]) -> str:
    canonical = orjson.dumps([tool.to_openai() for tool in sorted(tools, key=lambda t: t.name)], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:16]


# -- the target's message format ------------------------------------------------------------------

TOOL_FORMAT = (
    "You can call the following tools. For each call, answer with a JSON object inside "
    '<tool_call></tool_call> tags: <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>. '
    "Tool results come back in the next message. When you are done, answer the user in plain text.\n<tools>\n"
)


def render_system_prompt(instructions: str, tools: Sequence[Tool]) -> str:
    """The system prompt for models whose chat template has no tool support (SmolLM2's ChatML)."""
    listing = "\n".join(orjson.dumps(tool.to_openai()["function"]).decode() for tool in tools)
    return f"{instructions}\n\n{TOOL_FORMAT}{listing}\n</tools>"


@dataclass(slots=True)
class ToolCall:
    """A call parsed from an assistant message; ``arguments`` is None when they were not valid JSON."""

    name: str
    arguments: Any
    id: str


@dataclass(slots=True)
class ParsedTurn:
    text: str
    calls: list[ToolCall]
    errors: list[str]


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _call_from_object(data: Any, index: int, errors: list[str]) -> ToolCall | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        errors.append("tool call is not an object with a name")
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            errors.append(f"arguments of {data['name']} are not JSON")
            arguments = None
    return ToolCall(data["name"], arguments, f"call_{index}")


def _text_of(content: Any) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def parse_assistant(message: Message | Any) -> ParsedTurn:
    """Tool calls from an assistant message: OpenAI ``tool_calls``, ``<tool_call>{json}</tool_call>``
    blocks, or a bare JSON object; a malformed call is recorded in ``errors``, never raised.

    A policy's output is not always a message: a bare string is read as the content, anything else
    that is not a dict as an empty message (callers decide whether that is an event)."""
    if not isinstance(message, dict):
        message = {"role": "assistant", "content": message if isinstance(message, str) else ""}
    errors: list[str] = []
    calls: list[ToolCall] = []
    content = _text_of(message.get("content"))
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        errors.append("tool_calls is not a list")
        raw_calls = []
    for index, call in enumerate(raw_calls):
        function = call.get("function", {}) if isinstance(call, dict) else {}
        parsed = _call_from_object(function, index, errors)
        if parsed is not None:
            parsed.id = call.get("id") or parsed.id
            calls.append(parsed)
    if calls:
        return ParsedTurn(content, calls, errors)
    blocks = _TAGGED.findall(content)
    if blocks:
        for index, block in enumerate(blocks):
            try:
                data = orjson.loads(block)
            except orjson.JSONDecodeError:
                errors.append(f"tool call {index} is not valid JSON")
                continue
            parsed = _call_from_object(data, index, errors)
            if parsed is not None:
                calls.append(parsed)
        return ParsedTurn(_TAGGED.sub("", content).strip(), calls, errors)
    stripped = content.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            data = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return ParsedTurn(content, [], ["bare JSON tool call is not valid JSON"])
        if isinstance(data, dict) and "name" in data:
            parsed = _call_from_object(data, 0, errors)
            return ParsedTurn("", [parsed] if parsed else [], errors)
    return ParsedTurn(content, [], errors)


def assistant_call(name: str, arguments: dict[str, Any]) -> Message:
    """An assistant message calling one tool, in the tagged text format the system prompt asks for."""
    return {"role": "assistant", "content": f"<tool_call>{orjson.dumps({'name': name, 'arguments': arguments}).decode()}</tool_call>"}


def assistant_text(text: str) -> Message:
    return {"role": "assistant", "content": text}


def tool_message(call: ToolCall, result: Any) -> Message:
    content = result if isinstance(result, str) else orjson.dumps(result).decode()
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


# -- instances, families, environments --------------------------------------------------------------


@dataclass(slots=True)
class StepResult:
    messages: list[Message]
    done: bool


class Instance(ABC):
    """One seeded episode. Subclasses keep their state in plain attributes; same seed, same episode."""

    max_turns: int = 6

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int) -> None:
        self.tools = list(tools)
        self.seed = seed
        self.difficulty = difficulty
        self.random = random.Random(seed)
        self.events: list[str] = []  # observable events: parse errors, schema violations, …
        self.shaped: list[tuple[str, float, float]] = []  # (tool, fit before, fit after) of each dressed result
        # The entities its results talk about and their facts: every result goes through it (`_dress`).
        self.entities = World(seed)

    @abstractmethod
    def reset(self) -> list[Message]:
        """The opening messages: a system prompt with the target's tools and the first user turn."""

    @abstractmethod
    def step(self, assistant: Message) -> StepResult:
        """Take the policy's message; answer with tool results or user turns, or end the episode."""

    @abstractmethod
    def reward(self) -> float:
        """Score of the episode so far, in [0, 1], computed by code."""

    def success(self) -> bool:
        return self.reward() >= 1.0

    @abstractmethod
    def solution(self) -> list[Message]:
        """The assistant messages of a ground-truth episode, in order (replayable against step)."""

    def hint(self) -> str | None:
        """Guidance a trainer may inject into some rollouts when the base model is too weak."""
        return None

    def _dress(self, call: ToolCall, result: Any) -> Any:
        """A simulated result as the instance's world shows it (`World.present`): each entity with
        the same facts as in every other result, in the shape the agent's own tool returns when that
        was learned (the simulation's fields kept, the tool's other fields added, seeded by the
        call). Each dressed result's fit to the shape, before and after, is kept in ``shaped``."""
        tool = next((tool for tool in self.tools if tool.name == call.name), None)
        if tool is None:
            return result
        shown = self.present(tool, call.arguments, result)
        shape = tool.result_shape
        if shape is not None and shape.get("type") == "object" and isinstance(result, dict) and "error" not in result:
            self.shaped.append((tool.name, conformance(shape, result), conformance(shape, shown)))
        return shown

    def present(self, tool: Tool, arguments: Any, result: Any) -> Any:
        """`result` of a call of `tool` with `arguments` as the instance's world shows it (`World.present`), seeded by the call."""
        rng = random.Random(orjson.dumps([self.seed, tool.name, arguments], option=orjson.OPT_SORT_KEYS, default=str))
        return self.entities.present(tool, arguments if isinstance(arguments, dict) else {}, result, rng)


class DialogueInstance(Instance):
    """An instance that answers tool calls with simulated results and plain text with a user turn.

    Subclasses set ``instructions`` and ``request`` (in ``_start``), and implement ``_answer`` (one
    tool call) and ``_on_text`` (a plain-text turn); malformed or empty turns are handled here.
    """

    instructions: str = ""
    request: str = ""
    finished: bool = False

    def _start(self) -> None:
        """Build the episode's world; called by reset."""

    def reset(self) -> list[Message]:
        self.entities.rewind()
        self._start()
        return [
            {"role": "system", "content": render_system_prompt(self.instructions, self.tools)},
            {"role": "user", "content": self.request},
        ]

    def step(self, assistant: Message) -> StepResult:
        if self.finished:
            return StepResult([], True)
        if not isinstance(assistant, dict):
            self.events.append("assistant message is not an object")
            return StepResult([{"role": "user", "content": "Sorry, I didn't get that."}], False)
        parsed = parse_assistant(assistant)
        self.events.extend(parsed.errors)
        if parsed.calls:
            return StepResult([self._dressed(call, self._answer(call)) for call in parsed.calls], False)
        if parsed.errors:
            return StepResult([{"role": "user", "content": "Sorry, I couldn't read that. What did you mean?"}], False)
        text = parsed.text.strip()
        if not text:
            self.events.append("empty assistant message")
            return StepResult([{"role": "user", "content": "Hello? Are you still there?"}], False)
        return self._on_text(text)

    @abstractmethod
    def _answer(self, call: ToolCall) -> Message:
        """The simulated tool result for one call."""

    def _dressed(self, call: ToolCall, message: Message) -> Message:
        """The tool message with its result dressed in the tool's learned shape (`Instance._dress`)."""
        try:
            result = orjson.loads(message["content"])
        except (orjson.JSONDecodeError, TypeError):
            return message
        dressed = self._dress(call, result)
        return message if dressed is result else {**message, "content": orjson.dumps(dressed).decode()}

    @abstractmethod
    def _on_text(self, text: str) -> StepResult:
        """React to a plain-text assistant turn (the user's reply, or the end of the episode)."""


class Family(ABC):
    """How instances of one capability are built from a tool set and scored."""

    name: str
    capability: str
    version: str = "1"
    description: str = ""
    # The documented reward levels: which partial behaviour earns what.
    rewards: dict[str, float] = {}
    levels: tuple[int, ...] = (1,)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        """Why these tools cannot host this family (None when they can)."""
        return None

    def instance(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> Instance:
        """One seeded instance on these tools; a ValueError says why the tools cannot host it."""
        reason = self.unusable(tools)
        if reason:
            raise ValueError(f"{self.name} cannot use these tools: {reason}")
        return self.build(tools, seed, difficulty)

    @abstractmethod
    def build(self, tools: Sequence[Tool], seed: int, difficulty: int) -> Instance:
        """The instance itself, on tools already known to be usable."""


@dataclass(slots=True)
class Environment:
    """A family bound to the target's tools and a difficulty."""

    family: Family
    tools: list[Tool]
    difficulty: int = 1

    def __post_init__(self) -> None:
        reason = self.family.unusable(self.tools)
        if reason:
            raise ValueError(f"{self.family.name} cannot use these tools: {reason}")

    def instance(self, seed: int) -> Instance:
        return self.family.instance(self.tools, seed, self.difficulty)

    def spec(self) -> dict[str, Any]:
        return {
            "family": self.family.name,
            "capability": self.family.capability,
            "version": self.family.version,
            "difficulty": self.difficulty,
            "tools_hash": tools_hash(self.tools),
            "tools": [tool.name for tool in self.tools],
            "rewards": self.family.rewards,
        }


@dataclass(slots=True)
class Rollout:
    messages: list[Message]
    from_policy: list[bool]  # per message: True for the policy's own (trained) messages
    reward: float
    success: bool
    events: list[str] = field(default_factory=list)


def rollout(instance: Instance, policy: Policy, max_turns: int | None = None) -> Rollout:
    """Run one episode: the policy answers until the instance is done or the turn limit is hit."""
    messages = instance.reset()
    from_policy = [False] * len(messages)
    for _ in range(max_turns or instance.max_turns):
        assistant = policy(list(messages))
        messages.append(assistant)
        from_policy.append(True)
        result = instance.step(assistant)
        messages.extend(result.messages)
        from_policy.extend([False] * len(result.messages))
        if result.done:
            break
    return Rollout(messages, from_policy, instance.reward(), instance.success(), list(instance.events))


def solution_policy(instance: Instance) -> Policy:
    """Replays the instance's ground-truth solution."""
    steps = iter(instance.solution())
    return lambda messages: next(steps, assistant_text("Done."))


def noop_policy(messages: list[Message]) -> Message:
    return assistant_text("I'm sorry, I can't help with that.")


def random_policy(seed: int) -> Policy:
    """Calls a random declared tool with empty arguments, then gives up: a floor for rewards."""
    rng = random.Random(seed)

    def policy(messages: list[Message]) -> Message:
        prompt = messages[0].get("content", "") if messages else ""
        listing = prompt[prompt.find("<tools>") :]  # the declared tools, not the format example above them
        names = re.findall(r'"name":\s*"([^"<>]+)"', listing)
        if names and rng.random() < 0.7:
            return assistant_call(rng.choice(names), {})
        return assistant_text("Done.")

    return policy
