"""Capability analysis: label new or changed trajectories, then recompute the contrastive statistics.

Labeling is incremental (only trajectories without a current label, or reassembled since); the
statistics are one DuckDB query per window over all labels (ER+, ER-, Δ, coverage, Wilson
intervals, the paper's selection rule and the consistency vote). A pass labels only the capabilities
whose labeler is fast (rules, evaluation events); those whose labeler is ``deferred`` (the LLM's) are
judged beside it by ``LLMJudging`` (judging.py), and the statistics count whatever they judged so far.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from tracefix.daemon.core import metrics
from tracefix.daemon.analysis.capabilities import (
    Capability, CapabilityRegistry, Evaluation, Judgement, Label, ToolCall, ToolSpec, Trajectory, Turn,
)  # fmt: skip
from tracefix.daemon.analysis.builtin_capabilities import PreconditionVerification
from tracefix.daemon.analysis.evaluation_labels import EvaluationLabeler, log_evaluation, span_evaluations
from tracefix.daemon.analysis.profile import CONSULTING, AgentProfile, Profiles, derive, instructions_of, unknown_agents
from tracefix.daemon.core.settings import AnalysisSettings, CapabilitySettings
from tracefix.daemon.core.json_types import json_type
from tracefix.daemon.store.labels import Thresholds
from tracefix.daemon.store.store import AnalysisStore, Store

log = logging.getLogger(__name__)

PROFILE_RUNS = 200  # an agent's newest successful runs its profile is observed on
INSTRUCTION_RUNS = 20  # its newest runs whose instructions are read

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_start_ns(window: str, now_ns: int | None = None) -> int | None:
    """'all' -> None; '24h', '7d', '90m', '30s' -> the window's start in unix nanoseconds."""
    if window == "all":
        return None
    match = _DURATION.match(window.strip())
    if not match:
        raise ValueError(f"window {window!r} is neither 'all' nor a duration like '24h', '7d', '90m'")
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - int(float(match.group(1)) * _SECONDS[match.group(2)] * 1e9)


def infer_schemas(observed: list[tuple[str, str]]) -> dict[str, ToolSpec]:
    """JSON schemas inferred from observed calls: keys seen in (almost) every call are required."""
    by_tool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for tool, arguments in observed:
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            by_tool[tool].append(parsed)
    specs = {}
    for tool, calls in by_tool.items():
        types: dict[str, set[str]] = defaultdict(set)
        present: dict[str, int] = defaultdict(int)
        for call in calls:
            for key, value in call.items():
                types[key].add(json_type(value))
                present[key] += 1
        properties = {}
        for key, seen in types.items():
            if seen == {"integer", "number"}:
                seen = {"number"}
            properties[key] = {"type": sorted(seen)[0]} if len(seen) == 1 else {}
        required = sorted(key for key, count in present.items() if count >= 0.95 * len(calls))
        schema = {"type": "object", "properties": properties, "required": required}
        specs[tool] = ToolSpec(tool, "", schema)
    return specs


@dataclass(slots=True)
class AnalysisPass:
    labeled: int
    pass_id: int
    seconds: float


class Analyzer:
    """Runs labeling and statistics passes for every registered capability."""

    def __init__(
        self, store: Store, registry: CapabilityRegistry, settings: AnalysisSettings, capabilities: CapabilitySettings | None = None
    ) -> None:
        self.store = AnalysisStore(store)
        self.registry = registry
        self.settings = settings
        self.capabilities = capabilities or CapabilitySettings()
        # What each agent's policy requires before a change; the labelers consult it (daemon.analysis.profile).
        self._observer = PreconditionVerification(self.capabilities)
        self.profiles = Profiles(
            self._derive_profile, self.store.agent_profiles, self._save_profile, self.store.successes_of, settings.profile_refresh_s
        )  # fmt: skip
        for window in settings.windows + [settings.selection_window]:
            window_start_ns(window)  # invalid windows fail at start, not in the middle of a pass
        # Every trajectory assembled up to this batch has current labels (-1: unknown, scan all).
        # A daemon start scans all once, so a changed labeler version relabels old trajectories.
        self.labeled_through = -1
        self._generation = 0  # bumped by forget(), so a pass running meanwhile cannot skip the relabel

    def forget(self, capability: str | None = None) -> int:
        """Drop labels (all, or one capability's) so the next pass labels again."""
        self._generation += 1
        removed = self.store.forget_labels(capability)
        self.labeled_through = -1
        return removed

    def current(self) -> list[tuple[str, str, str]]:
        return [(c.name, c.labeler.name, c.labeler.version) for c in self.registry]

    def in_pass(self) -> list[Capability]:
        """The capabilities a pass labels: all but those whose labeler is judged beside it (``deferred``)."""
        return [capability for capability in self.registry if not getattr(capability.labeler, "deferred", False)]

    def trajectories(self, trajectory_ids: list[str], batches: dict[str, int] | None = None, profiled: bool = True) -> list[Trajectory]:
        """The labelers' view of these trajectories, with tool definitions resolved per DESIGN rules
        and (`profiled`) their agents' profiles, derived again where due.

        `batches`, when given, receives each trajectory's assembly batch (labels record it).
        """
        # Evaluation events are read only when a capability is labeled by them ([[capabilities.evaluations]]).
        mapped = any(isinstance(capability.labeler, EvaluationLabeler) for capability in self.registry)
        data = self.store.labeling_inputs(trajectory_ids, evaluations=mapped)
        if batches is not None:
            batches.update((row["trajectory_id"], row["updated_batch"]) for row in data["trajectories"])
        turns: dict[str, list[Turn]] = defaultdict(list)
        for trajectory_id, position, role, content, tool_calls, tool_call_id, span_id in data["messages"]:
            turns[trajectory_id].append(Turn(position, role, content, orjson.loads(tool_calls), tool_call_id, span_id))
        calls: dict[str, list[ToolCall]] = defaultdict(list)
        for trajectory_id, *row in data["tool_calls"]:
            calls[trajectory_id].append(ToolCall(*row))
        own: dict[str, dict[str, ToolSpec]] = defaultdict(dict)
        for trajectory_id, name, description, parameters in data["trajectory_tools"]:
            own[trajectory_id][name] = ToolSpec(name, description, orjson.loads(parameters) if parameters else None)
        agent: dict[str, dict[str, ToolSpec]] = defaultdict(dict)
        for service, name, description, parameters in data["agent_tools"]:
            agent[service][name] = ToolSpec(name, description, orjson.loads(parameters) if parameters else None)
        evaluations: dict[str, list[Evaluation]] = defaultdict(list)
        for trajectory_id, span_id, end_time, events in data["evaluation_spans"]:
            evaluations[trajectory_id].extend(span_evaluations(span_id, end_time, events))
        for trajectory_id, span_id, time_unix_nano, attributes, body in data["evaluation_logs"]:
            evaluation = log_evaluation(span_id, time_unix_nano, attributes, body)
            if evaluation is not None:
                evaluations[trajectory_id].append(evaluation)
        inferred: dict[str, dict[str, ToolSpec]] = {}
        result = []
        for row in data["trajectories"]:
            trajectory_id, service = row["trajectory_id"], row["service_name"]
            tools, source = own.get(trajectory_id), "trajectory"
            if not tools:
                tools, source = agent.get(service), "agent"
            if not tools and calls.get(trajectory_id):
                if service not in inferred:
                    inferred[service] = infer_schemas(self.store.observed_arguments(service))
                tools, source = inferred[service], "inferred"
            found = sorted(evaluations.get(trajectory_id, []), key=lambda evaluation: evaluation.time_unix_nano)
            result.append(
                Trajectory(
                    trajectory_id, service, row["outcome"], turns.get(trajectory_id, []),
                    calls.get(trajectory_id, []), tools or {}, source, found,
                )  # fmt: skip
            )
        if profiled and result:
            changed = self.profiles.refresh(sorted({trajectory.service_name for trajectory in result}))
            if changed:  # their other runs were labeled under the old profile: the next pass labels them again
                self.store.forget_agent_labels(changed, CONSULTING)
                self._generation += 1
                self.labeled_through = -1
            for trajectory in result:
                trajectory.profile = self.profiles.get(trajectory.service_name)
        return result

    def _derive_profile(self, agent: str) -> AgentProfile:
        """The agent's profile from its newest runs: the instructions they carry most often, and what
        its successful runs that changed state did before the change."""
        successes = self.store.recent_trajectory_ids(agent, "success", PROFILE_RUNS)
        ids = list(dict.fromkeys([*successes, *self.store.recent_trajectory_ids(agent, None, INSTRUCTION_RUNS)]))
        runs = self.trajectories(ids, profiled=False)
        instructions = instructions_of([turn.content for run in runs for turn in run.turns[:2] if turn.role == "system"])
        observed = [self._observer.observe(run) for run in runs if run.outcome == "success"]
        known = {name for run in runs for name in run.tools} | {call.name for run in runs for call in run.tool_calls}
        return derive(agent, instructions, [item for item in observed if item is not None], self.capabilities.agent(agent), known)

    def _save_profile(self, profile: AgentProfile) -> None:
        self.store.save_agent_profile(profile.agent, profile.fingerprint, profile.to_dict())

    def refused_overrides(self) -> list[str]:
        """The [[capabilities.agents]] overrides not applied: naming no agent that sent runs, or a tool it never had."""
        refused = unknown_agents(self.capabilities.agents, self.store.services())
        return refused + [reason for profile in self.profiles.profiles.values() for reason in profile.refused]

    def label_pass(self) -> int:
        """Label trajectories that lack a current label of a capability labeled in the pass; returns how many."""
        capabilities = self.in_pass()
        current = [(c.name, c.labeler.name, c.labeler.version) for c in capabilities]
        if not current:
            return 0
        generation = self._generation
        through = self.store.last_assembled_batch()  # read first: anything later is left for the next pass
        ids = self.store.trajectories_to_label(current, self.settings.label_batch, self.labeled_through)
        if not ids:
            if generation == self._generation:
                self.labeled_through = through
            return 0
        self._relabel(ids, capabilities)
        if len(ids) < self.settings.label_batch and generation == self._generation:
            self.labeled_through = through
        return len(ids)

    def retry_errors(self) -> int:
        """Label again the (trajectory, capability) pairs whose labeler gave no usable verdict at least
        `error_retry_s` ago, for the capabilities labeled in the pass (LLMJudging retries its own).
        Returns how many trajectories were tried; a pair that fails again waits as long again."""
        if not self.settings.error_retry_s:
            return 0
        before = datetime.now(timezone.utc) - timedelta(seconds=self.settings.error_retry_s)
        tried = 0
        for capability in self.in_pass():
            labeler = capability.labeler
            ids = self.store.errored(capability.name, labeler.name, labeler.version, before, self.settings.label_batch)
            if not ids:
                continue
            self._relabel(ids, [capability])
            tried += len(ids)
        return tried

    def _relabel(self, ids: list[str], capabilities: list[Capability]) -> None:
        """Label these trajectories for these capabilities and swap the labels in, in one transaction."""
        now = datetime.now(timezone.utc)
        batches: dict[str, int] = {}
        rows = []
        for trajectory in self.trajectories(ids, batches):
            for capability in capabilities:
                for run, judgement in enumerate(self._judge(capability.labeler, trajectory)):
                    rows.append(
                        (
                            trajectory.trajectory_id, capability.name, capability.labeler.name,
                            capability.labeler.version, run, judgement.label.value, judgement.reason,
                            list(judgement.span_ids), judgement.confidence, batches[trajectory.trajectory_id], now,
                        )  # fmt: skip
                    )
        self.store.replace_labels(ids, [(c.name, c.labeler.name) for c in capabilities], rows)
        metrics.LABELS.inc(len(rows))

    @staticmethod
    def _judge(labeler: Any, trajectory: Trajectory) -> list[Judgement]:
        try:
            if hasattr(labeler, "label_runs"):
                return labeler.label_runs(trajectory)
            return [labeler.label(trajectory)]
        except Exception as error:  # one broken labeler must not stop the others
            log.exception("labeler %s failed on %s", labeler.name, trajectory.trajectory_id)
            metrics.LABEL_ERRORS.labels(labeler.name).inc()
            return [Judgement(Label.ERROR, f"labeler error: {error}"[:200], (), 0.0)]

    def stats_pass(self) -> int:
        return self.store.compute_stats(self.current(), self._windows(), self._thresholds())

    def agent_stats(self, agent: str) -> list[dict[str, Any]]:
        """This pass's statistics over one agent's trajectories only (not stored, nothing selected by them)."""
        return self.store.scoped_stats(agent, self.current(), self._windows(), self._thresholds())

    def _windows(self) -> list[tuple[str, int | None]]:
        now_ns = time.time_ns()
        return [(window, window_start_ns(window, now_ns)) for window in dict.fromkeys([*self.settings.windows, self.settings.selection_window])]

    def _thresholds(self) -> Thresholds:
        settings = self.settings
        return Thresholds(settings.min_delta, settings.min_coverage, settings.min_failures, settings.consistency)

    def run_pass(self) -> AnalysisPass:
        """Label until caught up (bounded), then recompute the statistics of every capability."""
        started = time.perf_counter()
        labeled = 0
        for _ in range(100):
            done = self.label_pass()
            labeled += done
            if done < self.settings.label_batch:
                break
        labeled += self.retry_errors()
        pass_id = self.stats_pass()
        for row in self.store.stats(pass_id):
            if row["window_name"] != self.settings.selection_window:
                continue
            labels = (row["capability"],)
            metrics.CAPABILITY_ER_MINUS.labels(*labels).set(row["er_minus"] or 0)
            metrics.CAPABILITY_ER_PLUS.labels(*labels).set(row["er_plus"] or 0)
            metrics.CAPABILITY_DELTA.labels(*labels).set(row["delta"] or 0)
            metrics.CAPABILITY_COVERAGE.labels(*labels).set(row["coverage"] or 0)
        seconds = time.perf_counter() - started
        metrics.ANALYSIS_SECONDS.observe(seconds)
        return AnalysisPass(labeled, pass_id, seconds)
