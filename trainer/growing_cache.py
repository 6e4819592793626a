"""A key/value cache whose layers grow in place, for decoding without a copy of the cache a step.

``transformers``' ``DynamicLayer`` appends a decode step's keys and values by concatenation: every
step copies each layer's whole cache, ``rows × columns`` of it, to add one column. For the router's
batch of 8 rows that is a copy of the batch's cache 60 times a step (SmolLM2-135M's 30 layers, keys
and values); after prompts of 1,000 tokens, 370 MB a step in float32, more than its weights. A
``GrowingLayer`` keeps its keys and values at the start of buffers with room to spare, writes a
step's column into them and hands out views of the filled part; a full buffer is replaced by one
half as large again (amortised: on average at most two copies of a column), capped by ``limit``
columns where the caller knows the widest cache it will need (its context), never below what it
holds.

Anything that replaces a layer's ``keys``/``values`` from outside (selecting rows, cutting columns,
``batch_select_indices``) leaves tensors that are not the buffer's view: the next update notices
and starts a new buffer from them. Cutting columns off the end (``crop``) or rows off the end keeps
the view, and the buffer is written on from there. So the layer stays a ``DynamicLayer`` to
everything that reads or edits it.

Views handed out are overwritten only where the layer was cut back (rows or columns no longer
held); a caller keeping a row's keys beyond that copies them (``prefix_cache.row_layers`` does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE = 64  # columns of room a new buffer has beyond 1.5 times what it holds
# Off only to measure it (the caches concatenate as transformers' do); the environment variable
# reaches the router process a bench starts (``bench/throughput.py --concatenated``).
GROWING = os.environ.get("TRACEFIX_GROWING_CACHE", "1") != "0"


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose update writes into buffers with room to spare (see the module)."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return self.append(key_states, value_states)

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``[rows, kv_heads, columns, dim]`` keys and values after those held; the keys and
        values held now (views of the buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        rows, held, added = key_states.shape[0], self.keys.shape[-2], key_states.shape[-2]
        buffers = self._buffers
        if buffers is None or not _fits(buffers[0], self.keys, held + added, rows) or not _fits(buffers[1], self.values, held + added, rows):
            # first use, full, or the keys were replaced from outside: start a larger buffer
            needed = held + added
            roomy = needed + needed // 2 + SPARE  # at most half again as much memory as a cache that concatenates
            columns = roomy if self.limit is None else max(needed, min(roomy, self.limit))
            shape = (rows, key_states.shape[1], columns, key_states.shape[-1])
            buffers = (key_states.new_empty(shape), value_states.new_empty(shape))
            buffers[0][..., :held, :], buffers[1][..., :held, :] = self.keys, self.values
            self._buffers = buffers
        buffers[0][:rows, :, held : held + added] = key_states
        buffers[1][:rows, :, held : held + added] = value_states
        self.keys, self.values = buffers[0][:rows, :, : held + added], buffers[1][:rows, :, : held + added]
        return self.keys, self.values

    def reset(self) -> None:
        self._buffers = None
        super().reset()


def _fits(buffer: torch.Tensor, held: torch.Tensor, columns: int, rows: int) -> bool:
    """Whether ``held`` is a view of ``buffer``'s first rows and columns and the buffer has room for
    ``columns`` columns of ``rows`` rows."""
    return (
        held.data_ptr() == buffer.data_ptr() and held.stride() == buffer.stride() and buffer.shape[0] >= rows
        and buffer.shape[-2] >= columns and held.dtype == buffer.dtype
    )  # fmt: skip


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of ``GrowingLayer``s, one for each of the model's ``layers``, filled with
    ``data`` (``(keys, values)`` a layer, copied into the buffers) where given."""

    def __init__(self, layers: int, data: Iterable[tuple[torch.Tensor, torch.Tensor]] = (), limit: int | None = None) -> None:
        super().__init__()
        self.layers = [GrowingLayer(limit) for _ in range(layers)]
        for layer, held in zip(self.layers, data):  # a layer past the end of the data starts empty
            layer.append(*held)


def keeps_every_token(cache: Any) -> bool:
    """Whether every layer of ``cache`` holds all of its tokens (plain ``DynamicLayer``s: no sliding
    window, whose layers keep only the window)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def grows(config: Any) -> bool:
    """Whether a model of ``config`` keeps every token of every layer, which a ``GrowingCache``
    holds for it."""
    return keeps_every_token(DynamicCache(config=config))


def cache_of(config: Any, data: Sequence[tuple[torch.Tensor, torch.Tensor]], limit: int | None = None) -> Any:
    """A cache for a model of ``config`` holding ``data`` (``(keys, values)`` a layer): a
    ``GrowingCache`` where the model keeps every token, else transformers' own."""
    plain = DynamicCache(config=config)
    if not (GROWING and keeps_every_token(plain)):
        return DynamicCache(ddp_cache_data=data, config=config)
    return GrowingCache(len(plain.layers), data, limit)
