"""GRPO on one capability's environment: a LoRA adapter on a frozen base model.

One step: take ``groups_per_step`` training seeds, play ``group_size`` episodes of each
(``trainer.rollouts``, in lockstep), normalise each group's rewards into advantages, drop the
groups whose rewards are all equal (they carry no signal) and play as many new seeds in their
place, up to ``resample_groups`` more (dynamic sampling, as in DAPO; with ``screen_seeds`` the seeds
are drawn hardest first for the current greedy policy), and make ``num_iterations``
optimisation passes over the groups with variance. Each pass adds every group's gradient
(``trainer.policy_loss``: the group's opening runs once, its rollouts in micro-batches of
``micro_batch``) and takes one AdamW step. The
first pass's log-probabilities are the old policy's, so from the second pass on the ratio departs
from 1 and the clipped surrogate binds. Each step's progress record carries the clip fraction, the
mean ratio and the KL to the adapter GRPO started from.

The loop is ours rather than TRL's ``GRPOTrainer`` because its batch is a group: one shared
opening, micro-batched rollouts, several passes, all inside one step (about a hundred lines here).
TRL still runs the supervised warm start (``trainer.recipes``).

Checkpoints (``checkpoint-N``: adapter weights, optimiser state, the reference adapter, the step
history, ``trainer_state.json`` written last) let a killed run resume where it was; seeds and
sampling depend only on the step, so a resumed run takes the rollouts the killed one would have.

Given a ``judge`` (a validation score of the model's current weights), the run scores its starting
weights and each checkpoint and ends on the best of them, a later one only when it scores higher
(TRL's ``load_best_model_at_end``): the gain of a long run peaks and can be given back as its
training seeds stop showing failures. The best weights so far and every score are kept beside the
checkpoints (``best-N.safetensors``, then ``best.json``), so a resumed run chooses among all of them.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.trainer.environment import Environment
from tracefix.trainer.jobs import write_atomically
from tracefix.trainer.policy_loss import Completion, LossStats, group_backward, group_logprobs
from tracefix.trainer.rollouts import Sampling, TokenRollout, generate_rollouts

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]
Judge = Callable[[], dict[str, Any]]  # the current weights' validation score: success_rate, mean_reward, …
KEEP_CHECKPOINTS = 2
NO_UPDATE = {"loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 1.0, "kl": 0.0, "grad_norm": 0.0, "clip_fraction_max": 0.0}


@dataclass(slots=True)
class StepStats:
    """What one step's rollouts looked like."""

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


def group_advantages(rewards: list[float], baseline: float | None = None, epsilon: float = 1e-4) -> list[float]:
    """(r − b) / (std + ε) over one group (sample std), b the group's mean or the ``baseline`` given
    (its greedy episode's reward: ReMax's baseline, arXiv 2310.10505, at GRPO's scale)."""
    centre = statistics.fmean(rewards) if baseline is None else baseline
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [0.0 if math.isnan(value := (reward - centre) / (std + epsilon)) else value for reward in rewards]


def advantages(rewards: list[float], group_size: int, epsilon: float = 1e-4) -> list[float]:
    """(r − mean) / (std + ε) within each group of ``group_size`` (sample std)."""
    return [value for start in range(0, len(rewards), group_size) for value in group_advantages(rewards[start : start + group_size], None, epsilon)]


def step_seeds(config: TrainingSettings, step: int) -> list[int]:
    """The training seeds step ``step`` (0-based) may draw: its ``groups_per_step`` seeds, then
    ``resample_groups`` more for dynamic sampling. Disjoint from every other step's, and from the
    held-out and validation seeds, which lie below ``train_seed_offset``."""
    stride = max(config.groups_per_step + config.resample_groups, config.screen_seeds)
    first = config.train_seed_offset + step * stride
    return list(range(first, first + stride))


def take_rollouts(
    model: Any, tokenizer: Any, environment: Environment, config: TrainingSettings, step: int, guided_share: float,
    seeds: list[int] | None = None, draw: int = 0,
) -> list[TokenRollout]:
    """The groups of ``seeds`` (default: the step's first ``groups_per_step``), one after the other:
    per seed, the hinted episodes first, then the guided ones, then the plain ones, the last of them
    greedy with ``greedy_baseline``. ``draw`` counts the step's resampling rounds; each samples with
    its own seed."""
    hinted_count = round(config.hint_share * config.group_size)
    guided_count = min(round(guided_share * config.group_size), config.group_size - hinted_count)
    greedy_from = config.group_size - 1 if config.greedy_baseline else config.group_size
    seeds = step_seeds(config, step)[: config.groups_per_step] if seeds is None else seeds
    positions = [position for _ in seeds for position in range(config.group_size)]
    return generate_rollouts(
        model, tokenizer,
        [environment.instance(seed) for seed in seeds for _ in range(config.group_size)],
        Sampling(config.new_tokens, config.temperature, max_length=config.max_length),
        hinted=[position < hinted_count for position in positions],
        seed=config.seed * 100_003 + step + draw * 1_000_003,
        guided=[hinted_count <= position < hinted_count + guided_count for position in positions],
        greedy=[max(hinted_count + guided_count, greedy_from) <= position for position in positions],
    )  # fmt: skip


def hardest_first(model: Any, tokenizer: Any, environment: Environment, config: TrainingSettings, seeds: list[int]) -> tuple[list[int], int]:
    """``seeds`` in the order a step draws its groups: the first ``screen_seeds`` played once each,
    greedy, by the current policy and put lowest reward first (ties in seed order), then the rest.
    Greedy decoding is what the held-out evaluation scores, so the groups land on the decisions it
    still gets wrong rather than on ones it already makes (online difficulty filtering, arXiv
    2504.03380, with the greedy episode as the difficulty estimate). Returns the order and how many
    screened seeds greedy decoding failed."""
    screened, rest = seeds[: config.screen_seeds], seeds[config.screen_seeds :]
    if not screened:
        return seeds, 0
    instances = [environment.instance(seed) for seed in screened]
    played = generate_rollouts(model, tokenizer, instances, Sampling(config.new_tokens, 0.0, max_length=config.max_length))
    order = sorted(range(len(screened)), key=lambda index: played[index].rollout.reward)
    return [screened[index] for index in order] + rest, sum(not item.rollout.success for item in played)


def draw_rollouts(
    model: Any, tokenizer: Any, environment: Environment, config: TrainingSettings, step: int, guided_share: float,
    candidates: list[int] | None = None,
) -> tuple[list[TokenRollout], int]:
    """The step's rollouts with dynamic sampling (DAPO, arXiv 2503.14476): a group whose rewards all
    came out equal carries no signal, so as many new seeds are played again, until the step has
    ``groups_per_step`` groups with variance or its ``resample_groups`` extra seeds are spent.
    ``candidates`` (default: the step's seeds in order) is the order seeds are drawn in.
    Returns the rollouts of every group drawn and how many groups were drawn beyond the first."""
    candidates = step_seeds(config, step) if candidates is None else candidates
    candidates = candidates[: config.groups_per_step + config.resample_groups]
    taken = config.groups_per_step
    rollouts = take_rollouts(model, tokenizer, environment, config, step, guided_share, candidates[:taken])
    draw = 0
    while taken < len(candidates):
        stats = group_stats(rollouts, config.group_size)
        missing = config.groups_per_step - (stats.groups - stats.zero_variance_groups)
        if missing <= 0:
            break
        more = candidates[taken : taken + missing]
        taken, draw = taken + len(more), draw + 1
        rollouts += take_rollouts(model, tokenizer, environment, config, step, guided_share, more, draw)
    return rollouts, taken - config.groups_per_step


def lora_state(model: Any) -> dict[str, Any]:
    """A copy of the model's LoRA weights (what ``adapter_weights`` and ``set_peft_model_state_dict`` take)."""
    from peft import get_peft_model_state_dict

    return {name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(model).items()}


@contextmanager
def adapter_weights(model: Any, state: dict[str, Any]) -> Iterator[None]:
    """The model with the LoRA weights ``state`` for the duration (its own weights put back after)."""
    from peft import set_peft_model_state_dict

    own = lora_state(model)
    set_peft_model_state_dict(model, state)
    try:
        yield
    finally:
        set_peft_model_state_dict(model, own)


def _groups(rollouts: list[TokenRollout], config: TrainingSettings) -> list[tuple[list[int], list[Completion]]]:
    """(prompt, completions with advantages) of each group whose rewards differ; negative advantages
    weighted by ``negative_weight``. A group's greedy episode, when it has one, is its baseline and
    is not trained."""
    groups = []
    for start in range(0, len(rollouts), config.group_size):
        members = rollouts[start : start + config.group_size]
        rewards = [item.rollout.reward for item in members]
        if max(rewards) == min(rewards):
            continue
        values = group_advantages(rewards, next((item.rollout.reward for item in members if item.greedy), None))
        # Every episode of a group has the same plain prompt (a hint is stripped before the loss).
        completions = [
            Completion(item.completion_ids, item.env_mask, value * config.negative_weight if value < 0 else value)
            for item, value in zip(members, values, strict=True)
            if not item.greedy
        ]
        groups.append((members[0].prompt_ids, completions))
    return groups


def make_optimizer(model: Any, config: TrainingSettings) -> Any:
    """``config.optimizer`` over the model's trainable (LoRA) weights. Adam divides each weight's
    step by the root of its squared gradients so far, so over a few steps it moves every weight by
    about the learning rate (a sign step), those whose gradient is noise as far as those that carry
    the signal; SGD moves each in proportion to its gradient."""
    import torch

    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=config.learning_rate)
    return torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=0.0)


def optimise(model: Any, optimizer: Any, groups: list[tuple[list[int], list[Completion]]], config: TrainingSettings) -> dict[str, Any]:
    """``num_iterations`` passes over the step's groups, one optimiser step each; the last pass's
    loss, clip fraction, mean ratio and KL (the first pass's ratio is 1 by construction)."""
    import torch

    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    tokens = sum(sum(completion.mask) for _, completions in groups for completion in completions)
    passes = []
    for _ in range(config.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        for prompt, completions in groups:
            stats.add(group_backward(
                model, prompt, completions, tokens, config.micro_batch, config.clip_epsilon, config.kl_beta, config.temperature,
                config.grpo_opening_gradient,
            ))  # fmt: skip
        norm = float(torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm))
        optimizer.step()
        passes.append({**stats.summary(), "grad_norm": round(norm, 4)})
    return {**passes[-1], "clip_fraction_max": max(item["clip_fraction"] for item in passes)}


def grpo(
    model: Any,
    tokenizer: Any,
    environment: Environment,
    config: TrainingSettings,
    directory: Path,
    progress: Progress | None = None,
    guided_share: float = 0.0,
    phase: str = "grpo",
    judge: Judge | None = None,
    start_score: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``model`` (a PEFT model) for ``config.steps`` GRPO steps, checkpointing into
    ``directory`` and resuming from its newest checkpoint. Returns the report: where it resumed
    from, the step records and the number of rollouts; with ``judge``, also every scored step's
    validation score (``checkpoints``, each also reported to ``progress`` as a record of phase
    ``checkpoint``) and the step whose weights the model ends with (``kept_step``).
    ``start_score``, when given, is the judge's score of the weights the run starts from (a
    recipe's warm start already scored under 'auto'): a fresh run takes it instead of scoring them again."""
    import torch

    optimizer = make_optimizer(model, config)
    reference = lora_state(model)
    history: list[dict[str, Any]] = []
    rollouts_taken, start = 0, 0
    resume = latest_checkpoint(directory)
    if resume is not None:
        state = _load_checkpoint(resume, model, optimizer)
        reference, history, rollouts_taken, start = state["reference"], state["history"], state["rollouts"], state["step"]
    started = time.monotonic()
    best = BestCheckpoint(directory, judge, start) if judge else None

    def judged(step: int, known: dict[str, Any] | None = None) -> None:  # keep_best scores the weights after `step` steps
        assert best is not None
        found = best.consider(model, step, known)
        if progress:
            progress({
                "phase": "checkpoint", "step": step, "max_steps": config.steps, "success_rate": found["success_rate"],
                "mean_reward": found["mean_reward"], "best_step": best.step, "elapsed_s": round(time.monotonic() - started, 1),
            })  # fmt: skip

    if best and best.scored(start) is None:  # the starting weights (or a checkpoint saved before its score was)
        judged(start, start_score if resume is None else None)
    for step in range(start, config.steps):
        candidates, screen_failed = hardest_first(model, tokenizer, environment, config, step_seeds(config, step))
        rollouts, resampled = draw_rollouts(model, tokenizer, environment, config, step, guided_share, candidates)
        rollouts_taken += len(rollouts)
        stats = group_stats(rollouts, config.group_size)
        groups = _groups(rollouts, config)
        if step or resume is not None:  # at step 0 the policy is the reference: its KL is 0 by definition
            with torch.no_grad(), adapter_weights(model, reference):
                for prompt, completions in groups:
                    rows, masks = [completion.ids for completion in completions], [completion.mask for completion in completions]
                    scored = group_logprobs(model, prompt, rows, config.micro_batch, config.temperature, masks)
                    for completion, logprobs in zip(completions, scored, strict=True):
                        completion.reference = logprobs
        # A step whose every group earned equal rewards teaches nothing: no update, and it says so.
        update = optimise(model, optimizer, groups, config) if groups else dict(NO_UPDATE)
        record = {
            "phase": phase, "step": step + 1, "max_steps": config.steps,
            "mean_reward": round(stats.mean_reward, 4), "success_rate": round(stats.success_rate, 4),
            "zero_variance_groups": stats.zero_variance_groups, "groups": stats.groups, "resampled": resampled,
            "screened": config.screen_seeds, "screen_failed": screen_failed, **update,
            "guided": sum(item.forced_tokens > 0 for item in rollouts), "rollouts": rollouts_taken,
            "policy_tokens": stats.policy_tokens, "elapsed_s": round(time.monotonic() - started, 1),
        }  # fmt: skip
        history.append(record)
        if progress:
            progress(record)
        if (step + 1) % config.save_steps == 0 or step + 1 == config.steps:
            _save_checkpoint(directory, step + 1, model, optimizer, reference, history, rollouts_taken)
            if best:
                judged(step + 1)
    report = {"resumed_from": resume.name if resume else None, "steps": history, "rollouts": rollouts_taken}
    if best:
        best.restore(model)
        report.update(checkpoints=best.scores, kept_step=best.step)
    return report


class BestCheckpoint:
    """The best-scoring weights of a GRPO run so far, by its ``judge``, kept in ``directory``:
    ``best-N.safetensors`` for step N, then ``best.json`` with its step and every score, replaced
    atomically and last (a stop between the two leaves the earlier pair in force). Scores are
    (success rate, mean reward), compared in that order; a later step replaces the best only when
    it scores higher."""

    def __init__(self, directory: Path, judge: Judge, start: int) -> None:
        self.directory, self.judge = directory, judge
        self.scores: list[dict[str, Any]] = []
        self.step: int | None = None
        path = directory / "best.json"
        if path.exists():  # a resumed run: the scores up to the checkpoint it resumes from
            kept = json.loads(path.read_text())
            self.scores = [item for item in kept["scores"] if item["step"] <= start]
            self.step = kept["step"] if kept["step"] <= start else None

    def scored(self, step: int) -> dict[str, Any] | None:
        return next((item for item in self.scores if item["step"] == step), None)

    @property
    def best(self) -> dict[str, Any] | None:
        return self.scored(self.step) if self.step is not None else None

    def consider(self, model: Any, step: int, known: dict[str, Any] | None = None) -> dict[str, Any]:
        """Score the model's weights after ``step`` steps (``known``: their score, already taken);
        keep them if they beat the best so far."""
        from safetensors.torch import save_file

        found = {"step": step, **(known or self.judge())}
        self.scores = [item for item in self.scores if item["step"] != step] + [found]
        if self.best is None or validation_rank(found) > validation_rank(self.best):
            self.step = step
            self.directory.mkdir(parents=True, exist_ok=True)
            save_file({name: tensor.contiguous() for name, tensor in lora_state(model).items()}, str(self._weights(step)))
        write_atomically(self.directory / "best.json", {"step": self.step, "scores": self.scores})
        for old in self.directory.glob("best-*.safetensors"):
            if old != self._weights(self.step):
                old.unlink(missing_ok=True)
        return found

    def restore(self, model: Any) -> None:
        """Put the best weights into ``model``."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(self._weights(self.step))))

    def _weights(self, step: int | None) -> Path:
        return self.directory / f"best-{step}.safetensors"


def validation_rank(score: dict[str, Any]) -> tuple[float, float]:
    """How validation scores compare (checkpoints here, recipes under 'auto'): success rate, then mean reward."""
    return score["success_rate"], score["mean_reward"]


def _save_checkpoint(
    directory: Path, step: int, model: Any, optimizer: Any, reference: dict[str, Any], history: list[dict[str, Any]], rollouts: int
) -> None:
    import torch
    from safetensors.torch import save_file

    path = directory / f"checkpoint-{step}"
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    save_file({name: tensor.contiguous() for name, tensor in reference.items()}, str(path / "reference.safetensors"))
    # Written last: a checkpoint without it was cut short and is never resumed from.
    (path / "trainer_state.json").write_text(json.dumps({"step": step, "history": history, "rollouts": rollouts}))
    for old in _checkpoints(directory)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    state = json.loads((path / "trainer_state.json").read_text())
    return {**state, "reference": load_file(str(path / "reference.safetensors"))}


def checkpoint_step(path: Path) -> int:
    """The step a ``checkpoint-N`` directory was saved after."""
    return int(path.name.split("-")[-1])


def _checkpoints(directory: Path) -> list[Path]:
    found = (path for path in directory.glob("checkpoint-*") if path.name.split("-")[-1].isdigit())
    return sorted(found, key=checkpoint_step)


def complete_checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints, oldest first: a run killed while saving leaves a directory without
    the trainer state (written last), which is skipped."""
    return [path for path in _checkpoints(directory) if (path / "trainer_state.json").exists() and (path / "adapter_model.safetensors").exists()]


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint."""
    complete = complete_checkpoints(directory)
    return complete[-1] if complete else None
