"""A training run's progress records: read from its directory, and worded the same by the CLI, the API,
the demo and the dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def grpo_steps(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GRPO step records of a run's progress (the warm start's updates and the evaluation's
    parts are recorded too, with their own ``phase``)."""
    return [record for record in progress if record.get("phase", "grpo") == "grpo"]


def progress_text(record: dict[str, Any], steps: int | None = None) -> str:
    """Where a run stands, from its latest progress record: the warm start's update and loss, the
    GRPO step and reward, or the part of the held-out evaluation being scored."""
    elapsed = f"{record.get('elapsed_s') or 0:.0f} s"
    phase = record.get("phase", "grpo")
    if phase == "warm_start":
        return f"warm start, update {record.get('step', 0)}/{record.get('max_steps', '?')}, loss {record.get('loss', 0):.3f}, {elapsed}"
    if phase == "evaluation":
        return f"evaluating ({record.get('part', '')}), {elapsed} into the evaluation"
    reward = record.get("mean_reward")
    reward_text = "n/a" if reward is None else f"{reward:.2f}"
    return f"GRPO step {record.get('step', 0)}/{record.get('max_steps') or steps or '?'}, reward {reward_text}, {elapsed}"


def read_progress(directory: str) -> list[dict[str, Any]]:
    """A run's step records (``progress.jsonl``, appended by the training subprocess); a line being
    written right now is skipped."""
    path = Path(directory) / "progress.jsonl"
    records = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return records
