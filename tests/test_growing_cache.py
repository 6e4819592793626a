"""A key/value cache that grows in place (trainer/growing_cache.py): it holds what concatenating
holds, a decode step writes into the same buffer instead of copying the cache, edits from outside
(rows selected, columns cut) are followed, and a tiny random Llama decodes the same logits from it
as from transformers' own cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from tracefix.router.backend import Generation, Sampling
from tracefix.router.embedded import _Batch, _Row
from tracefix.trainer import growing_cache
from tracefix.trainer.growing_cache import GrowingCache, GrowingLayer, cache_of, grows


def _chunks(rows: int, first: int, steps: int) -> list[torch.Tensor]:
    return [torch.randn(rows, 2, first, 8)] + [torch.randn(rows, 2, 1, 8) for _ in range(steps)]


def test_a_layer_holds_what_concatenating_holds_in_a_few_growing_buffers() -> None:
    torch.manual_seed(0)
    layer, plain = GrowingLayer(), DynamicLayer()
    starts = set()
    for chunk in _chunks(3, 5, 300):
        keys, values = layer.update(chunk, chunk * 2)
        plain_keys, plain_values = plain.update(chunk, chunk * 2)
        starts.add(keys.data_ptr())
    assert torch.equal(keys, plain_keys) and torch.equal(values, plain_values)
    assert layer.get_seq_length() == 305
    # 5 columns, then 300 steps: buffers of 71, 172 and 323 columns; one per step would be 301
    assert len(starts) == 3


def test_a_decode_step_writes_into_the_buffer_and_copies_nothing_held() -> None:
    torch.manual_seed(1)
    layer = GrowingLayer()
    first = torch.randn(2, 2, 10, 8)
    keys, _ = layer.update(first, first)
    start, kept = keys.data_ptr(), keys.clone()
    for _ in range(20):  # 10 columns start a buffer of 79
        step = torch.randn(2, 2, 1, 8)
        keys, _ = layer.update(step, step)
        assert keys.data_ptr() == start and torch.equal(keys[:, :, -1:], step)
    assert torch.equal(keys[:, :, :10], kept)


def test_the_limit_caps_the_room_to_spare_but_never_what_is_held() -> None:
    layer = GrowingLayer(limit=100)
    layer.update(torch.zeros(1, 2, 60, 8), torch.zeros(1, 2, 60, 8))
    assert layer._buffers[0].shape[2] == 100  # 60 + 30 + 64 capped
    layer.update(torch.zeros(1, 2, 50, 8), torch.zeros(1, 2, 50, 8))
    assert layer._buffers[0].shape[2] == 110 and layer.get_seq_length() == 110  # more than the limit: exactly what it holds


def test_rows_selected_and_columns_cut_from_outside_are_followed() -> None:
    """As the router's batch edits its cache when rows leave (rows chosen, the columns no row
    attends cut from the left) and as ``batch_select_indices`` and ``crop`` do."""
    torch.manual_seed(2)
    layer, plain = GrowingLayer(), DynamicLayer()
    for chunk in _chunks(4, 6, 3):
        layer.update(chunk, -chunk)
        plain.update(chunk, -chunk)
    for edited in (layer, plain):
        edited.keys, edited.values = edited.keys[torch.tensor([3, 1]), :, 2:], edited.values[torch.tensor([3, 1]), :, 2:]
    step = torch.randn(2, 2, 1, 8)
    assert torch.equal(layer.update(step, -step)[0], plain.update(step, -step)[0])
    for edited in (layer, plain):
        edited.batch_select_indices(torch.tensor([1]))
    step = torch.randn(1, 2, 1, 8)
    assert torch.equal(layer.update(step, -step)[0], plain.update(step, -step)[0])
    start = layer.keys.data_ptr()
    for edited in (layer, plain):
        edited.crop(-3)  # the newest 3 columns go; appending writes over them
    step = torch.randn(1, 2, 2, 8)
    keys, values = layer.update(step, -step)
    plain_keys, plain_values = plain.update(step, -step)
    assert torch.equal(keys, plain_keys) and torch.equal(values, plain_values)
    assert keys.data_ptr() == start  # cutting the end keeps the buffer


def test_a_cache_holds_its_data_and_a_sliding_window_model_keeps_transformers_own(tiny_model: Path) -> None:
    torch.manual_seed(3)
    config = AutoModelForCausalLM.from_pretrained(tiny_model).config
    assert grows(config)
    data = [(torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)) for _ in range(config.num_hidden_layers)]
    taken = cache_of(config, data, limit=64)
    assert isinstance(taken, GrowingCache) and len(taken.layers) == config.num_hidden_layers
    for mine, (keys, values) in zip(taken.layers, data, strict=True):
        assert torch.equal(mine.keys, keys) and torch.equal(mine.values, values)
    empty = cache_of(config, [])
    assert isinstance(empty, GrowingCache) and empty.get_seq_length() == 0
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    config.sliding_window = 4
    assert not grows(config)
    sliding = cache_of(config, [])
    assert type(sliding) is DynamicCache and isinstance(sliding.layers[0], DynamicSlidingWindowLayer)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_model_decodes_the_same_logits_from_a_growing_cache(tiny_model: Path, rows: int) -> None:
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    prompt = torch.randint(0, model.config.vocab_size, (rows, 12))
    logits = {}
    with torch.no_grad():
        for kind in ("plain", "growing"):
            cache = DynamicCache(config=model.config) if kind == "plain" else cache_of(model.config, [])
            output = model(input_ids=prompt, cache=cache, use_cache=True)
            steps = [output.logits[:, -1]]
            for _ in range(100):  # past the first buffer of 12 + 6 + 64 columns
                output = model(input_ids=steps[-1].argmax(-1, keepdim=True), cache=output.cache, use_cache=True)
                steps.append(output.logits[:, -1])
            assert isinstance(output.cache, GrowingCache) == (kind == "growing")
            logits[kind] = torch.stack(steps)
    torch.testing.assert_close(logits["growing"], logits["plain"], rtol=1e-5, atol=1e-5)


def test_the_router_merges_a_joining_batch_into_a_growing_cache(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_Batch.merge``: the narrower cache padded on the left, into a cache a decode step writes
    into; with growing switched off (to measure it), into transformers' own."""
    torch.manual_seed(5)
    config = AutoModelForCausalLM.from_pretrained(tiny_model).config

    def batch(rows: int, columns: int) -> _Batch:
        data = [(torch.randn(rows, 2, columns, 8), torch.randn(rows, 2, columns, 8)) for _ in range(config.num_hidden_layers)]
        plain = [_Row(Generation([rows, columns, index], None, Sampling(8), 1, print), 0, None) for index in range(rows)]  # no opening in common
        return _Batch(plain, None, GrowingCache(len(data), data), torch.ones(rows, columns, dtype=torch.long), torch.zeros(rows, 1), torch.zeros(rows, 1))

    running, joining = batch(2, 9), batch(1, 4)
    before, theirs = running.cache.layers[1].keys.clone(), joining.cache.layers[1].keys
    running.merge(joining, config, limit=64)
    keys = running.cache.layers[1].keys
    assert isinstance(running.cache, GrowingCache) and keys.shape == (3, 2, 9, 8)
    assert torch.equal(keys[:2], before) and torch.equal(keys[2, :, 5:], theirs[0]) and not keys[2, :, :5].any()
    assert running.mask[2].tolist() == [0] * 5 + [1] * 4
    start = keys.data_ptr()
    step = torch.randn(3, 2, 1, 8)
    assert running.cache.layers[1].update(step, step)[0].data_ptr() == start

    monkeypatch.setattr(growing_cache, "GROWING", False)
    running, joining = batch(2, 9), batch(1, 4)
    running.merge(joining, config, limit=64)
    assert type(running.cache) is DynamicCache and running.cache.layers[1].keys.shape == (3, 2, 9, 8)
    assert type(cache_of(config, [])) is DynamicCache
