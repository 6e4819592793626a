"""Model loading and a model acting in environments, with a tiny random Llama that uses SmolLM2's
real tokenizer (seconds); the real SmolLM2 conversion is the `slow` test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import torch  # noqa: F401  (installed by make test: never skipped)
import transformers  # noqa: F401  (installed by make test: never skipped)

from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer import packed_linear  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from tracefix.daemon.core.settings import ValidationSettings  # noqa: E402
from tracefix.trainer.rollouts import Sampling, generate_rollouts  # noqa: E402
from tracefix.trainer.validate_job import run_gate  # noqa: E402

TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "retail.json").read_text()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[object, object]:
    return models.load(str(tiny_model), tmp_path_factory.mktemp("cache"))


def test_a_model_directory_that_is_not_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(models.ModelUnavailable, match="config.json"):
        models.resolve(str(tmp_path), tmp_path / "cache")


def _gate(model: str, cache: Path, **gate: object) -> dict[str, object]:
    family = next(f for f in load_families().values() if f.capability == "tool_call_precision")
    settings = {**ValidationSettings(seeds=2, group_size=2).model_dump(), **gate}
    return run_gate(family, TOOLS, {"name": model, "cache_dir": str(cache), "max_new_tokens": 8, "threads": 1}, settings)


def test_a_random_model_rolls_out_in_every_family_in_one_batch(tiny: tuple[object, object]) -> None:
    network, tokenizer = tiny
    instances = [Environment(family, TOOLS).instance(1) for family in load_families().values()]
    played = generate_rollouts(network, tokenizer, instances, Sampling(12, temperature=1.0, max_turns=2))
    assert len(played) == len(instances)
    for item in played:
        assert 0.0 <= item.rollout.reward < 1.0
        assert item.rollout.from_policy.count(True) >= 1


def test_the_validation_gate_rejects_a_random_base_model_and_is_seeded(tiny_model: Path, tmp_path: Path) -> None:
    report = _gate(str(tiny_model), tmp_path)
    assert report["passed"] is False
    assert report["attempts"] and all(attempt["verdict"] == "too_weak" for attempt in report["attempts"])
    assert report["rollouts"] == 4 * len(report["attempts"])
    again = _gate(str(tiny_model), tmp_path)
    assert again["attempts"] == report["attempts"]


def test_hinted_rollouts_in_the_gate_sample_with_the_hint(tiny: tuple[object, object]) -> None:
    """The gate's hinted rollouts are the trainer's hinted episodes: the hint in the context the
    model samples from, the plain prompt recorded."""
    network, tokenizer = tiny
    family = next(f for f in load_families().values() if f.capability == "precondition_verification")
    instance = Environment(family, TOOLS).instance(3)
    hinted, plain = generate_rollouts(
        network, tokenizer, [instance, Environment(family, TOOLS).instance(3)], Sampling(4, temperature=1.0, max_turns=1), hinted=[True, False]
    )
    assert hinted.hinted and not plain.hinted
    assert hinted.prompt_ids == plain.prompt_ids


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
    family = next(f for f in load_families().values() if f.capability == "tool_call_precision")
    (played,) = generate_rollouts(network, tokenizer, [Environment(family, TOOLS).instance(0)], Sampling(16, temperature=0.0, max_turns=1))
    answer = next(message for message, own in zip(played.rollout.messages, played.rollout.from_policy, strict=True) if own)
    assert answer["content"]



def _head_products(head: object, hidden: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """The output layer's logits of ``hidden`` and the products its weight took part in."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as run:
        logits = head(hidden)  # type: ignore[operator]
    return logits, [event.name for event in run.events() if event.name in ("aten::mm", "aten::bmm", "mkldnn::_linear_pointwise")]


def test_the_output_layer_multiplies_a_sliced_last_position_once(tiny: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill that keeps only the last logits slices the last position out of the hidden states.
    With the output layer frozen (a LoRA run's base, a served model) torch multiplies such a slice
    row by row, each against a copy of the whole layer (a bmm over the weight expanded per row). A
    loaded model's output layer makes it one product, with the same logits: from its packed weight
    where this torch packs float32 (``trainer.packed_linear``), else a plain one."""
    network, _ = tiny
    head = network.get_output_embeddings()  # type: ignore[attr-defined]
    hidden = torch.randn(3, 12, head.in_features)[:, -1:, :]
    plain = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    plain.weight = torch.nn.Parameter(head.weight.detach(), requires_grad=False)
    expected, plain_products = _head_products(plain, hidden)
    assert plain_products == ["aten::bmm"]  # what the loaded model avoids
    head.weight.requires_grad_(False)
    try:
        logits, products = _head_products(head, hidden)
        monkeypatch.setattr(packed_linear, "PACKED", False)
        plain_logits, unpacked_products = _head_products(head, hidden)
    finally:
        head.weight.requires_grad_(True)
    assert products == (["mkldnn::_linear_pointwise"] if packed_linear.available(torch.float32) else ["aten::mm"])
    assert unpacked_products == ["aten::mm"]
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(plain_logits, expected)
