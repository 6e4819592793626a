"""GRPO with tracefix's rollouts: the advantages and masks it trains on are the paper's, token by
token; micro-batched updates equal one batch; several passes make the clip bind; a tiny model learns
a trivially learnable environment; a killed run resumes; each recipe trains and names itself, and
'auto' keeps the better one.

The tiny models here are random 2-layer Llamas with SmolLM2's tokenizer (seconds per step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from tracefix.daemon.core.settings import TrainingSettings
from tests.learnable import LetterFamily, LetterInstance
from tracefix.trainer import model as models
from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.families import load_families
from tracefix.trainer.grpo import (
    _groups, advantages, draw_rollouts, group_advantages, group_stats, grpo, hardest_first, latest_checkpoint, make_optimizer, optimise, step_seeds,
    take_rollouts,
)
from tracefix.trainer import recipes
from tracefix.trainer.recipes import load_policy, lora_state, train
from tracefix.trainer.rollouts import ChatTokens, Sampling, demonstration, generate_rollouts

REPO = Path(__file__).resolve().parent.parent
TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "airline.json").read_text()))
LETTER = Environment(LetterFamily(), [], 1)


def _config(**values: object) -> TrainingSettings:
    """One-token turns on the letter environment; no warm start unless asked. In float32: the peaked
    model's logits run to ±100, where bfloat16's 8-bit mantissa rounds away what a dozen updates
    change (its numerics on a model of ordinary scale: tests/test_precision.py)."""
    return TrainingSettings(**{"max_new_tokens": 1, "warm_start_examples": 0, "recipe": "grpo", "eval_seeds": 8, "dtype": "float32", **values})


@pytest.fixture(scope="module")
def peaked(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: object) -> Path:
    """A tiny random model whose next-token distribution is peaked enough to be steered."""
    return models.tiny_random_model(tmp_path_factory.mktemp("peaked"), smollm2_tokenizer, initializer_range=1.0)


def test_advantages_are_group_normalised_by_hand() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0]
    # Group 1: mean 0.5, sample std sqrt(1/3) = 0.57735; group 2 has no variance; group 3: mean 0.25, std 0.5.
    expected = [0.8659, -0.8659, -0.8659, 0.8659, 0, 0, 0, 0, 1.4997, -0.4999, -0.4999, -0.4999]
    assert advantages(rewards, 4) == pytest.approx(expected, abs=1e-3)
    stats = group_stats([], 4)
    assert stats.groups == 0 and stats.zero_variance_groups == 0


def test_the_recipes_a_configuration_can_run() -> None:
    assert TrainingSettings(recipe="auto", steps=0, warm_start_examples=24).recipes == ("sft",)
    assert TrainingSettings(recipe="auto", steps=5, warm_start_examples=24).recipes == ("sft", "sft+grpo", "guided_grpo", "grpo")
    assert TrainingSettings(recipe="auto", steps=5, warm_start_examples=0).recipes == ("guided_grpo", "grpo")
    assert TrainingSettings(recipe="guided_grpo").recipes == ("guided_grpo",)
    for bad in ({"recipe": "sft", "warm_start_examples": 0}, {"recipe": "grpo", "steps": 0}, {"steps": 0, "warm_start_examples": 0}):
        with pytest.raises(ValidationError):
            TrainingSettings(**bad)
    # Held-out, validation, warm-start and training seeds never overlap.
    config = TrainingSettings(eval_seeds=50, validation_seeds=8, warm_start_examples=48)
    assert config.validation_range.start >= 50 and config.validation_range.stop == config.warm_start_range.start
    assert config.warm_start_range.stop == config.train_seed_offset


def test_a_step_trains_on_our_rewards_masks_and_plain_prompts(peaked: Path) -> None:
    config = _config(group_size=4, groups_per_step=2, hint_share=0.5)
    model, tokenizer = load_policy(peaked, config)
    rollouts = take_rollouts(model, tokenizer, LETTER, config, step=0, guided_share=0.25)
    # Per group: two hinted rollouts, then one guided, then one plain; all trained on the plain prompt.
    assert [item.hinted for item in rollouts] == [True, True, False, False] * 2
    assert [item.forced_tokens > 0 for item in rollouts] == [False, False, True, False] * 2
    plain = ChatTokens(tokenizer).opening(LETTER.instance(config.train_seed_offset).reset())
    assert rollouts[0].prompt_ids == plain and "Hint" not in tokenizer.decode(rollouts[0].prompt_ids)
    rewards = [item.rollout.reward for item in rollouts]
    groups = _groups(rollouts, config)
    kept = [index for index in (0, 4) if len(set(rewards[index : index + 4])) > 1]
    assert len(groups) == len(kept) == 2 - group_stats(rollouts, 4).zero_variance_groups
    for (prompt, completions), start in zip(groups, kept, strict=True):
        assert prompt == rollouts[start].prompt_ids
        assert [item.advantage for item in completions] == pytest.approx(advantages(rewards, 4)[start : start + 4])
        assert [item.mask for item in completions] == [item.env_mask for item in rollouts[start : start + 4]]


def test_negative_advantages_are_weighted_and_positive_ones_kept(peaked: Path) -> None:
    config = _config(group_size=4, groups_per_step=2)
    model, tokenizer = load_policy(peaked, config)
    rollouts = take_rollouts(model, tokenizer, LETTER, config, step=0, guided_share=0.0)
    plain = [item.advantage for _, completions in _groups(rollouts, config) for item in completions]
    quarter = config.model_copy(update={"negative_weight": 0.25})
    weighted = [item.advantage for _, completions in _groups(rollouts, quarter) for item in completions]
    assert any(value < 0 for value in plain) and any(value > 0 for value in plain), plain
    assert weighted == pytest.approx([value * 0.25 if value < 0 else value for value in plain])
    with pytest.raises(ValidationError):
        TrainingSettings(negative_weight=-0.1)


def test_a_greedy_baseline_is_decoded_greedily_in_the_group_and_not_trained(peaked: Path) -> None:
    config = _config(group_size=4, groups_per_step=3, greedy_baseline=True)
    model, tokenizer = load_policy(peaked, config)
    rollouts = take_rollouts(model, tokenizer, LETTER, config, step=0, guided_share=0.25)
    # Per group: one guided episode, two sampled ones, then the greedy one.
    assert [item.greedy for item in rollouts] == [False, False, False, True] * 3
    assert [item.forced_tokens > 0 for item in rollouts] == [True, False, False, False] * 3
    seeds = step_seeds(config, 0)[:3]
    alone = generate_rollouts(model, tokenizer, [LETTER.instance(seed) for seed in seeds], Sampling(1, 0.0))
    assert [item.completion_ids for item in rollouts[3::4]] == [item.completion_ids for item in alone]
    rewards = [item.rollout.reward for item in rollouts]
    groups = _groups(rollouts, config)
    kept = [start for start in range(0, 12, 4) if len(set(rewards[start : start + 4])) > 1]
    assert kept, f"no group with variance: {rewards}"
    assert len(groups) == len(kept)
    for (_, completions), start in zip(groups, kept, strict=True):
        group = rewards[start : start + 4]
        std = torch.tensor(group).std().item()
        assert [item.advantage for item in completions] == pytest.approx([(reward - group[3]) / (std + 1e-4) for reward in group[:3]], abs=1e-4)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], baseline=1.0) == pytest.approx([0.0, -1.7318, -1.7318, 0.0], abs=1e-3)


def _policy_with_a_nonzero_adapter(path: Path, config: TrainingSettings) -> tuple[Any, Any]:
    """The policy with the same non-zero LoRA B every time: a fresh LoRA's B is zero, and then A
    has no gradient."""
    model, tokenizer = load_policy(path, config)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model, tokenizer


def test_a_micro_batched_update_is_the_update_of_one_batch(peaked: Path) -> None:
    """With SGD, whose step is the gradient itself: AdamW's first steps are about the gradient's
    sign, which float rounding (a matrix product over other rows) can flip where a gradient is
    near zero."""
    results = []
    for micro_batch in (1, 4):
        config = _config(group_size=4, groups_per_step=2, micro_batch=micro_batch, num_iterations=2, learning_rate=0.5, optimizer="sgd")
        model, tokenizer = _policy_with_a_nonzero_adapter(peaked, config)
        groups = _groups(take_rollouts(model, tokenizer, LETTER, config, step=0, guided_share=0.0), config)
        assert groups, "the step had no group with reward variance"
        start = lora_state(model)
        update = optimise(model, make_optimizer(model, config), groups, config)
        results.append((update, lora_state(model)))
    (one, weights_one), (four, weights_four) = results
    assert max(float((weights_one[name] - start[name]).abs().max()) for name in start) > 1e-3  # the update moved the weights
    assert one["loss"] == pytest.approx(four["loss"], abs=1e-5) and one["ratio_mean"] == pytest.approx(four["ratio_mean"], abs=1e-5)
    for name, tensor in weights_one.items():
        torch.testing.assert_close(tensor, weights_four[name], atol=1e-5, rtol=1e-4, msg=name)


def test_sgd_moves_each_weight_by_its_gradient_and_adamw_by_about_the_learning_rate(peaked: Path) -> None:
    """One pass from the same weights and rollouts: SGD's step scales with the learning rate and
    differs from weight to weight (the gradient's shape); AdamW's first step moves every weight with
    a gradient by the learning rate itself (a sign step), whatever that gradient's size."""
    moves = {}
    for optimizer, rate in (("sgd", 0.5), ("sgd", 1.0), ("adamw", 1e-3)):
        config = _config(group_size=4, groups_per_step=2, num_iterations=1, optimizer=optimizer, learning_rate=rate, max_grad_norm=1e6)
        model, tokenizer = _policy_with_a_nonzero_adapter(peaked, config)
        before = lora_state(model)
        groups = _groups(take_rollouts(model, tokenizer, LETTER, config, step=0, guided_share=0.0), config)
        assert groups, "the step had no group with reward variance"
        optimise(model, make_optimizer(model, config), groups, config)
        moves[optimizer, rate] = torch.cat([(tensor - before[name]).flatten() for name, tensor in lora_state(model).items()])
    half, whole, adam = moves["sgd", 0.5], moves["sgd", 1.0], moves["adamw", 1e-3]
    assert whole.abs().max() > 0
    torch.testing.assert_close(whole, 2 * half, atol=1e-7, rtol=1e-4)
    moved = adam.abs()[adam != 0]
    assert ((moved - 1e-3).abs() < 2e-5).float().mean() > 0.9  # all but the weights whose gradient is near Adam's ε
    steps = whole.abs()[whole != 0]
    assert steps.max() > 10 * steps.median()  # SGD's steps follow the gradient's sizes, which vary widely


class _FlatOrSplit(LetterInstance):
    """Seeds in ``FLAT`` earn 0 whatever the reply (a group without variance); the others earn 1 in
    every second episode built (a group with variance whatever the model samples)."""

    FLAT: set[int] = set()
    built = 0

    def __init__(self, tools: object, seed: int, difficulty: int) -> None:
        super().__init__([], seed, difficulty)
        _FlatOrSplit.built += 1
        self.index = _FlatOrSplit.built

    def reward(self) -> float:
        return 0.0 if self.seed in self.FLAT else float(self.index % 2)


class _FlatOrSplitFamily(LetterFamily):
    def build(self, tools: object, seed: int, difficulty: int) -> LetterInstance:
        return _FlatOrSplit([], seed, difficulty)


def _seeds_played(rollouts: list, group_size: int, tokenizer: object) -> list[str]:
    return [tokenizer.decode(item.prompt_ids).split("Go ")[1][0] for item in rollouts[::group_size]]


@pytest.mark.parametrize(("flat", "resample", "expected_groups", "expected_resampled"), [
    ({0, 1}, 2, 4, 2),  # both groups flat: two more seeds are played, and both have variance
    ({0}, 2, 3, 1),  # one flat group: one more seed
    ({0, 1, 2}, 2, 4, 2),  # the first extra seed is flat too: the step ends with what it has
    ({0, 1}, 0, 2, 0),  # dynamic sampling off: the step keeps its flat groups
])  # fmt: skip
def test_dynamic_sampling_replaces_groups_without_variance(
    peaked: Path, flat: set[int], resample: int, expected_groups: int, expected_resampled: int
) -> None:
    config = _config(group_size=4, groups_per_step=2, resample_groups=resample)
    model, tokenizer = load_policy(peaked, config)
    environment = Environment(_FlatOrSplitFamily(), [], 1)
    candidates = step_seeds(config, 0)
    _FlatOrSplit.FLAT = {candidates[index] for index in flat}
    rollouts, resampled = draw_rollouts(model, tokenizer, environment, config, step=0, guided_share=0.0)
    stats = group_stats(rollouts, config.group_size)
    assert (stats.groups, resampled) == (expected_groups, expected_resampled)
    # The step played its own seeds in order, flat ones included, and the groups it trains on are
    # those with variance: at most groups_per_step.
    assert _seeds_played(rollouts, 4, tokenizer) == [str(seed % 7) for seed in candidates[:expected_groups]]
    assert len(_groups(rollouts, config)) == stats.groups - stats.zero_variance_groups == sum(c not in _FlatOrSplit.FLAT for c in candidates[:expected_groups])
    # Each step's seeds, spares included, are its own.
    assert set(step_seeds(config, 1)).isdisjoint(candidates) and len(candidates) == 2 + resample


class _Graded(LetterInstance):
    """Each seed earns its own reward in ``REWARDS`` (1 when absent), whatever the reply."""

    REWARDS: dict[int, float] = {}

    def reward(self) -> float:
        return self.REWARDS.get(self.seed, 1.0)


class _GradedFamily(LetterFamily):
    def build(self, tools: object, seed: int, difficulty: int) -> LetterInstance:
        return _Graded([], seed, difficulty)


def test_screening_draws_the_groups_from_the_seeds_greedy_decoding_fails(peaked: Path, tmp_path: Path) -> None:
    config = _config(group_size=2, groups_per_step=2, resample_groups=1, screen_seeds=6, steps=1, save_steps=100)
    model, tokenizer = load_policy(peaked, config)
    environment = Environment(_GradedFamily(), [], 1)
    seeds = step_seeds(config, 0)
    # A step's seeds stretch to the screened ones, and stay its own.
    assert len(seeds) == 6 and set(step_seeds(config, 1)).isdisjoint(seeds)
    _Graded.REWARDS = {seeds[4]: 0.0, seeds[2]: 0.5}
    order, failed = hardest_first(model, tokenizer, environment, config, seeds)
    # Lowest greedy reward first, ties in seed order; a partial reward is a failure too.
    assert order == [seeds[4], seeds[2], seeds[0], seeds[1], seeds[3], seeds[5]] and failed == 2
    rollouts, resampled = draw_rollouts(model, tokenizer, environment, config, 0, 0.0, order)
    # The two failed seeds are drawn first; both groups are flat here, so dynamic sampling adds the
    # next in that order, and no further (resample_groups = 1).
    assert _seeds_played(rollouts, 2, tokenizer) == [str(seed % 7) for seed in order[:3]] and resampled == 1
    # A whole step says what screening found.
    step = grpo(model, tokenizer, environment, config, tmp_path / "run")["steps"][0]
    assert (step["screened"], step["screen_failed"]) == (6, 2)
    # Off, the step's seeds keep their order and none is played greedy.
    off = config.model_copy(update={"screen_seeds": 0})
    assert hardest_first(model, tokenizer, environment, off, step_seeds(off, 0)) == (step_seeds(off, 0), 0)
    assert len(step_seeds(off, 0)) == 3


def test_environment_tokens_are_masked_token_by_token(smollm2_tokenizer: object) -> None:
    tokenizer = smollm2_tokenizer
    family = load_families()["precondition_verification"]
    instance = Environment(family, TOOLS).instance(3)
    layout = demonstration(tokenizer, instance)
    assert layout.rollout.reward == 1.0
    # Runs of trained tokens are exactly the solution's assistant turns, each closed by <|im_end|>.
    runs, current = [], []
    for token, trained in zip(layout.completion_ids, layout.env_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    solution = [message["content"] for message in Environment(family, TOOLS).instance(3).solution()]
    assert [tokenizer.decode(run) for run in runs] == [f"{text}<|im_end|>" for text in solution]
    # Everything else is the template around the environment's messages (tool results, user turns).
    masked = tokenizer.decode([t for t, trained in zip(layout.completion_ids, layout.env_mask) if not trained])
    for message, from_policy in zip(layout.rollout.messages, layout.rollout.from_policy):
        if not from_policy and message["role"] in ("tool", "user") and message is not layout.rollout.messages[1]:
            assert message["content"] in masked
    # The full sequence is the chat template's own rendering of the conversation.
    last_policy = max(i for i, flag in enumerate(layout.rollout.from_policy) if flag)
    rendered = ChatTokens(tokenizer).render(layout.rollout.messages[: last_policy + 1], generation_prompt=False)
    assert tokenizer.decode(layout.prompt_ids + layout.completion_ids) == rendered.rstrip("\n")


def test_a_tiny_model_learns_a_trivially_learnable_environment_and_the_clip_binds(peaked: Path, tmp_path: Path) -> None:
    def success(model, tokenizer) -> float:  # type: ignore[no-untyped-def]
        rollouts = generate_rollouts(model, tokenizer, [LETTER.instance(seed) for seed in range(64)], Sampling(max_new_tokens=1), seed=3)
        return sum(item.rollout.success for item in rollouts) / len(rollouts)

    base, tokenizer = models.load(str(peaked), tmp_path / "cache")
    before = success(base, tokenizer)
    config = _config(steps=8, group_size=4, groups_per_step=4, learning_rate=2e-2, save_steps=100, num_iterations=2)
    trained = train(LETTER, peaked, tmp_path / "run", config)
    report = trained.report
    after = success(trained.model, trained.tokenizer)
    assert 0.2 < before < 0.8  # the groups had variance to learn from
    assert after >= before + 0.15, (before, after, [step["mean_reward"] for step in report["steps"]])
    assert [step["step"] for step in report["steps"]] == list(range(1, 9))
    assert report["recipe"] == "grpo" and trained.warm_started is None
    # Every step plays its 4 groups, and dynamic sampling's extra groups are counted in its rollouts.
    assert all(step["groups"] == 4 + step["resampled"] for step in report["steps"])
    assert report["rollouts"] == 4 * sum(step["groups"] for step in report["steps"]) >= 8 * 16
    # The second pass over each step's rollouts moves the ratio off 1, and the clip binds somewhere;
    # the policy moves away from where GRPO started.
    assert any(step["clip_fraction_max"] > 0 for step in report["steps"] if "clip_fraction_max" in step)
    assert any(abs(step["ratio_mean"] - 1) > 1e-4 for step in report["steps"])
    assert report["steps"][0]["kl"] == 0 and any(step["kl"] > 0 for step in report["steps"][1:])


def test_guided_rollouts_start_from_the_solution_and_train_its_tokens(tiny_model: Path) -> None:
    config = _config(max_new_tokens=8)
    model, tokenizer = load_policy(tiny_model, config)
    environment = Environment(load_families()["precondition_verification"], TOOLS)
    instances = [environment.instance(seed) for seed in range(6)]
    solution = [demonstration(tokenizer, environment.instance(seed)) for seed in range(6)]
    rollouts = generate_rollouts(model, tokenizer, instances, Sampling(8, 1.0), guided=[True] * 6, seed=4)
    lengths = set()
    for item, reference in zip(rollouts, solution, strict=True):
        forced = item.forced_tokens
        assert forced > 0
        lengths.add(forced)
        # The forced tokens are the solution's first policy tokens, in order, and they are trained.
        trained = [token for token, flag in zip(item.completion_ids, item.env_mask, strict=True) if flag]
        expected = [token for token, flag in zip(reference.completion_ids, reference.env_mask, strict=True) if flag]
        assert trained[:forced] == expected[:forced]
    assert len(lengths) > 1  # the prefix length is drawn per episode


def test_sft_grpo_mixes_guided_rollouts_into_its_groups_when_asked(peaked: Path, tmp_path: Path) -> None:
    # warm_guided_share is sft+grpo's own share; guided_grpo keeps guided_share, plain grpo none.
    common = {"steps": 1, "group_size": 4, "groups_per_step": 2, "resample_groups": 0, "save_steps": 100}
    common |= {"warm_start_examples": 2, "warm_start_epochs": 1}
    guided = {}
    for recipe, share in (("sft+grpo", 0.5), ("sft+grpo", 0.0), ("guided_grpo", 0.5), ("grpo", 0.5)):
        config = _config(recipe=recipe, warm_guided_share=share, guided_share=0.25, **common)
        report = train(LETTER, peaked, tmp_path / f"{recipe}-{share}", config).report
        guided[(recipe, share)] = report["steps"][0]["guided"]
    assert guided == {("sft+grpo", 0.5): 4, ("sft+grpo", 0.0): 0, ("guided_grpo", 0.5): 2, ("grpo", 0.5): 0}
    with pytest.raises(ValidationError):
        TrainingSettings(warm_guided_share=1.5)


def test_a_run_from_a_generalist_rehearses_its_conversations_in_the_warm_start(peaked: Path, tmp_path: Path) -> None:
    from tracefix.trainer.recipes import Rehearsal

    assert [Rehearsal(((),), share).count(96) for share in (0.0, 0.3, 0.5)] == [0, 41, 96]
    assert Rehearsal((), 0.5).count(96) == 0  # nothing to rehearse
    config = _config(recipe="sft", steps=0, warm_start_examples=4, warm_start_epochs=1, warm_start_batch=2)
    first = train(LETTER, peaked, tmp_path / "generalist", config)
    assert first.started_from is None and first.report["warm_start"]["rehearsed"] == 0
    first.model.save_pretrained(str(tmp_path / "saved"))
    conversations = tuple(
        ({"role": "user", "content": f"Say {letter}."}, {"role": "assistant", "content": letter}) for letter in "xyz"
    )  # fmt: skip
    second = train(LETTER, peaked, tmp_path / "targeted", config, starts_from=tmp_path / "saved", rehearsal=Rehearsal(conversations, 0.5))
    # 4 demonstrations and, at half the warm start, 4 conversations drawn in turn: 8 sequences, 4 updates of 2.
    assert {key: second.report["warm_start"][key] for key in ("examples", "rehearsed", "updates")} == {"examples": 8, "rehearsed": 4, "updates": 4}
    # It started from the saved weights, and the run knows them (its evaluation's reference).
    assert second.started_from is not None
    assert all(torch.equal(second.started_from[name], value) for name, value in lora_state(first.model).items())


STEPS = 20  # a step of this tiny model takes a fraction of a second: enough of them that the kill lands mid-run
RESUMABLE = f"""
import sys
from pathlib import Path
from tracefix.daemon.core.settings import TrainingSettings
from tests.learnable import LetterFamily
from tracefix.trainer.environment import Environment
from tracefix.trainer.recipes import train
config = TrainingSettings(recipe="grpo", steps={STEPS}, group_size=4, groups_per_step=1, max_new_tokens=1, save_steps=1, warm_start_examples=0, dtype="float32",
                          validation_seeds=2)
train(Environment(LetterFamily(), [], 1), Path(sys.argv[1]), Path(sys.argv[2]), config, progress=lambda r: print(r, flush=True))
"""


def test_a_killed_run_resumes_from_its_last_checkpoint(peaked: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", RESUMABLE, str(peaked), str(run)], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    checkpoints = run / "checkpoints" / "grpo"
    # Checkpoints older than the last two are deleted: wait for any complete one from step 3 on.
    while time.monotonic() < deadline and int((latest_checkpoint(checkpoints) or Path("checkpoint-0")).name.split("-")[1]) < 3:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    reached = latest_checkpoint(checkpoints)
    assert reached is not None and int(reached.name.split("-")[1]) >= 3
    config = _config(steps=STEPS, group_size=4, groups_per_step=1, save_steps=1, validation_seeds=2)
    report = train(LETTER, peaked, run, config).report
    assert report["resumed_from"] == reached.name
    done = int(reached.name.split("-")[1])
    assert [step["step"] for step in report["steps"]] == list(range(1, STEPS + 1))  # the history travels with the checkpoint
    assert report["rollouts"] == 4 * sum(step["groups"] for step in report["steps"]) >= STEPS * 4
    assert done < STEPS
    # keep_best (on in both runs): every step scored once, the killed run's scores kept, one kept step
    trial = report["tried"][0]
    assert [item["step"] for item in trial["checkpoints"]] == list(range(STEPS + 1))
    assert trial["kept_step"] in range(STEPS + 1)


def test_auto_tries_each_recipe_and_keeps_the_one_that_validates_best(peaked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The warm start learns the letter outright; GRPO at a learning rate this small cannot move, so
    # the GRPO-only recipes stay where the base is, and sft+grpo ties with sft (the cheaper is kept).
    config = _config(
        recipe="auto", steps=1, group_size=4, groups_per_step=1, learning_rate=1e-12, warm_start_examples=16,
        warm_start_epochs=3, warm_start_learning_rate=5e-2, warm_start_batch=4, validation_seeds=24,
    )  # fmt: skip
    progress: list[dict[str, object]] = []
    scorings: list[int] = []
    real_score = recipes.validation_score

    def counted(*args: Any) -> dict[str, Any]:
        scorings.append(1)
        return real_score(*args)

    monkeypatch.setattr(recipes, "validation_score", counted)
    trained = train(LETTER, peaked, tmp_path / "run", config, progress.append)
    tried = {item["recipe"]: item for item in trained.report["tried"]}
    assert list(tried) == ["sft", "sft+grpo", "guided_grpo", "grpo"]
    # keep_best (the default): sft+grpo starts from the sft trial's weights and takes its score as
    # step 0's; the validation seeds are played once for sft, once for sft+grpo's step, twice for
    # each GRPO-only recipe (its start and its step).
    assert tried["sft+grpo"]["checkpoints"][0] == {"step": 0, **tried["sft"]["validation"]}
    assert len(scorings) == 1 + 1 + 2 + 2
    scores = {recipe: item["validation"]["success_rate"] for recipe, item in tried.items()}
    assert scores["sft"] >= scores["grpo"] + 0.3, scores
    assert trained.report["recipe"] == "sft" and trained.report["warm_start"]["examples"] == 16
    assert "warm_start" not in tried["sft+grpo"]  # it went on from the sft trial's weights
    assert {record["recipe"] for record in progress if record.get("phase") == "recipe"} == set(tried)
    # A stopped run keeps its finished trials: running again trains nothing new.
    again = train(LETTER, peaked, tmp_path / "run", config)
    assert [item["recipe"] for item in again.report["tried"]] == list(tried) and again.report["recipe"] == "sft"


def _scripted(rates: list[float], calls: list[int]) -> Any:
    """A judge that returns the given validation success rates in turn and counts its calls."""

    def judge() -> dict[str, Any]:
        calls.append(1)
        return {"seeds": 4, "success_rate": rates[len(calls) - 1], "mean_reward": rates[len(calls) - 1]}

    return judge


def test_keep_best_ends_on_the_checkpoint_that_validated_best_and_a_resumed_run_keeps_the_scores(peaked: Path, tmp_path: Path) -> None:
    config = _config(steps=3, group_size=4, groups_per_step=2, save_steps=1, learning_rate=5e-2)
    model, tokenizer = _policy_with_a_nonzero_adapter(peaked, config)
    weights: dict[int, dict[str, Any]] = {0: lora_state(model)}
    calls: list[int] = []
    told: list[dict[str, Any]] = []

    def remember(record: dict[str, Any]) -> None:
        if record["phase"] == "grpo":
            weights[record["step"]] = lora_state(model)
        else:
            told.append(record)

    # Steps 0-3 score 0.50, 0.75, 0.50, 0.75: step 1 is best, and step 3 only ties it, so step 1 stays.
    report = grpo(model, tokenizer, LETTER, config, tmp_path / "run", remember, judge=_scripted([0.5, 0.75, 0.5, 0.75], calls))
    assert len(calls) == 4 and [item["step"] for item in report["checkpoints"]] == [0, 1, 2, 3]
    assert report["kept_step"] == 1
    # each score is told as it is made: the step, its score and the best step so far
    assert [(item["phase"], item["step"], item["success_rate"], item["best_step"]) for item in told] == [
        ("checkpoint", 0, 0.5, 0), ("checkpoint", 1, 0.75, 1), ("checkpoint", 2, 0.5, 1), ("checkpoint", 3, 0.75, 1)]
    assert any((weights[3][name] - weights[1][name]).abs().max() > 0 for name in weights[1])  # the steps moved the weights
    for name, tensor in lora_state(model).items():
        torch.testing.assert_close(tensor, weights[1][name], msg=name)  # ...and the run ended on step 1's
    assert [path.name for path in (tmp_path / "run").glob("best-*.safetensors")] == ["best-1.safetensors"]

    # Two more steps resume from checkpoint-3: the four scores so far are kept, only steps 4 and 5
    # are scored, and step 5 beats step 1.
    config = _config(steps=5, group_size=4, groups_per_step=2, save_steps=1, learning_rate=5e-2)
    calls.clear()
    report = grpo(model, tokenizer, LETTER, config, tmp_path / "run", remember, judge=_scripted([0.25, 1.0], calls))
    assert report["resumed_from"] == "checkpoint-3" and len(calls) == 2
    assert [(item["step"], item["success_rate"]) for item in report["checkpoints"]] == [(0, 0.5), (1, 0.75), (2, 0.5), (3, 0.75), (4, 0.25), (5, 1.0)]
    assert report["kept_step"] == 5
    for name, tensor in lora_state(model).items():
        torch.testing.assert_close(tensor, weights[5][name], msg=name)


def test_keep_best_takes_a_known_score_of_the_starting_weights_and_a_resumed_run_does_not(peaked: Path, tmp_path: Path) -> None:
    # The starting weights' score, when the caller has it (auto's sft trial), is step 0's: only the
    # steps are judged, and the run still ends on the best of all of them.
    config = _config(steps=2, group_size=4, groups_per_step=2, save_steps=1, learning_rate=5e-2)
    model, tokenizer = _policy_with_a_nonzero_adapter(peaked, config)
    start = lora_state(model)
    calls: list[int] = []
    known = {"seeds": 4, "success_rate": 0.9, "mean_reward": 0.9}
    report = grpo(model, tokenizer, LETTER, config, tmp_path / "run", judge=_scripted([0.5, 0.75], calls), start_score=known)
    assert len(calls) == 2 and report["checkpoints"] == [{"step": 0, **known}, {"step": 1, "seeds": 4, "success_rate": 0.5, "mean_reward": 0.5},
                                                         {"step": 2, "seeds": 4, "success_rate": 0.75, "mean_reward": 0.75}]  # fmt: skip
    assert report["kept_step"] == 0
    for name, tensor in lora_state(model).items():
        torch.testing.assert_close(tensor, start[name], msg=name)
    # Resumed from checkpoint-2, the weights are not the ones that score was for: it is not taken.
    calls.clear()
    (tmp_path / "run" / "best.json").unlink()
    config = _config(steps=3, group_size=4, groups_per_step=2, save_steps=1, learning_rate=5e-2)
    report = grpo(model, tokenizer, LETTER, config, tmp_path / "run", judge=_scripted([0.25, 0.5], calls), start_score=known)
    assert len(calls) == 2 and [(item["step"], item["success_rate"]) for item in report["checkpoints"]] == [(2, 0.25), (3, 0.5)]


def test_keep_best_scores_on_the_validation_seeds_and_auto_takes_the_kept_score(peaked: Path, tmp_path: Path) -> None:
    # Real validation scoring of the letter environment: the trial lists every scored step, the
    # score kept is the recipe's validation score, and without keep_best GRPO scores nothing.
    config = _config(recipe="auto", steps=2, group_size=4, groups_per_step=1, save_steps=1, validation_seeds=6)
    tried = train(LETTER, peaked, tmp_path / "best", config).report["tried"]
    assert [item["recipe"] for item in tried] == ["guided_grpo", "grpo"]  # no warm start: the GRPO recipes only
    trial = tried[0]
    assert [item["step"] for item in trial["checkpoints"]] == [0, 1, 2] and all(item["seeds"] == 6 for item in trial["checkpoints"])
    kept = next(item for item in trial["checkpoints"] if item["step"] == trial["kept_step"])
    assert max(item["success_rate"] for item in trial["checkpoints"]) == kept["success_rate"]
    assert trial["validation"] == {key: value for key, value in kept.items() if key != "step"}
    plain = train(LETTER, peaked, tmp_path / "last", _config(steps=2, group_size=4, groups_per_step=1, save_steps=1, keep_best=False)).report
    assert "checkpoints" not in plain["tried"][0] and "kept_step" not in plain["tried"][0]
