"""The training recipes and the choice between them, on one capability's environment.

- ``sft``: a supervised warm start on the environment's verified solutions (TRL's ``SFTTrainer``,
  policy tokens only, each batch's common opening run once: ``trainer.shared_prefix``);
- ``sft+grpo``: that warm start, then GRPO from it (``trainer.grpo``), ``warm_guided_share`` of each
  group started from a forced prefix of the solution (0 by default: every rollout the policy's own);
- ``guided_grpo``: GRPO from the base in which ``guided_share`` of each group starts from a forced
  prefix of the solution (a weak base earns reward this way where plain GRPO earns none);
- ``grpo``: plain GRPO from the base, the paper's "GRPO on target" baseline.

With ``keep_best``, a recipe's GRPO ends on whichever of its starting weights and checkpoints
scored best on the validation seeds (``trainer.grpo``); the trial lists those scores.

``recipe = "auto"`` tries those the configuration allows, cheapest first, scores each on the
validation seeds (disjoint from the held-out and the training seeds), and keeps the best; a recipe
is skipped when the time left in the run's budget (half of ``timeout_s``; evaluation needs the
rest) is less than the longest one tried so far took. ``sft+grpo`` continues from the ``sft``
trial's weights instead of warm-starting again. Finished trials are kept on disk
(``trials/<recipe>``), so a killed run resumes with the next one (and GRPO within a trial from its
checkpoints).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, TrainerCallback

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.trainer import precision
from tracefix.trainer.conversations import conversation_sequence
from tracefix.trainer.environment import Environment, Message
from tracefix.trainer.grpo import grpo, latest_checkpoint, lora_state, validation_rank
from tracefix.trainer.model import prepare_products, training_device
from tracefix.trainer.rollouts import Sampling, demonstration

Progress = Callable[[dict[str, Any]], None]
BUDGET_SHARE = 0.5  # of timeout_s, for the recipes; the held-out evaluation needs the rest


@dataclass(slots=True)
class Trained:
    """A trained policy and what made it."""

    model: Any  # the PEFT model, with the chosen recipe's weights
    tokenizer: Any
    report: dict[str, Any]  # recipe, tried recipes with their validation scores, warm start, GRPO steps
    warm_started: dict[str, Any] | None = field(default=None)  # LoRA weights after the warm start, when GRPO followed it
    started_from: dict[str, Any] | None = field(default=None)  # the LoRA weights it started from, when not fresh (the generalist's)


def lora_config(config: TrainingSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets), task_type="CAUSAL_LM",
    )  # fmt: skip


def load_policy(model_dir: Path, config: TrainingSettings, starts_from: Path | None = None) -> tuple[Any, Any]:
    """The base model with a fresh LoRA adapter on ``config.device`` — or, with `starts_from`, the
    saved adapter there, trainable (a targeted adapter continues the agent's generalist, so it
    carries what the generalist learned: one LoRA serves both) — and its tokenizer (left padding for
    generation). ValueError when that adapter's LoRA shape is not ``config``'s."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracefix.trainer.merged_lora import merge_lora_products

    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    device = training_device(config.device)
    dtype = precision.torch_dtype(precision.resolve(config.dtype, device))
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    prepare_products(base)
    if starts_from is None:
        policy = get_peft_model(base, lora_config(config))
        merge_lora_products(policy)
        return policy, tokenizer
    from peft import PeftConfig, PeftModel

    saved = PeftConfig.from_pretrained(str(starts_from))
    shape = (saved.r, saved.lora_alpha, sorted(saved.target_modules or []))  # type: ignore[attr-defined]
    wanted = (config.lora_r, config.lora_alpha, sorted(config.lora_targets))
    if shape != wanted:
        raise ValueError(f"the adapter at {starts_from} has LoRA r, alpha, targets {shape}; this run trains {wanted}")
    policy = PeftModel.from_pretrained(base, str(starts_from), is_trainable=True).to(device)
    merge_lora_products(policy)
    return policy, tokenizer


@dataclass(frozen=True, slots=True)
class Rehearsal:
    """Conversations a targeted run rehearses in its warm start: those its agent's generalist learned
    from, at ``share`` of the warm start's sequences. Trained on its capability's demonstrations
    alone, an adapter that starts from the generalist learns that one step and forgets the
    conversation's others (docs/performance.md, Run 27); rehearsed, it keeps them."""

    conversations: tuple[tuple[Message, ...], ...]
    share: float

    def count(self, demonstrations: int) -> int:
        """How many rehearsed conversations go beside `demonstrations` (``share`` of the whole)."""
        if not self.conversations or self.share <= 0:
            return 0
        return round(demonstrations * self.share / (1 - self.share))


def warm_start(
    model: Any, tokenizer: Any, environment: Environment, config: TrainingSettings, directory: Path, progress: Progress | None = None,
    rehearsal: Rehearsal | None = None,
) -> dict[str, Any]:
    """Supervised pass on ground-truth demonstrations (seeds disjoint from evaluation's), with
    `rehearsal`'s conversations (taken in turn) among them, loss on the policy's tokens only; each
    update is reported to `progress` (phase ``warm_start``)."""
    sequences = [demonstration(tokenizer, environment.instance(seed), config.max_length).sequence() for seed in config.warm_start_range]
    rehearsed = rehearsal.count(len(sequences)) if rehearsal else 0
    if rehearsal and rehearsed:
        cycle = rehearsal.conversations
        sequences += [conversation_sequence(tokenizer, cycle[index % len(cycle)], config.max_length) for index in range(rehearsed)]
    report = supervised(model, tokenizer, sequences, config, directory / "warm_start", progress, group_openings=rehearsed > 0)
    return {**report, "rehearsed": rehearsed}


def supervised(
    model: Any, tokenizer: Any, sequences: list[tuple[list[int], list[int]]], config: TrainingSettings, output_dir: Path,
    progress: Progress | None = None, group_openings: bool = False,
) -> dict[str, Any]:
    """`config.warm_start_epochs` supervised passes over (token ids, policy mask) sequences with the
    warm start's batch and learning rate, the loss on the masked-in tokens only; with
    `group_openings`, batches keep sequences of one opening together (``OpeningBatches``)."""
    from datasets import Dataset
    from trl import SFTConfig

    from tracefix.trainer.shared_prefix import SharedPrefixSFTTrainer

    rows = [{"input_ids": ids, "assistant_masks": policy} for ids, policy in sequences]
    arguments = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=config.warm_start_epochs,
        # `warm_start_batch` demonstrations per update, in one batch whose common opening (the agent's
        # instructions and tool definitions, most of every prompt) is run once: trainer/shared_prefix.py.
        per_device_train_batch_size=config.warm_start_batch,
        gradient_accumulation_steps=1,
        learning_rate=config.warm_start_learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=next(model.parameters()).device.type == "cpu",
        # No autocast: a bfloat16 base runs its products in bfloat16 as loaded, the LoRA weights in float32
        # (trainer.precision), the same arithmetic as GRPO's own loop.
        bf16=False,
        seed=config.seed,
        max_length=config.max_length,
        dataloader_num_workers=0,
        disable_tqdm=True,
        activation_checkpointing=False,  # (TRL defaults it on; its old name, gradient_checkpointing, is deprecated)
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = SharedPrefixSFTTrainer(
        model=model, args=arguments, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        opening_gradient=config.warm_start_opening_gradient, group_openings=group_openings,
    )
    trainer.remove_callback(PrinterCallback)  # progress is reported by the caller, not printed
    if progress:
        trainer.add_callback(_WarmStartProgress(progress, time.monotonic()))
    result = trainer.train()
    return {
        "examples": len(rows), "epochs": config.warm_start_epochs, "batch": config.warm_start_batch,
        "updates": result.global_step, "loss": round(result.training_loss, 4),
    }  # fmt: skip


class _WarmStartProgress(TrainerCallback):
    """One record per warm-start update: its loss, how far the pass has come, and the time so far."""

    def __init__(self, progress: Progress, started: float) -> None:
        super().__init__()
        self.progress = progress
        self.started = started

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if logs and "loss" in logs:
            self.progress({
                "phase": "warm_start", "step": state.global_step, "max_steps": state.max_steps,
                "loss": round(float(logs["loss"]), 6), "elapsed_s": round(time.monotonic() - self.started, 1),
            })  # fmt: skip


def validation_score(model: Any, tokenizer: Any, environment: Environment, config: TrainingSettings) -> dict[str, Any]:
    from dataclasses import asdict

    from tracefix.trainer.evaluation import score

    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    found = score(model, tokenizer, environment, config.validation_range, sampling)
    return asdict(found)


def train(
    environment: Environment, model_dir: Path, directory: Path, config: TrainingSettings, progress: Progress | None = None,
    starts_from: Path | None = None,
    rehearsal: Rehearsal | None = None,
) -> Trained:
    """Train with the configured recipe (or choose one, for 'auto'), from a fresh adapter or the one at
    `starts_from` (whose conversations `rehearsal` brings to the warm start); see the module."""
    model, tokenizer = load_policy(model_dir, config, starts_from)
    fresh = lora_state(model)
    started = time.monotonic()
    auto = config.recipe == "auto"
    budget = BUDGET_SHARE * config.timeout_s
    tried: list[dict[str, Any]] = []
    kept: dict[str, dict[str, Any]] = {}  # recipe → LoRA weights
    warm_report: dict[str, Any] | None = None
    grpo_report: dict[str, Any] = {"steps": [], "rollouts": 0, "resumed_from": None}
    for recipe in config.recipes:
        trial_dir = directory / "trials" / recipe
        if (trial_dir / "trial.json").exists():  # finished before the run was stopped
            trial = json.loads((trial_dir / "trial.json").read_text())
            kept[recipe] = _load_state(trial_dir, "trial")
            warm_report = trial.get("warm_start") or warm_report
            if (trial_dir / "grpo.json").exists():  # its GRPO steps, and the checkpoint it ended on
                grpo_report = json.loads((trial_dir / "grpo.json").read_text())
                grpo_report["resumed_from"] = f"{grpo_report['checkpoint']} (finished)"
            tried.append(trial)
            continue
        longest = max((item.get("seconds", 0.0) for item in tried), default=0.0)
        if auto and tried and time.monotonic() - started + longest > budget:
            tried.append({"recipe": recipe, "skipped": f"{budget - (time.monotonic() - started):.0f} s of the budget left"})
            continue
        if progress and auto:
            progress({"phase": "recipe", "recipe": recipe, "elapsed_s": round(time.monotonic() - started, 1)})
        trial_started = time.monotonic()
        _set_state(model, kept.get("sft") if recipe == "sft+grpo" and "sft" in kept else fresh)
        trial: dict[str, Any] = {"recipe": recipe}
        if recipe.startswith("sft") and not (recipe == "sft+grpo" and "sft" in kept):
            if (trial_dir / "warm_start.json").exists():  # this trial's warm start finished before a stop
                warm_report = json.loads((trial_dir / "warm_start.json").read_text())
                _set_state(model, _load_state(trial_dir, "warm_start"))
            else:
                warm_report = warm_start(model, tokenizer, environment, config, trial_dir, progress, rehearsal)
                _save_state(trial_dir, "warm_start", model, warm_report)
            trial["warm_start"] = warm_report
            if recipe == "sft+grpo":
                kept["sft"] = lora_state(model)
        if "grpo" in recipe:
            guided = {"guided_grpo": config.guided_share, "sft+grpo": config.warm_guided_share}.get(recipe, 0.0)
            checkpoints = directory / "checkpoints" / recipe
            judge = (lambda: validation_score(model, tokenizer, environment, config)) if config.keep_best else None
            # Under 'auto' the sft trial has scored the weights sft+grpo starts from: not scored twice.
            warm_score = next((item.get("validation") for item in tried if item["recipe"] == "sft"), None) if recipe == "sft+grpo" else None
            grpo_report = grpo(model, tokenizer, environment, config, checkpoints, progress, guided, judge=judge, start_score=warm_score)
            last = latest_checkpoint(checkpoints)
            (trial_dir / "grpo.json").parent.mkdir(parents=True, exist_ok=True)
            (trial_dir / "grpo.json").write_text(json.dumps({**grpo_report, "checkpoint": last.name if last else None}))
            trial["rollouts"] = grpo_report["rollouts"]
            if judge:  # every scored step and the one kept; its score is the trial's validation score
                trial["checkpoints"], trial["kept_step"] = grpo_report["checkpoints"], grpo_report["kept_step"]
        if auto:
            trial["validation"] = _kept_score(trial) or validation_score(model, tokenizer, environment, config)
        trial["seconds"] = round(time.monotonic() - trial_started, 1)
        kept[recipe] = lora_state(model)
        _save_state(trial_dir, "trial", model, trial)
        tried.append(trial)
        if progress and auto:
            progress({"phase": "recipe", **trial, "elapsed_s": round(time.monotonic() - started, 1)})
    chosen = _best(tried) if auto else config.recipe
    _set_state(model, kept[chosen])
    report = {
        "recipe": chosen, "device": next(model.parameters()).device.type, "tried": tried,
        "warm_start": warm_report if chosen.startswith("sft") else None,
        "steps": grpo_report["steps"] if "grpo" in chosen else [], "rollouts": grpo_report["rollouts"] if "grpo" in chosen else 0,
        "resumed_from": grpo_report["resumed_from"],
    }  # fmt: skip
    return Trained(model, tokenizer, report, kept.get("sft") if chosen == "sft+grpo" else None, fresh if starts_from else None)


def _kept_score(trial: dict[str, Any]) -> dict[str, Any] | None:
    """The validation score of the weights a trial's GRPO ended on (keep_best), without its step."""
    kept = next((item for item in trial.get("checkpoints", []) if item["step"] == trial["kept_step"]), None)
    return {key: value for key, value in kept.items() if key != "step"} if kept else None


def _best(tried: list[dict[str, Any]]) -> str:
    """The recipe with the highest validation success (then mean reward); the cheaper on a tie."""
    scored = [item for item in tried if "validation" in item]
    top = max(scored, key=lambda item: validation_rank(item["validation"]))
    return top["recipe"]


def _set_state(model: Any, state: dict[str, Any]) -> None:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, state)


def _save_state(directory: Path, name: str, model: Any, record: dict[str, Any]) -> None:
    """The model's LoRA weights as ``name.safetensors`` and ``record`` as ``name.json``, written
    last: a stopped run finds either both or no record."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({key: tensor.contiguous() for key, tensor in lora_state(model).items()}, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(record))


def _load_state(directory: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / f"{name}.safetensors"))
