"""Decoding that lets a row go when its turn ends (trainer/decode.py) writes ``generate``'s tokens,
greedy and sampled, with and without an opening shared by the rows, while each decode step runs
only the rows still writing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from tests.conftest import ending_model
from tracefix.trainer.decode import decode
from tracefix.trainer.opening_attention import OpeningCache, opening_attention
from tracefix.trainer.prefix_cache import layout, prefill

OPENING = "You are the support agent of a small airline. " * 6
TAILS = ("Cancel my booking.", "Hi", "Which bags may I bring on board, please?", "Refund", "Change my seat to an aisle seat.")


@pytest.fixture(scope="module")
def base(wide_tiny_model: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(wide_tiny_model).eval()


@pytest.fixture(scope="module")
def model(base: Any, smollm2_tokenizer: Any) -> Any:
    """The wide tiny Llama with its end token raised so that sampled rows end at different steps."""
    return ending_model(base, smollm2_tokenizer.eos_token_id, 9.0)


class _Greedy:
    """What ``decode``'s ``greedy`` rows are for ``generate``: every score but the largest −∞."""

    def __init__(self, rows: list[int]) -> None:
        self.rows = rows

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        rows = scores[self.rows]
        best = rows.argmax(dim=-1, keepdim=True)
        scores[self.rows] = torch.full_like(rows, float("-inf")).scatter(1, best, rows.gather(1, best))
        return scores


def _batch(tokenizer: Any, shared: bool) -> tuple[list[int], Any, Any]:
    opening = tokenizer(OPENING)["input_ids"] if shared else []
    input_ids, mask = layout(opening, [tokenizer(text)["input_ids"] for text in TAILS], tokenizer.eos_token_id)
    return opening, input_ids, mask


def _generated(model: Any, tokenizer: Any, shared: bool, temperature: float, top_p: float, greedy: list[int], seed: int) -> list[list[int]]:
    opening, input_ids, mask = _batch(tokenizer, shared)
    extra: dict[str, Any] = {"cache": OpeningCache(prefill(model, opening))} if shared else {}
    if greedy:
        extra["logits_processor"] = LogitsProcessorList([_Greedy(greedy)])
    torch.manual_seed(seed)
    with torch.no_grad(), opening_attention(model):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=14,
            do_sample=temperature > 0,
            temperature=temperature or None,
            top_p=top_p if temperature else None,
            top_k=None,
            pad_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **extra,
        )
    turns = []
    for row in output[:, input_ids.shape[1] :].tolist():
        turns.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return turns


def _decoded(model: Any, tokenizer: Any, shared: bool, temperature: float, top_p: float, greedy: list[int], seed: int, sizes: list[int]) -> list[list[int]]:
    opening, input_ids, mask = _batch(tokenizer, shared)
    cache = OpeningCache(prefill(model, opening)) if shared else None
    hook = model.model.embed_tokens.register_forward_hook(lambda module, inputs, output: sizes.append(inputs[0].shape[0]))
    torch.manual_seed(seed)
    try:
        with opening_attention(model):
            decoded = decode(
                model, input_ids, mask, cache, max_new_tokens=14, end=tokenizer.eos_token_id, temperature=temperature, top_p=top_p, greedy=greedy, opening=len(opening)
            )
    finally:
        hook.remove()
    return decoded.turns


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "opening shared"])
@pytest.mark.parametrize(
    ("temperature", "top_p", "greedy", "bias"),
    [(0.0, 1.0, [], 4.0), (1.0, 1.0, [], 9.0), (0.7, 0.9, [1, 3], 5.0)],
    ids=["greedy", "sampled", "tempered, top-p, two rows greedy"],
)
def test_decoding_writes_generate_s_tokens_with_only_the_rows_still_writing(
    base: Any, smollm2_tokenizer: Any, shared: bool, temperature: float, top_p: float, greedy: list[int], bias: float
) -> None:
    """The end token's bias is one under which the rows of this way of decoding end at different steps."""
    model = ending_model(base, smollm2_tokenizer.eos_token_id, bias)
    for seed in (0, 1):
        sizes: list[int] = []
        decoded = _decoded(model, smollm2_tokenizer, shared, temperature, top_p, greedy, seed, sizes)
        assert decoded == _generated(model, smollm2_tokenizer, shared, temperature, top_p, greedy, seed)
        lengths = sorted(len(turn) for turn in decoded)
        assert lengths[0] < lengths[-1]  # rows ended at different steps
        # one forward a step, each of the rows that had not yet ended
        assert sizes == [sum(len(turn) > step for turn in decoded) for step in range(lengths[-1])]


def test_the_greedy_rows_of_a_sampled_batch_write_what_greedy_decoding_writes(model: Any, smollm2_tokenizer: Any) -> None:
    greedy = _decoded(model, smollm2_tokenizer, True, 0.0, 1.0, [], 0, [])
    mixed = _decoded(model, smollm2_tokenizer, True, 1.0, 1.0, [0, 2], 0, [])
    assert [mixed[0], mixed[2]] == [greedy[0], greedy[2]]
    assert mixed != greedy  # the other rows were sampled


def test_kept_rows_hold_their_own_columns_as_a_fresh_prefill_would(model: Any, smollm2_tokenizer: Any) -> None:
    """With ``keep`` the cache holds every row again, the finished ones set aside when they left:
    each row's attended columns are the keys of its tail and its turn but the last token."""
    opening, input_ids, mask = _batch(smollm2_tokenizer, True)
    torch.manual_seed(2)
    with opening_attention(model):
        decoded = decode(
            model, input_ids, mask, OpeningCache(prefill(model, opening)), max_new_tokens=14, end=smollm2_tokenizer.eos_token_id, temperature=1.0, opening=len(opening), keep=True
        )
    assert len({len(turn) for turn in decoded.turns}) > 1
    assert decoded.mask.shape[0] == len(TAILS) and decoded.cache.get_seq_length() == len(opening) + decoded.mask.shape[1]
    for row, (text, turn) in enumerate(zip(TAILS, decoded.turns, strict=True)):
        tokens = smollm2_tokenizer(text)["input_ids"] + turn[:-1]
        attended = decoded.mask[row].bool()
        assert int(attended.sum()) == len(tokens)
        fresh = prefill(model, opening + tokens)
        for layer, alone in zip(decoded.cache.layers, fresh.layers, strict=True):
            torch.testing.assert_close(layer.keys[row][:, attended], alone.keys[0][:, len(opening) :], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(layer.values[row][:, attended], alone.values[0][:, len(opening) :], rtol=1e-4, atol=1e-4)


def test_no_new_tokens_is_refused(model: Any, smollm2_tokenizer: Any) -> None:
    _, input_ids, mask = _batch(smollm2_tokenizer, False)
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        decode(model, input_ids, mask, None, max_new_tokens=0, end=smollm2_tokenizer.eos_token_id)
