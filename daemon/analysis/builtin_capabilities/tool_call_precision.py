"""The built-in capability tool_call_precision: calls only declared tools, with arguments that
satisfy each tool's JSON schema. Its rule labeler checks each call against the tools' JSON schemas
(fastjsonschema where it can, jsonschema otherwise) and a run given tools that answered without any."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fastjsonschema
import jsonschema
import orjson

from tracefix.daemon.analysis.builtin_capabilities._shared import DESCRIPTIONS, _GENERIC_VERBS, _ID_VALUE, _span
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory
from tracefix.daemon.core.settings import CapabilitySettings


def _words(text: str) -> list[str]:
    """Whitespace-separated words without surrounding punctuation ("ID: H9ZU1C." -> "H9ZU1C")."""
    return [word.strip(".,;:!?()[]{}\"'`*") for word in text.split()]


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


def tool_call_precision(settings: CapabilitySettings) -> Capability:
    return Capability("tool_call_precision", DESCRIPTIONS["tool_call_precision"], ToolCallPrecision(), "tool_call_precision", True)
