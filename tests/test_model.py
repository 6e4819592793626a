"""Model loading and a model acting in environments, with a tiny random Llama that uses SmolLM2's
real tokenizer (seconds); the real SmolLM2 conversion is the `slow` test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainer import model as models  # noqa: E402
from trainer.environment import Environment, load_tools, rollout  # noqa: E402
from trainer.families import load_families  # noqa: E402
from daemon.core.settings import ValidationSettings  # noqa: E402
from trainer.validation import validate  # noqa: E402

TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "retail.json").read_text()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[object, object]:
    return models.load(str(tiny_model), tmp_path_factory.mktemp("cache"))


def test_a_model_directory_that_is_not_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(models.ModelUnavailable, match="config.json"):
        models.resolve(str(tmp_path), tmp_path / "cache")


def test_model_policy_answers_deterministically_per_seed(tiny: tuple[object, object]) -> None:
    network, tokenizer = tiny
    policy = models.ModelPolicy(network, tokenizer, max_new_tokens=12)
    family = next(f for f in load_families().values() if f.capability == "tool_call_precision")
    messages = Environment(family, TOOLS).instance(2).reset()
    first, again = policy.answer(messages, seed=7), policy.answer(messages, seed=7)
    assert first == again and first["role"] == "assistant"
    assert policy.answer(messages, seed=8)["content"] != first["content"]  # sampling is seeded, not fixed


def test_a_random_model_rolls_out_in_every_family_without_crashing(tiny: tuple[object, object]) -> None:
    network, tokenizer = tiny
    policy = models.ModelPolicy(network, tokenizer, max_new_tokens=12)
    for family in load_families().values():
        instance = Environment(family, TOOLS).instance(1)
        result = rollout(instance, policy.for_rollout(instance, 0), max_turns=2)
        assert 0.0 <= result.reward <= 1.0 and result.reward < 1.0
        assert result.from_policy.count(True) >= 1


def test_the_validation_gate_rejects_a_random_base_model(tiny: tuple[object, object]) -> None:
    network, tokenizer = tiny
    policy = models.ModelPolicy(network, tokenizer, max_new_tokens=8)
    family = next(f for f in load_families().values() if f.capability == "tool_call_precision")
    report = validate(family, TOOLS, policy.for_rollout, ValidationSettings(seeds=2, group_size=2))
    assert not report.passed
    assert report.attempts and all(attempt.verdict == "too_weak" for attempt in report.attempts)


@pytest.mark.slow
def test_the_embedded_smollm2_is_converted_once_and_then_loads_fast(tmp_path: Path) -> None:
    started = time.perf_counter()
    network, tokenizer = models.load(models.EMBEDDED, tmp_path)
    converted = time.perf_counter() - started
    config = json.loads((tmp_path / "SmolLM2-135M-Instruct" / "config.json").read_text())
    assert "quantization_config" not in config
    started = time.perf_counter()
    models.load(models.EMBEDDED, tmp_path)
    assert time.perf_counter() - started < converted
    answer = models.ModelPolicy(network, tokenizer, max_new_tokens=16, temperature=0).answer(
        [{"role": "user", "content": "Say hello."}], seed=0
    )
    assert answer["content"]
