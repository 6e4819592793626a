"""Training the token-level gate (routing mode ``gate``) on successful synthetic trajectories.

Every assistant token of a trajectory is labelled with the slot of the capability whose environment
produced it (slot 0 is the base model); every other token is ignored. Each layer's gate is trained
to classify tokens by that label (cross-entropy, mean over layers), plus a small Switch-Transformer
load-balancing term, ``S · Σ_i f_i · P_i`` over the S slots (f_i: share of tokens whose top slot is
i, P_i: mean weight of slot i), that keeps the gate from collapsing onto a few experts. Only the
gates learn: the base model and every adapter stay frozen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tracefix.trainer.environment import Message
from tracefix.trainer.prefix_cache import evaluating, pad_id
from tracefix.trainer.rollouts import ChatTokens

if TYPE_CHECKING:
    from tracefix.trainer.gate import GatedExperts

IGNORE = -100  # the label of tokens the gate is not trained on


@dataclass(slots=True)
class GateExample:
    input_ids: list[int]
    labels: list[int]  # per token: the slot that should serve it, or IGNORE


def examples_from_trajectories(
    tokenizer: Any, trajectories: Sequence[tuple[Sequence[Message], int]], max_length: int = 4096
) -> list[GateExample]:
    """(messages, slot) pairs of successful trajectories → examples rendered with the chat template
    as rollouts render them, the assistant turns labelled ``slot`` (their end-of-turn token
    included), everything else ignored; cut at ``max_length`` tokens."""
    chat = ChatTokens(tokenizer)
    examples = []
    for messages, slot in trajectories:
        turns = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
        if not turns:
            continue
        conversation = list(messages[: turns[0]])
        input_ids = chat.opening(conversation)
        labels = [IGNORE] * len(input_ids)
        for position, index in enumerate(turns):
            turn = chat.encode(messages[index].get("content") or "") + [chat.end_of_turn]
            input_ids += turn
            labels += [slot] * len(turn)
            conversation.append(messages[index])
            following = turns[position + 1] if position + 1 < len(turns) else len(messages)
            added = list(messages[index + 1 : following])
            if added or following < len(messages):
                answer = chat.after_turn(conversation, added, generation_prompt=following < len(messages))
                input_ids += answer
                labels += [IGNORE] * len(answer)
            conversation += added
        examples.append(GateExample(input_ids[:max_length], labels[:max_length]))
    return examples


def gate_loss(
    logits: list[torch.Tensor], labels: torch.Tensor, attention_mask: torch.Tensor, balance_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over layers of cross-entropy against the labels plus ``balance_weight`` times the
    load-balancing term over all real tokens; returns (loss, its parts)."""
    slots = logits[0].shape[-1]
    real = attention_mask.bool()
    labelled = labels != IGNORE
    cross_entropy, balance, correct = [], [], []
    for layer in logits:  # (batch, seq, slots)
        cross_entropy.append(F.cross_entropy(layer[labelled], labels[labelled]))
        probabilities = layer[real].softmax(-1)  # (tokens, slots)
        top = F.one_hot(probabilities.argmax(-1), slots).float().mean(0)  # f_i
        balance.append(slots * (top * probabilities.mean(0)).sum())
        correct.append((layer[labelled].argmax(-1) == labels[labelled]).float().mean())
    cross_entropy_mean = torch.stack(cross_entropy).mean()
    balance_mean = torch.stack(balance).mean()
    parts = {
        "cross_entropy": cross_entropy_mean.item(),
        "balance": balance_mean.item(),
        "accuracy": torch.stack(correct).mean().item(),
    }
    return cross_entropy_mean + balance_weight * balance_mean, parts


def train_gate(
    gated: GatedExperts,
    tokenizer: Any,
    examples: Sequence[GateExample],
    steps: int = 200,
    lr: float = 1e-2,
    balance_weight: float = 0.01,
    batch_size: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Train the gates of ``gated`` on labelled examples (AdamW, batches drawn in a seeded order);
    freezes the model's own parameters. Returns the first and last step's loss and accuracy."""
    usable = [example for example in examples if any(label != IGNORE for label in example.labels)]
    if not usable:
        raise ValueError("no example has a labelled token; label the assistant turns with their slot")
    slots = len(gated.slots)
    for example in usable:
        if len(example.labels) != len(example.input_ids):
            raise ValueError(f"{len(example.input_ids)} tokens but {len(example.labels)} labels in an example")
        if any(label != IGNORE and not 0 <= label < slots for label in example.labels):
            raise ValueError(f"labels must be {IGNORE} or a slot in 0..{slots - 1} ({gated.slots})")

    gated.model.requires_grad_(False)
    parameters = list(gated.gates.parameters())
    for parameter in parameters:
        parameter.requires_grad_(True)
    # Fails if a gate were registered inside the model: then a model parameter would be trained.
    assert not any(parameter.requires_grad for parameter in gated.model.parameters()), "the model must stay frozen"

    device = parameters[0].device
    pad = pad_id(tokenizer)
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    order = random.Random(seed)
    queue: list[GateExample] = []
    history: list[dict[str, float]] = []
    started = time.monotonic()
    with evaluating(gated.model):  # the model runs as it serves (no dropout); only the gates change
        for _ in range(steps):
            batch = []
            while len(batch) < min(batch_size, len(usable)):
                if not queue:
                    queue = order.sample(list(usable), len(usable))
                batch.append(queue.pop())
            input_ids, labels, attention_mask = _pad(batch, pad, device)
            loss, parts = gate_loss(gated.gate_logits(input_ids, attention_mask), labels, attention_mask, balance_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            history.append({"loss": loss.item(), **parts})
    first, last = history[0] if history else {}, history[-1] if history else {}
    return {
        "steps": steps,
        "examples": len(usable),
        "labelled_tokens": sum(label != IGNORE for example in usable for label in example.labels),
        "first_loss": first.get("loss"),
        "loss": last.get("loss"),
        "first_accuracy": first.get("accuracy"),
        "accuracy": last.get("accuracy"),
        "balance": last.get("balance"),
        "elapsed_s": round(time.monotonic() - started, 2),
    }


def _pad(batch: list[GateExample], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, labels, attention_mask); padding is ignored and unattended."""
    width = max(len(example.input_ids) for example in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, example in enumerate(batch):
        input_ids[row, : len(example.input_ids)] = torch.tensor(example.input_ids)
        labels[row, : len(example.labels)] = torch.tensor(example.labels)
        attention_mask[row, : len(example.input_ids)] = 1
    return input_ids.to(device), labels.to(device), attention_mask.to(device)
