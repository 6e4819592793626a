"""Linear layers that multiply from a weight packed once where no gradient flows, in float32 and in
bfloat16: the same products within the dtype's rounding, the per-call product wherever autograd
needs it, packed again when the weight changes, and installed on every model the loop loads."""

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
# may differ by about one unit in the last place of the output. float32 products of 64 terms summed
# in another order differ by a few units in the 24th bit.
TOLERANCE = {torch.bfloat16: {"rtol": 2**-7, "atol": 2**-7}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}
# A whole model's logits, through every layer: the same, compounded.
LOGITS_TOLERANCE = {torch.bfloat16: {"rtol": 0.02, "atol": 0.02}, torch.float32: {"rtol": 1e-4, "atol": 1e-4}}


# oneDNN multiplies bfloat16 from packed weights only on a CPU with AVX-512 BW/VL/DQ or AVX-NE-CONVERT
# (Intel since Skylake-SP, AMD since Zen 4). Elsewhere (an AVX2-only CPU such as AMD Zen 3) the
# bfloat16 cases cannot run: the layers there keep the plain bfloat16 product, which the tests below
# without this mark check on every machine. float32 packs wherever torch was built with oneDNN, as
# the CPU builds the project installs are.
BFLOAT16_PATH = {"avx512bw", "avx512vl", "avx512dq"}
needs_packing = pytest.mark.skipif(
    not packed_linear.available(torch.bfloat16), reason="this CPU has no oneDNN bfloat16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT): bfloat16 is not packed here"
)
needs_onednn = pytest.mark.skipif(not packed_linear.available(torch.float32), reason="this torch was built without oneDNN: nothing is packed")
DTYPES = [pytest.param(torch.float32, marks=needs_onednn, id="float32"), pytest.param(torch.bfloat16, marks=needs_packing, id="bfloat16")]


def _layer(dtype: torch.dtype = torch.bfloat16, bias: bool = True, frozen: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(64, 48, bias=bias).to(dtype)
    layer.requires_grad_(not frozen)
    layer.__class__ = PackedLinear  # as pack_linears does where this CPU can pack
    return layer


def _flags_choosing(dtype: torch.dtype) -> frozenset[str]:
    """CPU flags on which ``dtype = "auto"`` resolves to ``dtype``."""
    return frozenset({"amx_bf16"} if dtype == torch.bfloat16 else {"avx2"})


def _packs(dtype: torch.dtype) -> bool:
    try:
        return packed_linear.pack(torch.randn(48, 64, dtype=dtype)).is_mkldnn
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
        return False


def test_packing_is_available_exactly_where_onednn_packs_the_dtype() -> None:
    # The CPU builds of torch the project installs carry oneDNN: float32 packs on any CPU, and
    # whether bfloat16 does is the CPU's.
    assert packed_linear.available(torch.float32) == _packs(torch.float32)
    assert packed_linear.available(torch.float32) == torch.backends.mkldnn.is_available()
    bfloat16 = _packs(torch.bfloat16)
    assert packed_linear.available(torch.bfloat16) == packed_linear.available() == bfloat16
    assert not packed_linear.available(torch.float16)
    if platform.machine() == "x86_64":  # and on x86, that is what the CPU's flags say
        flags = precision.cpu_flags()
        assert bfloat16 == (BFLOAT16_PATH <= flags or "avx_ne_convert" in flags)


def test_without_the_bfloat16_path_bfloat16_products_are_plain_and_float32_ones_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed_linear, "available", lambda dtype=torch.bfloat16: dtype == torch.float32)  # what an AVX2-only CPU answers
    model = nn.Sequential(nn.Linear(64, 48).to(torch.bfloat16), nn.Linear(48, 64))
    pack_linears(model)
    assert type(model[0]) is PackedLinear and type(model[1]) is PackedLinear
    layer = _layer()
    inputs = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(inputs), functional.linear(inputs, layer.weight, layer.bias))
    assert layer._packed is None
    # and a torch without oneDNN keeps every layer as it was
    monkeypatch.setattr(packed_linear, "available", lambda dtype=torch.bfloat16: False)
    plain = nn.Sequential(nn.Linear(64, 48))
    pack_linears(plain)
    assert type(plain[0]) is nn.Linear


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_autograd_a_layer_multiplies_from_its_packed_weight(dtype: torch.dtype) -> None:
    layer = _layer(dtype)
    assert type(layer) is PackedLinear
    inputs = torch.randn(3, 5, 64, dtype=dtype)
    with torch.no_grad():
        output = layer(inputs)
    assert layer._packed is not None and layer._packed.is_mkldnn
    assert output.shape == (3, 5, 48) and output.dtype == dtype
    torch.testing.assert_close(output, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE[dtype])
    # a slice that is not contiguous (a prefill's last position) gives the same rows
    sliced = torch.randn(4, 9, 64, dtype=dtype)[:, -1:]
    with torch.no_grad():
        torch.testing.assert_close(layer(sliced), functional.linear(sliced, layer.weight, layer.bias), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_frozen_layer_under_autograd_with_a_constant_input_is_packed_too(dtype: torch.dtype) -> None:
    layer = _layer(dtype, bias=False)
    inputs = torch.randn(2, 64, dtype=dtype)
    output = layer(inputs)  # grad mode on, but nothing here takes a gradient
    assert layer._packed is not None and not output.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_where_a_gradient_flows_it_is_the_plain_product_and_its_gradient(dtype: torch.dtype) -> None:
    trained = _layer(dtype, frozen=False)
    inputs = torch.randn(2, 7, 64, dtype=dtype)
    output = trained(inputs)
    assert trained._packed is None
    assert torch.equal(output, functional.linear(inputs, trained.weight, trained.bias))
    output.float().sum().backward()
    assert trained.weight.grad is not None and trained.weight.grad.abs().sum() > 0

    frozen = _layer(dtype)  # a LoRA run's base: its input carries the gradient to the adapters below it
    flowing = torch.randn(2, 7, 64, dtype=dtype, requires_grad=True)
    result = frozen(flowing)
    assert frozen._packed is None and result.requires_grad
    result.float().sum().backward()
    expected = frozen.weight.float().sum(dim=0).to(dtype).expand(2, 7, 64)
    torch.testing.assert_close(flowing.grad, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_weight_changed_in_place_or_replaced_is_packed_again(dtype: torch.dtype) -> None:
    layer = _layer(dtype)
    inputs = torch.randn(6, 64, dtype=dtype)
    with torch.no_grad():
        layer(inputs)
        first = layer._packed
        layer.weight.mul_(-2)  # as merging an adapter into the base does
        changed = layer(inputs)
        assert layer._packed is not first
        torch.testing.assert_close(changed, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE[dtype])
        layer.weight = nn.Parameter(torch.ones_like(layer.weight), requires_grad=False)
        replaced = layer(inputs)
        torch.testing.assert_close(replaced, functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE[dtype])
        unchanged = layer._packed
        layer(inputs)
        assert layer._packed is unchanged  # packed once while the weight stays


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_layer_copies_and_saves_without_its_packed_weight(dtype: torch.dtype, tmp_path: Path) -> None:
    layer = _layer(dtype)
    inputs = torch.randn(4, 64, dtype=dtype)
    with torch.no_grad():
        layer(inputs)
        copied = copy.deepcopy(layer)
        assert copied._packed is None and layer._packed is not None
        torch.save(layer, tmp_path / "layer.pt")
        loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
        for other in (copied, loaded):
            torch.testing.assert_close(other(inputs), functional.linear(inputs, layer.weight, layer.bias), **TOLERANCE[dtype])
            assert other._packed is not None and other._packed_of[0] is other.weight


def test_float16_and_a_switched_off_packing_keep_the_plain_product(monkeypatch: pytest.MonkeyPatch) -> None:
    half = _layer(torch.float16)
    inputs = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.equal(half(inputs.half()), functional.linear(inputs.half(), half.weight, half.bias))
    assert half._packed is None
    monkeypatch.setattr(packed_linear, "PACKED", False)
    for dtype in (torch.float32, torch.bfloat16):
        layer = _layer(dtype)
        with torch.no_grad():
            assert torch.equal(layer(inputs.to(dtype)), functional.linear(inputs.to(dtype), layer.weight, layer.bias))
        assert layer._packed is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_linear_layer_of_a_loaded_model_packs(dtype: torch.dtype, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: _flags_choosing(dtype))
    network, tokenizer = models.load(str(tiny_model), tmp_path, "auto")
    assert network.dtype == dtype
    linears = [module for module in network.modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(module) is PackedLinear for module in linears)
    ids = torch.tensor([tokenizer("a short prompt to score")["input_ids"]])
    with torch.no_grad():
        packed = network(input_ids=ids).logits
        assert all(module._packed is not None for module in linears)
        monkeypatch.setattr(packed_linear, "PACKED", False)
        plain = network(input_ids=ids).logits
    torch.testing.assert_close(packed, plain, **LOGITS_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_training_policy_packs_its_frozen_base_and_not_its_adapter(dtype: torch.dtype, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: _flags_choosing(dtype))
    policy, tokenizer = load_policy(tiny_model, TrainingSettings(dtype="auto", device="cpu"))
    bases = [module.base_layer for module in policy.modules() if hasattr(module, "lora_A")]
    adapters = [linear for module in policy.modules() if hasattr(module, "lora_A") for linear in module.lora_A.values()]
    assert bases and all(type(base) is PackedLinear and base.weight.dtype == dtype for base in bases)
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
    torch.testing.assert_close(sampled, trained.detach(), **LOGITS_TOLERANCE[dtype])
