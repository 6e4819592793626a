"""Supervised batches that share their opening, computed once.

Every demonstration of one environment starts with the same tokens: the agent's instructions and
its tool definitions, a thousand tokens and more, against a hundred or two of request and answer.
TRL's ``SFTTrainer`` runs each row of a batch over its whole length. ``SharedPrefixSFTTrainer``
runs the batch's common prefix once (batch size 1, with gradients), repeats its key/value cache for
every row, and runs only the rows' own tails on top of it. The loss and the gradients are those of
the plain forward pass: the prefix's activations stay in the autograd graph, so the gradient of
every row flows back through them once, summed. What it saves is the prefix's repeated forward and
backward passes, (rows − 1) × prefix tokens per batch.

With ``opening_gradient=False`` the prefix runs without autograd: the loss is the same, but the
gradient stops at the prefix's keys and values, so the adapter learns only through the rows' own
tokens (how they attend to the opening, not how the opening is represented). An update then skips
the prefix's backward pass and keeps none of its activations: 1.46× faster an update on the
airline agent's 1,200-token opening (docs/history/performance-log-2026.md). It is an
approximation; the exact gradient is the default (``[training] warm_start_opening_gradient``).

The loss is the summed negative log-likelihood of the labelled tokens over their count (or over
``num_items_in_batch`` when the trainer accumulates gradients), as in ``SFTTrainer``.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import SFTTrainer

from tracefix.trainer.output_layer import scored_logits

MIN_PREFIX = 16  # below this many shared tokens the plain forward pass is as cheap
CASCADE = True  # the tails attend the one opening by the cascade; off only to measure it (the opening then repeated per row)


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> int:
    """How many leading tokens every row shares (attended, identical), up to the first labelled
    token: the prefix's last position predicts it, the rows' tails the ones after."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    length = int(same.long().cumprod(dim=0).sum())
    labelled = (labels != -100).any(dim=0).nonzero()
    if len(labelled):
        length = min(length, int(labelled[0]))
    return max(0, min(length, input_ids.shape[1] - 1))


def _token_loss(logits: torch.Tensor, targets: torch.Tensor, num_items: Any) -> torch.Tensor:
    """Summed cross-entropy of ``logits`` against ``targets`` (−100 ignored) over the count."""
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    count = (targets != -100).sum() if num_items is None else num_items
    return total / torch.as_tensor(count, device=total.device).clamp(min=1)


def _scored_loss(model: Any, first: torch.Tensor | None, inputs: dict[str, Any], targets: torch.Tensor, num_items: Any) -> torch.Tensor:
    """The loss of ``targets`` [rows, T] after the forward pass of ``inputs``. With ``first``
    [rows, V], target 0 is predicted by it and target j + 1 by position j; without, target j by
    position j. Only the positions whose target is labelled go through the output layer
    (``trainer.output_layer``)."""
    own = targets[:, 1:] if first is not None else targets  # the targets of the forward pass's positions
    scored = own != -100
    logits = scored_logits(model, inputs, scored)  # [labelled, V]
    if first is None:
        return _token_loss(logits, own[scored], num_items)
    return _token_loss(torch.cat([first, logits]), torch.cat([targets[:, 0], own[scored]]), num_items)


def shared_prefix_loss(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, num_items: Any = None,
    opening_gradient: bool = True,
) -> torch.Tensor:
    """The causal-LM loss of a right-padded batch, its common prefix computed once (with or without
    the gradient through it: see the module)."""
    rows, width = input_ids.shape
    prefix = shared_prefix_length(input_ids, attention_mask, labels)
    if prefix >= MIN_PREFIX and not opening_gradient:
        # All but the prefix's last token as constants; that token starts the tails, so its
        # prediction of each row's first labelled token keeps its gradient.
        start = prefix - 1
        with torch.no_grad():
            opening = model(input_ids=input_ids[:1, :start], attention_mask=attention_mask[:1, :start], use_cache=True, logits_to_keep=1).cache
        cache, attending = tails_cache(model, opening, rows)
        positions = torch.arange(start, width, device=input_ids.device).unsqueeze(0).expand(rows, -1)
        tails = {"input_ids": input_ids[:, start:], "attention_mask": attention_mask, "cache": cache, "position_ids": positions, "use_cache": True}
        with attending:
            return _scored_loss(model, None, tails, labels[:, prefix:], num_items)
    if rows == 1 or prefix < MIN_PREFIX:
        return _scored_loss(model, None, {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}, labels[:, 1:], num_items)
    # Only the prefix's last position is scored: its other logits would cost the vocabulary × prefix.
    opening = model(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True, logits_to_keep=1)
    # Every row attends to the one prefix (autograd sums their gradients): held once, attended by the cascade.
    cache, attending = tails_cache(model, opening.cache, rows)
    positions = torch.arange(prefix, width, device=input_ids.device).unsqueeze(0).expand(rows, -1)
    tails = {"input_ids": input_ids[:, prefix:], "attention_mask": attention_mask, "cache": cache, "position_ids": positions, "use_cache": True}
    # The prefix's last position predicts each row's first tail token; the tails predict the rest.
    with attending:
        return _scored_loss(model, opening.logits[:, -1].expand(rows, -1), tails, labels[:, prefix:], num_items)


def tails_cache(model: Any, opening: Any, rows: int) -> tuple[Any, Any]:
    """The cache the tails run on after ``opening`` (its one-row cache) and the context to run them
    in: the opening held once and attended by ``opening_attention.cascade_attention`` where the
    model allows it (``CASCADE``), else repeated for every row under plain SDPA."""
    from contextlib import nullcontext

    from tracefix.trainer.opening_attention import TailsCache, opening_attention, shareable

    if CASCADE and shareable(opening):
        return TailsCache(opening), opening_attention(model)
    opening.batch_repeat_interleave(rows)
    return opening, nullcontext()


OPENING_KEY = 64  # sequences whose first this many tokens agree share an opening, for batching


class OpeningBatches(torch.utils.data.Sampler[int]):
    """Indices in batches of ``batch`` sequences that share their opening where they can: within
    each group of one opening the order is shuffled and cut into batches, and the batches are
    shuffled, anew each epoch. A batch that mixes openings (a warm start that rehearses the
    generalist's 2,000-token conversations among an environment's shorter demonstrations) shares no
    prefix and pads every row to the longest; grouped, only what no group fills is mixed, shuffled
    together (everything, where every opening differs: a plain random order)."""

    def __init__(self, sequences: list[list[int]], batch: int, seed: int) -> None:
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, ids in enumerate(sequences):
            groups.setdefault(tuple(ids[:OPENING_KEY]), []).append(index)
        self.groups, self.batch, self.seed, self.epoch = list(groups.values()), max(1, batch), seed, 0

    def __len__(self) -> int:
        return sum(len(group) for group in self.groups)

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        batches, rest = [], []
        for group in self.groups:
            shuffled = [group[int(i)] for i in torch.randperm(len(group), generator=generator)]
            whole = len(shuffled) - len(shuffled) % self.batch
            batches += [shuffled[start : start + self.batch] for start in range(0, whole, self.batch)]
            rest += shuffled[whole:]
        # What no group fills (all of it where every opening differs) is shuffled together, as a plain sampler would.
        rest = [rest[int(i)] for i in torch.randperm(len(rest), generator=generator)]
        batches += [rest[start : start + self.batch] for start in range(0, len(rest), self.batch)]
        for position in torch.randperm(len(batches), generator=generator):
            yield from batches[int(position)]


class SharedPrefixSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss runs a batch's common prefix once (see the module); with
    ``group_openings`` (sequences of several openings, a rehearsal's), batches drawn by
    ``OpeningBatches``, else in the trainer's own random order."""

    def __init__(self, *args: Any, opening_gradient: bool = True, group_openings: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opening_gradient = opening_gradient
        self.group_openings = group_openings

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        if not self.group_openings:
            return super()._get_train_sampler(train_dataset)
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return OpeningBatches(list(dataset["input_ids"]), self.args.per_device_train_batch_size, self.args.seed)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        if return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return shared_prefix_loss(model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"], num_items_in_batch, self.opening_gradient)
