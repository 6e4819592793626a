"""The token-level mixture of LoRA experts on a tiny random Llama with SmolLM2's tokenizer and three
real LoRA adapters: forced weights reproduce each adapter, the base and exact mixtures; generation
keeps the KV cache; gate training moves tokens to their expert and nothing else; gate files
round-trip and refuse other adapters."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import torch
import peft  # noqa: F401  (installed by make test: never skipped)

from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import Linear as LoraLinear  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from tracefix.trainer.gate import GatedExperts, GateMismatch, gate_adapters  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.gate_training import IGNORE, GateExample, examples_from_trajectories, train_gate  # noqa: E402
from tracefix.trainer.rollouts import ChatTokens  # noqa: E402

ADAPTERS = ["tool_call_precision@v1", "error_recovery@v1", "argument_grounding@v2"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    gguf = models.embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A wide initializer gives the random model logits with range, so greedy choices are not ties.
    directory = models.tiny_random_model(tmp_path_factory.mktemp("tiny"), tokenizer, initializer_range=0.2)
    _, tokenizer = models.load(str(directory), tmp_path_factory.mktemp("cache"))
    return directory, tokenizer


def _experts(directory: Path) -> object:
    """The tiny model with three LoRA adapters whose B matrices are random (seeded), so each changes
    the logits differently."""
    base = AutoModelForCausalLM.from_pretrained(directory)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.1)
    model = get_peft_model(base, config, adapter_name=ADAPTERS[0])
    for name in ADAPTERS[1:]:
        model.add_adapter(name, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval()


@pytest.fixture
def experts(tiny: tuple[Path, object]) -> object:
    return _experts(tiny[0])


def _ids(seed: int, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(100, 5000, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model: object, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def _one_hot(slot: int) -> list[float]:
    return [1.0 if index == slot else 0.0 for index in range(1 + len(ADAPTERS))]


def test_forced_weights_reproduce_each_adapter_alone_and_the_base(experts: object) -> None:
    input_ids = _ids(1)
    with experts.disable_adapter():
        base = _logits(experts, input_ids)
    alone = {}
    for name in ADAPTERS:
        experts.set_adapter(name)
        alone[name] = _logits(experts, input_ids)
        assert (alone[name] - base).abs().max() > 0.5  # each adapter really changes the model
    gated = GatedExperts(experts, ADAPTERS)
    for slot, name in enumerate(ADAPTERS, start=1):
        with gated.override(_one_hot(slot)):
            torch.testing.assert_close(_logits(experts, input_ids), alone[name], atol=1e-5, rtol=0)
    with gated.override({"base": 1.0}):
        torch.testing.assert_close(_logits(experts, input_ids), base, atol=1e-5, rtol=0)
    with experts.disable_adapter():  # PEFT's own switch still serves the base
        torch.testing.assert_close(_logits(experts, input_ids), base, atol=1e-5, rtol=0)


def test_an_even_mix_of_two_adapters_adds_half_of_each_delta(tiny: tuple[Path, object], experts: object) -> None:
    input_ids = _ids(2)
    # The reference merges base + 0.5·s₁B₁A₁ + 0.5·s₂B₂A₂ into a plain copy of the base weights.
    reference = AutoModelForCausalLM.from_pretrained(tiny[0]).eval()
    with torch.no_grad():
        for name, module in experts.get_base_model().named_modules():
            if isinstance(module, LoraLinear):
                delta = sum(
                    0.5 * module.scaling[adapter] * module.lora_B[adapter].weight @ module.lora_A[adapter].weight
                    for adapter in ADAPTERS[:2]
                )
                reference.get_submodule(name).weight += delta
    expected = _logits(reference, input_ids)
    gated = GatedExperts(experts, ADAPTERS)
    with gated.override({ADAPTERS[0]: 0.5, ADAPTERS[1]: 0.5}):
        mixed = _logits(experts, input_ids)
    torch.testing.assert_close(mixed, expected, atol=1e-5, rtol=0)
    for slot in (1, 2):
        with gated.override(_one_hot(slot)):
            assert (_logits(experts, input_ids) - mixed).abs().max() > 0.1  # a mix, not one adapter


def test_generation_with_the_kv_cache_matches_generation_without_it(experts: object) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a sharp random gate: the routing changes from token to token
        for gate in gated.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator))
            gate.bias.zero_()
    passes = []
    hook = experts.get_base_model().get_decoder().layers[0].register_forward_pre_hook(lambda *_: passes.append(1))
    prompt = _ids(4, batch=1, length=10)
    runs = {}
    for use_cache in (True, False):
        passes.clear()
        output = gated.generate(
            input_ids=prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, use_cache=use_cache,
            output_scores=True, return_dict_in_generate=True, pad_token_id=0,
        )
        runs[use_cache] = (output.sequences, torch.stack(output.scores), len(passes), gated.expert_shares())
    hook.remove()
    assert torch.equal(runs[True][0], runs[False][0])
    torch.testing.assert_close(runs[True][1], runs[False][1], atol=1e-4, rtol=0)
    assert runs[True][2] == 16  # one pass per generated token
    assert runs[True][3] == pytest.approx(runs[False][3], abs=1e-5)
    with torch.no_grad():
        experts(input_ids=runs[True][0])
    chosen = gated.token_shares()[0].argmax(-1)
    assert len(set(chosen.tolist())) >= 2  # the gate really routed different tokens differently
    with gated.override({"base": 1.0}):
        base = gated.generate(input_ids=prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    assert not torch.equal(base, runs[True][0])  # and the routing changed what was generated


def test_expert_shares_average_the_weights_over_generated_tokens(experts: object) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    assert gated.expert_shares() == {}
    forced = {"base": 0.25, ADAPTERS[0]: 0.5, ADAPTERS[2]: 0.25}
    with gated.override(forced):
        gated.generate(input_ids=_ids(5, batch=2), max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert gated.expert_shares() == pytest.approx({"base": 0.25, ADAPTERS[0]: 0.5, ADAPTERS[1]: 0.0, ADAPTERS[2]: 0.25})
    with pytest.raises(ValueError, match="unknown slots"), gated.override({"nonexistent@v1": 1.0}):
        pass


def test_the_base_slot_dominates_an_untrained_gate(experts: object) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    _logits(experts, _ids(6, batch=4, length=32))
    assert gated.token_shares()[..., 0].min() > 0.9
    gated.generate(input_ids=_ids(7, batch=1), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert gated.expert_shares()["base"] > 0.9


def _capability_sequences(count: int, seed: int) -> list[GateExample]:
    """Sequences alternating between two capabilities, each drawn from its own vocabulary;
    every token labelled with its capability's slot (1 or 2)."""
    rng = random.Random(seed)
    vocabularies = {1: range(1000, 1020), 2: range(2000, 2020)}
    examples = []
    for index in range(count):
        slot = 1 + index % 2
        input_ids = [rng.choice(vocabularies[slot]) for _ in range(16)]
        examples.append(GateExample(input_ids, [slot] * len(input_ids)))
    return examples


def _share_of_label(gated: GatedExperts, examples: list[GateExample]) -> float:
    labels = torch.tensor([example.labels for example in examples])
    _logits(gated.model, torch.tensor([example.input_ids for example in examples]))
    return float(gated.token_shares().gather(-1, labels[..., None]).mean())


def test_training_moves_tokens_to_their_expert_and_changes_only_the_gates(tiny: tuple[Path, object], experts: object) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    held_out = _capability_sequences(8, seed=1)
    before = _share_of_label(gated, held_out)
    frozen = {name: tensor.clone() for name, tensor in experts.state_dict().items()}
    gates = {name: tensor.clone() for name, tensor in gated.gates.state_dict().items()}
    metrics = train_gate(gated, tiny[1], _capability_sequences(32, seed=0), steps=40, lr=5e-2, balance_weight=0.01)
    after = _share_of_label(gated, held_out)
    assert before < 0.1 and after > 0.6, (before, after)
    assert metrics["accuracy"] > metrics["first_accuracy"] and metrics["loss"] < metrics["first_loss"]
    assert all(torch.equal(tensor, frozen[name]) for name, tensor in experts.state_dict().items())
    assert not all(torch.equal(tensor, gates[name]) for name, tensor in gated.gates.state_dict().items())


def test_training_refuses_labels_that_name_no_slot(tiny: tuple[Path, object], experts: object) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    with pytest.raises(ValueError, match="slot"):
        train_gate(gated, tiny[1], [GateExample([1000, 1001], [1, 9])], steps=1)
    with pytest.raises(ValueError, match="labelled"):
        train_gate(gated, tiny[1], [GateExample([1000, 1001], [IGNORE, IGNORE])], steps=1)


def test_gate_weights_round_trip_and_refuse_other_adapters(tiny: tuple[Path, object], experts: object, tmp_path: Path) -> None:
    gated = GatedExperts(experts, ADAPTERS)
    train_gate(gated, tiny[1], _capability_sequences(8, seed=0), steps=3, lr=5e-2)
    path = tmp_path / "gates" / "gate.safetensors"
    gated.save(path)
    assert gate_adapters(path) == ADAPTERS
    input_ids = _ids(8)
    _logits(experts, input_ids)
    shares = gated.token_shares()
    gated.remove()

    restored = GatedExperts(experts, ADAPTERS, seed=99)
    restored.load(path)
    for name, tensor in gated.gates.state_dict().items():
        assert torch.equal(restored.gates.state_dict()[name], tensor)
    _logits(experts, input_ids)
    assert torch.equal(restored.token_shares(), shares)
    restored.remove()

    with pytest.raises(GateMismatch, match="order"):
        GatedExperts(experts, [ADAPTERS[1], ADAPTERS[0], ADAPTERS[2]]).load(path)


def test_a_gate_for_other_adapters_or_no_gate_file_is_refused(experts: object, tmp_path: Path) -> None:
    path = tmp_path / "gate.safetensors"
    two = GatedExperts(experts, ADAPTERS[:2])
    two.save(path)
    two.remove()
    gated = GatedExperts(experts, ADAPTERS)
    with pytest.raises(GateMismatch, match=r"tool_call_precision@v1', 'error_recovery@v1'\]"):
        gated.load(path)
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(GateMismatch, match="not a gate file"):
        gated.load(tmp_path / "weights.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"not a gate")
    with pytest.raises(GateMismatch, match="not a safetensors file"):
        gated.load(tmp_path / "text.safetensors")


def test_removing_the_gate_restores_the_plain_peft_model(experts: object) -> None:
    input_ids = _ids(9)
    experts.set_adapter(ADAPTERS[1])
    plain = _logits(experts, input_ids)
    gated = GatedExperts(experts, ADAPTERS)
    assert not torch.equal(_logits(experts, input_ids), plain)
    with pytest.raises(ValueError, match="already gated"):
        GatedExperts(experts, ADAPTERS)
    gated.remove()
    assert torch.equal(_logits(experts, input_ids), plain)


def test_adapters_the_gate_cannot_mix_exactly_are_refused(tiny: tuple[Path, object]) -> None:
    cases = {
        "LoRA variant": LoraConfig(r=4, target_modules=TARGETS, use_dora=True),
        "outside the decoder layers": LoraConfig(r=4, target_modules=[*TARGETS, "lm_head"]),
        "share target modules": LoraConfig(r=4, target_modules=["q_proj"]),
    }
    for reason, config in cases.items():
        model = _experts(tiny[0])
        model.add_adapter("odd@v1", config)
        with pytest.raises(ValueError, match=reason):
            GatedExperts(model, [ADAPTERS[0], "odd@v1"])
        assert "forward" not in vars(model.get_base_model().model.layers[0].self_attn.q_proj)  # nothing installed
    with pytest.raises(ValueError, match="not loaded"):
        GatedExperts(_experts(tiny[0]), [ADAPTERS[0], "missing@v1"])


def test_trajectories_become_examples_labelled_on_assistant_tokens(tiny: tuple[Path, object]) -> None:
    tokenizer = tiny[1]
    messages = [
        {"role": "system", "content": "You are a shop assistant."},
        {"role": "user", "content": "Cancel order 7."},
        {"role": "assistant", "content": '<tool_call>{"name": "get_order"}</tool_call>'},
        {"role": "tool", "content": '{"status": "open"}'},
        {"role": "assistant", "content": "Order 7 is cancelled."},
    ]
    [example] = examples_from_trajectories(tokenizer, [(messages, 2), ([messages[0]], 1)])
    chat = ChatTokens(tokenizer)
    rendered = chat.render(messages, generation_prompt=False)
    assert tokenizer.decode(example.input_ids) == rendered[: rendered.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]
    labelled = [token for token, label in zip(example.input_ids, example.labels, strict=True) if label == 2]
    eos = tokenizer.eos_token
    assert tokenizer.decode(labelled) == f'<tool_call>{{"name": "get_order"}}</tool_call>{eos}Order 7 is cancelled.{eos}'
    assert set(example.labels) == {IGNORE, 2}
