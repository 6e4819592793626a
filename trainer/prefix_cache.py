"""Generation over prompts that share their opening: the opening is prefilled once.

An agent's prompts all start with the same instructions and tool definitions, about 1,200 tokens
of the airline agent's 1,300-token opening, and every turn of every conversation sends them again.
Prefilling them for each row of each batch is most of a CPU turn's work. Here the shared opening
runs once (batch size 1) and the rows share its key/value cache (``trainer.opening_attention``);
only each row's own tail is prefilled on top of it. The same idea as vLLM's automatic prefix
caching, on one cache entry.

Rows are laid out ``[opening][padding][tail]``: the opening at the same positions in every row (so
one cache serves them all), each tail ending in the last column (so the next token of every row is
predicted from there), the padding masked. Position ids come from the attention mask (its running
sum), so a tail's positions continue its opening's exactly as in the unpadded prompt.

Used by the trainer's rollouts (``trainer.rollouts``) and the embedded router backend.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

MIN_PREFIX = 64  # below this many shared tokens a separate prefill saves less than it costs


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``sequences`` share, leaving each at least one of its own (the
    last prompt token is what the first new token is predicted from)."""
    if not sequences:
        return 0
    length = min(len(sequence) for sequence in sequences) - 1
    for other in sequences[1:]:
        length = min(length, _same(sequences[0], other))
    return max(0, length)


def _same(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))


def prefill(model: Any, ids: Sequence[int], **model_arguments: Any) -> Any:
    """The key/value cache of ``ids`` (one row), without gradients."""
    import torch

    with torch.no_grad():
        device = next(model.parameters()).device
        output = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=True, logits_to_keep=1, **model_arguments)
    return output.cache


def pad_id(tokenizer: Any) -> int:
    """The token that pads a batch's rows: the tokenizer's pad token, else its end-of-sequence token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """``model`` in eval mode within (no dropout: it runs as it serves), in the mode it came in after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def layout(prefix: Sequence[int], tails: Sequence[Sequence[int]], pad: int) -> tuple[Any, Any]:
    """``input_ids`` and ``attention_mask`` of rows ``prefix + tail``: the prefix in the first
    columns, each tail right-aligned, the padding between them masked."""
    import torch

    width = len(prefix) + max(len(tail) for tail in tails)
    input_ids = torch.full((len(tails), width), pad, dtype=torch.long)
    mask = torch.zeros((len(tails), width), dtype=torch.long)
    if prefix:
        input_ids[:, : len(prefix)] = torch.tensor(list(prefix))
        mask[:, : len(prefix)] = 1
    for row, tail in enumerate(tails):
        if tail:
            input_ids[row, width - len(tail) :] = torch.tensor(list(tail))
            mask[row, width - len(tail) :] = 1
    return input_ids, mask


def positions(mask: Any) -> Any:
    """Position ids from the attention mask: each attended token's index among its row's attended
    tokens (padding gets 0, never attended)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass(slots=True, eq=False)
class Cached:
    """One prompt's key/value cache: per layer, keys and values of shape [heads, tokens, dim] of its
    tokens from ``start`` on. The first ``start`` are those of ``base``, a stored prompt it begins
    with, held there once for every prompt that continues it (a radix tree's edges, as SGLang's
    cache and vLLM's shared blocks hold a prefix once); ``children``: the stored prompts that hold
    this one as their base, which keep it stored."""

    ids: tuple[int, ...]
    layers: list[tuple[Any, Any]]
    nbytes: int
    base: Cached | None = None
    start: int = 0
    children: int = 0

    def pieces(self, layer: int, begin: int, end: int) -> list[tuple[Any, Any]]:
        """Views of layer ``layer``'s keys and values of tokens ``begin`` to ``end``, in order, one
        for each stored prompt they are held in."""
        found = self.base.pieces(layer, begin, min(end, self.start)) if self.base is not None and begin < self.start else []
        if end > self.start:
            own = slice(max(begin, self.start) - self.start, end - self.start)
            keys, values = self.layers[layer]
            found.append((keys[:, own], values[:, own]))
        return found

    def columns(self, layer: int, begin: int, end: int) -> tuple[Any, Any]:
        """Layer ``layer``'s keys and values of tokens ``begin`` to ``end``: a view where one stored
        prompt holds them all, else its pieces joined."""
        import torch

        found = self.pieces(layer, begin, end)
        if len(found) == 1:
            return found[0]
        return torch.cat([keys for keys, _ in found], dim=1), torch.cat([values for _, values in found], dim=1)


class PrefixStore:
    """The key/value caches of recently prefilled prompts, per model variant (an adapter name, or
    None for the base), the least recently used dropped past ``max_bytes``.

    A new prompt takes the cached one it shares the longest prefix with: the next turn of a
    conversation shares its whole previous prompt, a new conversation the agent's opening. Each row
    of a batch takes its own (``batch_layers``), so conversations and variants mix in one batch.
    A prompt stored after starting from a cached one keeps only what follows (``Cached.base``):
    an agent's opening is held once, not once a conversation. Only prompts that no other continues
    are dropped, so a base stays while its continuations do.
    Thread-safe: the generation thread looks up and stores, adapter changes clear it.
    """

    def __init__(self, max_bytes: int, min_prefix: int = MIN_PREFIX) -> None:
        self.max_bytes = max_bytes
        self.min_prefix = min_prefix
        self._entries: OrderedDict[tuple[Any, tuple[int, ...]], Cached] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def lookup(self, variant: Any, prompt: Sequence[int]) -> tuple[Cached | None, int]:
        """The cached prompt sharing the longest prefix with ``prompt`` (leaving it at least one
        token of its own) and that length; ``(None, 0)`` below ``min_prefix``."""
        best, length = None, 0
        with self._lock:
            for (entry_variant, _), entry in self._entries.items():
                if entry_variant == variant and (shared := min(_same(entry.ids, prompt), len(prompt) - 1)) > length:
                    best, length = entry, shared
            if best is None or length < self.min_prefix:
                return None, 0
            self._entries.move_to_end((variant, best.ids))
            return best, length

    def store(self, variant: Any, prompt: Sequence[int], layers: list[tuple[Any, Any]], base: tuple[Cached, int] | None = None) -> None:
        """Keep ``prompt``'s keys and values: ``layers`` holds all of them, or with ``base`` (a
        ``lookup`` result, ``(entry, length)``) those of its tokens from ``length`` on, the rest
        being the entry's. Not kept when the base has left the store meanwhile (its adapter was
        unloaded), when it is larger than the whole budget, or when it is already there."""
        entry = Cached(tuple(prompt), layers, sum(k.nbytes + v.nbytes for k, v in layers), *(base or (None, 0)))
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            key = (variant, entry.ids)
            if key in self._entries or (entry.base is not None and self._entries.get((variant, entry.base.ids)) is not entry.base):
                return
            if entry.base is not None:
                entry.base.children += 1
            # A prompt this one extends is of no more use (every lookup that matched it matches
            # this), unless another holds it as its base.
            for old in [old for old, cached in self._entries.items() if old[0] == variant and not cached.children and entry.ids[: len(cached.ids)] == cached.ids]:
                self._remove(old)
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:  # the least recently used prompt that none continues
                self._remove(next(old for old, cached in self._entries.items() if not cached.children))

    def _remove(self, key: tuple[Any, tuple[int, ...]]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        if entry.base is not None:
            entry.base.children -= 1

    def drop(self, variant: Any) -> None:
        """Forget ``variant``'s caches (its adapter was unloaded, or a new one took its name)."""
        with self._lock:
            for key in [key for key in self._entries if key[0] == variant]:
                self._remove(key)

    @property
    def nbytes(self) -> int:
        return self._bytes


def batch_layers(matches: Sequence[tuple[Cached | None, int]], start: int = 0) -> tuple[list[tuple[Any, Any]], Any]:
    """A batch's cached keys and values from each row's match (``PrefixStore.lookup``), from column
    ``start`` on (what the rows hold apart from an opening held once), ``(keys, values)``
    ``[rows, kv_heads, columns, dim]`` a layer, and the attention mask of those columns: row ``r``'s
    cached tokens ``start`` to its ``length``, right-aligned to the longest, the columns before them
    zero and masked. Positions from the mask stay those the keys were cached at."""
    import torch

    width = max(length for _, length in matches) - start
    sample = next(entry for entry, length in matches if entry is not None and length)
    mask = torch.zeros((len(matches), width), dtype=torch.long)
    layers = []
    for layer, (keys, values) in enumerate(sample.layers):
        batch_keys = keys.new_zeros((len(matches), keys.shape[0], width, keys.shape[2]))
        batch_values = values.new_zeros((len(matches), values.shape[0], width, values.shape[2]))
        for row, (entry, length) in enumerate(matches):
            column = width - length + start
            for piece_keys, piece_values in entry.pieces(layer, start, length) if entry is not None and length > start else ():
                batch_keys[row, :, column : column + piece_keys.shape[1]] = piece_keys
                batch_values[row, :, column : column + piece_keys.shape[1]] = piece_values
                column += piece_keys.shape[1]
        layers.append((batch_keys, batch_values))
    for row, (entry, length) in enumerate(matches):
        if entry is not None and length > start:
            mask[row, width - length + start :] = 1
    return layers, mask


def row_layers(cache: Any, row: int, columns: Any, skip: int = 0) -> list[tuple[Any, Any]]:
    """Row ``row``'s keys and values at ``columns`` (a boolean mask over the cache's positions) but
    the first ``skip`` of them (those a stored prompt holds), copied out of a batch cache for
    ``PrefixStore.store``; a cache holding an opening once for every row
    (``trainer.opening_attention.OpeningCache``) has it first, all of it attended."""
    import torch

    opening = getattr(cache.layers[0], "opening_keys", None)
    held = 0 if opening is None else opening.shape[2]  # every layer's opening is as long
    own = columns[held:].nonzero().squeeze(1)[max(0, skip - held) :]
    copied = []
    for layer in cache.layers:
        keys, values = layer.keys[row][:, own], layer.values[row][:, own]
        if skip < held:
            keys, values = torch.cat([layer.opening_keys[0][:, skip:], keys], dim=1), torch.cat([layer.opening_values[0][:, skip:], values], dim=1)
        copied.append((keys, values))
    return copied
