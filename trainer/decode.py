"""Batched decoding in which a row leaves the batch as soon as its turn ends.

``transformers``' ``generate`` steps every row of a batch until the longest is done: a row that has
written its end-of-turn token goes on being fed padding, and on a CPU each decode step costs about
as much per row as a prefill token does. Here a finished row is dropped from the batch and from its
key/value cache at once, as the router's continuous batching does (``router.embedded``), so a step
costs what the rows still writing cost. In a cache whose opening the rows share
(``trainer.opening_attention.OpeningCache``) a row still writing moves into the place of one that
left (``leaving``), within the cache's buffers: one row copied for each that leaves, not the batch.

The tokens are ``generate``'s: the same inputs (positions from the attention mask's running sum,
the 2-D mask extended by one column a step), the same logits processors in the same order, and for
sampling the same draw: ``torch.multinomial`` over a ``[rows of the whole batch, vocabulary]``
tensor every step, finished rows holding a one-hot row, so the random stream is consumed exactly as
when they were still there. Only float rounding differs (a matrix product of fewer rows may sum in
another order), so a near-tie between two tokens can go either way.

With ``keep=True`` (the rollouts' batches whose cache is carried to the next turn) each finished
row's own keys and values are set aside when it leaves, and the cache handed back holds every row
again, in the batch's order, each row's columns up to its last fed token and masked after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracefix.trainer.prefix_cache import positions

LET_GO = True  # a finished row leaves the batch at once; off only to measure it (rows then run to the longest, as in ``generate``)


@dataclass(slots=True)
class Decoded:
    """``turns``: each row's new tokens, through its end token when it wrote one. ``cache`` and
    ``mask`` (``[rows, own columns]``, 1 where the row attends), only with ``keep``: the batch's
    cache after the turn, every row's own columns up to its last fed token."""

    turns: list[list[int]]
    cache: Any = None
    mask: Any = None


def decode(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    cache: Any,
    *,
    max_new_tokens: int,
    end: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    greedy: Sequence[int] = (),
    opening: int = 0,
    keep: bool = False,
) -> Decoded:
    """Up to ``max_new_tokens`` tokens for each row of ``input_ids`` ``[rows, columns]``, whose
    first ``cache.get_seq_length()`` columns the ``cache`` holds already (None: nothing cached).
    ``attention_mask`` ``[rows, columns]`` masks the padding. Greedy when ``temperature`` is 0,
    else sampled with temperature and top-p as ``generate`` does, the rows ``greedy`` (indices in
    the batch) drawn from their largest score alone. ``opening``: the leading columns the cache
    shares among the rows (an ``OpeningCache``'s), not part of the mask handed back with ``keep``."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
    import torch
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    from tracefix.trainer.opening_attention import OpeningCache

    rows, greedy = input_ids.shape[0], set(greedy)
    sample = temperature > 0
    chain = LogitsProcessorList()
    if sample and temperature != 1.0:
        chain.append(TemperatureLogitsWarper(temperature))
    if sample and top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p))
    cached = cache.get_seq_length() if cache is not None else 0
    mask = attention_mask
    step_ids, step_positions = input_ids[:, cached:], positions(attention_mask)[:, cached:]
    live = list(range(rows))  # the batch's rows still in it, by their index in the whole batch
    ended: set[int] = set()
    turns: list[list[int]] = [[] for _ in range(rows)]
    kept: dict[int, tuple[list[tuple[Any, Any]], Any]] = {}  # a finished row's own keys and values, and mask
    with torch.no_grad():
        for step in range(max_new_tokens):
            output = model(input_ids=step_ids, attention_mask=mask, position_ids=step_positions, cache=cache, use_cache=True, logits_to_keep=1)
            cache = output.cache
            scores = output.logits[:, -1].to(dtype=torch.float32, copy=True)
            if sample and (argmax := [index for index, row in enumerate(live) if row in greedy]):
                picked = scores[argmax]
                best = picked.argmax(dim=-1, keepdim=True)
                scores[argmax] = torch.full_like(picked, float("-inf")).scatter(1, best, picked.gather(1, best))
            scores = chain(step_ids, scores)
            if sample:
                whole = scores.new_zeros((rows, scores.shape[-1]))
                whole[:, 0] = 1  # a finished row's distribution: only its place in the draw matters
                whole[live] = scores.softmax(dim=-1)
                tokens = torch.multinomial(whole, num_samples=1).squeeze(1)[live]
            else:
                tokens = scores.argmax(dim=-1)
            writing = []
            for index, (row, token) in enumerate(zip(live, tokens.tolist(), strict=True)):
                if row in ended:
                    continue
                turns[row].append(token)
                if token != end:
                    writing.append(index)
                    continue
                ended.add(row)
                if keep:
                    kept[row] = ([(layer.keys[index].clone(), layer.values[index].clone()) for layer in cache.layers], mask[index, opening:])
            if not writing or step == max_new_tokens - 1:
                break
            if LET_GO and len(writing) < len(live):
                order = leaving(writing, len(live))
                chosen = torch.tensor(order, device=tokens.device)
                if isinstance(cache, OpeningCache):
                    cache.let_go(order)  # moved within its buffers
                else:
                    cache.batch_select_indices(chosen)
                live, tokens, mask, step_positions = [live[index] for index in order], tokens[chosen], mask[chosen], step_positions[chosen]
            step_ids = tokens[:, None]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            step_positions = step_positions[:, -1:] + 1
    if not keep:
        return Decoded(turns)
    for index, row in enumerate(live):  # the rows cut by max_new_tokens
        if row not in ended:
            kept[row] = ([(layer.keys[index], layer.values[index]) for layer in cache.layers], mask[index, opening:])
    return Decoded(turns, *_gathered(cache, [kept[row] for row in range(rows)]))


def leaving(writing: list[int], rows: int) -> list[int]:
    """The rows of a batch of ``rows`` that stay when only ``writing`` (ascending) go on, in their
    new order: a row already among the first ``len(writing)`` places keeps its place, one after
    them takes the place of a row that leaves. So a cache moves one row for each that leaves at
    most, into a place no row still needs."""
    staying = len(writing)
    places = set(writing)
    holes = [index for index in range(staying) if index not in places]
    order = list(range(staying))
    for hole, moving in zip(holes, [index for index in writing if index >= staying], strict=True):
        order[hole] = moving
    return order


def _gathered(cache: Any, rows: list[tuple[list[tuple[Any, Any]], Any]]) -> tuple[Any, Any]:
    """``cache`` holding ``rows``' own keys and values again (each ``[kv_heads, columns, dim]`` per
    layer), right-padded to the widest, and their mask ``[rows, widest]``."""
    width = max(mask.shape[0] for _, mask in rows)
    mask = rows[0][1].new_zeros((len(rows), width))
    for index, (_, own) in enumerate(rows):
        mask[index, : own.shape[0]] = own
    for number, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values
        layer.keys = keys.new_zeros((len(rows), keys.shape[1], width, keys.shape[3]))
        layer.values = values.new_zeros((len(rows), values.shape[1], width, values.shape[3]))
        for index, (kept, _) in enumerate(rows):
            row_keys, row_values = kept[number]
            layer.keys[index, :, : row_keys.shape[1]] = row_keys
            layer.values[index, :, : row_values.shape[1]] = row_values
    return cache, mask
