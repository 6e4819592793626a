"""The GRPO policy loss of one group of rollouts: its shared opening computed once, its rollouts in
micro-batches, its gradient exact.

Every rollout of a group starts with the same prompt P (the agent's instructions, its tool
definitions, the user's request) and goes on with a completion C_i of its own (the policy's turns
and the environment's answers). The plain computation runs G rows of P + C_i. Here P runs once,
with gradients, and the completions run on top of its key/value cache a few rows at a time (the
shared-prefix technique of Prefix Grouper, arXiv 2506.05433): a group costs P + Σ|C_i| tokens
instead of G·P + Σ|C_i|, and peak memory is P's activations plus one micro-batch's, whatever G is.

The prefix's keys and values, and its last logit (which predicts each completion's first token),
are cut out of the graph as leaf tensors. Each micro-batch's backward pass adds into their
``.grad`` as it adds into the LoRA weights'; after the last micro-batch one backward pass through
the prefix carries those sums into the LoRA weights. The result is the gradient of one backward
pass over the whole group (tests/test_policy_loss.py checks it against the plain computation).

Per policy token t of rollout i, with advantage A_i and ratio r_t = π(t) / π_old(t):

    loss_t = −min(r_t·A_i, clip(r_t, 1 − ε, 1 + ε)·A_i) + β·KL_t
    KL_t   = e^d − d − 1,  d = log π_ref(t) − log π(t)     (the k3 estimator, ≥ 0)

summed over the batch's policy tokens and divided by their count (token-level normalisation, as
in DAPO and TRL's ``loss_type="dapo"``), so splitting a batch into micro-batches cannot change it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracefix.trainer.output_layer import scored_logits


@dataclass(slots=True)
class Completion:
    """One rollout as the loss sees it: what followed the group's prompt."""

    ids: list[int]  # completion tokens, the policy's and the environment's, in order
    mask: list[int]  # per token: 1 = the policy's own (trained), 0 = the environment's
    advantage: float = 0.0
    old: torch.Tensor | None = None  # [sum(mask)] the policy tokens' log-probs when the rollouts were taken; None = now (ratio 1)
    reference: torch.Tensor | None = None  # [sum(mask)] the policy tokens' log-probs under the reference policy, for the KL


@dataclass(slots=True)
class LossStats:
    """Sums over the policy tokens of one optimisation pass (means by ``summary``)."""

    tokens: int = 0
    loss: float = 0.0
    clipped: int = 0  # tokens whose clipped term is the smaller one (no gradient through them)
    ratio: float = 0.0
    kl: float = 0.0

    def add(self, other: LossStats) -> None:
        self.tokens += other.tokens
        self.loss += other.loss
        self.clipped += other.clipped
        self.ratio += other.ratio
        self.kl += other.kl

    def summary(self) -> dict[str, float]:
        count = max(self.tokens, 1)
        return {
            "loss": round(self.loss, 6), "clip_fraction": round(self.clipped / count, 4),
            "ratio_mean": round(self.ratio / count, 6), "kl": round(self.kl / count, 6),
        }  # fmt: skip


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _prefix(model: Any, prompt: Sequence[int], gradient: bool = True) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The prompt's keys and values per layer (each [1, heads, P, dim]) and its last logit [1, V].
    Without ``gradient`` all but the prompt's last token run without autograd: the last token's
    keys, values and logit (which predicts every completion's first token) keep their gradient, as
    the warm start's stopped opening does (``trainer.shared_prefix``)."""
    ids = torch.tensor([list(prompt)], device=_device(model))
    if gradient or len(prompt) < 2:
        output = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    else:
        with torch.no_grad():
            head = model(input_ids=ids[:, :-1], use_cache=True).cache
        output = model(input_ids=ids[:, -1:], cache=head, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in output.cache.layers], output.logits[:, -1]


def _completion_logprobs(
    model: Any,
    layers: list[tuple[torch.Tensor, torch.Tensor]],
    last: torch.Tensor,
    rows: Sequence[Sequence[int]],
    temperature: float = 1.0,
    masks: Sequence[Sequence[int]] | None = None,
) -> list[torch.Tensor]:
    """log π of each row's tokens where its mask is 1 (every token without ``masks``), the rows
    continuing the prefix whose cache is ``layers`` and whose last logit is ``last``; π is the
    distribution the rollouts were sampled from, the logits divided by ``temperature`` (as TRL's
    GRPO does). Rows are right-padded; the padding is masked. Only the positions read go through
    the output layer (``trainer.output_layer``)."""
    from transformers import DynamicCache

    device = _device(model)
    count, width, prefix = len(rows), max(len(row) for row in rows), layers[0][0].shape[2]
    ids = torch.zeros((count, width), dtype=torch.long, device=device)  # [n, W]
    mask = torch.zeros((count, prefix + width), dtype=torch.long, device=device)  # [n, P + W]
    read = torch.zeros((count, width), dtype=torch.bool, device=device)  # [n, W]: the tokens scored
    mask[:, :prefix] = 1
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(list(row), device=device)
        mask[index, prefix : prefix + len(row)] = 1
        read[index, : len(row)] = torch.tensor(list(masks[index]), dtype=torch.bool, device=device) if masks is not None else True
    cache = DynamicCache(
        ddp_cache_data=[(keys.expand(count, -1, -1, -1), values.expand(count, -1, -1, -1)) for keys, values in layers],
        config=model.config,
    )
    positions = torch.arange(prefix, prefix + width, device=device).unsqueeze(0).expand(count, -1)
    inputs = {"input_ids": ids, "attention_mask": mask, "cache": cache, "position_ids": positions, "use_cache": True}
    # The prefix's last logit predicts each row's first token; row position j predicts token j + 1.
    later = read[:, 1:]  # tokens 1 … W − 1, predicted by positions 0 … W − 2
    table = torch.cat([last, scored_logits(model, inputs, later)])  # [1 + k', V]: the prefix's logit, then the later tokens'
    where = torch.zeros((count, width), dtype=torch.long, device=device)
    where[:, 1:][later] = torch.arange(1, 1 + int(later.sum()), device=device)
    logits = table[where[read]]  # [k, V], row by row
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, ids[read].unsqueeze(-1)).squeeze(-1)  # [k]
    return list(logprobs.split(read.sum(dim=1).tolist()))


def group_logprobs(
    model: Any, prompt: Sequence[int], rows: Sequence[Sequence[int]], micro_batch: int, temperature: float = 1.0,
    masks: Sequence[Sequence[int]] | None = None,
) -> list[torch.Tensor]:
    """log π of the completions' tokens (those whose mask is 1; all without ``masks``), without
    gradients (the old or the reference policy)."""
    with torch.no_grad():
        layers, last = _prefix(model, prompt)
        out: list[torch.Tensor] = []
        for start in range(0, len(rows), micro_batch):
            end = start + micro_batch
            out.extend(_completion_logprobs(model, layers, last, rows[start:end], temperature, None if masks is None else masks[start:end]))
    return out


def _token_loss(logprobs: torch.Tensor, completion: Completion, epsilon: float, beta: float, stats: LossStats) -> torch.Tensor:
    """The summed loss of one completion's policy tokens, ``logprobs`` theirs (see the module);
    adds to ``stats``."""
    if completion.old is None:  # the first pass over fresh rollouts: the current policy took them
        completion.old = logprobs.detach()
    ratio = torch.exp(logprobs - completion.old)
    advantage = completion.advantage
    per_token = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantage)
    if completion.reference is not None:
        difference = completion.reference - logprobs
        kl = torch.exp(difference) - difference - 1
        if beta:
            per_token = per_token + beta * kl
        stats.kl += float(kl.detach().sum())
    clipped = ((ratio < 1 - epsilon) & (advantage < 0)) | ((ratio > 1 + epsilon) & (advantage > 0))
    stats.tokens += len(logprobs)
    stats.clipped += int(clipped.sum())
    stats.ratio += float(ratio.detach().sum())
    return per_token.sum()


def group_backward(
    model: Any,
    prompt: Sequence[int],
    completions: Sequence[Completion],
    normaliser: int,
    micro_batch: int = 2,
    epsilon: float = 0.2,
    beta: float = 0.0,
    temperature: float = 1.0,
    opening_gradient: bool = True,
) -> LossStats:
    """Add the gradient of the group's loss (summed over its policy tokens, divided by
    ``normaliser``, the policy tokens of the whole batch) to the model's parameters; π is the
    sampling distribution at ``temperature``. Without ``opening_gradient`` the gradient stops at
    the prompt's keys and values (all but its last token's): the loss is the same, the prompt's
    backward pass is skipped."""
    layers, last = _prefix(model, prompt, opening_gradient)  # the prefix runs through the LoRA weights too
    cut = [(keys.detach().requires_grad_(), values.detach().requires_grad_()) for keys, values in layers]
    cut_last = last.detach().requires_grad_()
    stats = LossStats()
    for start in range(0, len(completions), micro_batch):
        chunk = completions[start : start + micro_batch]
        part = LossStats()
        logprobs = _completion_logprobs(
            model, cut, cut_last, [completion.ids for completion in chunk], temperature, [completion.mask for completion in chunk]
        )
        loss = torch.stack([_token_loss(row, completion, epsilon, beta, part) for row, completion in zip(logprobs, chunk, strict=True)])
        loss = loss.sum() / max(normaliser, 1)
        if loss.requires_grad:
            loss.backward()
        part.loss = float(loss.detach())
        stats.add(part)
    # The micro-batches' gradients with respect to the prefix's outputs, carried through the prefix.
    outputs = [tensor for pair in layers for tensor in pair] + [last]
    gradients = [tensor.grad for pair in cut for tensor in pair] + [cut_last.grad]
    flowing = [(output, gradient) for output, gradient in zip(outputs, gradients, strict=True) if gradient is not None]
    if flowing:
        torch.autograd.backward([output for output, _ in flowing], [gradient for _, gradient in flowing])
    return stats
