"""The built-in capability error_recovery: after a tool error, changes course (fixes the call or tries
another way) instead of repeating or giving up. Its rule labeler looks at what follows each failed
call: the same call failing again, no call succeeding, or no new call where the error named the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracefix.daemon.analysis.builtin_capabilities._shared import DESCRIPTIONS, _call_key, _span
from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, ToolCall, Trajectory
from tracefix.daemon.core.settings import CapabilitySettings


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


def error_recovery(settings: CapabilitySettings) -> Capability:
    return Capability("error_recovery", DESCRIPTIONS["error_recovery"], ErrorRecovery(), "error_recovery", True)
