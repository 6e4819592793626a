"""LoRA layers that decode from the adapter merged into a copy of the base weight: PEFT's outputs
within the dtype's rounding wherever no gradient flows, PEFT's own forward and gradients under
autograd, merged again when the adapter or the base changes, and installed on every model the loop
loads an adapter into."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.trainer import adapters, merged_lora, packed_linear, precision
from tracefix.trainer.merged_lora import MergedLoraLinear, merge_lora_products
from tracefix.trainer.model import prepare_products
from tracefix.trainer.recipes import load_policy

IDS = torch.tensor([[1, 17, 256, 4096, 30000, 2, 88, 9]])
# float32: the merged product sums W x + (B A) x in one product, another order of the same sum.
# bfloat16: the merged weight is rounded to 8 bits of mantissa, as a served merged adapter is.
TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.bfloat16: {"rtol": 0.03, "atol": 0.03}}


def _noisy(model: Any, seed: int, adapter: str = "default") -> None:
    """LoRA weights of seeded noise (a fresh adapter's B is zero and would change nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name and f".{adapter}." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def _policy(tiny_model: Path, dtype: torch.dtype, seed: int = 0) -> Any:
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype)
    prepare_products(base)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    merge_lora_products(model)
    _noisy(model, seed)
    return model


def _layers(model: Any) -> list[MergedLoraLinear]:
    return [module for module in model.modules() if isinstance(module, MergedLoraLinear)]


def _peft_logits(model: Any, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> torch.Tensor:
    """The logits from PEFT's own forward (base plus the adapter's branch), no gradient."""
    with monkeypatch.context() as patched, torch.no_grad():
        patched.setattr(merged_lora, "MERGED", False)
        return model(input_ids=IDS, **kwargs).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_autograd_the_merged_product_gives_peft_s_logits(tiny_model: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, dtype)
    layers = _layers(model)
    assert len(layers) == 4 * model.config.num_hidden_layers
    with torch.no_grad():
        merged = model(input_ids=IDS).logits
    assert all(layer._merged is not None and ("default",) in layer._merged for layer in layers)
    # packed for the CPU's matrix units as the base's own products are, where this CPU can pack
    assert all(layer._merged[("default",)][1].is_mkldnn == packed_linear.available(dtype) for layer in layers)
    reference = _peft_logits(model, monkeypatch)
    torch.testing.assert_close(merged, reference, **TOLERANCE[dtype])
    with torch.no_grad(), model.disable_adapter():  # the adapter makes a difference the test can see
        base = model(input_ids=IDS).logits
    # measured: 7e-7 (float32) and 0.007 (bfloat16) of the merged from PEFT's, 0.77 from the base
    assert (base - reference).abs().max() > 10 * (merged - reference).abs().max()


def test_under_autograd_it_is_peft_s_forward_and_gradients(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, torch.float32)
    logits = model(input_ids=IDS).logits
    assert all(layer._merged is None for layer in _layers(model))
    assert torch.equal(logits.detach(), _peft_logits(model, monkeypatch))
    logits.sum().backward()
    assert all(layer.lora_B["default"].weight.grad is not None for layer in _layers(model))


def test_an_adapter_changed_in_place_is_merged_again(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, torch.float32)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=0.05)
    with torch.no_grad():
        before = model(input_ids=IDS).logits
    first = _layers(model)[0]._merged[("default",)][1]
    model(input_ids=IDS).logits.sum().backward()
    optimizer.step()  # in place, as each GRPO step is
    with torch.no_grad():
        after = model(input_ids=IDS).logits
    assert _layers(model)[0]._merged[("default",)][1] is not first
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, _peft_logits(model, monkeypatch), **TOLERANCE[torch.float32])
    kept = _layers(model)[0]._merged[("default",)][1]
    with torch.no_grad():
        model(input_ids=IDS)
    assert _layers(model)[0]._merged[("default",)][1] is kept  # merged once while nothing changes


def test_one_adapter_per_batch_of_a_mixed_model_is_merged_and_mixed_rows_are_peft_s(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, torch.float32)
    model.add_adapter("other", LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    merge_lora_products(model)
    _noisy(model, 1, "other")
    model.eval()
    rows = IDS.expand(2, -1)
    for names in (["other", "other"], ["__base__", "__base__"], ["default", "other"]):
        with torch.no_grad():
            served = model(input_ids=rows, adapter_names=names).logits
        torch.testing.assert_close(served, _peft_logits_rows(model, monkeypatch, rows, names), **TOLERANCE[torch.float32])
    assert list(_layers(model)[0]._merged) == [("other",)]  # the base's rows took the base, the mixed rows PEFT
    with torch.no_grad():  # the two rows of different adapters differ: the mixed batch was not merged as one
        mixed = model(input_ids=rows, adapter_names=["default", "other"]).logits
    assert (mixed[0] - mixed[1]).abs().max() > 1e-3


def _peft_logits_rows(model: Any, monkeypatch: pytest.MonkeyPatch, rows: torch.Tensor, names: list[str]) -> torch.Tensor:
    with monkeypatch.context() as patched, torch.no_grad():
        patched.setattr(merged_lora, "MERGED", False)
        return model(input_ids=rows, adapter_names=names).logits


def test_a_layer_keeps_a_bounded_number_of_merged_adapters(tiny_model: Path) -> None:
    model = _policy(tiny_model, torch.float32)
    config = LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    names = [f"adapter{index}" for index in range(merged_lora._KEEP + 2)]
    for name in names:
        model.add_adapter(name, config)
    merge_lora_products(model)
    model.eval()
    for name in names:
        with torch.no_grad():
            model(input_ids=IDS, adapter_names=[name])
    layer = next(layer for layer in _layers(model) if names[0] in layer.lora_A)
    assert list(layer._merged) == [(name,) for name in names[-merged_lora._KEEP :]]


def test_a_deleted_adapter_s_merged_weight_goes_at_the_next_merge(tiny_model: Path) -> None:
    model = _policy(tiny_model, torch.float32)
    model.add_adapter("v2", LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    merge_lora_products(model)
    model.eval()
    for name in ("default", "v2"):
        with torch.no_grad():
            model(input_ids=IDS, adapter_names=[name])
    assert list(_layers(model)[0]._merged) == [("default",), ("v2",)]
    model.delete_adapter("default")  # as the router unloads an old version
    _noisy(model, 4, "v2")  # the live version changes: merged again, and the deleted one's weight is let go
    with torch.no_grad():
        model(input_ids=IDS, adapter_names=["v2"])
    assert all(list(layer._merged) == [("v2",)] for layer in _layers(model))


def test_a_used_layer_copies_without_its_merged_weights(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, torch.bfloat16)
    with torch.no_grad():
        model(input_ids=IDS)
    copied = copy.deepcopy(model)  # packed weights are opaque tensors that cannot be copied
    assert all(layer._merged is None for layer in _layers(copied))
    with torch.no_grad():
        torch.testing.assert_close(copied(input_ids=IDS).logits, model(input_ids=IDS).logits, **TOLERANCE[torch.bfloat16])


def test_switched_off_it_is_peft_s_forward(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _policy(tiny_model, torch.float32)
    monkeypatch.setattr(merged_lora, "MERGED", False)
    with torch.no_grad():
        model(input_ids=IDS)
    assert all(layer._merged is None for layer in _layers(model))


def test_an_adapter_with_its_own_bias_decodes_by_peft_s_forward(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True, task_type="CAUSAL_LM"))
    merge_lora_products(model)
    _noisy(model, 3)
    with torch.no_grad():
        served = model(input_ids=IDS).logits
    assert all(layer._merged is None for layer in _layers(model))  # the delta weight alone would leave its bias out
    assert torch.equal(served, _peft_logits(model, monkeypatch))


def test_the_loop_s_loaders_install_it(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: frozenset({"amx_bf16"}))
    policy, _ = load_policy(tiny_model, TrainingSettings(dtype="auto", device="cpu"))
    targets = [module for module in policy.modules() if hasattr(module, "lora_A") and isinstance(module, nn.Module) and hasattr(module, "base_layer")]
    assert targets and all(type(module) is MergedLoraLinear for module in targets)
    _noisy(policy, 2)
    base_hash = adapters.base_model_hash(tiny_model)
    directory = tmp_path / "adapter"
    adapters.save_adapter(policy, directory, {"base_model_hash": base_hash})
    served = adapters.load_adapter(AutoModelForCausalLM.from_pretrained(tiny_model), directory, "v1", base_hash)
    loaded = [module for module in served.modules() if hasattr(module, "lora_A") and hasattr(module, "base_layer")]
    assert loaded and all(type(module) is MergedLoraLinear for module in loaded)
