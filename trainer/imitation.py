"""Imitation of an agent's successful conversations, whole: the generalist's recipe.

Where an agent fails often and successful runs of its tools exist, the daemon's generalist stage
(`daemon/pipeline/generalist.py`) sends them here (`run_generalist`, run by `trainer.train_job`): one
LoRA adapter learns them with the warm start's settings (batch, learning rate, LoRA shape; its own
epochs), is scored against the base on held-out successful conversations by its next actions,
teacher-forced (`trainer.next_action`), and is offered like any adapter when it does better.
`bench/imitation_baseline.py` trains the same at the targeted adapters' budget, as the equal-budget
check of what targeting adds. Conversations are laid out as ``trainer.conversations`` lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.daemon.core.states import TrainingVerdict
from tracefix.trainer.adapters import base_model_hash, save_adapter
from tracefix.trainer.conversations import conversation_sequence, read_conversations
from tracefix.trainer.environment import Message
from tracefix.trainer.recipes import Progress, load_policy, supervised

RECIPE = "imitation"


def train_imitation(
    conversations: Sequence[Sequence[Message]],
    model_dir: Path,
    directory: Path,
    config: TrainingSettings,
    capability: str,
    base_model: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train on `conversations` (each once per epoch) and save the adapter as `capability` v1 under
    `directory/adapter`; returns its manifest."""
    if not conversations:
        raise ValueError("no successful conversations to imitate")
    model, tokenizer = load_policy(model_dir, config)
    sequences = [conversation_sequence(tokenizer, messages, config.max_length) for messages in conversations]
    report = supervised(model, tokenizer, sequences, config, directory / RECIPE, progress)
    report["policy_tokens"] = sum(sum(mask) for _, mask in sequences)
    manifest = {
        "capability": capability,
        "version": 1,
        "environment": None,
        "base_model": base_model,
        "base_model_hash": base_model_hash(model_dir),
        "recipe": RECIPE,
        "training": config.model_dump(mode="json"),
        "metrics": {"imitation": report},
        "created_at": datetime.now(timezone.utc).isoformat(),
    }
    return save_adapter(model, directory / "adapter", manifest)


def run_generalist(request: dict[str, Any], run_dir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """A generalist's train job: learn from the request's conversations by imitation, score its next
    actions against the base's on the held-out ones, teacher-forced (`trainer.next_action`), and save
    it when it beats the base by more than the request's margin. Returns the result record the daemon
    reads (as `trainer.train_job.run_training` does for a targeted run)."""
    import time

    from tracefix.trainer import model as models
    from tracefix.trainer.jobs import RequestError
    from tracefix.trainer.next_action import compare_next_actions
    from tracefix.trainer.rollouts import Sampling
    from pydantic import ValidationError

    started = time.monotonic()
    train, held_out = read_conversations(request["conversations"])
    if not train or not held_out:
        raise RequestError(f"{request['conversations']} needs conversations to learn from and held-out ones to score on")
    try:
        config = TrainingSettings.model_validate(request["training"])
    except ValidationError as error:
        raise RequestError(f"bad [training] settings: {error}") from error
    model_settings = request["model"]
    model_dir = models.resolve(model_settings["name"], Path(model_settings["cache_dir"]))
    model, tokenizer = load_policy(model_dir, config)
    sequences = [conversation_sequence(tokenizer, messages, config.max_length) for messages in train]
    report = supervised(model, tokenizer, sequences, config, run_dir / RECIPE, progress)
    report["policy_tokens"] = sum(sum(mask) for _, mask in sequences)
    if progress:
        progress({"phase": "evaluation", "part": f"next actions on {len(held_out)} held-out conversations", "elapsed_s": 0.0})
    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    scored = compare_next_actions(model, tokenizer, held_out, sampling)
    margin = float(request.get("margin", 0.0))
    base_rate, adapter_rate = scored["base"]["matched"]["rate"], scored["adapter"]["matched"]["rate"]
    gain = adapter_rate - base_rate
    offered = gain > margin
    reasons = [] if offered else [
        f"next-action accuracy {adapter_rate:.2f} does not beat the base's {base_rate:.2f} by more than {margin:.2f}"
    ]
    evaluation = {"kind": "next_action", "verdict": TrainingVerdict.CANDIDATE if offered else TrainingVerdict.REJECTED_BY_EVAL, "reasons": reasons,
                  "conversations": len(held_out), "learned_from": len(train), "margin": margin, **scored}  # fmt: skip
    result: dict[str, Any] = {
        "run_id": request["run_id"],
        "capability": request["capability"],
        "verdict": evaluation["verdict"],
        "evaluation": evaluation,
        "training": {"recipe": RECIPE, "imitation": report},
        "steps": report.get("steps") if isinstance(report.get("steps"), int) else None,
        "seconds": round(time.monotonic() - started, 1),
        "adapter": None,
    }
    if offered:
        directory = run_dir / "adapter"
        manifest = {
            "capability": request["capability"],
            "version": request["version"],
            "environment": None,
            "agent": request["agent"],
            "base_model": model_settings["name"],
            "base_model_hash": base_model_hash(model_dir),
            "recipe": RECIPE,
            "training": config.model_dump(mode="json"),
            "metrics": {"evaluation": evaluation, "imitation": report},
            "created_at": datetime.now(timezone.utc).isoformat(),
        }
        save_adapter(model, directory, manifest)
        result["adapter"] = str(directory)
    return result
