"""Token-level rollouts: a causal LM acting in environment instances, many episodes in lockstep.

Every episode is kept as one token sequence, exactly the one the model saw while sampling: the
opening messages rendered with the chat template, then for each turn the tokens the model sampled
(trained) followed by the environment's answer rendered the same way (masked). The trainer gets
``prompt_ids``, ``completion_ids`` and ``env_mask`` (1 = the policy's own token) per episode.

A hinted episode samples with the hint in its system prompt, but its ``prompt_ids`` are those of the
plain prompt: the hint is stripped before the gradient step, so the model learns to act without it.
A guided episode starts from a forced prefix of the environment's own solution, of random length
(whole solution turns, then part of the next): the model goes on from there, and the forced tokens
are trained as the policy's (guided GRPO, the paper's hint injection done at the token level).
A greedy episode is decoded greedily in the same lockstep pass as the sampled ones (its rows'
logits cut to their largest), so a group can carry the answer greedy evaluation would give.

The episodes' common opening is prefilled once and shared by the rows (``trainer.prefix_cache``,
``trainer.opening_attention``), and a batch's cache is carried from one turn to the next: a turn
prefills only what is new since the last (the environment's answer, the next generation prompt),
not the conversation so far. Within a turn a row leaves the batch as soon as its turn ends
(``trainer.decode``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracefix.trainer.decode import decode
from tracefix.trainer.environment import Instance, Message, Rollout
from tracefix.trainer.prefix_cache import MIN_PREFIX, common_prefix, evaluating, layout, pad_id, prefill

CARRY_TURNS = True  # a batch's cache carried from turn to turn (``_generate``); off only to measure it


def with_hint(messages: list[Message], hint: str | None) -> list[Message]:
    """The opening messages with the hint appended to the system prompt (unchanged without either)."""
    if not hint or not messages or messages[0].get("role") != "system":
        return messages
    return [{**messages[0], "content": f"{messages[0]['content']}\n\nHint: {hint}"}, *messages[1:]]


@dataclass(slots=True)
class Sampling:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_turns: int | None = None  # default: the instance's own limit
    max_length: int = 4096  # an episode whose tokens reach this ends where it is


@dataclass(slots=True)
class TokenRollout:
    rollout: Rollout
    prompt_ids: list[int]  # the plain opening (no hint), ending with the generation prompt
    completion_ids: list[int]  # policy and environment tokens, in order
    env_mask: list[int]  # per completion token: 1 = sampled by the policy, 0 = environment/template
    hinted: bool = False
    truncated_turns: int = 0  # turns cut by max_new_tokens
    forced_tokens: int = 0  # tokens of the environment's solution forced at the start (guided episodes)
    greedy: bool = False  # decoded greedily among sampled episodes

    @property
    def policy_tokens(self) -> int:
        return sum(self.env_mask)

    def sequence(self) -> tuple[list[int], list[int]]:
        """The whole episode as one token sequence, with its mask (1 = the policy's own token)."""
        return self.prompt_ids + self.completion_ids, [0] * len(self.prompt_ids) + self.env_mask


@dataclass(slots=True)
class _Episode:
    instance: Instance
    messages: list[Message]  # the plain conversation (no hint), as recorded
    from_policy: list[bool]
    context: list[int]  # what the model sees: hinted prompt + completion
    prompt_ids: list[int]
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    hinted: bool = False
    forced: list[list[int]] = field(default_factory=list)  # per coming turn: the tokens it starts with
    greedy: bool = False
    done: bool = False
    turns: int = 0
    truncated_turns: int = 0

    def extend(self, ids: Sequence[int], trained: bool) -> None:
        self.context.extend(ids)
        self.completion.extend(ids)
        self.mask.extend([int(trained)] * len(ids))


class ChatTokens:
    """Renders conversations into token ids with the tokenizer's chat template, turn by turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token_id
        self.end_text = tokenizer.eos_token or ""

    def render(self, messages: list[Message], generation_prompt: bool) -> str:
        chat = [{"role": message["role"], "content": message.get("content") or ""} for message in messages]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def opening(self, messages: list[Message]) -> list[int]:
        return self.encode(self.render(messages, generation_prompt=True))

    def after_turn(self, conversation: list[Message], added: list[Message], generation_prompt: bool) -> list[int]:
        """Tokens that follow the policy's end-of-turn token: the rest of the template's rendering of
        the assistant turn (e.g. ChatML's newline), the added messages and, when the policy acts
        again, the generation prompt."""
        before = self.render(conversation, generation_prompt=False)
        after = self.render(conversation + added, generation_prompt=generation_prompt)
        if not after.startswith(before):  # a template that re-renders history; keep what is new
            after = after[len(self.render(conversation[:-1], generation_prompt=False)) :]
            before = ""
        tail = before[before.rfind(self.end_text) + len(self.end_text) :] if self.end_text in before else ""
        return self.encode(tail + after[len(before) :])


def generate_rollouts(
    model: Any,
    tokenizer: Any,
    instances: Sequence[Instance],
    sampling: Sampling,
    hinted: Sequence[bool] | None = None,
    seed: int = 0,
    guided: Sequence[bool] | None = None,
    greedy: Sequence[bool] | None = None,
) -> list[TokenRollout]:
    """Run every instance to its end with the model, batching one assistant turn of all live
    episodes per decode. Sampling (and the length of guided episodes' forced prefixes)
    is seeded by ``seed``: same inputs, same rollouts. The episodes flagged ``greedy`` are decoded
    greedily whatever ``sampling`` says."""
    import random

    import torch

    chat = ChatTokens(tokenizer)
    hinted = list(hinted) if hinted is not None else [False] * len(instances)
    guided = list(guided) if guided is not None else [False] * len(instances)
    greedy = list(greedy) if greedy is not None else [False] * len(instances)
    cut = random.Random(seed)
    episodes = []
    for instance, with_hint_text, with_guide, argmax in zip(instances, hinted, guided, greedy, strict=True):
        messages = instance.reset()
        prompt_ids = chat.opening(messages)
        context = chat.opening(with_hint(messages, instance.hint())) if with_hint_text else list(prompt_ids)
        forced = forced_solution(chat, instance, cut) if with_guide else []
        episodes.append(_Episode(instance, messages, [False] * len(messages), context, prompt_ids, hinted=with_hint_text, forced=forced, greedy=argmax))
    forced_tokens = [sum(len(turn) for turn in episode.forced) for episode in episodes]
    generator_state = torch.random.get_rng_state()
    with evaluating(model):
        try:
            # The episodes' common opening (instructions, tools) is prefilled once for all their turns:
            # contexts only grow, so it stays the prefix of every one.
            opening: list[int] = []
            opening_cache = None
            if len(episodes) > 1 and (shared := common_prefix([episode.context for episode in episodes])) >= MIN_PREFIX:
                opening = episodes[0].context[:shared]
                opening_cache = prefill(model, opening)
            turn = 0
            carried: _Carried | None = None
            while live := [episode for episode in episodes if not episode.done]:
                torch.manual_seed(seed * 7919 + turn)
                starts = [episode.forced.pop(0) if episode.forced else [] for episode in live]
                whole = [bool(start) and start[-1] == chat.end_of_turn for start in starts]  # a forced turn needs no sampling
                sampling_rows = [index for index, done in enumerate(whole) if not done]
                sampled: dict[int, list[int]] = {index: starts[index] for index, done in enumerate(whole) if done}
                if sampling_rows:
                    rows = [live[index] for index in sampling_rows]
                    turns, carried = _generate(model, tokenizer, rows, sampling, opening, opening_cache, [starts[index] for index in sampling_rows], carried)
                    sampled.update({index: starts[index] + ids for index, ids in zip(sampling_rows, turns, strict=True)})
                for index, episode in enumerate(live):
                    _advance(chat, episode, sampled[index], sampling)
                turn += 1
        finally:
            torch.random.set_rng_state(generator_state)
    return [
        TokenRollout(
            Rollout(episode.messages, episode.from_policy, episode.instance.reward(), episode.instance.success(), list(episode.instance.events)),
            episode.prompt_ids,
            episode.completion,
            episode.mask,
            episode.hinted,
            episode.truncated_turns,
            forced,
            episode.greedy,
        )
        for episode, forced in zip(episodes, forced_tokens, strict=True)
    ]


def play_in_batches(
    model: Any, tokenizer: Any, instances: Sequence[Instance], sampling: Sampling, batch: int,
    hinted: Sequence[bool] | None = None, seed: int = 0,
) -> list[TokenRollout]:
    """``generate_rollouts`` over ``instances``, ``batch`` episodes per lockstep pass (pass k seeded
    by ``seed + k``)."""
    hinted = list(hinted) if hinted is not None else [False] * len(instances)
    played: list[TokenRollout] = []
    for number, start in enumerate(range(0, len(instances), batch)):
        end = start + batch
        played.extend(generate_rollouts(model, tokenizer, instances[start:end], sampling, hinted[start:end], seed=seed + number))
    return played


def forced_solution(chat: ChatTokens, instance: Instance, cut: Any) -> list[list[int]]:
    """The start of the instance's solution, of a length drawn uniformly from 1 to all but its last
    token, as the tokens each coming turn starts with: whole turns (ending in the end-of-turn token)
    and then the beginning of one more."""
    turns = [chat.encode(message.get("content") or "") + [chat.end_of_turn] for message in instance.solution()]
    total = sum(len(turn) for turn in turns)
    if total < 2:
        return []
    length = cut.randint(1, total - 1)
    forced = []
    for turn in turns:
        forced.append(turn[:length])
        length -= len(forced[-1])
        if length <= 0:
            break
    return forced


@dataclass(slots=True)
class _Carried:
    """A batch's cache after its turn, kept for the next (``OpeningCache``: the opening shared, the
    rows' own keys after it): its episodes in row order, each row's tokens after the opening in the
    order of the columns it attends, and which of the own columns each row attends (the others are
    padding, or tokens generated after the row's turn had ended)."""

    cache: Any
    episodes: list[_Episode]
    known: list[list[int]]
    mask: Any  # [rows, own columns], 1 where the row attends


def _carry(carried: _Carried, episodes: list[_Episode], opening: list[int]) -> tuple[Any, list[list[int]], Any]:
    """The carried cache cut to this turn's rows (in ``episodes``' order) and to the own columns any
    of them attends, with each row's known tokens and its mask. A row the cache does not hold (it did
    not sample last turn) starts afresh: no known tokens, nothing attended."""
    import torch

    index = {id(episode): row for row, episode in enumerate(carried.episodes)}
    rows, known = [], []
    for episode in episodes:
        row = index.get(id(episode))
        tokens = carried.known[row] if row is not None else []
        if row is None or episode.context[len(opening) : len(opening) + len(tokens)] != tokens:
            row, tokens = None, []
        rows.append(row)
        known.append(tokens)
    picked = torch.tensor([row if row is not None else 0 for row in rows], device=carried.mask.device)
    mask = carried.mask[picked].clone()
    mask[[position for position, row in enumerate(rows) if row is None]] = 0
    columns = mask.bool().any(dim=0)
    carried.cache.keep(picked, columns)
    return carried.cache, known, mask[:, columns]


def _generate(
    model: Any,
    tokenizer: Any,
    episodes: list[_Episode],
    sampling: Sampling,
    opening: list[int],
    opening_cache: Any,
    starts: Sequence[Sequence[int]] | None = None,
    carried: _Carried | None = None,
) -> tuple[list[list[int]], _Carried | None]:
    """One assistant turn for each episode, the sampled ids up to and including the end-of-turn
    token, sampled after the turn's forced start (``starts``, when given). The batch is laid out
    ``[opening][padding][tail]`` (``trainer.prefix_cache``), the opening's cache (when there is
    one) shared by its rows (``trainer.opening_attention``). With ``carried`` (the last turn's
    cache, when its opening was shared) the rows' earlier turns are not run again: the batch is
    ``[opening][the carried columns][padding][what is new]`` and only what is new is prefilled, the
    vLLM prefix cache's saving for a conversation's next turn. A row leaves the decoding batch when
    its turn ends (``trainer.decode``). Returns the turns and the cache to carry to the next turn
    (None where the opening is not shared)."""
    import torch

    from tracefix.trainer import opening_attention

    pad = pad_id(tokenizer)
    starts = starts or [[] for _ in episodes]
    device = next(model.parameters()).device  # the first GPU when training there
    cache: Any = None
    attending: Any = contextlib.nullcontext()
    known: list[list[int]] = [[] for _ in episodes]
    own_mask = torch.zeros((len(episodes), 0), dtype=torch.long, device=device)
    if opening_cache is not None:
        cache, attending = opening_attention.rows_cache(model, opening_cache, len(episodes))
        if carried is not None and CARRY_TURNS and isinstance(cache, opening_attention.OpeningCache):
            cache, known, own_mask = _carry(carried, episodes, opening)
    tails = [episode.context[len(opening) + len(done) :] + list(start) for episode, done, start in zip(episodes, known, starts, strict=True)]
    input_ids, attention = layout(opening, tails, pad)
    input_ids, attention = input_ids.to(device), attention.to(device)
    carried_columns = own_mask.shape[1]
    if carried_columns:  # the carried columns go between the opening and the new tails; their ids are never read
        filler = torch.full((len(episodes), carried_columns), pad, dtype=input_ids.dtype, device=device)
        input_ids = torch.cat([input_ids[:, : len(opening)], filler, input_ids[:, len(opening) :]], dim=1)
        attention = torch.cat([attention[:, : len(opening)], own_mask.to(attention.dtype), attention[:, len(opening) :]], dim=1)
    with attending:
        decoded = decode(
            model,
            input_ids,
            attention,
            cache,
            max_new_tokens=sampling.max_new_tokens,
            end=tokenizer.eos_token_id,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            greedy=[row for row, episode in enumerate(episodes) if episode.greedy],
            opening=len(opening),
            keep=isinstance(cache, opening_attention.OpeningCache),
        )
    turns = decoded.turns
    if decoded.cache is None:
        return turns, None
    # Each row's own columns hold its tokens up to the last it fed: its turn but the last token.
    known = [done + tail + turn[:-1] for done, tail, turn in zip(known, tails, turns, strict=True)]
    return turns, _Carried(decoded.cache, list(episodes), known, decoded.mask)


def _advance(chat: ChatTokens, episode: _Episode, sampled: list[int], sampling: Sampling) -> None:
    """Record the sampled turn, let the instance answer, and append the answer's tokens."""
    ended = bool(sampled) and sampled[-1] == chat.end_of_turn
    text = chat.tokenizer.decode(sampled, skip_special_tokens=True).strip()
    episode.extend(sampled, trained=True)
    if not ended:  # cut by max_new_tokens: close the turn as the template would, untrained
        episode.truncated_turns += 1
        episode.extend([chat.end_of_turn], trained=False)
    assistant = {"role": "assistant", "content": text}
    episode.messages.append(assistant)
    episode.from_policy.append(True)
    episode.turns += 1
    result = episode.instance.step(assistant)
    episode.messages.extend(result.messages)
    episode.from_policy.extend([False] * len(result.messages))
    limit = sampling.max_turns or episode.instance.max_turns
    if result.done or episode.turns >= limit:
        episode.done = True
        return
    conversation = episode.messages[: len(episode.messages) - len(result.messages)]
    answer = chat.after_turn(conversation, result.messages, generation_prompt=True)
    if len(episode.context) + len(answer) + sampling.max_new_tokens > sampling.max_length:
        episode.done = True
        return
    episode.extend(answer, trained=False)


def demonstration(tokenizer: Any, instance: Instance, max_length: int = 4096) -> TokenRollout:
    """The instance's ground-truth solution laid out exactly like a model rollout (for warm starts):
    each solution message is rendered as the policy's tokens, the environment's answers masked."""
    chat = ChatTokens(tokenizer)
    messages = instance.reset()
    prompt_ids = chat.opening(messages)
    episode = _Episode(instance, messages, [False] * len(messages), list(prompt_ids), prompt_ids)
    for assistant in instance.solution():
        sampled = chat.encode(assistant.get("content") or "") + [chat.end_of_turn]
        _advance(chat, episode, sampled, Sampling(max_new_tokens=0, max_length=max_length, max_turns=len(instance.solution()) + 1))
        if episode.done:
            break
    rollout = Rollout(episode.messages, episode.from_policy, instance.reward(), instance.success(), list(instance.events))
    return TokenRollout(rollout, episode.prompt_ids, episode.completion, episode.mask)
