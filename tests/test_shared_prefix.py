"""The warm start's shared-prefix loss against the plain forward pass it replaces: the same loss and
the same LoRA gradients, on a real (tiny, random) Llama with a PEFT adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tracefix.trainer.shared_prefix import shared_prefix_length, shared_prefix_loss


def _batch(prefix: int, tails: list[int], pad: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows: one common prefix, then each row's own tail, the second half of it labelled."""
    generator = torch.Generator().manual_seed(seed)
    opening = torch.randint(10, 4000, (prefix,), generator=generator)
    width = prefix + max(tails)
    ids = torch.full((len(tails), width), pad)
    mask = torch.zeros((len(tails), width), dtype=torch.long)
    labels = torch.full((len(tails), width), -100)
    for row, tail in enumerate(tails):
        ids[row, :prefix] = opening
        ids[row, prefix : prefix + tail] = torch.randint(10, 4000, (tail,), generator=generator)
        mask[row, : prefix + tail] = 1
        labels[row, prefix + tail // 2 : prefix + tail] = ids[row, prefix + tail // 2 : prefix + tail]
    return ids, mask, labels


def _plain_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
    targets = labels[:, 1:]
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="sum")
    return total / (targets != -100).sum()


@pytest.fixture
def adapted(tiny_model: Path) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"])
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # LoRA's B starts at zero, which would make every adapter gradient but B's vanish
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    peft_model.train()
    return peft_model


def _gradients(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.requires_grad}


@pytest.mark.parametrize("tails", [[12, 30, 7], [20, 20]])
def test_the_shared_prefix_loss_and_gradients_equal_the_plain_forward_pass(adapted: Any, tails: list[int]) -> None:
    ids, mask, labels = _batch(48, tails)
    assert shared_prefix_length(ids, mask, labels) == 48  # the shortcut is taken, not the fallback
    plain = _plain_loss(adapted, ids, mask, labels)
    expected = _gradients(adapted, plain)
    shared = shared_prefix_loss(adapted, ids, mask, labels)
    got = _gradients(adapted, shared)
    assert torch.allclose(shared, plain, rtol=1e-5, atol=1e-6), (shared.item(), plain.item())
    assert expected.keys() == got.keys() and len(got) > 0
    for name in expected:
        assert torch.allclose(got[name], expected[name], rtol=1e-3, atol=1e-6), name
    assert any(gradient.abs().sum() > 0 for gradient in got.values())


def test_accumulated_batches_are_normalised_by_the_trainers_count(adapted: Any) -> None:
    """With `num_items_in_batch` (gradient accumulation), the sum is divided by that count instead."""
    ids, mask, labels = _batch(40, [10, 16])
    labelled = int((labels[:, 1:] != -100).sum())
    mean = shared_prefix_loss(adapted, ids, mask, labels)
    assert torch.allclose(shared_prefix_loss(adapted, ids, mask, labels, num_items=4 * labelled), mean / 4, rtol=1e-5)


def test_the_prefix_stops_at_the_first_label_padding_and_the_first_difference() -> None:
    ids, mask, labels = _batch(30, [10, 6])
    assert shared_prefix_length(ids, mask, labels) == 30
    early = labels.clone()
    early[1, 20] = ids[1, 20]  # a labelled token inside the common part: it must be predicted, not skipped
    assert shared_prefix_length(ids, mask, early) == 20
    one = ids[:1], mask[:1], labels[:1]
    assert shared_prefix_length(*one) == 30 + 10 // 2  # a single row: everything before its first label
    different = ids.clone()
    different[1, 3] += 1
    assert shared_prefix_length(different, mask, labels) == 3
    left_padded = mask.clone()
    left_padded[1, 0] = 0
    assert shared_prefix_length(ids, left_padded, labels) == 0  # padding is never part of the prefix


def test_short_prefixes_and_single_rows_take_the_plain_pass(adapted: Any) -> None:
    for ids, mask, labels in (_batch(4, [10, 12]), _batch(40, [14])):
        assert torch.allclose(shared_prefix_loss(adapted, ids, mask, labels), _plain_loss(adapted, ids, mask, labels), rtol=1e-5)


def _detached_opening_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, prefix: int) -> torch.Tensor:
    """The reference for a gradient stopped at the opening: each row on its own, after a copy of
    the opening's cache computed without autograd, its losses summed over the batch's labels."""
    import copy

    with torch.no_grad():
        opening = model(input_ids=ids[:1, : prefix - 1], use_cache=True).cache
    total = torch.zeros(())
    for row in range(len(ids)):
        end = int(mask[row].sum())
        logits = model(input_ids=ids[row : row + 1, prefix - 1 : end], cache=copy.deepcopy(opening), use_cache=True).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits.float(), labels[row, prefix:end], ignore_index=-100, reduction="sum")
    return total / (labels != -100).sum()


@pytest.mark.parametrize("tails", [[12, 30, 7], [20]])
def test_a_gradient_stopped_at_the_opening_keeps_the_loss_and_drops_only_the_openings_share(adapted: Any, tails: list[int]) -> None:
    ids, mask, labels = _batch(48, tails, seed=1)
    prefix = shared_prefix_length(ids, mask, labels)  # a single row's runs up to its first label
    assert prefix == (48 if len(tails) > 1 else 48 + tails[0] // 2)
    plain = _plain_loss(adapted, ids, mask, labels)
    full = _gradients(adapted, plain)
    reference = _gradients(adapted, _detached_opening_loss(adapted, ids, mask, labels, prefix))
    stopped = shared_prefix_loss(adapted, ids, mask, labels, opening_gradient=False)
    got = _gradients(adapted, stopped)
    assert torch.allclose(stopped, plain, rtol=1e-5, atol=1e-6), (stopped.item(), plain.item())  # the forward pass is exact
    assert got.keys() == reference.keys() and len(got) > 0
    for name in reference:
        assert torch.allclose(got[name], reference[name], rtol=1e-3, atol=1e-6), name
    # The gradient really stops: the full one differs (it also flows through the opening's activations).
    differing = [name for name in full if not torch.allclose(got[name], full[name], rtol=1e-3, atol=1e-6)]
    assert len(differing) > len(full) // 2
    # What is left still points the same way as the full gradient.
    flat_got = torch.cat([got[name].flatten() for name in full])
    flat_full = torch.cat([full[name].flatten() for name in full])
    assert torch.nn.functional.cosine_similarity(flat_got, flat_full, dim=0) > 0.5


def _head_rows(model: Any, loss: Any) -> list[int]:
    """How many positions reach the output layer in each of its calls while ``loss()`` runs."""
    seen: list[int] = []
    head = model.get_base_model().get_output_embeddings()
    handle = head.register_forward_hook(lambda _module, args, _output: seen.append(args[0].shape[:-1].numel()))
    try:
        loss()
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("opening_gradient", [True, False])
def test_only_the_labelled_positions_reach_the_output_layer(adapted: Any, opening_gradient: bool) -> None:
    ids, mask, labels = _batch(48, [12, 30, 7])
    labelled = int((labels != -100).sum())
    seen = _head_rows(adapted, lambda: shared_prefix_loss(adapted, ids, mask, labels, opening_gradient=opening_gradient))
    # The opening's last position once (its logits predict every row's first tail token), then
    # the tails' labelled positions and no other.
    assert seen == [1, labelled]
    single = _batch(40, [14])
    assert _head_rows(adapted, lambda: shared_prefix_loss(adapted, *single)) == [int((single[2] != -100).sum())]


def test_a_model_that_scales_its_logits_keeps_the_whole_pass(adapted: Any) -> None:
    """The output layer alone would not be the model's logits where the model softcaps or scales
    them, so such a model is run whole (Llama ignores the setting: the loss stays the plain one)."""
    ids, mask, labels = _batch(48, [12, 30, 7])
    adapted.get_base_model().config.final_logit_softcapping = 30.0
    try:
        seen = _head_rows(adapted, lambda: shared_prefix_loss(adapted, ids, mask, labels))
        loss = shared_prefix_loss(adapted, ids, mask, labels)
    finally:
        adapted.get_base_model().config.final_logit_softcapping = None
    assert seen == [1, 3 * 30]
    assert torch.allclose(loss, _plain_loss(adapted, ids, mask, labels), rtol=1e-5, atol=1e-6)


def test_batches_keep_sequences_of_one_opening_together_and_cover_each_once_an_epoch() -> None:
    from tracefix.trainer.shared_prefix import OPENING_KEY, OpeningBatches

    demonstration, conversation = [1] * OPENING_KEY, [2] * OPENING_KEY
    sequences = [[*demonstration, index] for index in range(7)] + [[*conversation, index] for index in range(5)]
    sampler = OpeningBatches(sequences, batch=2, seed=3)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(12)) and len(sampler) == 12
    assert first != second  # shuffled anew each epoch
    assert list(OpeningBatches(sequences, batch=2, seed=3)) == first  # and the same for the same seed
    batches = [first[start : start + 2] for start in range(0, 12, 2)]
    mixed = [batch for batch in batches if len({index < 7 for index in batch}) > 1]
    assert len(mixed) <= 1  # only where a group's odd last sequence meets the other group
    # Where every opening differs, the batches differ from epoch to epoch, as with a plain shuffle.
    distinct = OpeningBatches([[index] * OPENING_KEY for index in range(12)], batch=4, seed=3)
    epochs = [list(distinct) for _ in range(3)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert len({frozenset(frozenset(epoch[start : start + 4]) for start in range(0, 12, 4)) for epoch in epochs}) > 1


def test_the_tails_attend_one_opening_by_the_cascade_with_the_loss_and_gradients_of_copying_it(adapted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracefix.trainer import shared_prefix
    from tracefix.trainer.opening_attention import TailsCache

    ids, mask, labels = _batch(48, [12, 30, 7])
    opening = adapted(input_ids=ids[:1, :48], attention_mask=mask[:1, :48], use_cache=True, logits_to_keep=1).cache
    assert isinstance(shared_prefix.tails_cache(adapted, opening, 3)[0], TailsCache)
    cascaded = shared_prefix_loss(adapted, ids, mask, labels)
    expected = _gradients(adapted, cascaded)
    monkeypatch.setattr(shared_prefix, "CASCADE", False)
    copied = shared_prefix_loss(adapted, ids, mask, labels)
    got = _gradients(adapted, copied)
    assert torch.allclose(cascaded, copied, rtol=1e-5, atol=1e-6)
    for name in expected:
        assert torch.allclose(got[name], expected[name], rtol=1e-3, atol=1e-6), name
