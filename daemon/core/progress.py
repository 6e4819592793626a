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
    GRPO step and reward, a checkpoint's validation score (keep_best), or the part of the held-out
    evaluation being scored."""
    elapsed = f"{record.get('elapsed_s') or 0:.0f} s"
    phase = record.get("phase", "grpo")
    if phase == "warm_start":
        return f"warm start, update {record.get('step', 0)}/{record.get('max_steps', '?')}, loss {record.get('loss', 0):.3f}, {elapsed}"
    if phase == "evaluation":
        return f"evaluating ({record.get('part', '')}), {elapsed} into the evaluation"
    if phase == "checkpoint":
        return (
            f"GRPO checkpoint after step {record.get('step', 0)}: validation success {record.get('success_rate', 0):.2f}"
            f" (best so far: step {record.get('best_step')}), {elapsed}"
        )
    if phase == "recipe":
        validation = record.get("validation")
        if validation is None:
            return f"trying recipe {record.get('recipe')}, {elapsed}"
        return f"recipe {record.get('recipe')}: validation success {validation['success_rate']:.2f}, {elapsed}"
    reward = record.get("mean_reward")
    reward_text = "n/a" if reward is None else f"{reward:.2f}"
    clip = record.get("clip_fraction_max")
    clip_text = "" if clip is None else f", clipped {clip:.0%}, KL {record.get('kl', 0):.4f}"
    return f"GRPO step {record.get('step', 0)}/{record.get('max_steps') or steps or '?'}, reward {reward_text}{clip_text}, {elapsed}"


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


def grpo_added_text(added: dict[str, Any] | None) -> str | None:
    """What GRPO added to the warm start on the held-out seeds (``evaluation.grpo_added``), in words;
    None when the run had no warm start followed by GRPO."""
    if not added:
        return None
    low, high = added["interval"]
    return (
        f"GRPO added {added['difference']:+.2f} [{low:+.2f}, {high:+.2f}] to the warm start's held-out success "
        f"({added['before']:.2f} → {added['after']:.2f} on the same {added['seeds']} seeds: {added['after_only']} won, "
        f"{added['before_only']} lost; McNemar p {added['mcnemar_p']:.2f})"
    )


def reference_name(evaluation: dict[str, Any]) -> str:
    """What an adapter's held-out success was measured against: the bare base, or (for a targeted
    adapter trained from its agent's generalist) that generalist."""
    return f"the generalist {evaluation['reference']}" if evaluation.get("reference") else "base"


def retention_text(evaluation: dict[str, Any]) -> str | None:
    """Whether a targeted adapter trained from its agent's generalist kept the generalist's next
    actions on the conversations the generalist was scored on (``evaluation.retention``), in words;
    None for an adapter that started fresh."""
    kept = evaluation.get("retention")
    if not kept:
        return None
    generalist, adapter, difference = kept["generalist"]["matched"], kept["adapter"]["matched"], kept["difference"]
    low, high = difference["interval"]
    verdict = "forgets them" if kept["forgets"] else "keeps them"
    return (
        f"next actions on the generalist's held-out conversations: generalist {generalist['rate']:.2f} → adapter {adapter['rate']:.2f} "
        f"of {kept['turns']} turns ({difference['rate']:+.2f} [{low:+.2f}, {high:+.2f}], McNemar p {difference['mcnemar_p']:.2f}): "
        f"{verdict} (margin {kept['margin']:.2f})"
    )


def checkpoints_text(trial: dict[str, Any]) -> str | None:
    """How ``keep_best`` scored a recipe's GRPO checkpoints on the validation seeds and which it kept,
    in words; None when the trial scored none."""
    scores = trial.get("checkpoints")
    if not scores:
        return None
    listed = ", ".join(f"{item['step']}: {item['success_rate']:.2f}" for item in scores)
    return f"{trial['recipe']}: validation success after GRPO step {listed} ({scores[0]['seeds']} seeds); kept step {trial['kept_step']}"
