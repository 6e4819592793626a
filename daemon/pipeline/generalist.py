"""The generalist stage: which agent gets a generalist next, and the data it learns from.

An agent (a service) wants a generalist when it fails often — at least `[generalist]
min_failure_rate` of its last `min_trajectories` runs with an outcome — and none of its generalist's
versions is training, waiting for approval, in canary or live, and it is not cooling down after a
rejection or rollback. It learns from successful trajectories with its tools (its own, or another
service's offered the same tools: a stronger model serving part of the traffic, people, an earlier
version), one per distinct first user turn, newest first: `held_out` of them are kept back for its
evaluation, up to `max_conversations` are learned from. With fewer than `min_successes` it waits,
and `waiting` says how many it has and needs. The train job (`trainer.imitation`) does the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracefix.daemon.core import generalist
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.states import AdapterState, CapabilityState
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.store.store import AnalysisStore
from tracefix.daemon.store.traces import TrajectoryStore

log = logging.getLogger(__name__)

# A stored trajectory's messages and tools -> the conversation as the router renders it for the
# model (`router.protocol.stored_prompt_messages`, injected by the app: the pipeline does not import
# the router). ValueError for a conversation the router would not take.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[dict[str, Any]]]
CONVERSATIONS = "conversations.json"  # in the run directory: {"train": [...], "held_out": [...]}


class GeneralistStage:
    def __init__(self, runs: RunStore, analysis: AnalysisStore, settings: Settings, render: Render | None) -> None:
        self.runs = runs
        self.analysis = analysis
        self.settings = settings
        self.render = render
        self.trajectories = TrajectoryStore(runs.store)
        self.waiting: dict[str, str] = {}  # agent -> why its generalist does not train now
        self.blocking: set[str] = set()  # agents whose targeted training waits for their generalist

    def next_run(self, directory_root: Path, config: dict[str, Any]) -> dict[str, Any] | None:
        """Queue a generalist run for the first agent that wants one and has the successes for it."""
        settings = self.settings.generalist
        if not settings.enabled or self.render is None:
            self.waiting, self.blocking = {}, set()
            return None
        waiting: dict[str, str] = {}
        blocking: set[str] = set()
        run = None
        for agent in self.runs.agent_names():
            why, blocks = self._why_not(agent)
            if why is None and run is None:
                run, why, blocks = self._queue(agent, directory_root, config)
            if why:
                waiting[agent] = why
            if blocks:
                blocking.add(agent)
        for agent, why in waiting.items():
            if self.waiting.get(agent) != why:
                log.info("generalist of %s: %s", agent, why)
        self.waiting, self.blocking = waiting, blocking
        return run

    def holds_targeted(self, service: str | None) -> bool:
        """Whether targeted training for `service`'s agent waits for its generalist (any agent's, for
        an environment pooled over all of them): one is on its way, or wanted with successes to
        learn from still coming in. Where the agent has no successful runs at all, nothing waits."""
        return bool(self.blocking) if service is None else service in self.blocking

    def _why_not(self, agent: str) -> tuple[str | None, bool]:
        """Why the agent's generalist does not train now (None: it may), and whether its targeted
        training waits for it."""
        settings = self.settings.generalist
        if not self.settings.capabilities.trains(agent):
            return "not trained for: [[capabilities.agents]] train = false", False
        failures, total = self.runs.agent_outcomes(agent, settings.min_trajectories)
        if total < settings.min_trajectories:
            return f"waits for outcomes: {total} of {settings.min_trajectories} runs have one", False
        if failures / total < settings.min_failure_rate:
            return f"not wanted: failure rate {failures / total:.2f} over its last {total} runs is below {settings.min_failure_rate:.2f}", False
        capability = generalist.capability(agent)
        busy = self.runs.generalist_busy(capability)
        if busy is not None:
            return busy, not busy.endswith(f" is {AdapterState.LIVE}")
        state = self.analysis.states().get(capability) or {}
        until = state.get("cooldown_until")
        if state.get("state") == CapabilityState.COOLDOWN and until is not None:
            until = until if until.tzinfo else until.replace(tzinfo=timezone.utc)
            if until > datetime.now(timezone.utc):
                return f"cooling down until {until.isoformat(timespec='minutes')}: {state.get('reason')}", False
        return None, False

    def _queue(self, agent: str, directory_root: Path, config: dict[str, Any]) -> tuple[dict[str, Any] | None, str, bool]:
        """Render the agent's successes; queue the run when enough of them are usable. Returns the
        run, else why not; and whether targeted training waits (a run, or successes to wait for)."""
        settings = self.settings.generalist
        wanted = settings.max_conversations + settings.held_out
        ids = self.runs.successes_with_tools_of(agent, settings.exclude_conversations, wanted)
        usable: list[tuple[str, list[dict[str, Any]]]] = []
        for trajectory_id in ids:
            record = self.trajectories.trajectory(trajectory_id)
            try:
                messages = self.render(record["messages"], record["tools"]) if record else []  # type: ignore[misc]
            except ValueError:
                continue
            if messages and any(message["role"] == "assistant" for message in messages):
                usable.append((trajectory_id, messages))
        if len(usable) < max(settings.min_successes, settings.held_out + 1):
            needed = max(settings.min_successes, settings.held_out + 1)
            return None, f"waits for successes: {len(usable)} usable successful trajectories with its tools, {needed} needed", bool(usable)
        # Newest first: the newest are held out, so the evaluation scores what the agent does now.
        held_out, train = usable[: settings.held_out], usable[settings.held_out :]
        capability = generalist.capability(agent)
        run = self.runs.create_generalist_run(
            capability, agent, config, str(directory_root), [item for item, _ in train], [item for item, _ in held_out]
        )
        directory = Path(run["directory"])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONVERSATIONS).write_text(
            json.dumps({"train": [messages for _, messages in train], "held_out": [messages for _, messages in held_out]})
        )
        log.info("generalist run %d for %s: %d conversations to learn from, %d held out", run["run_id"], agent, len(train), len(held_out))
        return run, "", True
