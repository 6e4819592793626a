"""The GRPO policy loss against the plain computation it replaces: one group's shared opening run
once and its rollouts in micro-batches give the loss and the LoRA gradients of one plain forward
and backward pass over every row; several passes move the ratio off 1 so the clip binds.

On a real (tiny, random) Llama with a PEFT adapter whose B matrices are not zero."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tracefix.trainer.policy_loss import Completion, LossStats, group_backward, group_logprobs

PROMPT = 40


@pytest.fixture
def adapted(tiny_model: Path) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():  # a fresh LoRA's B is zero, which would zero every gradient but B's
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    model.train()
    return model


def _group(lengths: list[int], seed: int = 0) -> tuple[list[int], list[Completion]]:
    """A prompt and completions of the given lengths: policy tokens, then an environment answer
    (masked), then policy tokens again; advantages of both signs."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(10, 4000, (PROMPT,), generator=generator).tolist()
    completions = []
    for index, length in enumerate(lengths):
        ids = torch.randint(10, 4000, (length,), generator=generator).tolist()
        mask = [0 if length // 3 <= position < length // 2 else 1 for position in range(length)]
        completions.append(Completion(ids, mask, advantage=(-1.0) ** index * (0.5 + index / 4)))
    return prompt, completions


def _plain_loss(
    model: Any, prompt: list[int], completions: list[Completion], epsilon: float, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row prompt + completion through the model, right-padded; the same token loss written
    out directly, on the distribution sampled at ``temperature``. Returns (loss, per-token
    log-probs of the first row)."""
    width = PROMPT + max(len(item.ids) for item in completions)
    ids = torch.zeros((len(completions), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, item in enumerate(completions):
        ids[row, : PROMPT + len(item.ids)] = torch.tensor(prompt + item.ids)
        attention[row, : PROMPT + len(item.ids)] = 1
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
    logprobs = torch.log_softmax(logits[:, :-1].float() / temperature, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    total, tokens = torch.zeros(()), 0
    for row, item in enumerate(completions):
        own = logprobs[row, PROMPT - 1 : PROMPT - 1 + len(item.ids)]
        trained = torch.tensor(item.mask, dtype=torch.bool)
        old = own.detach().clone()
        if item.old is not None:  # the policy tokens' log-probs
            old[trained] = item.old
        ratio = torch.exp(own - old)
        surrogate = torch.minimum(ratio * item.advantage, ratio.clamp(1 - epsilon, 1 + epsilon) * item.advantage)
        total = total - surrogate[trained].sum()
        tokens += int(trained.sum())
    return total / tokens, logprobs[0, PROMPT - 1 : PROMPT - 1 + len(completions[0].ids)]


def _gradients(model: Any) -> dict[str, torch.Tensor]:
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.requires_grad}


@pytest.mark.parametrize(("micro_batch", "temperature"), [(1, 1.0), (2, 1.0), (4, 1.0), (2, 0.7)])
def test_the_shared_prefix_micro_batched_loss_equals_one_plain_pass(adapted: Any, micro_batch: int, temperature: float) -> None:
    prompt, completions = _group([9, 23, 14, 17])
    adapted.zero_grad()
    plain, first_row = _plain_loss(adapted, prompt, completions, 0.2, temperature)
    plain.backward()
    expected = _gradients(adapted)

    adapted.zero_grad()
    tokens = sum(sum(item.mask) for item in completions)
    stats = group_backward(adapted, prompt, completions, tokens, micro_batch=micro_batch, temperature=temperature)
    got = _gradients(adapted)

    assert stats.tokens == tokens and stats.clipped == 0
    assert stats.ratio == pytest.approx(tokens)  # first pass: the ratio is 1 on every token
    assert stats.loss == pytest.approx(float(plain.detach()), abs=1e-5)
    # The old log-probs kept are the policy tokens' alone.
    first_trained = torch.tensor(completions[0].mask, dtype=torch.bool)
    torch.testing.assert_close(completions[0].old, first_row.detach()[first_trained], atol=1e-5, rtol=1e-4)
    for name, gradient in expected.items():
        assert float(gradient.abs().max()) > 0, name  # every LoRA matrix gets a gradient, through the prefix too
        torch.testing.assert_close(got[name], gradient, atol=1e-6, rtol=1e-4, msg=name)


def test_no_grad_logprobs_are_those_the_loss_trains_from(adapted: Any) -> None:
    prompt, completions = _group([12, 5, 30])
    rows = [item.ids for item in completions]
    assert [len(row) for row in group_logprobs(adapted, prompt, rows, micro_batch=1)] == [12, 5, 30]
    one, two = group_logprobs(adapted, prompt, rows, micro_batch=1), group_logprobs(adapted, prompt, rows, micro_batch=3)
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    _, first_row = _plain_loss(adapted, prompt, completions, 0.2)
    torch.testing.assert_close(one[0], first_row.detach(), atol=1e-5, rtol=1e-4)
    # Rollouts sampled at a temperature are scored on the distribution they were sampled from.
    _, tempered = _plain_loss(adapted, prompt, completions, 0.2, temperature=0.7)
    cooled = group_logprobs(adapted, prompt, rows, micro_batch=2, temperature=0.7)
    torch.testing.assert_close(cooled[0], tempered.detach(), atol=1e-5, rtol=1e-4)
    assert float((cooled[0] - one[0]).abs().max()) > 1e-3


def test_a_second_pass_over_the_same_rollouts_moves_the_ratio_and_the_clip_binds(adapted: Any) -> None:
    prompt, completions = _group([20, 20, 20, 20], seed=3)
    tokens = sum(sum(item.mask) for item in completions)
    optimizer = torch.optim.SGD([parameter for parameter in adapted.parameters() if parameter.requires_grad], lr=2.0)
    passes = []
    for _ in range(2):
        optimizer.zero_grad()
        stats = group_backward(adapted, prompt, completions, tokens, micro_batch=2, epsilon=0.05)
        optimizer.step()
        passes.append(stats.summary())
    assert passes[0]["clip_fraction"] == 0 and passes[0]["ratio_mean"] == pytest.approx(1.0)
    assert passes[1]["clip_fraction"] > 0 and passes[1]["ratio_mean"] != pytest.approx(1.0, abs=1e-4)


def test_the_kl_to_the_reference_is_zero_at_the_reference_and_positive_away_from_it(adapted: Any) -> None:
    prompt, completions = _group([15, 15], seed=5)
    reference = group_logprobs(adapted, prompt, [item.ids for item in completions], micro_batch=2, masks=[item.mask for item in completions])
    assert [len(logprobs) for logprobs in reference] == [sum(item.mask) for item in completions]
    for item, logprobs in zip(completions, reference, strict=True):
        item.reference = logprobs
    tokens = sum(sum(item.mask) for item in completions)
    at_reference = group_backward(adapted, prompt, completions, tokens, beta=0.1)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    moved = LossStats()
    moved.add(group_backward(adapted, prompt, completions, tokens, beta=0.1))
    assert at_reference.summary()["kl"] == pytest.approx(0.0, abs=1e-6)
    assert moved.summary()["kl"] > 1e-4


def test_a_gradient_stopped_at_the_prompt_keeps_the_loss_and_matches_a_detached_prompt(adapted: Any) -> None:
    import copy

    prompt, completions = _group([9, 23, 14], seed=3)
    tokens = sum(sum(item.mask) for item in completions)
    adapted.zero_grad()
    plain, _ = _plain_loss(adapted, prompt, completions, 0.2)
    plain.backward()
    full = _gradients(adapted)

    # The reference: each row on its own after a copy of the prompt's cache (all but its last token)
    # computed without autograd; the last prompt token and the completion run with gradients.
    adapted.zero_grad()
    with torch.no_grad():
        head = adapted(input_ids=torch.tensor([prompt[:-1]]), use_cache=True).cache
    total = torch.zeros(())
    for item in completions:
        ids = torch.tensor([prompt[-1:] + item.ids])
        logits = adapted(input_ids=ids, cache=copy.deepcopy(head), use_cache=True).logits[0, :-1]
        own = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        trained = torch.tensor(item.mask, dtype=torch.bool)
        total = total - (torch.exp(own - own.detach()) * item.advantage)[trained].sum()
    (total / tokens).backward()
    reference = _gradients(adapted)

    adapted.zero_grad()
    fresh = [Completion(item.ids, item.mask, item.advantage) for item in completions]
    stats = group_backward(adapted, prompt, fresh, tokens, micro_batch=2, opening_gradient=False)
    got = _gradients(adapted)

    assert stats.loss == pytest.approx(float(plain.detach()), abs=1e-5)  # the forward pass is exact
    for name in reference:
        torch.testing.assert_close(got[name], reference[name], atol=1e-6, rtol=1e-3, msg=name)
    # The gradient really stops: most LoRA matrices' gradients differ from the exact ones.
    differing = [name for name in full if not torch.allclose(got[name], full[name], atol=1e-6, rtol=1e-3)]
    assert len(differing) > len(full) // 2
