"""GRPO on one capability's environment: a LoRA adapter on a frozen base model, with TRL.

TRL's ``GRPOTrainer`` does the optimisation (group-normalised advantages, the clipped surrogate,
KL 0 by default); tracefix supplies the rollouts through its ``rollout_func``: each prompt of the
dataset names one seed, the trainer repeats it ``group_size`` times, and ``generate_rollouts`` plays
those episodes in lockstep. The environment's reward comes back as an extra field that the reward
function passes through; ``env_mask`` keeps tool results and user turns out of the loss, and hinted
rollouts are trained on their plain prompt (the hint is stripped before the gradient step).

A base model too weak to earn any reward (typical of a 135M model on tool use) gets a warm start
first: a short supervised pass on the environment's ground-truth demonstrations (TRL's
``SFTTrainer``, policy tokens only, each batch's common opening run once:
``trainer.shared_prefix``), so that GRPO starts from a policy whose groups show variance.
"""

from __future__ import annotations

import logging
import math
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, TrainerCallback

from trainer.environment import Environment
from trainer.rollouts import Sampling, TokenRollout, demonstration, generate_rollouts

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]
_SEED_PROMPT = re.compile(r"^seed (\d+)$")


@dataclass(slots=True)
class TrainConfig:
    """Everything a training run needs besides the environment and the base model.

    The defaults fit a 2-core CPU and SmolLM2-135M. On a GPU: raise ``groups_per_step`` (8–16) and
    ``group_size`` (8), and pass ``grpo_args={"bf16": True}``; launch with ``accelerate launch`` for
    several GPUs (see docs/training.md).
    """

    steps: int = 30  # GRPO steps; 0 = the warm start only
    group_size: int = 4  # K rollouts per seed; advantages are normalised within each group
    groups_per_step: int = 2
    learning_rate: float = 1e-4
    clip_epsilon: float = 0.2
    kl_beta: float = 0.0
    temperature: float = 1.0
    max_new_tokens: int = 96
    max_length: int = 3072
    hint_share: float = 0.0  # share of each group's rollouts sampled with the hint (from validation)
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    warm_start_examples: int = 0  # ground-truth demonstrations for the warm start; 0 = none
    warm_start_epochs: int = 2
    warm_start_batch: int = 2  # demonstrations per update (one batch; their common opening runs once)
    warm_start_learning_rate: float = 1e-3
    save_steps: int = 5
    seed: int = 0
    train_seed_offset: int = 100_000  # training seeds start here; evaluation uses seeds below it
    threads: int = 0  # torch CPU threads; 0 = all cores
    grpo_args: dict[str, Any] = field(default_factory=dict)  # passed to GRPOConfig as is

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training settings: {', '.join(unknown)}")
        values = dict(values)
        if "lora_targets" in values:
            values["lora_targets"] = tuple(values["lora_targets"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["lora_targets"] = list(self.lora_targets)
        return values

    @property
    def recipe(self) -> str:
        """Which of the design's recipes this configuration runs: ``sft`` (the warm start on verified
        solutions only), ``sft+grpo``, or plain ``grpo``."""
        if self.warm_start_examples and not self.steps:
            return "sft"
        return "sft+grpo" if self.warm_start_examples else "grpo"

    @property
    def hinted_per_group(self) -> int:
        return round(self.hint_share * self.group_size)


@dataclass(slots=True)
class StepStats:
    """What one generation step's rollouts looked like (TRL logs the optimisation side)."""

    rollouts: int = 0
    groups: int = 0
    zero_variance_groups: int = 0
    mean_reward: float = 0.0
    success_rate: float = 0.0
    policy_tokens: int = 0


def group_stats(rollouts: list[TokenRollout], group_size: int) -> StepStats:
    rewards = [item.rollout.reward for item in rollouts]
    groups = [rewards[start : start + group_size] for start in range(0, len(rewards), group_size)]
    return StepStats(
        rollouts=len(rollouts),
        groups=len(groups),
        zero_variance_groups=sum(max(group) == min(group) for group in groups),
        mean_reward=statistics.fmean(rewards) if rewards else 0.0,
        success_rate=sum(item.rollout.success for item in rollouts) / len(rollouts) if rollouts else 0.0,
        policy_tokens=sum(item.policy_tokens for item in rollouts),
    )


class EnvironmentRollouts:
    """TRL's ``rollout_func``: seeds in, token rollouts with environment rewards out."""

    def __init__(self, environment: Environment, tokenizer: Any, config: TrainConfig) -> None:
        self.environment = environment
        self.tokenizer = tokenizer
        self.config = config
        self.sampling = Sampling(config.max_new_tokens, config.temperature, max_length=config.max_length)
        self.calls = 0
        self.last = StepStats()
        self.last_rollouts: list[TokenRollout] = []
        self.total_rollouts = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        seeds = [_seed_of(prompt) for prompt in prompts]
        hinted, position = [], 0
        for index, seed in enumerate(seeds):
            position = position + 1 if index and seeds[index - 1] == seed else 0
            hinted.append(position < self.config.hinted_per_group)
        instances = [self.environment.instance(seed) for seed in seeds]
        rollouts = generate_rollouts(
            trainer.model, self.tokenizer, instances, self.sampling, hinted, seed=self.config.seed * 100_003 + self.calls
        )
        self.calls += 1
        self.total_rollouts += len(rollouts)
        self.last = group_stats(rollouts, self.config.group_size)
        self.last_rollouts = rollouts
        return {
            "prompt_ids": [item.prompt_ids for item in rollouts],
            "completion_ids": [item.completion_ids for item in rollouts],
            "logprobs": None,  # only used for vLLM importance-sampling correction
            "env_mask": [item.env_mask for item in rollouts],
            "env_reward": [item.rollout.reward for item in rollouts],
        }


def _seed_of(prompt: Any) -> int:
    match = _SEED_PROMPT.match(prompt if isinstance(prompt, str) else "")
    if not match:
        raise ValueError(f"training prompts name a seed ('seed N'), got {prompt!r:.80}")
    return int(match.group(1))


def environment_reward(prompts: list[Any], completions: list[Any], env_reward: list[float], **_: Any) -> list[float]:
    """The environment computed the reward by code during the rollout; pass it through."""
    return list(env_reward)


def lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        task_type="CAUSAL_LM",
    )


def warm_start(
    model: Any, tokenizer: Any, environment: Environment, config: TrainConfig, output_dir: Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Supervised pass on ground-truth demonstrations (seeds disjoint from evaluation's), loss on the
    policy's tokens only; each update is reported to `progress` (phase ``warm_start``). Returns the
    SFT metrics."""
    from datasets import Dataset
    from trl import SFTConfig

    from trainer.shared_prefix import SharedPrefixSFTTrainer

    seeds = range(config.train_seed_offset - config.warm_start_examples, config.train_seed_offset)
    rows = []
    for seed in seeds:
        demo = demonstration(tokenizer, environment.instance(seed), config.max_length)
        ids, policy = demo.sequence()
        rows.append({"input_ids": ids, "assistant_masks": policy})
    arguments = SFTConfig(
        output_dir=str(output_dir / "warm_start"),
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
        use_cpu=not _has_cuda(),
        seed=config.seed,
        max_length=config.max_length,
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=False,
    )
    trainer = SharedPrefixSFTTrainer(model=model, args=arguments, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # progress is reported by the caller, not printed
    if progress:
        trainer.add_callback(_WarmStartProgress(progress, time.monotonic()))
    result = trainer.train()
    return {
        "examples": len(rows), "epochs": config.warm_start_epochs, "batch": config.warm_start_batch,
        "updates": result.global_step, "loss": round(result.training_loss, 4),
    }  # fmt: skip


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


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


class _ProgressCallback(TrainerCallback):
    """Reports one record per optimisation step: TRL's logs merged with the rollouts' own stats."""

    def __init__(self, rollouts: EnvironmentRollouts, progress: Progress | None, started: float) -> None:
        super().__init__()
        self.rollouts = rollouts
        self.progress = progress
        self.started = started
        self.history: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not logs or "loss" not in logs:
            return
        stats = self.rollouts.last
        elapsed = time.monotonic() - self.started
        record = {
            "phase": "grpo",
            "step": state.global_step,
            "max_steps": state.max_steps,
            "mean_reward": round(stats.mean_reward, 4),
            "success_rate": round(stats.success_rate, 4),
            "zero_variance_groups": stats.zero_variance_groups,
            "groups": stats.groups,
            "loss": round(float(logs["loss"]), 6),
            "rollouts": self.rollouts.total_rollouts,
            "tokens_per_s": round(stats.policy_tokens / max(logs.get("step_time", 0) or 1e-9, 1e-9), 1) if "step_time" in logs else None,
            "elapsed_s": round(elapsed, 1),
        }
        self.history.append(record)
        if self.progress:
            self.progress(record)


def build_trainer(
    environment: Environment,
    model_dir: Path,
    output_dir: Path,
    config: TrainConfig,
    progress: Progress | None = None,
) -> tuple[Any, _ProgressCallback, dict[str, Any]]:
    """A ``GRPOTrainer`` for a LoRA on ``model_dir`` over ``environment`` (warm-started first when
    configured and not resuming). Returns (trainer, its progress callback, report so far)."""
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if config.threads:
        torch.set_num_threads(config.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, lora_config(config))
    resume = latest_checkpoint(output_dir / "checkpoints")
    report: dict[str, Any] = {"recipe": config.recipe, "resumed_from": resume.name if resume else None, "warm_start": None}
    if config.warm_start_examples and resume is None:
        report["warm_start"] = warm_start(model, tokenizer, environment, config, output_dir, progress)

    rollouts = EnvironmentRollouts(environment, tokenizer, config)
    seeds = max(config.steps, 1) * config.groups_per_step
    dataset = Dataset.from_dict({"prompt": [f"seed {config.train_seed_offset + index}" for index in range(seeds)]})
    defaults: dict[str, Any] = dict(
        output_dir=str(output_dir / "checkpoints"),
        max_steps=max(config.steps, 1),
        per_device_train_batch_size=config.groups_per_step * config.group_size,
        num_generations=config.group_size,
        gradient_accumulation_steps=1,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        beta=config.kl_beta,
        epsilon=config.clip_epsilon,
        loss_type="grpo",
        scale_rewards="group",
        temperature=config.temperature,
        max_completion_length=config.max_length,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.save_steps,
        report_to=[],
        use_cpu=not _has_cuda(),
        seed=config.seed,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=False,  # recomputation costs more than it saves at this size on a CPU
    )
    arguments = GRPOConfig(**{**defaults, **config.grpo_args})
    callback = _ProgressCallback(rollouts, progress, time.monotonic())
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=environment_reward,
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollouts,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)
    return trainer, callback, report


def train(
    environment: Environment,
    model_dir: Path,
    output_dir: Path,
    config: TrainConfig,
    progress: Progress | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train a LoRA adapter on ``environment``; resumes from the newest checkpoint in
    ``output_dir/checkpoints``. Returns (peft model, tokenizer, report with the step history)."""
    trainer, callback, report = build_trainer(environment, model_dir, output_dir, config, progress)
    resume = latest_checkpoint(output_dir / "checkpoints")
    if config.steps:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    report["steps"] = callback.history
    report["rollouts"] = callback.rollouts.total_rollouts
    return trainer.model, trainer.processing_class, report


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint: a run killed while saving leaves a directory without the
    trainer state (written last), which is skipped."""
    found = sorted(
        (path for path in directory.glob("checkpoint-*") if path.name.split("-")[-1].isdigit()),
        key=lambda path: int(path.name.split("-")[-1]),
    )
    complete = [path for path in found if (path / "trainer_state.json").exists() and (path / "adapter_model.safetensors").exists()]
    return complete[-1] if complete else None


def advantages(rewards: list[float], group_size: int, epsilon: float = 1e-4) -> list[float]:
    """(r − mean) / (std + ε) within each group of ``group_size``; the definition TRL implements
    (with ``scale_rewards="group"``), kept here to check it against."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if len(group) > 1 else 0.0
        out.extend((reward - mean) / (std + epsilon) for reward in group)
    return [0.0 if math.isnan(value) else value for value in out]
