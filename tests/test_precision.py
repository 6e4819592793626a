"""bfloat16 where the hardware multiplies it natively: the dtype chosen from the CPU's flags, one
clear message where it cannot run, and the bfloat16 losses and LoRA gradients against float32's on
a tiny real Llama."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tracefix.daemon.core.settings import TrainingSettings
from tracefix.trainer import model as models
from tracefix.trainer import precision
from tracefix.trainer.policy_loss import Completion, group_backward
from tracefix.trainer.recipes import load_policy
from tracefix.trainer.shared_prefix import shared_prefix_loss

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import ModelShape  # noqa: E402

INTEL_SPR = frozenset("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile".split())
AMD_ZEN4 = frozenset("fpu avx2 avx512f avx512_bf16".split())
OLDER = frozenset("fpu sse4_2 avx2 fma".split())

# Tolerances of bfloat16 against float32 (8 bits of mantissa against 24: a relative rounding of
# 2^-8 per operation): the loss within 1 %, the LoRA gradient pointing the same way (cosine ≥ 0.999)
# and of the same size within 2 %. Measured here: 4e-6, 0.99999 and 0.3 %.
LOSS_TOLERANCE = 0.01
GRADIENT_COSINE = 0.999
GRADIENT_NORM_TOLERANCE = 0.02


def test_cpu_flags_are_read_from_the_first_flags_line_of_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\nbugs\t\t: none\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "avx512f", "avx512_bf16"}
    assert precision.cpu_flags(tmp_path / "missing") == frozenset()


def test_native_bfloat16_is_amx_or_avx512_bf16() -> None:
    assert precision.cpu_bfloat16(INTEL_SPR) == "amx_bf16"
    assert precision.cpu_bfloat16(AMD_ZEN4) == "avx512_bf16"
    assert precision.cpu_bfloat16(OLDER) is None


def test_auto_is_bfloat16_only_where_the_cpu_multiplies_it_natively() -> None:
    assert precision.resolve("auto", "cpu", INTEL_SPR) == "bfloat16"
    assert precision.resolve("auto", "cpu", AMD_ZEN4) == "bfloat16"
    assert precision.resolve("auto", "cpu", OLDER) == "float32"
    assert precision.resolve("float32", "cpu", INTEL_SPR) == "float32"
    assert precision.resolve("bfloat16", "cpu", AMD_ZEN4) == "bfloat16"


def test_bfloat16_asked_of_a_cpu_without_it_is_one_clear_error() -> None:
    with pytest.raises(precision.UnsupportedDtype, match="no native bfloat16.*set dtype = 'auto' or 'float32'"):
        precision.resolve("bfloat16", "cpu", OLDER)
    with pytest.raises(precision.UnsupportedDtype, match="'float16' is not one of"):
        precision.resolve("float16", "cpu", INTEL_SPR)


def test_the_served_model_takes_its_dtype_from_the_cpu_flags(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: AMD_ZEN4)
    network, _ = models.load(str(tiny_model), tmp_path, "auto")
    assert next(network.parameters()).dtype == torch.bfloat16
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: OLDER)
    network, _ = models.load(str(tiny_model), tmp_path, "auto")
    assert next(network.parameters()).dtype == torch.float32
    with pytest.raises(precision.UnsupportedDtype):
        models.load(str(tiny_model), tmp_path, "bfloat16")


def test_training_keeps_lora_weights_float32_beside_a_bfloat16_base(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: INTEL_SPR)
    model, _ = load_policy(tiny_model, TrainingSettings(dtype="auto", device="cpu"))
    frozen = {parameter.dtype for parameter in model.parameters() if not parameter.requires_grad}
    trained = {parameter.dtype for parameter in model.parameters() if parameter.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: OLDER)
    with pytest.raises(precision.UnsupportedDtype, match="no native bfloat16"):
        load_policy(tiny_model, TrainingSettings(dtype="bfloat16", device="cpu"))


# -- numerics: bfloat16 against float32 on the same weights and inputs ------------------------------


def _adapted(tiny_model: Path, dtype: torch.dtype) -> Any:
    """The tiny Llama in ``dtype`` with a float32 LoRA adapter whose B is not zero (seeded: the same
    adapter for both dtypes)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    model.train()
    return model


def _gradient(model: Any) -> torch.Tensor:
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters() if parameter.requires_grad])


def _warm_start_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    opening = torch.randint(10, 4000, (48,), generator=generator)
    ids = torch.cat([opening.expand(2, -1), torch.randint(10, 4000, (2, 24), generator=generator)], dim=1)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0  # the second row is shorter: right padding
    labels = torch.where(torch.arange(ids.shape[1]) >= 60, ids, -100)
    labels[1, -5:] = -100
    return ids, mask, labels


def _warm_start(model: Any) -> tuple[float, torch.Tensor]:
    loss = shared_prefix_loss(model, *_warm_start_batch())
    loss.backward()
    return float(loss.detach()), _gradient(model)


def _grpo(model: Any) -> tuple[float, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(10, 4000, (40,), generator=generator).tolist()
    completions = []
    for advantage in (1.0, -0.5, 0.7):
        ids = torch.randint(10, 4000, (20,), generator=generator).tolist()
        completions.append(Completion(ids, [1] * 8 + [0] * 4 + [1] * 8, advantage))
    stats = group_backward(model, prompt, completions, normaliser=48, micro_batch=2)
    return stats.loss, _gradient(model)


@pytest.mark.parametrize("loss", [_warm_start, _grpo], ids=["warm_start", "grpo"])
def test_bfloat16_loss_and_lora_gradients_agree_with_float32(tiny_model: Path, loss: Any) -> None:
    exact_loss, exact = loss(_adapted(tiny_model, torch.float32))
    half_loss, half = loss(_adapted(tiny_model, torch.bfloat16))
    assert half.dtype == torch.float32  # the LoRA weights' gradients, as the optimizer keeps them
    assert abs(half_loss - exact_loss) <= LOSS_TOLERANCE * abs(exact_loss)
    cosine = torch.nn.functional.cosine_similarity(half.double(), exact.double(), dim=0)
    assert cosine >= GRADIENT_COSINE, float(cosine)
    assert abs(half.norm() - exact.norm()) <= GRADIENT_NORM_TOLERANCE * exact.norm()


def test_a_wrong_gradient_falls_outside_the_tolerance(tiny_model: Path) -> None:
    # What the tolerance can see: the float32 gradient of another batch is not "within" it.
    _, exact = _warm_start(_adapted(tiny_model, torch.float32))
    model = _adapted(tiny_model, torch.float32)
    ids, mask, labels = _warm_start_batch()
    shared_prefix_loss(model, ids.flip(1), mask, labels).backward()
    cosine = torch.nn.functional.cosine_similarity(_gradient(model).double(), exact.double(), dim=0)
    assert cosine < GRADIENT_COSINE


# -- the throughput bench's FLOP count --------------------------------------------------------------


def test_the_bench_counts_a_layers_flops_as_by_hand(tiny_model: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = ModelShape.of(AutoConfig.from_pretrained(tiny_model))
    # tests' tiny Llama: hidden 32, MLP 64, 4 heads of 8, 2 kv heads; per token, 2 FLOPs a weight:
    # q 32·32 + k 32·16 + v 32·16 + o 32·32 + gate 32·64 + up 32·64 + down 64·32 = 9,216 weights
    assert shape.layer_flops == 2 * 9_216
    assert shape.head_flops == 2 * 32 * shape.vocab
    # and the same as every Linear of the decoder stack of the real model, counted from its modules
    network = AutoModelForCausalLM.from_pretrained(tiny_model)
    linears = [module for module in network.model.layers.modules() if isinstance(module, torch.nn.Linear)]
    assert shape.token_flops == sum(2 * module.in_features * module.out_features for module in linears)
    assert shape.linear_flops(10, 3, backward=True) == 2 * (10 * shape.token_flops + 3 * shape.head_flops)
    assert shape.attention_flops(1) == 2 * 4 * 4 * 8  # layers × (scores + values: 2 · 2 FLOPs) × heads × head_dim


def test_the_router_refuses_bfloat16_on_a_cpu_without_it_in_one_line(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from tracefix.daemon.app.cli import main

    monkeypatch.setattr(precision, "cpu_flags", lambda *_: OLDER)
    config = tmp_path / "tracefix.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "store.duckdb"}"\n[model]\nname = "{tiny_model}"\ncache_dir = "{tmp_path}"\ndtype = "bfloat16"\n'
        '[router]\nport = 0\nexport_spans = false\n'
    )
    result = CliRunner().invoke(main, ["router", "--config", str(config)])
    assert result.exit_code == 1
    assert "Error: dtype = 'bfloat16', but this CPU" in result.output and "set dtype = 'auto' or 'float32'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("section", "setting"), [("model", 'dtype = "bfloat16"'), ("training", 'dtype = "bfloat16"\ndevice = "cpu"')])
def test_the_daemon_refuses_at_start_a_dtype_its_jobs_could_not_run(section: str, setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused before anything is opened or started, not when the first job runs hours later.
    from click.testing import CliRunner

    from tracefix.daemon.app.cli import main

    monkeypatch.setattr(precision, "cpu_flags", lambda *_: OLDER)
    store = tmp_path / "store.duckdb"
    config = tmp_path / "tracefix.toml"
    config.write_text(f'[store]\npath = "{store}"\n[{section}]\n{setting}\n')
    result = CliRunner().invoke(main, ["daemon", "--config", str(config)])
    assert result.exit_code == 1
    assert f"Error: [{section}] dtype = 'bfloat16', but this CPU" in result.output and "set dtype = 'auto' or 'float32'" in result.output
    assert "Traceback" not in result.output and not store.exists()


def test_start_up_passes_what_the_cpu_or_a_gpu_job_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: INTEL_SPR)
    precision.check_settings("bfloat16", "bfloat16", "cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda *_: OLDER)
    precision.check_settings("auto", "auto", "auto")  # float32 on this CPU
    precision.check_settings("float32", "bfloat16", "cuda")  # the job asks the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # where CUDA can take an auto job
    precision.check_settings("auto", "bfloat16", "auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(precision.UnsupportedDtype, match=r"^\[training\] dtype = 'bfloat16'"):
        precision.check_settings("auto", "bfloat16", "auto")
