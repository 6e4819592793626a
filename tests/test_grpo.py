"""GRPO through TRL with tracefix's rollouts: the advantages and masks TRL trains on are the paper's,
token by token; a tiny model learns a trivially learnable environment; a killed run resumes.

The tiny models here are random 2-layer Llamas with SmolLM2's tokenizer (seconds per step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from tests.learnable import LetterFamily  # noqa: E402
from trainer import model as models  # noqa: E402
from trainer.environment import Environment, load_tools  # noqa: E402
from trainer.families import load_families  # noqa: E402
from trainer.grpo import TrainConfig, advantages, build_trainer, group_stats, latest_checkpoint, train  # noqa: E402
from trainer.rollouts import ChatTokens, Sampling, demonstration, generate_rollouts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "airline.json").read_text()))
LETTER = Environment(LetterFamily(), [], 1)


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


def test_the_recipe_is_named_from_the_configuration() -> None:
    assert TrainConfig(steps=0, warm_start_examples=24).recipe == "sft"
    assert TrainConfig(steps=5, warm_start_examples=24).recipe == "sft+grpo"
    assert TrainConfig(steps=5, warm_start_examples=0).recipe == "grpo"


def test_trl_trains_on_our_rewards_masks_and_plain_prompts(peaked: Path, tmp_path: Path) -> None:
    config = TrainConfig(steps=1, group_size=4, groups_per_step=2, max_new_tokens=1, hint_share=0.5)
    trainer, callback, _ = build_trainer(LETTER, peaked, tmp_path, config)
    batch = trainer._generate_and_score_completions([{"prompt": f"seed {seed}"} for seed in (5, 5, 5, 5, 6, 6, 6, 6)])
    rollouts = callback.rollouts.last_rollouts
    rewards = [item.rollout.reward for item in rollouts]
    assert batch["advantages"].tolist() == pytest.approx(advantages(rewards, 4), abs=1e-4)
    stats = callback.rollouts.last
    assert stats.zero_variance_groups == sum(len(set(rewards[i : i + 4])) == 1 for i in (0, 4))
    # Two of each group's four rollouts were sampled with the hint, all are trained on the plain prompt.
    assert [item.hinted for item in rollouts] == [True, True, False, False] * 2
    chat = ChatTokens(trainer.processing_class)
    plain = chat.opening(LETTER.instance(5).reset())
    for row, item in enumerate(rollouts[:4]):
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        assert prompt == plain and "Hint" not in trainer.processing_class.decode(prompt)
        width = len(item.completion_ids)
        assert batch["completion_ids"][row][:width].tolist() == item.completion_ids
        assert batch["tool_mask"][row][:width].tolist() == item.env_mask


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


def test_a_tiny_model_learns_a_trivially_learnable_environment(peaked: Path, tmp_path: Path) -> None:
    def success(model, tokenizer) -> float:  # type: ignore[no-untyped-def]
        rollouts = generate_rollouts(model, tokenizer, [LETTER.instance(seed) for seed in range(64)], Sampling(max_new_tokens=1), seed=3)
        return sum(item.rollout.success for item in rollouts) / len(rollouts)

    base, tokenizer = models.load(str(peaked), tmp_path / "cache")
    before = success(base, tokenizer)
    config = TrainConfig(steps=8, group_size=4, groups_per_step=4, max_new_tokens=1, learning_rate=2e-2, save_steps=100)
    model, tokenizer, report = train(LETTER, peaked, tmp_path / "run", config)
    after = success(model, tokenizer)
    assert 0.2 < before < 0.8  # the groups had variance to learn from
    assert after >= before + 0.15, (before, after, [step["mean_reward"] for step in report["steps"]])
    assert [step["step"] for step in report["steps"]] == list(range(1, 9))
    assert report["rollouts"] == 8 * 16


RESUMABLE = """
import sys
from pathlib import Path
from tests.learnable import LetterFamily
from trainer.environment import Environment
from trainer.grpo import TrainConfig, train
config = TrainConfig(steps=6, group_size=4, groups_per_step=1, max_new_tokens=1, save_steps=1)
train(Environment(LetterFamily(), [], 1), Path(sys.argv[1]), Path(sys.argv[2]), config, progress=lambda r: print(r, flush=True))
"""


def test_a_killed_run_resumes_from_its_last_checkpoint(peaked: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", RESUMABLE, str(peaked), str(run)], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run / "checkpoints" / "checkpoint-3" / "trainer_state.json").exists():
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    reached = latest_checkpoint(run / "checkpoints")
    assert reached is not None and int(reached.name.split("-")[1]) >= 3
    config = TrainConfig(steps=6, group_size=4, groups_per_step=1, max_new_tokens=1, save_steps=1)
    _, _, report = train(LETTER, peaked, run, config)
    assert report["resumed_from"] == reached.name
    done = int(reached.name.split("-")[1])
    assert [step["step"] for step in report["steps"]] == list(range(done + 1, 7))
