"""Trajectory assembly: turns stored spans and logs into conversations, tool calls and outcomes.

A trajectory is one trace; traces that share a conversation id join one trajectory. Assembly is
incremental and idempotent: each pass takes the traces touched by newly committed batches and
rebuilds their trajectories from all of their spans, so out-of-order and late spans are handled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson

from tracefix.collectors.dialects import Message, SpanView, ToolExecution, interpret
from tracefix.daemon.core import metrics
from tracefix.daemon.core.semconv import EVALUATION_EVENT, decoded, event_attributes
from tracefix.daemon.core.settings import AssemblerSettings, OutcomeSettings
from tracefix.daemon.store.store import DerivedRows, Store
from tracefix.daemon.store.traces import (
    MessageRow, OutcomeRow, ToolCallRow, ToolDefinitionRow, TraceMapRow, TrajectoryRow, TrajectoryToolRow,
)  # fmt: skip

log = logging.getLogger(__name__)


def _arguments_key(arguments: str | None) -> str:
    """Arguments compared by meaning, not by formatting."""
    parsed = decoded(arguments)
    if isinstance(parsed, (dict, list)):
        return orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    return str(parsed)


def _message_key(message: Message) -> tuple:
    calls = tuple((call.name, _arguments_key(call.arguments)) for call in message.tool_calls)
    return (message.role, message.content.strip(), calls, message.tool_call_id)


@dataclass(slots=True)
class _Entry:
    message: Message
    trace_id: str
    span_id: str


_INPUT_KEYS = ("gen_ai.input.messages",)
_INPUT_PREFIXES = ("gen_ai.prompt.", "llm.input_messages.")
_DEFINITION_KEY = "gen_ai.tool.definitions"


def _without_inputs(attributes: dict[str, Any], seen_definitions: set[str]) -> dict[str, Any]:
    """The attributes minus the input history (and tool definitions already parsed for this trajectory)."""
    definitions = attributes.get(_DEFINITION_KEY)
    repeated = isinstance(definitions, str) and definitions in seen_definitions
    if isinstance(definitions, str):
        seen_definitions.add(definitions)
    return {
        key: value
        for key, value in attributes.items()
        if key not in _INPUT_KEYS and not key.startswith(_INPUT_PREFIXES) and not (repeated and key == _DEFINITION_KEY)
    }


def merge_transcript(transcript: list[_Entry], incoming: Iterable[Message], trace_id: str, span_id: str) -> None:
    """Append the messages of `incoming` not already at the end of `transcript`.

    Each model call usually resends the whole history; the longest suffix of the transcript that
    is a prefix of the new input is the part already known.
    """
    incoming = list(incoming)
    if not incoming:
        return
    known = [_message_key(entry.message) for entry in transcript]
    keys = [_message_key(message) for message in incoming]
    overlap = 0
    if keys[: len(known)] == known:
        overlap = len(known)
    else:
        for size in range(min(len(known), len(keys)), 0, -1):
            if known[-size:] == keys[:size]:
                overlap = size
                break
    transcript.extend(_Entry(message, trace_id, span_id) for message in incoming[overlap:])


def _attribute_spans(
    transcript: list[_Entry],
    chats: list[tuple[dict[str, Any], SpanView, dict[str, Any], list[dict[str, Any]]]],
    executions: list[tuple[dict[str, Any], ToolExecution]],
) -> None:
    """Point each message read from the last call's history at the span that recorded it: an answer
    at the call that wrote it, a tool result at its tool span, a user turn at the first call that read
    it. Evidence (a label's span, the dashboard's marked turn) then names one turn, not the whole run."""
    answers: dict[tuple, list[dict[str, Any]]] = {}
    for span, view, _, _ in chats:
        for message in view.output_messages:
            answers.setdefault(_message_key(message), []).append(span)
    tool_spans = {execution.call_id: span for span, execution in executions if execution.call_id}
    waiting: list[_Entry] = []  # user turns until the next call that read them
    for entry in transcript:
        message = entry.message
        span = None
        if message.role == "assistant" and answers.get(_message_key(message)):
            span = answers[_message_key(message)].pop(0)
            for earlier in waiting:
                earlier.trace_id, earlier.span_id = span["trace_id"], span["span_id"]
            waiting = []
        elif message.role == "tool" and message.tool_call_id in tool_spans:
            span = tool_spans[message.tool_call_id]
        elif message.role == "user":
            waiting.append(entry)
        if span is not None:
            entry.trace_id, entry.span_id = span["trace_id"], span["span_id"]


class OutcomeRules:
    """Reads success or failure out of evaluation events and root-span attributes.

    Evaluations in `capability_evaluations` judge a capability ([[capabilities.evaluations]]), not
    the run, so they never decide an outcome.
    """

    def __init__(self, settings: OutcomeSettings, capability_evaluations: Iterable[str] = ()) -> None:
        self.success = {label.lower() for label in settings.success_labels}
        self.failure = {label.lower() for label in settings.failure_labels}
        self.threshold = settings.success_threshold
        self.names = set(settings.evaluation_names)
        self.capability_evaluations = set(capability_evaluations)
        for name in sorted(self.names & self.capability_evaluations):
            log.warning(
                "evaluation %r is in [outcome] evaluation_names but mapped to a capability: it decides no outcome", name
            )

    def evaluation(self, attributes: dict[str, Any]) -> tuple[str, float | None, str] | None:
        name = attributes.get("gen_ai.evaluation.name")
        if self.names and name not in self.names:
            return None
        if isinstance(name, str) and name.strip() in self.capability_evaluations:
            return None
        label = attributes.get("gen_ai.evaluation.score.label")
        score = attributes.get("gen_ai.evaluation.score.value")
        score = float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
        detail = " ".join(
            str(part) for part in (name, label, attributes.get("gen_ai.evaluation.explanation")) if part
        )
        if isinstance(label, str) and label.strip().lower() in self.success:
            return "success", score, detail
        if isinstance(label, str) and label.strip().lower() in self.failure:
            return "failure", score, detail
        if score is not None:
            return ("success" if score >= self.threshold else "failure"), score, detail
        return None

    def root_attributes(self, attributes: dict[str, Any]) -> tuple[str, float | None, str] | None:
        outcome = attributes.get("tracefix.outcome")
        if isinstance(outcome, str) and outcome.strip().lower() in ("success", "failure"):
            reward = attributes.get("tracefix.reward")
            reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
            return outcome.strip().lower(), reward, "tracefix.outcome"
        reward = attributes.get("tracefix.reward")
        if isinstance(reward, str):
            try:
                reward = float(reward)
            except ValueError:
                return None
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            return ("success" if reward >= self.threshold else "failure"), float(reward), "tracefix.reward"
        return None


class Assembler:
    """Runs assembly passes over the store; one pass at a time (the scheduler guarantees it)."""

    def __init__(
        self,
        store: Store,
        settings: AssemblerSettings,
        outcome: OutcomeSettings,
        committed_batch: Callable[[], int] | None = None,
        capability_evaluations: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.settings = settings
        self.rules = OutcomeRules(outcome, capability_evaluations)
        self.position = store.assembler_position()
        self._committed_batch = committed_batch or (lambda: max(self.position))
        # Every ingest batch up to this one is assembled (spans and logs share one batch sequence).
        self.assembled_batch = max(self.position)

    def run_pass(self, max_traces: int | None = None) -> int:
        """Assemble what was committed since the last pass (at most `max_traces` traces, default
        from the settings); returns how many trajectories were rebuilt."""
        started = time.perf_counter()
        committed = self._committed_batch()  # read first: every batch up to it is visible below
        span_batch, log_batch = self.position
        # One snapshot for everything the pass reads: a root span committed between grouping and
        # reading would otherwise be assembled under its trace id with its conversation's outcome,
        # a trajectory that the next pass removes, after the jobs may have picked it.
        with self.store.transaction():
            trace_ids, reach_span, reach_log, complete = self.store.pending_traces(
                span_batch, log_batch, max_traces or self.settings.max_traces_per_pass
            )
            if trace_ids:
                groups = self.store.trajectory_groups(trace_ids)
                all_traces = [trace for traces in groups.values() for trace in traces]
                spans = self.store.spans_of_traces(all_traces)
                conversations = [trajectory_id for trajectory_id, traces in groups.items() if trajectory_id not in traces]
                logs = self.store.logs_of_traces(all_traces, conversations)
        if not trace_ids:
            if (reach_span, reach_log) != self.position:
                self.store.replace_derived(DerivedRows([], [], [], [], [], [], [], []), reach_span, reach_log)
                self.position = (reach_span, reach_log)
            if complete:
                self.assembled_batch = max(self.assembled_batch, committed)
            return 0
        rows = self.build(groups, spans, logs, max(reach_span, reach_log))
        self.store.replace_derived(rows, reach_span, reach_log)
        self.position = (reach_span, reach_log)
        if complete:
            self.assembled_batch = max(self.assembled_batch, committed)
        metrics.ASSEMBLER_SECONDS.observe(time.perf_counter() - started)
        return len(groups)

    def run_until_idle(self, max_passes: int = 1000) -> int:
        total = 0
        for _ in range(max_passes):
            done = self.run_pass()
            total += done
            if not done:
                break
        return total

    def build(
        self, groups: dict[str, list[str]], spans: list[dict[str, Any]], logs: list[dict[str, Any]], batch: int
    ) -> DerivedRows:
        trajectory_of_trace = {trace: trajectory for trajectory, traces in groups.items() for trace in traces}
        spans_by_trajectory: dict[str, list[dict[str, Any]]] = {}
        for span in spans:
            spans_by_trajectory.setdefault(trajectory_of_trace[span["trace_id"]], []).append(span)
        logs_by_trajectory: dict[str, list[dict[str, Any]]] = {}
        for record in logs:
            trajectory = trajectory_of_trace.get(record["trace_id"]) or (
                record["conversation_id"] if record["conversation_id"] in groups else None
            )
            if trajectory:
                logs_by_trajectory.setdefault(trajectory, []).append(record)
        trace_map = [TraceMapRow(trace_id, trajectory_id) for trace_id, trajectory_id in sorted(trajectory_of_trace.items())]
        rows = DerivedRows(list(groups), trace_map, [], [], [], [], [], [])
        now = datetime.now(timezone.utc)
        definitions: dict[tuple[str, str], tuple] = {}
        for trajectory_id, trajectory_spans in spans_by_trajectory.items():
            self._assemble(
                trajectory_id,
                groups[trajectory_id],
                trajectory_spans,
                logs_by_trajectory.get(trajectory_id, []),
                batch,
                now,
                rows,
                definitions,
            )
        rows.tool_definitions = list(definitions.values())
        return rows

    def _assemble(
        self,
        trajectory_id: str,
        trace_ids: list[str],
        spans: list[dict[str, Any]],
        logs: list[dict[str, Any]],
        batch: int,
        now: datetime,
        rows: DerivedRows,
        definitions: dict[tuple[str, str], tuple],
    ) -> None:
        # Each model call resends the whole history, so parsing every call's input is quadratic in
        # the conversation's length. Inputs are parsed for the last call only; earlier calls are
        # parsed in full only when their outputs are missing from that last history.
        views: list[tuple[dict[str, Any], SpanView, dict[str, Any], list[dict[str, Any]]]] = []
        seen_definitions: set[str] = set()
        for span in spans:
            attributes = decoded(span["attributes"]) or {}
            events = decoded(span["events"]) or []
            view = interpret(
                span["name"], _without_inputs(attributes, seen_definitions), events,
                span["status_code"], span["status_message"] or "",
            )  # fmt: skip
            views.append((span, view, attributes, events))
        chats = [index for index, (_, view, _, _) in enumerate(views) if view.operation == "chat"]
        history_from = set(chats)
        if chats:
            full = lambda index: interpret(  # noqa: E731
                views[index][0]["name"], views[index][2], views[index][3],
                views[index][0]["status_code"], views[index][0]["status_message"] or "",
            )  # fmt: skip
            last = full(chats[-1])
            known = {_message_key(message) for message in [*last.input_messages, *last.output_messages]}
            covered = all(
                _message_key(message) in known for index in chats[:-1] for message in views[index][1].output_messages
            )
            if covered:
                history_from = {chats[-1]}
            for index in sorted(history_from):
                span, view, attributes, events = views[index]
                parsed = last if index == chats[-1] else full(index)
                parsed.tool_definitions = parsed.tool_definitions or view.tool_definitions
                views[index] = (span, parsed, attributes, events)

        roots = [span for span in spans if not span["parent_span_id"]]
        first_root = roots[0] if roots else spans[0]
        service_name = first_root["service_name"]
        agent_name = next((view.agent_name for _, view, _, _ in views if view.agent_name), None)

        transcript: list[_Entry] = []
        executions: list[tuple[dict[str, Any], ToolExecution]] = []
        tools: dict[str, tuple[str, str | None]] = {}
        system_text: tuple[str, dict[str, Any]] | None = None
        for index, (span, view, _, _) in enumerate(views):
            if view.operation == "chat" and view.system_instructions and system_text is None:
                system_text = (view.system_instructions, span)
            if index in history_from:
                merge_transcript(transcript, view.input_messages, span["trace_id"], span["span_id"])
                merge_transcript(transcript, view.output_messages, span["trace_id"], span["span_id"])
            if view.tool_execution is not None:
                executions.append((span, view.tool_execution))
            for definition in view.tool_definitions:
                parameters = orjson.dumps(definition.parameters).decode() if definition.parameters is not None else None
                tools[definition.name] = (definition.description or "", parameters)
        if system_text and not (transcript and transcript[0].message.role == "system"):
            text, span = system_text
            transcript.insert(0, _Entry(Message("system", text, [], None, None), span["trace_id"], span["span_id"]))
        if chats and len(history_from) == 1 and len(chats) > 1:
            _attribute_spans(transcript, [views[index] for index in chats], executions)

        for position, entry in enumerate(transcript):
            message = entry.message
            calls = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in message.tool_calls]
            rows.messages.append(
                MessageRow(
                    trajectory_id, position, message.role, message.content, orjson.dumps(calls).decode(), message.tool_call_id,
                    message.name, entry.trace_id, entry.span_id, batch,
                )
            )  # fmt: skip

        tool_calls = self._tool_calls(trajectory_id, transcript, executions, batch)
        rows.tool_calls.extend(tool_calls)
        for name, (description, parameters) in sorted(tools.items()):
            rows.trajectory_tools.append(TrajectoryToolRow(trajectory_id, name, description, parameters, batch))
            definitions[(service_name, name)] = ToolDefinitionRow(service_name, name, description, parameters)

        rows.outcomes.extend(self._outcomes(trajectory_id, views, logs, now))
        n_llm = sum(1 for _, view, _, _ in views if view.operation == "chat")
        dialects = sorted({view.dialect for _, view, _, _ in views if view.dialect != "none"})
        conversation = next((span["conversation_id"] for span in spans if span["conversation_id"]), None)
        rows.trajectories.append(
            TrajectoryRow(
                trajectory_id=trajectory_id, conversation_id=conversation, service_name=service_name, agent_name=agent_name,
                trace_ids=sorted(trace_ids), root_name=first_root["name"] if roots else None,
                start_time_unix_nano=min(span["start_time_unix_nano"] for span in spans),
                end_time_unix_nano=max(span["end_time_unix_nano"] for span in spans),
                n_spans=len(spans), n_llm_calls=n_llm, n_tool_calls=len(tool_calls),
                n_tool_errors=sum(1 for call in tool_calls if call.error), dialects=dialects, tool_names=sorted(tools),
                updated_batch=batch, updated_at=now,
            )
        )  # fmt: skip

    def _tool_calls(
        self,
        trajectory_id: str,
        transcript: list[_Entry],
        executions: list[tuple[dict[str, Any], ToolExecution]],
        batch: int,
    ) -> list[ToolCallRow]:
        """Executed tools (tool spans) first-class; requested calls without a span fill the gaps."""
        results = {
            entry.message.tool_call_id: entry.message.content
            for entry in transcript
            if entry.message.role == "tool" and entry.message.tool_call_id
        }
        requested: list[tuple[int, Any, _Entry]] = [
            (position, call, entry)
            for position, entry in enumerate(transcript)
            for call in entry.message.tool_calls
        ]
        rows: list[ToolCallRow] = []  # positions are set once they are in order
        matched: set[int] = set()
        for span, execution in executions:
            message_position = None
            for index, (position, call, _) in enumerate(requested):
                if index in matched:
                    continue
                same_id = execution.call_id and call.id == execution.call_id
                same_call = call.name == execution.name and (
                    execution.arguments is None or _arguments_key(call.arguments) == _arguments_key(execution.arguments)
                )
                if same_id or (not execution.call_id and same_call) or (execution.call_id and not call.id and same_call):
                    matched.add(index)
                    message_position = position
                    break
            result = execution.result
            if result is None and execution.call_id:
                result = results.get(execution.call_id)
            rows.append(
                ToolCallRow(
                    trajectory_id, 0, execution.name, execution.call_id, execution.arguments, result, execution.error, "tool_span",
                    message_position, span["trace_id"], span["span_id"], span["start_time_unix_nano"], batch,
                )
            )  # fmt: skip
        for index, (position, call, entry) in enumerate(requested):
            if index in matched:
                continue
            rows.append(
                ToolCallRow(
                    trajectory_id, 0, call.name, call.id, call.arguments, results.get(call.id) if call.id else None, None, "message",
                    position, entry.trace_id, entry.span_id, 0, batch,
                )
            )  # fmt: skip
        # Order by when the call happened: the message that asked for it, else the span's start.
        rows.sort(key=lambda row: (row.message_position if row.message_position is not None else 1 << 30, row.start_time_unix_nano))
        return [row._replace(position=position) for position, row in enumerate(rows)]

    def _outcomes(
        self,
        trajectory_id: str,
        views: list[tuple[dict[str, Any], SpanView, dict[str, Any], list[dict[str, Any]]]],
        logs: list[dict[str, Any]],
        now: datetime,
    ) -> list[OutcomeRow]:
        outcomes: list[OutcomeRow] = []
        for record in logs:
            if record["event_name"] != EVALUATION_EVENT:
                continue
            decided = self.rules.evaluation(event_attributes(decoded(record["attributes"]), decoded(record["body"])))
            if decided:
                outcome, reward, detail = decided
                outcomes.append(
                    OutcomeRow(trajectory_id, "evaluation", outcome, reward, detail, record["log_id"], record["time_unix_nano"], now)
                )
        for span, _, attributes, events in views:
            for index, event in enumerate(events):
                if not isinstance(event, dict) or event.get("name") != EVALUATION_EVENT:
                    continue
                decided = self.rules.evaluation(event_attributes(event.get("attributes")))
                if decided:
                    outcome, reward, detail = decided
                    evidence = f"{span['span_id']}#{index}"
                    observed = event.get("time_unix_nano") or span["end_time_unix_nano"]
                    outcomes.append(OutcomeRow(trajectory_id, "evaluation", outcome, reward, detail, evidence, observed, now))
            if not span["parent_span_id"]:
                decided = self.rules.root_attributes(attributes)
                if decided:
                    outcome, reward, detail = decided
                    outcomes.append(
                        OutcomeRow(trajectory_id, "attribute", outcome, reward, detail, span["span_id"], span["end_time_unix_nano"], now)
                    )
        return outcomes
