"""Next-action evaluation: an adapter judged on held-out successful conversations, without the live
agent. At each of the agent's turns the model is given the true conversation so far (teacher
forcing), writes one turn greedily, and is scored on whether it takes the reference's next action:
the same tool calls with the same arguments, or a plain-text reply where the reference replied in
text. Beside the match, a weaker one (the same tools, whatever the arguments) and, for a reply, the
word F1 of its text against the reference's, which never decides the match.

Conversations come as ``trainer.imitation`` takes them, rendered as the model sees them
(``router.protocol.stored_prompt_messages``: tools in the system prompt, calls as tagged text), and
turns are read with ``parse_assistant``, as the environments read a policy's turn.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal

from tracefix.daemon.core.intervals import mcnemar_p, paired_difference, wilson
from tracefix.trainer.environment import Message, assistant_text, parse_assistant
from tracefix.trainer.prefix_cache import MIN_PREFIX, common_prefix, layout, prefill
from tracefix.trainer.rollouts import ChatTokens, Sampling

BATCH = 16  # prompts per decode pass


@dataclass(frozen=True, slots=True)
class ActionMatch:
    """One produced turn against the reference's. ``kind``: the reference's ("call": it called
    tools, "answer": it replied in text); ``tool_match``: the same tools in the same order,
    arguments aside (for an answer, the same as ``match``); ``answer_f1``: for an answer, the word
    F1 of the produced text against the reference's."""

    kind: Literal["call", "answer"]
    match: bool
    tool_match: bool
    answer_f1: float | None = None


def reference_turns(conversation: Sequence[Message]) -> list[tuple[list[Message], Message]]:
    """(the messages before it, the turn) for each of the agent's turns, in order."""
    return [(list(conversation[:index]), message) for index, message in enumerate(conversation) if message["role"] == "assistant"]


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: objects whatever their key order, arrays in order, 1 equal to 1.0 but
    ``true`` not equal to 1 (as Python's ``==`` would have it)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def word_f1(produced: str, reference: str) -> float:
    """F1 of the lowercased words two texts share (SQuAD's answer F1); 1 when neither has any."""
    ours, theirs = _words(produced), _words(reference)
    if not ours or not theirs:
        return float(ours == theirs)
    common = sum((Counter(ours) & Counter(theirs)).values())
    return 2 * common / (len(ours) + len(theirs))


def same_action(produced: Message, expected: Message) -> ActionMatch:
    """Whether ``produced`` takes ``expected``'s action. Calls match when the same tools are called
    in the same order with equal arguments (``same_json``; arguments that are not JSON never
    match); a reply matches a reply. A turn with a malformed call matches neither: it is a failed
    call, not a reply."""
    wanted, got = parse_assistant(expected), parse_assistant(produced)
    if wanted.calls:
        tools = [call.name for call in got.calls] == [call.name for call in wanted.calls]
        arguments = all(
            call.arguments is not None and same_json(call.arguments, reference.arguments) for call, reference in zip(got.calls, wanted.calls)
        )
        return ActionMatch("call", tools and arguments and not got.errors, tools)
    replied = not got.calls and not got.errors
    return ActionMatch("answer", replied, replied, word_f1(got.text, wanted.text))


def _rate(hits: Sequence[bool]) -> dict[str, Any]:
    """``hits`` counted, with the rate and its 95 % Wilson interval (0 and (0, 1) without any)."""
    count = sum(hits)
    return {
        "hits": count,
        "total": len(hits),
        "rate": round(count / len(hits), 4) if hits else 0.0,
        "interval": [round(value, 4) for value in wilson(count, len(hits))],
    }


def score_actions(matches: Sequence[Sequence[ActionMatch | None]]) -> dict[str, Any]:
    """The report of a model's turns, per conversation (None: a turn skipped, ``next_actions``):
    ``matched`` and ``tool_matched`` over the scored turns, ``call`` and ``call_tool`` over the
    turns that called tools, ``answer`` over those that replied, ``conversations`` over those with
    no turn skipped (hits: every turn matched), each a ``_rate``; ``mean_answer_f1`` (None without
    a reply)."""
    scored = [item for conversation in matches for item in conversation if item is not None]
    calls = [item for item in scored if item.kind == "call"]
    answers = [item for item in scored if item.kind == "answer"]
    f1 = [item.answer_f1 for item in answers if item.answer_f1 is not None]
    return {
        "turns": len(scored),
        "skipped": sum(item is None for conversation in matches for item in conversation),
        "matched": _rate([item.match for item in scored]),
        "tool_matched": _rate([item.tool_match for item in scored]),
        "call": _rate([item.match for item in calls]),
        "call_tool": _rate([item.tool_match for item in calls]),
        "answer": _rate([item.match for item in answers]),
        "conversations": _rate([all(item is not None and item.match for item in turns) for turns in matches if turns and None not in turns]),
        "mean_answer_f1": round(fmean(f1), 4) if f1 else None,
    }


def fitted(chat: ChatTokens, prefix: Sequence[Message], room: int) -> list[int] | None:
    """The prompt of ``prefix`` (ending with the generation prompt) in at most ``room`` tokens: its
    oldest whole turns after the opening (the messages before the agent's first turn) dropped until
    it fits, each turn with what followed it; None when even the last alone does not fit."""
    agent = [index for index, message in enumerate(prefix) if message["role"] == "assistant"]
    opening = list(prefix[: agent[0]]) if agent else list(prefix)
    for start in [len(opening), *agent[1:]]:
        ids = chat.opening([*opening, *prefix[start:]])
        if len(ids) <= room:
            return ids
    return None


def written(model: Any, tokenizer: Any, prompts: Sequence[list[int] | None], max_new_tokens: int, batch: int = BATCH) -> list[str | None]:
    """The model's greedy turn after each prompt as text (None for None), ``batch`` prompts per
    decode, shortest first so that a batch pads little; their common opening is prefilled once
    and shared by the rows (``trainer.prefix_cache``), as in the rollouts."""
    from tracefix.trainer.decode import decode
    from tracefix.trainer.opening_attention import rows_cache

    order = sorted((index for index, ids in enumerate(prompts) if ids is not None), key=lambda index: len(prompts[index] or []))
    texts: list[str | None] = [None] * len(prompts)
    if not order:
        return texts
    shared = common_prefix([prompts[index] or [] for index in order])
    opening = (prompts[order[0]] or [])[:shared] if shared >= MIN_PREFIX else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        opening_cache = prefill(model, opening) if opening else None
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            input_ids, mask = layout(opening, [(prompts[index] or [])[len(opening) :] for index in rows], pad)
            cache, attending = rows_cache(model, opening_cache, len(rows)) if opening_cache is not None else (None, nullcontext())
            with attending:
                decoded = decode(
                    model, input_ids.to(device), mask.to(device), cache, max_new_tokens=max_new_tokens, end=tokenizer.eos_token_id, opening=len(opening)
                )
            for index, turn in zip(rows, decoded.turns, strict=True):
                texts[index] = tokenizer.decode(turn, skip_special_tokens=True).strip()
    finally:
        model.train(was_training)
    return texts


def next_actions(
    model: Any, tokenizer: Any, conversations: Sequence[Sequence[Message]], sampling: Sampling, batch: int = BATCH
) -> list[list[ActionMatch | None]]:
    """Each agent turn of each conversation against the model's own, written greedily (whatever
    ``sampling.temperature``) after the true conversation before it. A prefix that leaves fewer
    than ``sampling.max_new_tokens`` of ``sampling.max_length`` loses its oldest whole turns after
    the opening (``fitted``); a turn whose prompt does not fit even so is skipped: None in its
    place, counted as ``skipped`` by ``score_actions``."""
    chat = ChatTokens(tokenizer)
    turns = [reference_turns(conversation) for conversation in conversations]
    room = sampling.max_length - sampling.max_new_tokens
    prompts = [fitted(chat, prefix, room) for conversation in turns for prefix, _ in conversation]
    texts = iter(written(model, tokenizer, prompts, sampling.max_new_tokens, batch))
    matches: list[list[ActionMatch | None]] = []
    for conversation in turns:
        produced = [next(texts) for _ in conversation]
        references = [expected for _, expected in conversation]
        matches.append([None if text is None else same_action(assistant_text(text), expected) for text, expected in zip(produced, references, strict=True)])
    return matches


def compare_next_actions(
    model: Any, tokenizer: Any, conversations: Sequence[Sequence[Message]], sampling: Sampling, batch: int = BATCH,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The base model (``model``, a PEFT model, with its adapters disabled; or with the LoRA weights
    ``reference`` in place of its own) and the adapter scored on the same turns, and the difference
    of their match rates, turn by turn: the paired 95 % interval (Newcombe) and McNemar's exact p.
    The skipped turns are the same for both (the prompts do not depend on the weights) and left out
    of the pairs."""
    if not hasattr(model, "disable_adapter"):
        raise TypeError("compare_next_actions needs a PEFT model: its base is scored with the adapter disabled")
    from tracefix.trainer.grpo import adapter_weights

    with model.disable_adapter() if reference is None else adapter_weights(model, reference):
        base = next_actions(model, tokenizer, conversations, sampling, batch)
    adapter = next_actions(model, tokenizer, conversations, sampling, batch)
    base_turns, adapter_turns = ([item for conversation in run for item in conversation] for run in (base, adapter))
    pairs = [(before.match, after.match) for before, after in zip(base_turns, adapter_turns, strict=True) if before is not None and after is not None]
    adapter_only = sum(after and not before for before, after in pairs)
    base_only = sum(before and not after for before, after in pairs)
    both = sum(before and after for before, after in pairs)
    delta, low, high = paired_difference(adapter_only, base_only, both, len(pairs) - adapter_only - base_only - both)
    return {
        "base": score_actions(base),
        "adapter": score_actions(adapter),
        "difference": {
            "rate": round(delta, 4), "interval": [round(low, 4), round(high, 4)], "mcnemar_p": round(mcnemar_p(adapter_only, base_only), 4),
            "adapter_only": adapter_only, "base_only": base_only, "both": both,
        },
        "turns": len(pairs),
    }  # fmt: skip
