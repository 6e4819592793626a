"""Rows after one shared opening attend it once (trainer/opening_attention.py): the split
attention is SDPA's over the whole keys, and a tiny random Llama generates the same tokens from a
shared opening as from the opening copied for every row, without copying it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from trainer import model as models
from trainer import opening_attention as attention
from trainer import rollouts
from trainer.environment import Instance, Message, StepResult, assistant_text
from trainer.opening_attention import NAME, OpeningCache, Split, _OpeningLayer, _split_attention, opening_attention, rows_cache
from trainer.prefix_cache import layout, prefill


class _Module:
    """What the attention functions read of a layer: its grouping of query heads."""

    num_key_value_groups = 3
    is_causal = True


def _keys(rows: int, opening: int, own: int) -> tuple[Split, Split]:
    return tuple(Split(torch.randn(1, 2, opening, 8), torch.randn(rows, 2, own, 8)) for _ in range(2))  # type: ignore[return-value]


def _whole(split: Split) -> torch.Tensor:
    """The keys (or values) as a plain cache holds them: the opening copied for every row."""
    rows = split.own.shape[0]
    return torch.cat([split.opening.expand(rows, -1, -1, -1), split.own], dim=2)


@pytest.mark.parametrize("queries", [1, 5])
def test_the_split_attention_is_sdpa_over_the_whole_keys_with_padding_masked(queries: int) -> None:
    torch.manual_seed(0)
    rows, opening, own = 3, 20, 9
    keys, values = _keys(rows, opening, own)
    query = torch.randn(rows, 6, queries, 8)
    mask = torch.ones(rows, 1, queries, opening + own, dtype=torch.bool)
    mask[1, :, :, opening : opening + 3] = False  # row 1's padding between the opening and its tail
    mask[2, :, :, opening : opening + 1] = False
    mask &= torch.ones(queries, opening + own, dtype=torch.bool).tril(opening + own - queries)  # causal among the queries
    split, _ = _split_attention(_Module(), query, keys, values, mask, scaling=0.3)
    plain, _ = sdpa_attention_forward(_Module(), query, _whole(keys), _whole(values), mask, scaling=0.3)
    assert split.shape == plain.shape == (rows, queries, 6, 8)
    torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-5)
    mask[1, :, :, 0] = False  # a column that matters: the results must part
    assert not torch.allclose(_split_attention(_Module(), query, keys, values, mask, scaling=0.3)[0], split, atol=1e-3)


def test_without_a_mask_the_queries_are_causal_and_end_at_the_last_key() -> None:
    torch.manual_seed(1)
    keys, values = _keys(2, 16, 6)
    query = torch.randn(2, 6, 4, 8)
    causal = torch.ones(4, 22, dtype=torch.bool).tril(22 - 4)[None, None].expand(2, 1, 4, 22)
    split, _ = _split_attention(_Module(), query, keys, values, None)
    plain, _ = sdpa_attention_forward(_Module(), query, _whole(keys), _whole(values), causal)
    torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-5)


def test_plain_keys_go_to_sdpa_unchanged() -> None:
    torch.manual_seed(2)
    query, key, value = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    torch.testing.assert_close(_split_attention(_Module(), query, key, value, mask)[0], sdpa_attention_forward(_Module(), query, key, value, mask)[0])


def test_the_rows_own_keys_grow_in_place_and_are_those_appended() -> None:
    torch.manual_seed(3)
    opening = torch.randn(1, 2, 10, 8)
    layer = _OpeningLayer(opening, opening.clone())
    appended = [torch.randn(3, 2, 5, 8)] + [torch.randn(3, 2, 1, 8) for _ in range(150)]  # past the first buffer
    starts = set()
    for chunk in appended:
        keys, values = layer.update(chunk, chunk * 2)
        starts.add(keys.own.data_ptr())
        assert keys.opening is opening
    whole = torch.cat(appended, dim=2)
    assert torch.equal(keys.own, whole) and torch.equal(values.own, whole * 2)
    assert layer.get_seq_length() == 10 + 155
    assert 1 < len(starts) < 5  # a few buffers, each doubled, not one per step


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    gguf = models.embedded_gguf()
    source = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    directory: Path = models.tiny_random_model(tmp_path_factory.mktemp("tiny"), source, initializer_range=0.2)
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def test_sampling_from_a_shared_opening_gives_the_tokens_of_a_copied_one_and_copies_nothing(tiny: tuple[object, object]) -> None:
    model, tokenizer = tiny
    opening = tokenizer("You are the support agent of a small airline. " * 10)["input_ids"]
    tails = [tokenizer(text)["input_ids"] for text in ("Cancel my booking.", "Hi", "Which bags may I bring on board, please?")]
    input_ids, mask = layout(opening, tails, tokenizer.eos_token_id)
    cache = prefill(model, opening)
    keys = cache.layers[0].keys

    def sample(**cached: object) -> torch.Tensor:
        torch.manual_seed(7)
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=12, do_sample=True, temperature=1.0, top_k=None, pad_token_id=tokenizer.eos_token_id, **cached)

    copied = copy.deepcopy(cache)
    copied.batch_repeat_interleave(len(tails))
    plain = sample(cache=copied)
    shared_cache = OpeningCache(cache)
    with opening_attention(model):
        assert model.config._attn_implementation == NAME
        shared = sample(cache=shared_cache)
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(shared, plain)
    assert shared.shape[1] > input_ids.shape[1]  # it did generate
    assert shared_cache.layers[0].opening_keys is keys and keys.shape[0] == 1  # the opening, never copied
    assert cache.get_seq_length() == len(opening)  # nor extended
    assert shared_cache.get_seq_length() == shared.shape[1] - 1  # the opening's columns and the rows' own


def test_the_attention_is_restored_when_generation_fails(tiny: tuple[object, object]) -> None:
    model, _ = tiny
    with pytest.raises(RuntimeError, match="stop"), opening_attention(model):
        raise RuntimeError("stop")
    assert model.config._attn_implementation == "sdpa"


def test_a_sliding_window_opening_is_copied_for_every_row() -> None:
    """A sliding-window layer keeps only its window of the opening: no split can stand for the
    rest, so the rows get copies of the cache as it is, and the one-row cache stays as it was."""
    opening = DynamicCache()
    opening.layers = [DynamicSlidingWindowLayer(sliding_window=4)]
    opening.update(torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), 0)
    assert not attention.shareable(opening)
    cache, attending = rows_cache(object(), opening, 3)
    assert not isinstance(cache, OpeningCache) and cache.layers[0].keys.shape[0] == 3
    assert opening.layers[0].keys.shape[0] == 1
    with attending:  # nothing to switch: the model's attention stays what it is
        pass


class _Asking(Instance):
    """Two turns after a long opening; no reward."""

    def __init__(self, seed: int) -> None:
        super().__init__([], seed, 1)

    def reset(self) -> list[Message]:
        return [{"role": "system", "content": "You are the support agent of a small airline. " * 10}, {"role": "user", "content": f"Case {self.seed}."}]

    def step(self, assistant: Message) -> StepResult:
        return StepResult([{"role": "user", "content": "And then?"}], False)  # ends at max_turns

    def reward(self) -> float:
        return 0.0

    def solution(self) -> list[Message]:
        return [assistant_text("Done.")]


def test_rollouts_share_the_opening_and_sample_what_copying_it_samples(tiny: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's rollouts take the shared path on a Llama, and sampled two-turn episodes come
    out token for token as with the opening copied for every row."""
    model, tokenizer = tiny
    made: list[type] = []
    real = attention.rows_cache
    monkeypatch.setattr(attention, "rows_cache", lambda *a: made.append(type((result := real(*a))[0])) or result)
    sampling = rollouts.Sampling(max_new_tokens=8, temperature=1.0, max_turns=2)
    shared = rollouts.generate_rollouts(model, tokenizer, [_Asking(seed) for seed in range(4)], sampling, seed=3)
    assert made and set(made) == {OpeningCache}  # every turn's batch
    monkeypatch.setattr(attention, "shareable", lambda opening: False)
    copied = rollouts.generate_rollouts(model, tokenizer, [_Asking(seed) for seed in range(4)], sampling, seed=3)
    assert OpeningCache not in made[-1:]
    assert [item.sequence() for item in shared] == [item.sequence() for item in copied]
    assert all(sum(message["role"] == "assistant" for message in item.rollout.messages) == 2 for item in shared)
