"""One conversation: the agent loop, traced the way the GenAI semantic conventions describe it.

The customer opens; the policy answers; tool calls run against the conversation's own copy of the
database; a customer reply follows each question; the run ends on an answer that asks nothing, on
a model error, or at the turn limit. Then the outcome checker decides, and the verdict goes out as
a ``gen_ai.evaluation.result`` event in the conversation's trace.

Spans: ``invoke_agent airline-support`` (root) → ``chat <model>`` per model call (input and output
messages, system instructions, tool definitions) and ``execute_tool <name>`` per tool call. The
trace context of each chat span travels to the model endpoint in a W3C ``traceparent`` header, so
the router's own span joins the trace.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanKind, Status, StatusCode

from examples.airline.database import Database
from examples.airline.instructions import AGENT_NAME, SYSTEM_INSTRUCTIONS
from examples.airline.outcomes import EVALUATION_NAME, Outcome, check
from examples.airline.policies import Policy, PolicyError, Reply, ToolCallRequest
from examples.airline.progress import progress
from examples.airline.tasks import Task
from examples.airline.telemetry import Telemetry, dumps, input_messages, output_messages, system_instructions
from examples.airline.tools import TOOLS, ToolError, execute
from examples.airline.users import SimulatedUser

_TOOL_DEFINITIONS = dumps(TOOLS)
_INSTRUCTIONS = system_instructions(SYSTEM_INSTRUCTIONS)
_DESCRIPTIONS = {tool["name"]: tool["description"] for tool in TOOLS}


class Conversation:
    """The state of one running conversation and the spans it writes."""

    def __init__(
        self, task: Task, database: Database, policy: Policy, telemetry: Telemetry, conversation_id: str,
        rng: random.Random, request_attributes: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.task = task
        self.initial = database
        self.world = database.copy()
        self.policy = policy
        self.tracer = telemetry.tracer
        self.logger = telemetry.logger
        self.conversation_id = conversation_id
        self.rng = rng
        self.request_attributes = request_attributes or {}
        self.user = SimulatedUser(task, rng)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_INSTRUCTIONS},
            {"role": "user", "content": self.user.opening()},
        ]
        self.turns = self.tool_calls = self.tool_errors = 0
        self.served_by: list[str] = []  # the models that answered its calls, in the order they first did

    def run(self, max_turns: int) -> Outcome:
        """Play the conversation to its end and report (and return) its outcome."""
        root = self.tracer.start_span(
            f"invoke_agent {AGENT_NAME}", kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": AGENT_NAME,
                "gen_ai.conversation.id": self.conversation_id,
                "gen_ai.provider.name": self.policy.provider,
                "gen_ai.request.model": self.policy.model,
                "user.id": self.task.user_id,
                "airline.task.id": self.task.task_id,
                "airline.task.goal": self.task.goal,
            },
        )  # fmt: skip
        context = trace.set_span_in_context(root)
        ended = "answer"
        try:
            while True:
                if self.turns >= max_turns:
                    ended = "turn_limit"
                    break
                self.turns += 1
                reply = self._chat(context)
                if reply is None:
                    ended = "model_error"
                    break
                self.messages.append(reply.as_message())
                if reply.tool_calls:
                    for call in reply.tool_calls:
                        self._execute(call, context)
                    continue
                answer = self.user.reply(reply.content)
                if answer is None:
                    break
                self.messages.append({"role": "user", "content": answer})
            verdict = check(self.task, self.initial, self.world, self.messages)
            self.logger.emit(
                timestamp=time.time_ns(), context=context, severity_number=SeverityNumber.INFO,
                event_name="gen_ai.evaluation.result",
                attributes={
                    "gen_ai.evaluation.name": EVALUATION_NAME,
                    "gen_ai.evaluation.score.label": "pass" if verdict.success else "fail",
                    "gen_ai.evaluation.score.value": verdict.reward,
                    "gen_ai.evaluation.explanation": verdict.explanation,
                    "gen_ai.conversation.id": self.conversation_id,
                },
            )  # fmt: skip
            root.set_attribute("airline.ended", ended)
        finally:
            root.end()
        return Outcome(
            self.conversation_id, format(root.get_span_context().trace_id, "032x"), self.task.task_id, self.task.goal,
            self.policy.name, verdict.success, verdict.reward, verdict.explanation, self.turns, self.tool_calls,
            self.tool_errors, ended, list(getattr(self.policy, "applied", [])), progress(self.task, self.messages).as_dict(),
            self.served_by,
        )  # fmt: skip

    def _chat(self, parent: Any) -> Reply | None:
        """One model call in a chat span; None when the model endpoint failed."""
        model = self.policy.model
        span = self.tracer.start_span(
            f"chat {model}", context=parent, kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.policy.provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": self.conversation_id,
                "gen_ai.system_instructions": _INSTRUCTIONS,
                "gen_ai.tool.definitions": _TOOL_DEFINITIONS,
                "gen_ai.input.messages": input_messages(self.messages),
                **self.request_attributes,
            },
        )  # fmt: skip
        headers: dict[str, str] = {}
        inject(headers, context=trace.set_span_in_context(span))
        try:
            reply = self.policy.respond(self.messages, headers, self.rng.randrange(2**31), self.conversation_id)
        except PolicyError as error:
            span.set_attribute("error.type", error.error_type)
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()
            return None
        served = reply.response_model or model
        if served not in self.served_by:
            self.served_by.append(served)
        attributes: dict[str, Any] = {
            "gen_ai.output.messages": output_messages(reply),
            "gen_ai.response.finish_reasons": [reply.finish_reason],
            "gen_ai.response.model": served,
        }
        if reply.response_id:
            attributes["gen_ai.response.id"] = reply.response_id
        if reply.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = reply.input_tokens
        if reply.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = reply.output_tokens
        span.set_attributes(attributes)
        span.end()
        return reply

    def _execute(self, call: ToolCallRequest, parent: Any) -> None:
        """Run one requested tool call in an execute_tool span and append its result to the conversation."""
        self.tool_calls += 1
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.call.arguments": call.arguments,
            "gen_ai.conversation.id": self.conversation_id,
        }
        if call.name in _DESCRIPTIONS:
            attributes["gen_ai.tool.description"] = _DESCRIPTIONS[call.name]
        span = self.tracer.start_span(f"execute_tool {call.name}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes)
        try:
            try:
                arguments = json.loads(call.arguments) if call.arguments.strip() else {}
            except json.JSONDecodeError as error:
                raise ToolError("InvalidArguments", f"the arguments of {call.name} are not valid JSON: {error}") from None
            content = dumps(execute(self.world, call.name, arguments))
            span.set_attribute("gen_ai.tool.call.result", content)
        except ToolError as error:
            self.tool_errors += 1
            content = dumps(error.as_result())
            span.set_attribute("error.type", error.error_type)
            span.set_status(Status(StatusCode.ERROR, f"{error.error_type}: {error.message}"))
        finally:
            span.end()
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
