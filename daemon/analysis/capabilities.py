"""Capabilities and labelers: what a capability is, how a trajectory is labeled, and the plugin registry.

A capability is registered through the entry point group ``tracefix.capabilities``; each entry
point names a callable that takes the CapabilitySettings and returns a Capability. The six
built-ins (daemon/analysis/builtin_capabilities/, one module each) are registered exactly that way, in pyproject.toml.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from tracefix.daemon.core.settings import CapabilitySettings

if TYPE_CHECKING:
    from tracefix.daemon.analysis.profile import AgentProfile

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tracefix.capabilities"


class Label(StrEnum):
    NA = "NA"  # the task did not need the capability
    PRESENT = "PRESENT"  # needed and exercised
    LACKING = "LACKING"  # needed and not exercised
    ERROR = "ERROR"  # the labeler could not decide (e.g. invalid LLM output); excluded from statistics


@dataclass(frozen=True, slots=True)
class Judgement:
    """One labeler's verdict on one trajectory, with the evidence a person can check."""

    label: Label
    reason: str
    span_ids: tuple[str, ...] = ()
    confidence: float = 1.0


@dataclass(slots=True)
class Turn:
    """One message of the assembled conversation."""

    position: int
    role: str
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str | None
    span_id: str


_UNPARSED = object()


@dataclass(slots=True)
class ToolCall:
    """One tool call of the trajectory, executed (tool span) or only requested (assistant message)."""

    position: int
    name: str
    call_id: str | None
    arguments: str | None
    result: str | None
    error: str | None
    message_position: int | None
    span_id: str
    # Parsed once: every labeler reads the same calls' arguments and results.
    _arguments: Any = field(default=_UNPARSED, repr=False, compare=False)
    _result: Any = field(default=_UNPARSED, repr=False, compare=False)

    def parsed_arguments(self) -> Any:
        """The arguments as JSON: {} when none were recorded, None when they are not JSON."""
        if self._arguments is _UNPARSED:
            if self.arguments is None:
                self._arguments = {}
            else:
                try:
                    self._arguments = orjson.loads(self.arguments)
                except orjson.JSONDecodeError:
                    self._arguments = None
        return self._arguments

    def parsed_result(self) -> Any:
        """The result as JSON; None when there is none or it is not JSON (plain text)."""
        if self._result is _UNPARSED:
            try:
                self._result = orjson.loads(self.result) if self.result else None
            except orjson.JSONDecodeError:
                self._result = None
        return self._result

    @property
    def failed(self) -> bool:
        if self.error:
            return True
        if self.result and self.result.lstrip().startswith("{"):
            result = self.parsed_result()
            return isinstance(result, dict) and bool(result.get("error"))
        return False


@dataclass(slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One ``gen_ai.evaluation.result`` event of the trajectory, from a span event or a log record."""

    name: str
    label: str | None
    score: float | None
    explanation: str | None
    span_id: str | None  # the span that carried the event, or the log record's span
    time_unix_nano: int


@dataclass(slots=True)
class Trajectory:
    """What labelers see: the conversation, the tool calls and the tools the agent declared."""

    trajectory_id: str
    service_name: str
    outcome: str
    turns: list[Turn]
    tool_calls: list[ToolCall]
    tools: dict[str, ToolSpec]
    # Where the tools came from: "trajectory", "agent" (other trajectories of the same service)
    # or "inferred" (from the calls themselves; labels based on them are less certain).
    tools_source: str = "trajectory"
    # The evaluators' verdicts on this run; [[capabilities.evaluations]] maps them to capabilities.
    evaluations: list[Evaluation] = field(default_factory=list)
    # What the agent's policy requires before a change (daemon.analysis.profile); None: not known.
    profile: AgentProfile | None = None

    def turn(self, position: int | None) -> Turn | None:
        if position is None or not (0 <= position < len(self.turns)):
            return None
        return self.turns[position]


class Labeler(Protocol):
    """Labels one (trajectory, capability) pair.

    A labeler that samples (an LLM) may also define ``label_runs(trajectory) -> list[Judgement]``
    returning one judgement per repeated run; the statistics vote over runs.
    """

    name: str
    version: str

    def label(self, trajectory: Trajectory) -> Judgement: ...


@dataclass(slots=True)
class Capability:
    """A capability the agent may lack, how to detect it, and the environment family that trains it."""

    name: str
    description: str
    labeler: Labeler
    environment_family: str | None = None
    builtin: bool = False


CapabilityFactory = Callable[[CapabilitySettings], Capability]


@dataclass(slots=True)
class CapabilityRegistry:
    """All capabilities known to this daemon, by name."""

    capabilities: dict[str, Capability] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, capability: Capability) -> None:
        if capability.name in self.capabilities:
            raise ValueError(f"capability {capability.name!r} is registered twice")
        self.capabilities[capability.name] = capability

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.capabilities.values())

    def __contains__(self, name: object) -> bool:
        return name in self.capabilities

    def __getitem__(self, name: str) -> Capability:
        return self.capabilities[name]

    def names(self) -> list[str]:
        return list(self.capabilities)


def load_registry(settings: CapabilitySettings) -> CapabilityRegistry:
    """Load every capability plugin; a broken plugin is reported, not fatal. The daemon's registry adds
    the LLM-labeled and evaluation-mapped capabilities to these (daemon/analysis/registry.py)."""
    registry = CapabilityRegistry()
    disabled = set(settings.disabled)
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda item: item.name):
        if entry_point.name in disabled:
            continue
        try:
            factory = entry_point.load()
            capability = factory(settings)
            registry.add(capability)
        except Exception as error:  # a plugin must not take the daemon down
            message = f"capability plugin {entry_point.name!r} failed to load: {error}"
            log.error(message)
            registry.errors.append(message)
    return registry
