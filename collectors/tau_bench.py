"""τ-bench's historical trajectories (`historical_trajectories/*.json`) as agent runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracefix.collectors.agent_runs import AgentRun, RunFormatError, load_json


def read_tau_bench(path: Path, tools: list[dict[str, Any]] | None = None) -> Iterator[AgentRun]:
    """The runs of a τ-bench historical-trajectory file: a list of {task_id, trial, reward, traj}.

    Ground truth under `info.task` (expected writes, the user's hidden goal) stays out: a deployed
    agent's traces never carry it.
    """
    runs = load_json(path, "a τ-bench trajectory list")
    if not isinstance(runs, list):
        raise RunFormatError(f"{path}: a τ-bench file is a JSON list of runs, found {type(runs).__name__}")
    for number, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("traj"), list):
            raise RunFormatError(f"{path}: run {number} has no 'traj' list of chat messages")
        task_id, trial = run.get("task_id", number), run.get("trial", 0)
        messages = []
        for message in run["traj"]:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RunFormatError(f"{path}: run {number} holds a message without a role")
            message = dict(message)
            content = message.get("content")
            # τ-bench's environment turns a tool's exception into this text.
            if message["role"] == "tool" and isinstance(content, str) and content.startswith("Error:"):
                message["error"] = content.removeprefix("Error:").strip() or content
            messages.append(message)
        reward = run.get("reward")
        yield AgentRun(
            run_id=f"{path.stem}/task-{task_id}/trial-{trial}",
            messages=messages,
            tools=tools or [],
            reward=float(reward) if isinstance(reward, (int, float)) else None,
            evaluation_name="tau-bench",
            attributes={"tau_bench.task_id": str(task_id), "tau_bench.trial": int(trial) if isinstance(trial, int) else 0},
        )
