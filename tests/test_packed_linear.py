"""Linear layers that multiply bfloat16 from a weight packed once where no gradient flows: the same
products within bfloat16's rounding, the per-call product wherever autograd needs it, packed again
when the weight changes, and installed on every model the loop loads."""

from __future__ import annotations

import copy
import platform
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.trainer import model as models
from tracefix.trainer import packed_linear, precision
from tracefix.trainer.packed_linear import PackedLinear, pack_linears
from tracefix.trainer.recipes import load_policy

# A bfloat16 product of 64 terms rounds to 8 bits of mantissa; summed in another order its result
# may differ by about one unit in the last place of the output.
TOLERANCE = {"rtol": 2**-7, "atol": 2**-7}


# oneDNN multiplies bfloat16 from packed weights only on a CPU with AVX-512 BW/VL/DQ or AVX-NE-CONVERT
# (Intel since Skylake-SP, AMD since Zen 4). Elsewhere (an AVX2-only CPU such as AMD Zen 3) these
# tests cannot run: the layers there keep the plain product, which the tests below without this mark
# check on every machine.
BFLOAT16_PATH = {"avx512bw", "avx512vl", "avx512dq"}
needs_packing = pytest.mark.skipif(
    not packed_linear.available(), reason="this CPU has no oneDNN bfloat16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT): nothing is packed here"
)


def _layer(dtype: torch.dtype = torch.bfloat16, bias: bool = True, frozen: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(64, 48, bias=bias).to(dtype)
    layer.requires_grad_(not frozen)
    layer.__class__ = PackedLinear  # as pack_linears does where this CPU can pack
    return layer


def test_packing_is_available_exactly_where_onednn_packs_bfloat16() -> None:
    # The CPU builds of torch the project installs carry oneDNN; whether it packs is the CPU's.
    try:
        packs = packed_linear.pack(torch.randn(48, 64, dtype=torch.bfloat16)).is_mkldnn
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
        packs = False
    assert packed_linear.available() == packs
    if platform.machine() == "x86_64":  # and on x86, that is what the CPU's flags say
        flags = precision.cpu_flags()
        assert packs == (BFLOAT16_PATH <= flags or "avx_ne_convert" in flags)


def test_without_the_bfloat16_path_nothing_is_packed_and_products_are_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed_linear, "available", lambda: False)  # what an AVX2-only CPU answers
    model = nn.Sequential(nn.Linear(64, 48).to(torch.bfloat16))
    pack_linears(model)
    assert type(model[0]) is nn.Linear
    layer = _layer()
    inputs = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(inputs), functional.linear(inputs, layer.weight, layer.bias))
    assert layer._packed is None


@needs_packing
def test_without_autograd_a_bfloat16_layer_multiplies_from_its_packed_weight() -> None:
    layer = _layer()
    assert type(layer) is PackedLinear
    inputs = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        output = layer(inputs)
    assert layer._packed is not None and layer._packed.is_mkldnn
    assert output.shape == (3, 5, 48) and output.dtype == torch.bfloat16
    torch.testing.assert_close(output, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE)
    # a slice that is not contiguous (a prefill's last position) gives the same rows
    sliced = torch.randn(4, 9, 64, dtype=torch.bfloat16)[:, -1:]
    with torch.no_grad():
        torch.testing.assert_close(layer(sliced), functional.linear(sliced, layer.weight, layer.bias), **TOLERANCE)


@needs_packing
def test_a_frozen_layer_under_autograd_with_a_constant_input_is_packed_too() -> None:
    layer = _layer(bias=False)
    inputs = torch.randn(2, 64, dtype=torch.bfloat16)
    output = layer(inputs)  # grad mode on, but nothing here takes a gradient
    assert layer._packed is not None and not output.requires_grad


def test_where_a_gradient_flows_it_is_the_plain_product_and_its_gradient() -> None:
    trained = _layer(frozen=False)
    inputs = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    output = trained(inputs)
    assert trained._packed is None
    assert torch.equal(output, functional.linear(inputs, trained.weight, trained.bias))
    output.float().sum().backward()
    assert trained.weight.grad is not None and trained.weight.grad.abs().sum() > 0

    frozen = _layer()  # a LoRA run's base: its input carries the gradient to the adapters below it
    flowing = torch.randn(2, 7, 64, dtype=torch.bfloat16, requires_grad=True)
    result = frozen(flowing)
    assert frozen._packed is None and result.requires_grad
    result.float().sum().backward()
    expected = frozen.weight.float().sum(dim=0).to(torch.bfloat16).expand(2, 7, 64)
    torch.testing.assert_close(flowing.grad, expected, **TOLERANCE)


@needs_packing
def test_a_weight_changed_in_place_or_replaced_is_packed_again() -> None:
    layer = _layer()
    inputs = torch.randn(6, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(inputs)
        first = layer._packed
        layer.weight.mul_(-2)  # as merging an adapter into the base does
        changed = layer(inputs)
        assert layer._packed is not first
        torch.testing.assert_close(changed, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE)
        layer.weight = nn.Parameter(torch.ones_like(layer.weight), requires_grad=False)
        replaced = layer(inputs)
        torch.testing.assert_close(replaced, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE)
        unchanged = layer._packed
        layer(inputs)
        assert layer._packed is unchanged  # packed once while the weight stays


@needs_packing
def test_a_packed_layer_copies_and_saves_without_its_packed_weight(tmp_path: Path) -> None:
    layer = _layer()
    inputs = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(inputs)
        copied = copy.deepcopy(layer)
        assert copied._packed is None and layer._packed is not None
        torch.save(layer, tmp_path / "layer.pt")
        loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
        for other in (copied, loaded):
            torch.testing.assert_close(other(inputs), functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE)
            assert other._packed is not None and other._packed_of[0] is other.weight


def test_float32_and_a_switched_off_packing_keep_the_plain_product(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = torch.randn(5, 64)
    single = _layer(torch.float32)
    with torch.no_grad():
        assert torch.equal(single(inputs), functional.linear(inputs, single.weight, single.bias))
    assert single._packed is None
    monkeypatch.setattr(packed_linear, "PACKED", False)
    half = _layer()
    with torch.no_grad():
        half(inputs.to(torch.bfloat16))
    assert half._packed is None


@needs_packing
def test_every_linear_layer_of_a_loaded_model_packs(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: frozenset({"amx_bf16"}))
    network, tokenizer = models.load(str(tiny_model), tmp_path, "auto")
    linears = [module for module in network.modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(module) is PackedLinear for module in linears)
    ids = torch.tensor([tokenizer("a short prompt to score")["input_ids"]])
    with torch.no_grad():
        packed = network(input_ids=ids).logits
        assert all(module._packed is not None for module in linears)
        monkeypatch.setattr(packed_linear, "PACKED", False)
        plain = network(input_ids=ids).logits
    torch.testing.assert_close(packed, plain, rtol=0.02, atol=0.02)


@needs_packing
def test_a_training_policy_packs_its_frozen_base_and_not_its_adapter(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: frozenset({"amx_bf16"}))
    policy, tokenizer = load_policy(tiny_model, TrainingSettings(dtype="auto", device="cpu"))
    bases = [module.base_layer for module in policy.modules() if hasattr(module, "lora_A")]
    adapters = [linear for module in policy.modules() if hasattr(module, "lora_A") for linear in module.lora_A.values()]
    assert bases and all(type(base) is PackedLinear for base in bases)
    assert adapters and all(type(linear) is nn.Linear and linear.weight.dtype == torch.float32 for linear in adapters)
    ids = torch.tensor([tokenizer("a short prompt to score")["input_ids"]])
    with torch.no_grad():
        sampled = policy(input_ids=ids).logits  # rollouts: packed
    trained = policy(input_ids=ids).logits  # a loss pass: the plain products, gradients to the adapter
    # the layers without an adapter pack their own weight, those with one the merged (trainer.merged_lora)
    unwrapped = [module for module in policy.modules() if type(module) is PackedLinear and all(module is not base for base in bases)]
    assert unwrapped and all(module._packed is not None for module in unwrapped)
    assert all(module._merged[("default",)][1].is_mkldnn for module in policy.modules() if hasattr(module, "_merged"))
    trained.float().sum().backward()
    assert all(linear.weight.grad is not None for linear in adapters)
    torch.testing.assert_close(sampled, trained.detach(), rtol=0.02, atol=0.02)
