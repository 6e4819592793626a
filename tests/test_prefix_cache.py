"""Prompts that share their opening are prefilled once (trainer/prefix_cache.py): in the trainer's
batched rollouts and across the embedded router's requests. The same greedy text either way, on a
real (tiny, random) Llama, with and without LoRA adapters in the batch."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import pytest

import torch  # noqa: F401  (installed by make test: never skipped)

from tracefix.router import metrics  # noqa: E402
from tracefix.router.backend import Failed, Finished, Generation, Sampling  # noqa: E402
from tracefix.router.embedded import EmbeddedBackend  # noqa: E402
from tests.lora_support import make_adapter  # noqa: E402
from tracefix.trainer import prefix_cache, rollouts  # noqa: E402
from tracefix.trainer.environment import Instance, Message, StepResult, assistant_text  # noqa: E402
from tracefix.trainer.prefix_cache import PrefixStore, batch_layers, common_prefix  # noqa: E402

OPENING = "You are the support agent of a small airline. " * 12  # well over MIN_PREFIX tokens


@pytest.fixture(scope="module")
def base_dir(wide_tiny_model: Path) -> Path:
    return wide_tiny_model


# -- the store ------------------------------------------------------------------------------------


def _layers(tokens: int, value: float = 0.0) -> list[tuple[Any, Any]]:
    import torch

    return [(torch.full((2, tokens, 4), value), torch.full((2, tokens, 4), value)) for _ in range(3)]


def test_common_prefix_leaves_every_sequence_a_token_of_its_own() -> None:
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix([[7, 8]]) == 1
    assert common_prefix([[1, 2], [3, 4]]) == 0
    assert common_prefix([]) == 0


def test_the_store_returns_the_longest_match_of_the_same_variant_only() -> None:
    store = PrefixStore(max_bytes=1 << 30, min_prefix=4)
    opening = list(range(100, 110))
    store.store(None, opening + [1, 2, 3], _layers(13))
    store.store(None, opening + [7, 8], _layers(12))
    entry, length = store.lookup(None, opening + [1, 2, 3, 4, 5])
    assert entry is not None and entry.ids[-1] == 3 and length == 13
    entry, length = store.lookup(None, opening + [9])
    assert length == 10  # a new conversation: only the opening is shared
    assert store.lookup("billing@v1", opening + [1, 2, 3, 4]) == (None, 0)  # the adapter's keys differ
    assert store.lookup(None, [100, 101, 102, 0, 0]) == (None, 0)  # under min_prefix
    store.drop(None)
    assert store.lookup(None, opening + [1, 2, 3, 4]) == (None, 0) and store.nbytes == 0


def test_a_prompt_replaces_the_one_it_extends_and_the_oldest_go_past_the_budget() -> None:
    one_entry = sum(k.nbytes + v.nbytes for k, v in _layers(10))
    store = PrefixStore(max_bytes=2 * one_entry, min_prefix=2)
    store.store(None, list(range(5)), _layers(5))
    store.store(None, list(range(10)), _layers(10))  # extends the first: the first is dropped
    assert store.nbytes == one_entry
    store.store(None, [50 + i for i in range(10)], _layers(10))
    store.lookup(None, list(range(10)) + [1])  # used: now the newest
    store.store(None, [80 + i for i in range(10)], _layers(10))  # over budget: the least recent goes
    assert store.nbytes == 2 * one_entry
    assert store.lookup(None, [50 + i for i in range(10)] + [1]) == (None, 0)
    assert store.lookup(None, list(range(10)) + [1])[1] == 10
    store.store(None, list(range(100)), _layers(100))  # bigger than the whole budget: not kept
    assert store.nbytes == 2 * one_entry


def _ranged(first: int, last: int) -> list[tuple[Any, Any]]:
    """Layers whose keys and values name their tokens: column ``c`` holds ``first + c`` (values negated)."""
    import torch

    tokens = torch.arange(first, last, dtype=torch.float32)[None, :, None].expand(2, -1, 4).contiguous()
    return [(tokens + layer, -(tokens + layer)) for layer in range(3)]


def test_a_prompt_that_continues_a_stored_one_holds_only_what_follows_and_keeps_it_stored() -> None:
    import torch

    one_token = sum(k.nbytes + v.nbytes for k, v in _ranged(0, 1))
    store = PrefixStore(max_bytes=40 * one_token, min_prefix=4)
    opening = list(range(100, 120))
    store.store(None, opening + [1], _ranged(0, 21))
    cases = {}
    for case in (2, 3):  # two conversations after the same opening: each holds its own two tokens
        base = store.lookup(None, opening + [case, case])
        assert base[1] == 20
        store.store(None, opening + [case, case], _ranged(20, 22), base)
        cases[case] = store.lookup(None, opening + [case, case, 9])
        assert cases[case][1] == 22 and cases[case][0].start == 20
    assert store.nbytes == 25 * one_token  # the opening once, not once a conversation
    entry = cases[3][0]
    for layer in range(3):
        keys, values = entry.columns(layer, 0, 22)
        torch.testing.assert_close(keys, _ranged(0, 22)[layer][0])  # the opening's then its own
        torch.testing.assert_close(values, _ranged(0, 22)[layer][1])
        assert [piece[0].shape[1] for piece in entry.pieces(layer, 5, 22)] == [15, 2]
    layers, mask = batch_layers([cases[2], (None, 0), cases[3]], start=18)
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    torch.testing.assert_close(layers[1][0][0], _ranged(18, 22)[1][0])  # the opening's last two, then its own
    # A stored opening is never dropped while a conversation continues it; the conversations go
    # least recent first, and the opening with the last of them.
    store.lookup(None, opening + [2, 2, 9])  # the least recent: the opening (kept), then conversation 3
    store.store(None, list(range(500, 516)), _ranged(0, 16))  # 41 tokens, over the budget of 40
    assert store.lookup(None, opening + [3, 3, 9])[1] == 20 and store.nbytes == 39 * one_token  # conversation 3 went
    assert store.lookup(None, opening + [2, 2, 9])[1] == 22
    store.store(None, list(range(600, 630)), _ranged(0, 30))  # 69 tokens: the rest goes, the opening after conversation 2
    assert store.lookup(None, opening + [2, 2, 9]) == (None, 0) and store.nbytes == 30 * one_token
    # A base that left the store (its adapter unloaded) is not continued.
    gone = store.lookup(None, list(range(600, 630)) + [7])
    store.drop(None)
    store.store(None, list(range(600, 631)), _ranged(30, 31), gone)
    assert store.nbytes == 0 and store.lookup(None, list(range(600, 631)) + [7]) == (None, 0)


# -- the trainer's rollouts -----------------------------------------------------------------------


class _Chatty(Instance):
    """Three turns over the long shared opening, each answered by the user; reward unused."""

    max_turns = 3

    def reset(self) -> list[Message]:
        self.turns = 0
        return [{"role": "system", "content": OPENING}, {"role": "user", "content": f"Booking {self.seed * 7919}, please."}]

    def step(self, assistant: Message) -> StepResult:
        self.turns += 1
        return StepResult([{"role": "user", "content": f"And then {self.turns}?"}], self.turns >= 3)

    def reward(self) -> float:
        return 0.0

    def solution(self) -> list[Message]:
        return [assistant_text("Done.")]


def test_rollouts_with_the_opening_prefilled_once_are_the_rollouts_without(base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy three-turn episodes over one long opening: identical conversations and tokens whether
    the opening is prefilled once for all rows and turns or for every row of every turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    instances = lambda: [_Chatty([], seed, 1) for seed in range(5)]  # noqa: E731
    sampling = rollouts.Sampling(max_new_tokens=12, temperature=0.0)

    prefilled: list[int] = []
    real_prefill = prefix_cache.prefill
    monkeypatch.setattr(rollouts, "prefill", lambda model, ids: prefilled.append(len(ids)) or real_prefill(model, ids))
    shared = rollouts.generate_rollouts(model, tokenizer, instances(), sampling)
    assert len(prefilled) == 1 and prefilled[0] >= len(tokenizer(OPENING)["input_ids"])  # the opening, once
    monkeypatch.setattr(rollouts, "MIN_PREFIX", 10**9)
    plain = rollouts.generate_rollouts(model, tokenizer, instances(), sampling)
    assert [item.rollout.messages for item in shared] == [item.rollout.messages for item in plain]
    assert [item.sequence() for item in shared] == [item.sequence() for item in plain]
    assert all(len(item.rollout.messages) == 8 for item in plain)  # system, user, then 3 × (assistant, user)


# -- the router -----------------------------------------------------------------------------------


def _complete(backend: EmbeddedBackend, requests: list[tuple[list[int], str | None]], max_tokens: int = 10) -> list[str]:
    """Greedy completions of ``requests`` (prompt ids, adapter), submitted together so that they
    share a batch."""
    events: queue.Queue[tuple[int, Any]] = queue.Queue()
    for index, (prompt, adapter) in enumerate(requests):
        emit = lambda event, index=index: events.put((index, event))  # noqa: E731
        backend.submit(Generation(prompt, adapter, Sampling(max_tokens, temperature=0.0, seed=1), 1, emit))
    texts: dict[int, str] = {}
    while len(texts) < len(requests):
        index, event = events.get(timeout=60)
        assert not isinstance(event, Failed), event.message
        if isinstance(event, Finished):
            texts[index] = event.text
    return [texts[index] for index in range(len(requests))]


def _cached_tokens() -> float:
    return metrics.PREFILL_TOKENS.labels("cached")._value.get()


def test_the_router_reuses_prompts_across_requests_and_answers_as_without(base_dir: Path, tmp_path: Path) -> None:
    cached = EmbeddedBackend(str(base_dir), tmp_path / "models", max_batch=8)
    plain = EmbeddedBackend(str(base_dir), tmp_path / "models", max_batch=8, prefix_cache_mib=0)
    try:
        assert plain.prefixes is None
        adapter = make_adapter(base_dir, tmp_path / "adapter", "billing", 1, seed=5)
        for backend in (cached, plain):
            backend.load("billing@v1", adapter)

        def chat(*turns: str) -> list[int]:
            messages = [{"role": "system", "content": OPENING}]
            for index, text in enumerate(turns):
                messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
            return cached.encode_chat(messages)

        first = [(chat("Where is my booking ABC123?"), None)]
        before = _cached_tokens()
        assert _complete(cached, first) == _complete(plain, first)
        assert _cached_tokens() == before  # nothing to reuse yet

        # Two new conversations (one on the adapter) and the first one's next turn, in one batch.
        reply = _complete(plain, first)[0]
        batch = [
            (chat("Cancel reservation XYZ789 please."), None),
            (chat("Cancel reservation XYZ789 please."), "billing@v1"),
            (chat("Where is my booking ABC123?", reply, "And my baggage allowance?"), None),
        ]
        assert _complete(cached, batch) == _complete(plain, batch)
        reused = _cached_tokens() - before
        # The base rows reuse the first prompt (the opening; all of it for the next turn); the
        # adapter's row has no prompt of its own yet, so it prefills.
        assert reused >= len(first[0][0]) + 64

        # Now the adapter has one: the same conversation on it reuses it, with the same answer.
        again = [(chat("Cancel reservation XYZ789 please.", "Done.", "Thanks, and a refund?"), "billing@v1")]
        before = _cached_tokens()
        assert _complete(cached, again) == _complete(plain, again)
        assert _cached_tokens() - before >= len(batch[1][0]) - 1

        # Unloading the adapter forgets its caches (and only them).
        assert cached.prefixes.lookup("billing@v1", again[0][0])[1] > 0
        cached.unload("billing@v1")
        assert cached.prefixes.lookup("billing@v1", again[0][0]) == (None, 0)
        assert cached.prefixes.lookup(None, batch[2][0])[1] > 0
    finally:
        cached.stop()
        plain.stop()
