"""The embedded backend: one frozen base model in process (transformers + peft, CPU), any number of
LoRA adapters attached to it under versioned names, and one generation thread that serves them all.

Why one thread: PEFT's adapter state lives on the shared model, so two threads generating with
different adapters would corrupt each other. Instead the generation thread decodes every running
sequence together, up to ``max_batch`` of them, whatever adapter each uses: PEFT applies a
different adapter to each row of a batch (``adapter_names``), so requests for different adapters
share one forward pass instead of waiting for each other.

Continuous batching (as vLLM and TGI do it, one request's prefill at a time between decode steps):
between two decode steps, waiting requests join the running batch in arrival order while there is
room. Their prompts are prefilled in a forward pass of their own, their first tokens sampled, and
their key/value caches merged into the batch's; a sequence that ends leaves the batch at once and
frees its row. So a short request is not held up by the longest one it happens to share a batch
with, and a new one does not wait for the batch to drain. Rows are right-aligned (every row's
latest token in the last column, left padding masked, positions kept per row), so merging pads the
narrower cache on the left. ``continuous_batching = false`` keeps static batches, each running
until its last sequence ends (the baseline ``bench/router_batching.py`` compares against).

The batch's key/value cache grows in place (``trainer.growing_cache``): a decode step writes its
column into buffers with room to spare instead of concatenating, which would copy the whole cache
every step (after long agent prompts, more bytes than the model's weights). Rows whose prompts
begin alike (an agent's instructions and tools, for one adapter) hold that opening once: the cache
is an ``OpeningCache`` and a decode step attends it through the split of
``trainer.opening_attention`` (one pass over the opening for all rows, then each row's own
tokens), as the trainer's rollouts do. A join re-splits the batch for what all its rows then share
(``_Batch.split``), so the opening shrinks, grows or goes as rows come and leave.

Requests routed by the token-level gate (``trainer.gate``) run only with each other: the gate
replaces the LoRA layers' forward for the whole model, so it is installed for gate batches and
removed before anything else runs. Admission is first come, first served: a request that cannot
join (no room for its ``n`` rows, or the other kind of batch) holds back those behind it until the
running batch has made room, so none waits forever.

Every generated token is pushed to its request's sink at once; the HTTP side drains its own queue,
so a slow client never holds up the batch. Loading and unloading adapters take the same lock as a
decode step, so the model never changes under a forward pass.

`router.backend` holds what the server and the routing table need of any backend (`Backend`), with
the request and event types both backends share; `router.vllm` is the other one.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import deque
from contextlib import nullcontext
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import Settings
from tracefix.router import metrics
from tracefix.router.backend import (
    AdapterConflict,
    Delta,
    Event,
    Failed,
    Finished,
    GateSpec,
    Generation,
    chat_token_ids,
    first_token_id,
    held_back,
)
from tracefix.trainer import adapters, prefix_cache
from tracefix.trainer import model as models

log = logging.getLogger(__name__)

PEFT_BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch


def peft_name(name: str) -> str:
    """The name PEFT holds adapter `name` under: a torch module name has no ".", which a generalist's
    (``generalist.<agent>@v1``) has; "%" is in no served name, so the mapping is one to one."""
    return name.replace(".", "%2E")


@dataclass(slots=True)
class _Row:
    """One sequence of a batch: a choice of a request."""

    generation: Generation
    choice: int
    generator: Any
    tokens: list[int] = field(default_factory=list)
    sent: int = 0
    finished: bool = False
    share_sum: Any = None  # gate-routed: the sum of the gate's expert weights over generated tokens
    slots: list[str] | None = None
    text: str = ""  # the tokens' text so far, an unfinished UTF-8 character aside
    decoder: Any = None  # tokenizers' DecodeStream, which text grows by


@dataclass(slots=True)
class _Batch:
    """The running rows and their key/value cache, laid out right-aligned: every row's latest token
    in the cache's last column, the columns before its own masked. ``next_ids`` [rows, 1] are the
    tokens fed at the next step, at ``positions`` [rows, 1]; ``mask`` [rows, width] covers the cache.

    ``opening``: how many leading prompt tokens every row shares (same tokens, same adapter) and the
    cache holds once, for all rows, in an ``OpeningCache``: its first ``opening`` columns of ``mask``
    (all attended), then each row's own columns. A row's keys carry their positions (rotary), so
    only which columns a row attends matters, not their order: moving columns between the opening
    and the rows' own changes no attention. 0: every row holds all its columns (a ``GrowingCache``)."""

    rows: list[_Row] = field(default_factory=list)
    gate: GateSpec | None = None
    cache: Any = None
    mask: Any = None
    positions: Any = None
    next_ids: Any = None
    opening: int = 0

    def keep(self, indices: list[int]) -> None:
        """Only the rows at ``indices`` stay; own columns no remaining row attends are cut from the left."""
        if len(indices) == len(self.rows):
            return
        self.rows = [self.rows[index] for index in indices]
        if not indices:
            self.cache = self.mask = self.positions = self.next_ids = None
            self.opening = 0
            return
        import torch

        chosen = torch.tensor(indices)
        mask = self.mask[chosen]
        own = mask[:, self.opening :]
        start = int(own.any(dim=0).long().argmax())  # the first own column some row attends
        self.mask = torch.cat([mask[:, : self.opening], own[:, start:]], dim=1)
        self.positions, self.next_ids = self.positions[chosen], self.next_ids[chosen]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[chosen, :, start:], layer.values[chosen, :, start:]

    def merge(self, other: _Batch, config: Any, limit: int) -> None:
        """Add ``other``'s rows, the narrower own columns padded on the left (masked), into a cache
        that grows in place (``trainer.growing_cache``) for the model of ``config``; ``limit``: the
        columns its buffers need at most, the context. The merged rows share the opening all their
        prompts begin with (``shared_opening``); each batch's cache is split again for it first."""
        if not other.rows:
            return
        opening = shared_opening([*self.rows, *other.rows], config)
        other.split(opening, config, limit)
        if not self.rows:
            self.rows, self.gate, self.cache, self.mask, self.opening = other.rows, other.gate, other.cache, other.mask, other.opening
            self.positions, self.next_ids = other.positions, other.next_ids
            return
        self.split(opening, config, limit)
        import torch

        width = max(self.mask.shape[1], other.mask.shape[1]) - opening  # of the rows' own columns

        def padded(tensor: Any, dim: int) -> Any:
            missing = width - tensor.shape[dim]
            if not missing:
                return tensor
            shape = list(tensor.shape)
            shape[dim] = missing
            return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

        own = [
            (torch.cat([padded(mine.keys, 2), padded(theirs.keys, 2)]), torch.cat([padded(mine.values, 2), padded(theirs.values, 2)]))
            for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True)
        ]
        self.cache = _cache(_opening_of(self.cache), own, config, limit)
        own_mask = torch.cat([padded(self.mask[:, opening:], 1), padded(other.mask[:, opening:], 1)])
        self.mask = torch.cat([own_mask.new_ones((own_mask.shape[0], opening)), own_mask], dim=1)
        self.positions = torch.cat([self.positions, other.positions])
        self.next_ids = torch.cat([self.next_ids, other.next_ids])
        self.rows = self.rows + other.rows

    def split(self, opening: int, config: Any, limit: int) -> None:
        """Hold the first ``opening`` tokens of the rows' prompts once (they are the same in every
        row) and the rest in each row's own columns. A shorter opening moves its last columns into
        every row's own, on their left; a longer one takes each row's first own tokens out of its
        own columns, those of the first row becoming the opening's."""
        if opening == self.opening:
            return
        import torch

        held = self.opening
        shared = _opening_of(self.cache)
        own = [(layer.keys, layer.values) for layer in self.cache.layers]
        rows = len(self.rows)
        if opening < held:
            own = [
                tuple(torch.cat([whole[:, :, opening:].expand(rows, -1, -1, -1), mine], dim=2) for whole, mine in zip(pair, theirs, strict=True))
                for pair, theirs in zip(shared, own, strict=True)
            ]
            shared = [(keys[:, :, :opening], values[:, :, :opening]) for keys, values in shared] if opening else None
            self.cache, self.opening = _cache(shared, own, config, limit), opening
            return
        # Each row's attended own columns hold its tokens in the order of their positions: a
        # column is added on the right, padded or cut on the left, or moved in from the opening.
        taking = opening - held
        attended = [row.nonzero().squeeze(1) for row in self.mask[:, held:]]
        width = max(len(columns) - taking for columns in attended)
        mask = self.mask.new_zeros((rows, width))
        for index, columns in enumerate(attended):
            mask[index, width - len(columns) + taking :] = 1
        taken, kept = [], []
        for keys, values in own:
            taken.append((keys[:1, :, attended[0][:taking]], values[:1, :, attended[0][:taking]]))
            kept_keys, kept_values = keys.new_zeros((rows, keys.shape[1], width, keys.shape[3])), values.new_zeros((rows, values.shape[1], width, values.shape[3]))
            for index, columns in enumerate(attended):
                kept_keys[index, :, width - len(columns) + taking :] = keys[index, :, columns[taking:]]
                kept_values[index, :, width - len(columns) + taking :] = values[index, :, columns[taking:]]
            kept.append((kept_keys, kept_values))
        if shared:
            taken = [tuple(torch.cat([old, new], dim=2) for old, new in zip(pair, more, strict=True)) for pair, more in zip(shared, taken, strict=True)]
        self.cache, self.opening = _cache(taken, kept, config, limit), opening
        self.mask = torch.cat([self.mask.new_ones((rows, opening)), mask], dim=1)


# Tokens: a shorter common opening is held by every row. The split costs a second attention pass a
# layer: 8 rows after a 70-token opening decoded 4 % slower with it, after 255 tokens 8 % faster
# (one thread, SmolLM2-135M), after the airline agent's 1,232 tokens 1.2-1.4x (docs/performance.md).
MIN_OPENING = 128
# Off only to measure it (every row holds its whole prompt); the environment variable reaches the
# router process a bench starts (``bench/throughput.py --unshared``).
SHARED_OPENING = os.environ.get("TRACEFIX_SHARED_OPENING", "1") != "0"


def shared_opening(rows: list[_Row], config: Any) -> int:
    """How many leading prompt tokens ``rows`` hold once: their prompts' common prefix (each keeps
    at least one token of its own) when there are two rows or more, all for one adapter, none
    routed by the gate (which runs only plain batches), the model (of ``config``) keeps every token
    (a sliding-window layer keeps only its window of an opening), and it is at least
    ``MIN_OPENING`` long; else 0."""
    from tracefix.trainer.growing_cache import grows

    if not SHARED_OPENING or len(rows) < 2 or any(row.generation.gate is not None for row in rows) or len({row.generation.adapter for row in rows}) > 1:
        return 0
    if not grows(config):
        return 0
    opening = prefix_cache.common_prefix([row.generation.prompt for row in rows])
    return opening if opening >= MIN_OPENING else 0


def _opening_of(cache: Any) -> list[tuple[Any, Any]] | None:
    """An ``OpeningCache``'s opening, ``(keys, values)`` ``[1, kv_heads, opening, dim]`` a layer; None for another cache."""
    from tracefix.trainer.opening_attention import OpeningCache

    if not isinstance(cache, OpeningCache):
        return None
    return [(layer.opening_keys, layer.opening_values) for layer in cache.layers]


def _cache(opening: list[tuple[Any, Any]] | None, own: list[tuple[Any, Any]], config: Any, limit: int) -> Any:
    """A batch's cache: ``opening`` held once (an ``OpeningCache``) and the rows' ``own`` keys and
    values, each layer's growing in place; without an opening, a ``GrowingCache`` of ``own``."""
    from tracefix.trainer import growing_cache
    from tracefix.trainer.opening_attention import OpeningCache

    if not opening:
        return growing_cache.cache_of(config, own, limit)
    return OpeningCache.holding(opening, own, limit)


class EmbeddedBackend:
    """The base model, its loaded adapters and the generation thread."""

    supports_gate = True

    def __init__(
        self,
        model: str,
        cache_dir: Path,
        max_batch: int = 8,
        max_context_tokens: int = 8192,
        threads: int = 0,
        prefix_cache_mib: int = 1024,
        continuous: bool = True,
        dtype: str = "float32",
    ) -> None:
        import torch

        from tracefix.trainer import growing_cache

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = models.resolve(model, Path(cache_dir))
        self.model, self.tokenizer = models.load(str(self.model_dir), Path(cache_dir), dtype)
        self.base_hash = adapters.base_model_hash(self.model_dir)
        self.max_batch = max_batch
        # Joining and leaving a running batch moves its cache's columns, which a sliding-window
        # layer (holding only its window) cannot follow: such a model keeps static batches. A model
        # that keeps every token decodes into a cache that grows in place (trainer.growing_cache).
        self.continuous = continuous and growing_cache.grows(self.model.config)
        if continuous and not self.continuous:
            log.warning("%s has sliding-window attention layers: the embedded backend runs static batches", model)
        positions = getattr(self.model.config, "max_position_embeddings", None) or max_context_tokens
        self.context_tokens = min(max_context_tokens, positions)
        eos = self.model.generation_config.eos_token_id
        self.end_ids = {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        self.pad_id = self.tokenizer.pad_token_id
        # A row's text grows token by token (tokenizers' DecodeStream, as vLLM and TGI detokenize):
        # decoding all its tokens again at every step costs time quadratic in its length. A slow
        # tokenizer, or one that cleans up spaces around punctuation afterwards, decodes them all.
        self.incremental = getattr(self.tokenizer, "backend_tokenizer", None) is not None and not getattr(
            self.tokenizer, "clean_up_tokenization_spaces", False
        )  # fmt: skip
        self.loaded: dict[str, Path] = {}
        self.prefixes = prefix_cache.PrefixStore(prefix_cache_mib << 20) if prefix_cache_mib else None
        self._lock = threading.Lock()  # held by every forward pass and every change of the model
        self._gate: Any = None  # the installed trainer.gate.GatedExperts, for `_gate_spec`
        self._gate_spec: GateSpec | None = None
        self._pending: deque[Generation] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="generation", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedBackend:
        """The backend for a tracefix configuration: its [model] and [router] sections."""
        cache_dir = settings.model_cache_dir
        router = settings.router
        return cls(
            settings.model.name, cache_dir, router.max_batch, router.max_context_tokens, settings.model.threads,
            router.prefix_cache_mib, router.continuous_batching, settings.model.dtype,
        )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def health(self) -> str:
        return "ok" if self.alive else "generation stopped"

    # -- adapters ---------------------------------------------------------------------------------

    def load(self, name: str, directory: Path) -> None:
        """Verify the adapter against this base model and attach it as `name`. A damaged or foreign
        adapter raises `AdapterRejected` and leaves everything as it was."""
        if name in self.loaded:
            raise AdapterConflict(f"{name} is already loaded; load the new weights under a new version")
        adapters.verify_adapter(directory, self.base_hash)  # refused without stalling generation
        with self._lock:
            self._use_gate(None)
            try:
                # Verifies again: the weights attached are the ones checked, even if the files changed.
                self.model = adapters.load_adapter(self.model, directory, peft_name(name), self.base_hash)
            except adapters.AdapterRejected:
                raise
            except Exception as error:  # PEFT refused the weights (wrong shapes, missing modules)
                self._discard(name)
                raise adapters.AdapterRejected(f"{directory} does not fit the base model: {error}") from error
            self.loaded[name] = Path(directory)
            if self.prefixes is not None:
                self.prefixes.drop(name)

    def unload(self, name: str) -> None:
        """Detach an adapter; the caller guarantees no request is using it."""
        with self._lock:
            if self.loaded.pop(name, None) is not None:
                self._use_gate(None)
                self._discard(name)
            if self.prefixes is not None:
                self.prefixes.drop(name)

    def _discard(self, name: str) -> None:
        from peft import PeftModel

        name = peft_name(name)
        if not isinstance(self.model, PeftModel) or name not in self.model.peft_config:
            return
        if len(self.model.peft_config) == 1:
            # PEFT cannot delete its last adapter; removing the LoRA layers gives the plain base back.
            self.model = self.model.unload()
            return
        if self.model.active_adapter == name:
            # Requests name their adapter per row, so which one is "active" only matters to PEFT,
            # which warns when it has to pick another itself.
            other = next(other for other in self.model.peft_config if other != name)
            self.model.set_adapter(other, inference_mode=True)
        self.model.delete_adapter(name)

    def check_gate(self, gate: GateSpec) -> None:
        """Install the gate now, so weights that do not fit these adapters are refused before any
        request depends on them (`ValueError` with the reason)."""
        with self._lock:
            self._use_gate(gate)

    def _use_gate(self, gate: GateSpec | None) -> None:
        """Make `gate` (or no gate) the one installed; the model lock is held."""
        if self._gate is not None and self._gate_spec != gate:
            self._gate.remove()
            self._gate, self._gate_spec = None, None
        if gate is not None and self._gate is None:
            from tracefix.trainer.gate import GatedExperts

            gated = GatedExperts(self.model, list(gate.adapters))
            try:
                gated.load(gate.path)
            except Exception:
                gated.remove()
                raise
            self._gate, self._gate_spec = gated, gate

    # -- prompts ----------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a conversation in the model's chat template, ending with the assistant prompt."""
        return chat_token_ids(self.tokenizer, messages)

    def token_id(self, text: str) -> int:
        """The first token of `text`, as the model would write it at the start of its answer."""
        return first_token_id(self.tokenizer, text)

    def next_token_logits(self, prompt: list[int]) -> Any:
        """The base model's next-token logits after `prompt` (adapters off), as a 1-D tensor."""
        import torch

        with self._lock, torch.no_grad():
            self._use_gate(None)
            output = self.model(input_ids=torch.tensor([prompt]), logits_to_keep=1, **self._adapter_arguments([None]))
        return output.logits[0, -1].float()

    def next_token_scores(self, prompt: list[int], token_ids: Sequence[int]) -> list[float]:
        """The base model's next-token logits after `prompt` of `token_ids` only, in their order."""
        logits = self.next_token_logits(prompt)
        return [float(logits[token]) for token in token_ids]

    # -- generation -------------------------------------------------------------------------------

    def submit(self, generation: Generation) -> None:
        """Queue a request; its events arrive through ``generation.emit`` from the generation thread."""
        if generation.n > self.max_batch:
            raise ValueError(f"n={generation.n} is more than the {self.max_batch} sequences of a batch")
        with self._ready:
            if self._stopping:
                raise RuntimeError("the router is shutting down")
            self._pending.append(generation)
            metrics.BATCH_WAITING.set(len(self._pending))
            self._ready.notify()

    def stop(self) -> None:
        """End the running batch after its current step and fail its requests and those still waiting;
        the generation thread ends."""
        with self._ready:
            self._stopping = True
            waiting = list(self._pending)
            self._pending.clear()
            metrics.BATCH_WAITING.set(0)
            self._ready.notify()
        for generation in waiting:
            _emit(generation, Failed("the router is shutting down"))
        self._thread.join(timeout=30)

    def _admit(self, batch: _Batch) -> list[Generation]:
        """The waiting requests that join ``batch`` now, in arrival order; waits while there is
        nothing to run. A request that cannot join (no room for its rows, a gate batch and a plain
        one) stops admission, so the running batch drains and it goes next. Static batching admits
        only into an empty batch. [] when stopping."""
        with self._ready:
            while not self._pending and not batch.rows and not self._stopping:
                self._ready.wait()
            if self._stopping or (batch.rows and not self.continuous):
                return []
            gate = batch.gate if batch.rows else self._pending[0].gate if self._pending else None
            room = self.max_batch - len(batch.rows)
            joining: list[Generation] = []
            while self._pending and self._pending[0].n <= room and self._pending[0].gate == gate:
                joining.append(self._pending.popleft())
                room -= joining[-1].n
            metrics.BATCH_WAITING.set(len(self._pending))
            return joining

    def _serve(self) -> None:
        batch = _Batch()
        while True:
            joining = self._admit(batch)
            if self._stopping:  # shutting down: what is left of the running batch ends now
                for generation in {row.generation for row in batch.rows}:
                    _emit(generation, Failed("the router is shutting down"))
                metrics.BATCH_ROWS.set(0)
                return
            try:
                if joining:
                    self._join(batch, joining)
                if batch.rows:
                    self._step(batch)
            except Exception as error:  # a failing batch fails its requests, never the thread
                log.exception("generation failed")
                for generation in {*joining, *(row.generation for row in batch.rows)}:
                    _emit(generation, Failed(f"generation failed: {error}"))
                batch = _Batch()
            metrics.BATCH_ROWS.set(len(batch.rows))

    def _adapter_arguments(self, adapters_of_rows: Sequence[str | None]) -> dict[str, Any]:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            return {}
        return {"adapter_names": [peft_name(name) if name else PEFT_BASE for name in adapters_of_rows]}

    def _forward(self, rows: list[_Row], gate: GateSpec | None, shared: bool = False, **inputs: Any) -> Any:
        """One forward pass of ``rows`` under the model lock, each with its adapter (or the gate);
        the next-token logits only. ``shared``: the cache is an ``OpeningCache``, attended through
        the split (``trainer.opening_attention``)."""
        import torch

        from tracefix.trainer.opening_attention import opening_attention

        with self._lock, torch.no_grad(), opening_attention(self.model) if shared else nullcontext():
            # Both per pass: an adapter load between passes removes the gate, and the first load
            # wraps the model in PEFT, which then needs per-row adapter names.
            self._use_gate(gate)
            chosen = {} if gate else self._adapter_arguments([row.generation.adapter for row in rows])
            output = self.model(**inputs, use_cache=True, logits_to_keep=1, **chosen)
            if gate:
                self._add_shares(rows, self._gate.token_shares()[:, -1], self._gate.slots)
        return output

    def _join(self, batch: _Batch, joining: list[Generation]) -> None:
        """Prefill the joining requests' prompts, sample their first tokens and merge them into ``batch``."""
        import torch

        rows = [
            _Row(generation, choice, _generator(generation.sampling.seed, choice))
            for generation in joining
            for choice in range(generation.n)
        ]
        gate = joining[0].gate
        # Each row starts from the longest cached prefix of its prompt (prefix_cache.PrefixStore):
        # its cached keys right-aligned in the first columns, then its uncached tail right-aligned,
        # so every row's next token sits in the last column; positions skip the padding. The gate
        # replaces the model's forward, so its batches neither use nor fill the store.
        storing = self.prefixes is not None and gate is None
        matches = [self.prefixes.lookup(row.generation.adapter, row.generation.prompt) if storing else (None, 0) for row in rows]
        longest = max(length for _, length in matches)
        # Joining rows that share a cached opening (an agent's instructions and tools) hold it once
        # from the start, as a running batch does (``_Batch.split``), rather than a copy of it for
        # every row that the merge would then take apart again; each row holds the rest of its
        # cached prefix (a conversation's earlier turns) as its own columns.
        opening = min(shared_opening(rows, self.model.config), longest)
        opening = opening if opening >= MIN_OPENING else 0
        if longest > opening:
            own, cached_mask = prefix_cache.batch_layers(matches, start=opening)
        else:
            own, cached_mask = [], torch.zeros((len(rows), 0), dtype=torch.long)
        shared = None
        if opening:
            entry = max(matches, key=lambda match: match[1])[0]
            shared = [tuple(part[None].contiguous() for part in entry.columns(layer, 0, opening)) for layer in range(len(entry.layers))]
            own = own or [tuple(part.new_empty((len(rows), part.shape[1], 0, part.shape[3])) for part in pair) for pair in shared]
            cached_mask = torch.cat([torch.ones((len(rows), opening), dtype=torch.long), cached_mask], dim=1)
        cache = _cache(shared, own, self.model.config, self.context_tokens)
        tails = [row.generation.prompt[length:] for row, (_, length) in zip(rows, matches)]
        input_ids, tail_mask = prefix_cache.layout([], tails, self.pad_id)
        mask = torch.cat([cached_mask, tail_mask], dim=1)
        positions = prefix_cache.positions(mask)[:, cached_mask.shape[1] :]
        output = self._forward(rows, gate, bool(opening), input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache)
        if storing:  # each distinct prompt's keys and values, for its next turn
            cached_tokens = sum(length for _, length in matches)
            metrics.PREFILL_TOKENS.labels("cached").inc(cached_tokens)
            metrics.PREFILL_TOKENS.labels("prefilled").inc(sum(len(row.generation.prompt) for row in rows) - cached_tokens)
            for index, (row, (entry, length)) in enumerate(zip(rows, matches)):
                if row.choice == 0:  # the n choices of a request share its prompt
                    # Only what follows its cached prefix, which the store holds already.
                    layers = prefix_cache.row_layers(output.cache, index, mask[index].bool(), skip=length)
                    self.prefixes.store(row.generation.adapter, row.generation.prompt, layers, (entry, length) if entry is not None else None)
            metrics.PREFIX_CACHE_BYTES.set(self.prefixes.nbytes)
        joined = _Batch(rows, gate, output.cache, mask, positions[:, -1:] + 1, opening=opening)
        self._take(joined, output.logits[:, -1])
        batch.merge(joined, self.model.config, self.context_tokens)

    def _step(self, batch: _Batch) -> None:
        """One decode step of every running row."""
        import torch

        mask = torch.cat([batch.mask, torch.ones((len(batch.rows), 1), dtype=torch.long)], dim=1)
        output = self._forward(
            batch.rows, batch.gate, bool(batch.opening), input_ids=batch.next_ids, attention_mask=mask, position_ids=batch.positions, cache=batch.cache
        )
        batch.cache, batch.mask, batch.positions = output.cache, mask, batch.positions + 1
        self._take(batch, output.logits[:, -1])

    def _take(self, batch: _Batch, logits: Any) -> None:
        """Sample each row's next token from ``logits`` [rows, vocabulary], send its text, and let
        the rows that ended (or whose client went away) leave the batch."""
        import torch

        sampled = _sample(logits.float(), batch.rows)
        for row, token in zip(batch.rows, sampled):
            if row.generation.cancelled.is_set():
                row.finished = True
            else:
                self._advance(row, token)
        batch.next_ids = torch.tensor(sampled).unsqueeze(1)
        batch.keep([index for index, row in enumerate(batch.rows) if not row.finished])

    @staticmethod
    def _add_shares(rows: list[_Row], weights: Any, slots: list[str]) -> None:
        """Each unfinished row's expert weights at the position its next token is predicted from."""
        for index, row in enumerate(rows):
            if not row.finished:
                row.share_sum = weights[index].clone() if row.share_sum is None else row.share_sum + weights[index]
                row.slots = slots

    def _advance(self, row: _Row, token: int) -> None:
        """Record one sampled token and send the text that can no longer change or turn into a stop string."""
        sampling = row.generation.sampling
        row.tokens.append(token)
        ended = token in self.end_ids
        if not ended:
            self._extend_text(row, token)
        text = row.text
        cut = min((index for index in (text.find(stop) for stop in sampling.stop) if index >= 0), default=-1)
        reason = None
        if cut >= 0:
            reason, text = "stop", text[:cut]
            safe = len(text)
        elif ended or len(row.tokens) >= sampling.max_tokens:
            # The whole text once more: what an unfinished character at the end decodes to.
            reason = "stop" if ended else "length"
            text = self.tokenizer.decode(row.tokens[:-1] if ended else row.tokens, skip_special_tokens=True)
            safe = len(text)
        else:
            safe = len(text) - held_back(text, sampling.stop)
        if safe > row.sent:
            _emit(row.generation, Delta(row.choice, text[row.sent : safe]))
            row.sent = safe
        if reason is not None:
            row.finished = True
            shares = None
            if row.share_sum is not None and row.slots:
                mean = (row.share_sum / row.share_sum.sum()).tolist()
                shares = {slot: round(value, 4) for slot, value in zip(row.slots, mean, strict=True)}
            _emit(row.generation, Finished(row.choice, reason, text, len(row.tokens), shares))

    def _extend_text(self, row: _Row, token: int) -> None:
        """``row.text`` with ``token`` added: by the row's DecodeStream, which holds back the bytes of
        an unfinished character; without one, all the row's tokens decoded again."""
        if not self.incremental:
            row.text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            return
        if row.decoder is None:
            from tokenizers.decoders import DecodeStream

            row.decoder = DecodeStream(skip_special_tokens=True)
        row.text += row.decoder.step(self.tokenizer.backend_tokenizer, token) or ""


def _generator(seed: int | None, choice: int) -> Any:
    import torch

    base = secrets.randbits(62) if seed is None else seed
    return torch.Generator().manual_seed((base * 1_000_003 + choice) % (1 << 63))


def _sample(logits: Any, rows: list[_Row]) -> list[int]:
    """The next token of every row: greedy where its temperature is 0, else drawn with its own
    generator by inverse CDF (torch.multinomial takes ~20 ms a row over a 49k vocabulary)."""
    import torch

    temperatures = torch.tensor([row.generation.sampling.temperature for row in rows])
    probabilities = torch.softmax(logits / temperatures.clamp(min=1e-6).unsqueeze(1), dim=-1)
    for index, row in enumerate(rows):
        top_p = row.generation.sampling.top_p
        if top_p < 1:
            ordered, order = probabilities[index].sort(descending=True)
            # Keep the most likely tokens until their mass reaches top_p; the first one always stays.
            dropped = order[(ordered.cumsum(-1) - ordered) >= top_p]
            probabilities[index, dropped] = 0
    cumulative = probabilities.cumsum(-1)
    draws = torch.cat([torch.rand(1, generator=row.generator) for row in rows]) * cumulative[:, -1]
    drawn = torch.searchsorted(cumulative, draws.unsqueeze(1)).squeeze(1).clamp(max=logits.shape[-1] - 1)
    return torch.where(temperatures > 0, drawn, logits.argmax(-1)).tolist()


def _emit(generation: Generation, event: Event) -> None:
    try:
        generation.emit(event)
    except Exception:  # a sink whose client is gone must not stop the batch
        log.debug("dropped an event for a request that went away", exc_info=True)
