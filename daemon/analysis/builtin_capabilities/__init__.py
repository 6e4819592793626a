"""The six built-in capabilities of DESIGN.md section 4, as rule labelers.

Each is registered through the ``tracefix.capabilities`` entry point group like any user plugin.
The rules read only the assembled conversation, tool calls and tool definitions: fast,
deterministic, no model.

One module per capability holds its labeler and the factory its entry point names
(pyproject.toml); ``_shared`` holds what several of them use and the capabilities' descriptions.
This package re-exports them, so ``tracefix.daemon.analysis.builtin_capabilities:tool_call_precision``
and the other entry points name them here.
"""

from tracefix.daemon.analysis.builtin_capabilities._shared import DESCRIPTIONS
from tracefix.daemon.analysis.builtin_capabilities.argument_grounding import ArgumentGrounding, argument_grounding
from tracefix.daemon.analysis.builtin_capabilities.error_recovery import ErrorRecovery, error_recovery
from tracefix.daemon.analysis.builtin_capabilities.multi_step_completion import MultiStepCompletion, multi_step_completion
from tracefix.daemon.analysis.builtin_capabilities.precondition_verification import (
    PreconditionVerification, precondition_verification,
)  # fmt: skip
from tracefix.daemon.analysis.builtin_capabilities.structured_data_reasoning import (
    StructuredDataReasoning, structured_data_reasoning,
)  # fmt: skip
from tracefix.daemon.analysis.builtin_capabilities.tool_call_precision import ToolCallPrecision, tool_call_precision

RULES_VERSION = "1"

__all__ = [
    "DESCRIPTIONS",
    "RULES_VERSION",
    "ArgumentGrounding",
    "ErrorRecovery",
    "MultiStepCompletion",
    "PreconditionVerification",
    "StructuredDataReasoning",
    "ToolCallPrecision",
    "argument_grounding",
    "error_recovery",
    "multi_step_completion",
    "precondition_verification",
    "structured_data_reasoning",
    "tool_call_precision",
]
