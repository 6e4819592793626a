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

from tests.conftest import ending_model
from tracefix.trainer import model as models
from tracefix.trainer import opening_attention as attention
from tracefix.trainer import rollouts
from tracefix.trainer.decode import leaving
from tracefix.trainer.environment import Instance, Message, StepResult, assistant_text
from tracefix.trainer.opening_attention import NAME, OpeningCache, Split, _OpeningLayer, _split_attention, opening_attention, rows_cache
from tracefix.trainer.prefix_cache import layout, prefill


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


def _padded(queries: int, opening: int = 20, own: int = 9) -> tuple[Split, Split, torch.Tensor, torch.Tensor]:
    """Keys, values, queries and SDPA's mask of 3 rows after an opening, rows 1 and 2 padded."""
    keys, values = _keys(3, opening, own)
    query = torch.randn(3, 6, queries, 8)
    mask = torch.ones(3, 1, queries, opening + own, dtype=torch.bool)
    mask[1, :, :, opening : opening + 3] = False  # row 1's padding between the opening and its tail
    mask[2, :, :, opening : opening + 1] = False
    mask &= torch.ones(queries, opening + own, dtype=torch.bool).tril(opening + own - queries)  # causal among the queries
    return keys, values, query, mask


@pytest.mark.parametrize("queries", [1, 5])
def test_the_split_attention_is_sdpa_over_the_whole_keys_with_padding_masked(queries: int) -> None:
    torch.manual_seed(0)
    rows = 3
    keys, values, query, mask = _padded(queries)
    split, _ = _split_attention(_Module(), query, keys, values, mask, scaling=0.3)
    plain, _ = sdpa_attention_forward(_Module(), query, _whole(keys), _whole(values), mask, scaling=0.3)
    assert split.shape == plain.shape == (rows, queries, 6, 8)
    torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-5)
    mask[1, :, :, 0] = False  # a column that matters: the results must part
    assert not torch.allclose(_split_attention(_Module(), query, keys, values, mask, scaling=0.3)[0], split, atol=1e-3)


@pytest.mark.parametrize("queries", [1, 5])
def test_the_split_and_the_whole_keys_give_the_same_attention(queries: int) -> None:
    """A decode step takes the split, a prefill SDPA over the whole keys; either serves either."""
    torch.manual_seed(4)
    keys, values, query, mask = _padded(queries)
    split = attention.split_attention(query, keys, values, mask, 0.3)
    whole = attention.whole_attention(query, keys, values, mask, 0.3)
    assert split.shape == whole.shape == (3, 6, queries, 8)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))  # a float mask means the same
    torch.testing.assert_close(attention.split_attention(query, keys, values, additive, 0.3), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention.whole_attention(query, keys, values, additive, 0.3), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_decode_step_takes_the_two_fused_passes_where_every_row_attends_the_opening(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(5)
    keys, values, query, mask = _padded(1, opening=300, own=40)
    keys, values = (Split(part.opening.to(dtype), part.own.to(dtype)) for part in (keys, values))
    query = query.to(dtype)
    taken = []
    fused = attention.split_flash
    monkeypatch.setattr(attention, "split_flash", lambda *args: taken.append(args[3]) or fused(*args))
    split = attention.split_attention(query, keys, values, mask, 0.3)
    unmasked = attention.split_attention(query, keys, values, None, 0.3)
    assert len(taken) == 2 and taken[0].shape == (3, 1, 1, 40) and taken[1] is None  # the rows' own columns' mask only
    whole = attention.whole_attention(query.float(), *(Split(part.opening.float(), part.own.float()) for part in (keys, values)), mask, 0.3)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}
    assert split.dtype == dtype
    torch.testing.assert_close(split.float(), whole, **tolerance)
    torch.testing.assert_close(unmasked.float(), attention.whole_attention(query.float(), *(Split(part.opening.float(), part.own.float()) for part in (keys, values)), None, 0.3), **tolerance)
    mask[0, :, :, 7] = False  # a column of the opening masked: the scores joined in one softmax instead
    attention.split_attention(query, keys, values, mask, 0.3)
    assert len(taken) == 2


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
    assert 1 < len(starts) < 5  # a few buffers, each larger, not one per step


def test_rows_that_leave_make_room_in_place_for_rows_that_stay() -> None:
    """``decode.leaving``'s order moves each row after the staying ones into a leaving row's place:
    the kept rows' keys are those they had, and the buffers are written on, not started anew."""
    torch.manual_seed(5)
    opening = torch.randn(1, 2, 10, 8)
    cache = OpeningCache(DynamicCache())
    cache.layers = [_OpeningLayer(opening, opening.clone())]
    layer = cache.layers[0]
    first = torch.randn(6, 2, 4, 8)
    layer.update(first, first * 2)
    start = layer.keys.data_ptr()
    writing = [0, 2, 4, 5]  # rows 1 and 3 leave
    order = leaving(writing, 6)
    assert sorted(order) == writing and order[0] == 0 and order[2] == 2  # rows in place stay there
    cache.let_go(order)
    step = torch.randn(4, 2, 1, 8)
    keys, values = layer.update(step, step * 2)
    assert keys.own.data_ptr() == start  # the same buffer
    assert torch.equal(keys.own, torch.cat([first[order], step], dim=2)) and torch.equal(values.own, keys.own * 2)
    assert leaving([1, 2], 3) == [2, 1] and leaving([0, 1], 2) == [0, 1] and leaving([], 4) == []


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


class _Talking(Instance):
    """One to three turns (by seed) after a long opening, answered at lengths that differ by seed and turn."""

    def __init__(self, seed: int) -> None:
        super().__init__([], seed, 3)
        self.turns = 0

    def reset(self) -> list[Message]:
        self.turns = 0
        return [{"role": "system", "content": "You are the support agent of a small airline. " * 10}, {"role": "user", "content": f"Case {self.seed}."}]

    def step(self, assistant: Message) -> StepResult:
        self.turns += 1
        return StepResult([{"role": "user", "content": "And then? " * (1 + (self.seed + self.turns) % 4)}], self.turns >= 1 + self.seed % 3)

    def reward(self) -> float:
        return 0.0

    def solution(self) -> list[Message]:
        return [assistant_text("Done."), assistant_text("Anything else?"), assistant_text("Goodbye.")]


def test_a_batch_carries_its_cache_from_turn_to_turn_and_samples_what_prefilling_anew_samples(
    tiny: tuple[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the second turn on, a batch's earlier turns stay in its cache and only what is new is
    prefilled: episodes that ended drop out, rows whose turn ended part-way keep nothing they
    generated after it, answers of different lengths are padded, and the sampled tokens are those
    of prefilling every turn anew after the shared opening."""
    model, tokenizer = tiny
    model = ending_model(model, tokenizer.eos_token_id, 10.0)
    carried: list[tuple[int, int]] = []
    real = rollouts._carry
    monkeypatch.setattr(rollouts, "_carry", lambda *a: carried.append((len(a[1]), sum(map(len, a[0].known)))) or real(*a))
    sampling = rollouts.Sampling(max_new_tokens=8, temperature=1.0)
    kept = rollouts.generate_rollouts(model, tokenizer, [_Talking(seed) for seed in range(6)], sampling, seed=5)
    assert [rows for rows, _ in carried] == [4, 2]  # turns 2 and 3, after the one- and two-turn episodes ended
    assert all(tokens > 0 for _, tokens in carried)
    turns = sum(sum(item.rollout.from_policy) for item in kept)
    assert turns == 12 and 0 < sum(item.truncated_turns for item in kept) < turns  # some turns ended part-way, some were cut
    monkeypatch.setattr(rollouts, "CARRY_TURNS", False)
    anew = rollouts.generate_rollouts(model, tokenizer, [_Talking(seed) for seed in range(6)], sampling, seed=5)
    assert len(carried) == 2  # nothing carried this time
    assert [item.sequence() for item in kept] == [item.sequence() for item in anew]


def test_the_carried_cache_holds_each_row_s_known_tokens_as_a_fresh_prefill_would(tiny: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """After every turn each row's attended columns hold the keys and values of its conversation so
    far (prefilled alone, after the opening), in order: nothing it generated after its turn ended,
    no padding, no other row's, also for a row that sat a turn out (its turn forced whole)."""
    model, tokenizer = tiny
    model = ending_model(model, tokenizer.eos_token_id, 10.0)
    states: list[tuple[set[int], list[list[int]], torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []
    real = rollouts._generate

    def generate(*arguments: object) -> object:
        turns, carried = real(*arguments)
        layers = [(layer.keys.clone(), layer.values.clone()) for layer in carried.cache.layers]
        states.append(({id(episode) for episode in carried.episodes}, [list(tokens) for tokens in carried.known], carried.mask.clone(), layers))
        return turns, carried

    monkeypatch.setattr(rollouts, "_generate", generate)
    sampling = rollouts.Sampling(max_new_tokens=8, temperature=1.0)
    guided = [seed % 3 == 2 for seed in range(9)]  # the three-turn episodes start from their solution's first tokens
    rollouts.generate_rollouts(model, tokenizer, [_Talking(seed) for seed in range(9)], sampling, seed=0, guided=guided)
    assert any(later - earlier for (earlier, *_), (later, *_) in zip(states, states[1:]))  # a row joined a carried batch
    openings = [rollouts.ChatTokens(tokenizer).opening(_Talking(seed).reset()) for seed in range(9)]
    shared = rollouts.common_prefix(openings)
    ended_part_way = 0
    for _, known, mask, layers in states:
        for row, tokens in enumerate(known):
            attended = mask[row].bool()
            assert int(attended.sum()) == len(tokens)
            ended_part_way += int(not attended[-1])
            fresh = prefill(model, openings[0][:shared] + tokens)
            for (keys, values), alone in zip(layers, fresh.layers, strict=True):  # the last layer's depend on the context
                torch.testing.assert_close(keys[row][:, attended], alone.keys[0][:, shared:], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(values[row][:, attended], alone.values[0][:, shared:], rtol=1e-4, atol=1e-4)
    assert ended_part_way > 0  # some row's last columns were generated after its turn had ended


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cascade_gives_sdpas_attention_and_gradients_under_the_causal_mask(dtype: torch.dtype) -> None:
    """A training batch's tails after their opening: the two fused passes joined by their
    log-sum-exps against one SDPA pass over the whole keys, the opening copied per row and the tails
    causal behind a mask; forward and every input's gradient."""
    from tracefix.trainer.opening_attention import cascade_attention

    generator = torch.Generator().manual_seed(0)
    opening, own, rows = 23, 11, 3

    def drawn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype).requires_grad_()

    query, opening_keys, opening_values, own_keys, own_values = drawn(rows, 6, own, 8), drawn(1, 2, opening, 8), drawn(1, 2, opening, 8), drawn(rows, 2, own, 8), drawn(rows, 2, own, 8)
    upstream = torch.randn(rows, 6, own, 8, generator=generator).to(dtype)
    inputs = (query, opening_keys, opening_values, own_keys, own_values)

    def gradients(output: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad(output, inputs, upstream))

    got = cascade_attention(query, Split(opening_keys, own_keys, causal=True), Split(opening_values, own_values, causal=True), 8**-0.5)
    keys, values = (torch.cat([part.expand(rows, -1, -1, -1), mine], dim=2).repeat_interleave(3, dim=1) for part, mine in ((opening_keys, own_keys), (opening_values, own_values)))
    mask = torch.ones(own, opening + own, dtype=torch.bool).tril(opening)
    expected = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=8**-0.5)
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}
    assert got.dtype == dtype and got.shape == expected.shape
    assert torch.allclose(got.float(), expected.float(), **tolerance)
    for mine, theirs in zip(gradients(got), gradients(expected), strict=True):
        assert mine.shape == theirs.shape and torch.allclose(mine.float(), theirs.float(), **tolerance)
