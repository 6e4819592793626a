"""The embedded backend's continuous batching (router/embedded.py): requests join a running batch
between decode steps and leave it when they end, on a real (tiny, random) Llama with a LoRA adapter.
What each request generates must not depend on what it shared a batch with."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import torch  # noqa: F401  (installed by make test: never skipped)

from tracefix.router import metrics  # noqa: E402
from tracefix.router.backend import Delta, Failed, Finished, Generation, Sampling  # noqa: E402
from tracefix.router.embedded import EmbeddedBackend, _Row  # noqa: E402
from tracefix.trainer import prefix_cache  # noqa: E402
from tests.lora_support import make_adapter  # noqa: E402

OPENING = "You are the support agent of a small airline. " * 12
ADAPTER = "billing@v1"


@pytest.fixture(scope="module")
def base_dir(wide_tiny_model: Path) -> Path:
    return wide_tiny_model


@pytest.fixture(scope="module")
def adapter(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(base_dir, tmp_path_factory.mktemp("adapters") / "billing", "billing", 1, seed=5)


def _backend(base_dir: Path, adapter: Path, cache: Path, **options: Any) -> EmbeddedBackend:
    backend = EmbeddedBackend(str(base_dir), cache, **options)
    backend.load(ADAPTER, adapter)
    return backend


class Requests:
    """Requests submitted to a backend, with every event each one received, in order."""

    def __init__(self, backend: EmbeddedBackend) -> None:
        self.backend = backend
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.log: list[tuple[str, Any]] = []  # (request, event) in arrival order

    def submit(self, name: str, prompt: list[int], adapter: str | None, sampling: Sampling, n: int = 1) -> None:
        self.backend.submit(Generation(prompt, adapter, sampling, n, lambda event: self.events.put((name, event))))

    def wait(self, until: Any, timeout: float = 120) -> None:
        """Take events until ``until(self.log)`` holds."""
        deadline = time.monotonic() + timeout
        while not until(self.log):
            name, event = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            assert not isinstance(event, Failed), f"{name}: {event.message}"
            self.log.append((name, event))

    def finished(self, name: str) -> list[Finished]:
        return [event for who, event in self.log if who == name and isinstance(event, Finished)]

    def done(self, *names: str, choices: int = 1) -> Any:
        return lambda log: all(len(self.finished(name)) == choices for name in names)

    def deltas(self, name: str) -> int:
        return sum(who == name and isinstance(event, Delta) for who, event in self.log)

    def first(self, kind: type, name: str) -> int:
        """Index in the log of ``name``'s first event of ``kind``."""
        return next(index for index, (who, event) in enumerate(self.log) if who == name and isinstance(event, kind))


def _alone(backend: EmbeddedBackend, prompt: list[int], adapter: str | None, sampling: Sampling, n: int = 1) -> list[str]:
    """The texts of one request run by itself."""
    requests = Requests(backend)
    requests.submit("it", prompt, adapter, sampling, n)
    requests.wait(requests.done("it", choices=n))
    return [event.text for event in sorted(requests.finished("it"), key=lambda event: event.choice)]


def _chat(backend: EmbeddedBackend, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": OPENING}]
    messages += [{"role": "user" if index % 2 == 0 else "assistant", "content": text} for index, text in enumerate(turns)]
    return backend.encode_chat(messages)


def _rows_gauge() -> float:
    return metrics.BATCH_ROWS._value.get()


def test_a_short_request_joins_a_long_one_and_leaves_first_with_the_text_it_has_alone(base_dir: Path, adapter: Path, tmp_path: Path) -> None:
    continuous = _backend(base_dir, adapter, tmp_path / "models")
    static = _backend(base_dir, adapter, tmp_path / "models", continuous=False)
    try:
        long_prompt, short_prompt = _chat(continuous, "Where is my booking ABC123?"), _chat(continuous, "Cancel XYZ789.")
        long_sampling, short_sampling = Sampling(60, temperature=0.0), Sampling(4, temperature=0.0)
        expected_long = _alone(static, long_prompt, None, long_sampling)
        expected_short = _alone(static, short_prompt, ADAPTER, short_sampling)
        order = {}
        for name, backend in (("continuous", continuous), ("static", static)):
            requests = Requests(backend)
            requests.submit("long", long_prompt, None, long_sampling)
            requests.wait(lambda log: requests.deltas("long") >= 3)  # the long one is decoding
            requests.submit("short", short_prompt, ADAPTER, short_sampling)
            requests.wait(requests.done("long", "short"))
            assert [requests.finished("long")[0].text, requests.finished("short")[0].text] == [*expected_long, *expected_short]
            assert requests.finished("long")[0].tokens == 60  # it ran its whole length: the short one had time to join
            order[name] = requests.first(Finished, "short") < requests.first(Finished, "long")
        # Continuous: the short request joined the running batch and left it first. Static: it
        # waited for the long one's batch to end.
        assert order == {"continuous": True, "static": False}
        deadline = time.monotonic() + 10
        while _rows_gauge() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rows_gauge() == 0
    finally:
        continuous.stop()
        static.stop()


def test_requests_joining_and_leaving_at_every_step_generate_what_they_do_alone(base_dir: Path, adapter: Path, tmp_path: Path) -> None:
    """Prompts of different lengths, from the prefix cache and not, on the base and the adapter,
    greedy and seeded with two choices, submitted while others run: each the same as alone."""
    continuous = _backend(base_dir, adapter, tmp_path / "models", max_batch=4)
    static = _backend(base_dir, adapter, tmp_path / "models", prefix_cache_mib=0, continuous=False)
    try:
        plan = [
            ("a", _chat(continuous, "Where is my booking ABC123?"), None, Sampling(30, temperature=0.0), 1),
            ("b", _chat(continuous, "Cancel reservation XYZ789 please, it is urgent."), ADAPTER, Sampling(12, temperature=0.0), 1),
            ("c", _chat(continuous, "Hi."), None, Sampling(20, temperature=0.8, seed=7), 2),
            ("d", _chat(continuous, "Where is my booking ABC123?", "It is confirmed.", "And my bags?"), None, Sampling(8, temperature=0.0), 1),
            ("e", _chat(continuous, "Change my flight to Friday."), ADAPTER, Sampling(25, temperature=0.0), 1),
            ("f", list(range(5, 40)), None, Sampling(6, temperature=0.0), 1),  # no opening: nothing cached
        ]
        expected = {name: _alone(static, prompt, adapter_name, sampling, n) for name, prompt, adapter_name, sampling, n in plan}
        requests = Requests(continuous)
        for index, (name, prompt, adapter_name, sampling, n) in enumerate(plan):
            requests.submit(name, prompt, adapter_name, sampling, n)
            if index < len(plan) - 1:  # the next one arrives while this one is decoding
                requests.wait(lambda log, name=name: requests.deltas(name) >= 1)
        requests.wait(lambda log: all(len(requests.finished(name)) == n for name, *_, n in plan))
        got = {name: [event.text for event in sorted(requests.finished(name), key=lambda event: event.choice)] for name, *_ in plan}
        assert got == expected
        # Some request started while another was mid-way: the batch did change under running rows.
        assert requests.first(Delta, "b") < requests.first(Finished, "a")
    finally:
        continuous.stop()
        static.stop()


def _rows_logits(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Any]]:
    """The logits each generation (by ``id``) is sampled from at every step, recorded from now on."""
    from tracefix.router import embedded as backend_module

    seen: dict[int, list[Any]] = {}
    real_sample = backend_module._sample

    def recording(logits: Any, rows: list[Any]) -> list[int]:
        for index, row in enumerate(rows):
            seen.setdefault(id(row.generation), []).append(logits[index].clone())
        return real_sample(logits, rows)

    monkeypatch.setattr(backend_module, "_sample", recording)
    return seen


def _as_a_plain_forward(backend: EmbeddedBackend, requests: Requests, seen: dict[int, list[Any]], generations: dict[str, Generation]) -> int:
    """Assert that every step's logits of each greedy generation equal one uncached forward pass
    over its prompt and the tokens it had generated; the steps compared."""
    import torch

    compared = 0
    for name, generation in generations.items():
        steps = seen[id(generation)]
        tokens = [int(step.argmax()) for step in steps]  # greedy: what the row went on with
        assert len(steps) == requests.finished(name)[0].tokens
        with torch.no_grad():
            chosen = backend._adapter_arguments([generation.adapter])
            plain = backend.model(input_ids=torch.tensor([generation.prompt + tokens[:-1]]), **chosen).logits[0, len(generation.prompt) - 1 :]
        torch.testing.assert_close(torch.stack(steps), plain.float(), atol=2e-4, rtol=1e-4)
        compared += len(steps)
    return compared


def test_every_row_predicts_each_token_as_a_plain_forward_over_its_own_tokens(
    base_dir: Path, adapter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The logits every row is sampled from, while rows join and leave around it, against one
    uncached forward pass over that row's prompt and the tokens it has generated so far: a wrong
    position, mask or merged cache shows here even where the tiny model's greedy text would not."""
    seen = _rows_logits(monkeypatch)
    backend = _backend(base_dir, adapter, tmp_path / "models", max_batch=3)
    try:
        plan = [
            ("a", _chat(backend, "Where is my booking ABC123?"), None, 14),
            ("b", _chat(backend, "Cancel reservation XYZ789 please, it is urgent."), ADAPTER, 5),
            ("c", _chat(backend, "Where is my booking ABC123?", "It is confirmed.", "And my bags?"), None, 9),
            ("d", list(range(5, 40)), ADAPTER, 6),
            ("e", _chat(backend, "Hi."), None, 4),
        ]
        requests = Requests(backend)
        generations = {}
        for index, (name, prompt, adapter_name, tokens) in enumerate(plan):
            emit = lambda event, name=name: requests.events.put((name, event))  # noqa: E731
            generations[name] = Generation(prompt, adapter_name, Sampling(tokens, temperature=0.0), 1, emit)
            backend.submit(generations[name])
            if index < len(plan) - 1:
                requests.wait(lambda log, name=name: requests.deltas(name) >= 1)
        requests.wait(requests.done(*(name for name, *_ in plan)))
        assert _as_a_plain_forward(backend, requests, seen, generations) > len(plan)
    finally:
        backend.stop()


def test_rows_share_their_common_opening_as_it_shrinks_and_grows_and_predict_as_a_plain_forward(
    base_dir: Path, adapter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows whose prompts begin alike hold that opening once (``_Batch.split``): it forms when a
    second row joins, shrinks when a row shares less of it, grows when the rows left share more,
    and goes when a row for another adapter joins. Every step's logits, against one uncached
    forward pass over the row's prompt and its tokens so far."""
    from tracefix.router import embedded as backend_module

    seen = _rows_logits(monkeypatch)
    real_split = backend_module._Batch.split
    splits: list[tuple[int, int]] = []  # (opening held, opening wanted) of each split that changed it

    def split(batch: Any, opening: int, config: Any, limit: int) -> None:
        if opening != batch.opening:
            splits.append((batch.opening, opening))
        real_split(batch, opening, config, limit)

    monkeypatch.setattr(backend_module._Batch, "split", split)
    backend = _backend(base_dir, adapter, tmp_path / "models", max_batch=4)
    try:
        # (name, prompt, adapter, tokens, wait before the next: for its first token or its end)
        plan = [
            ("a", _chat(backend, "Where is my booking ABC123?"), None, 60, "token"),
            ("b", _chat(backend, "Where is my booking ABC124?"), None, 50, "token"),  # a and b share their opening
            ("c", _chat(backend, "Cancel XYZ789."), None, 5, "end"),  # shares less: it shrinks
            ("d", _chat(backend, "Where is my booking ABC125?"), None, 30, "token"),  # c gone: it grows again
            ("e", list(range(5, 40)), ADAPTER, 4, "end"),  # another adapter: no opening
            ("f", _chat(backend, "Where is my booking ABC126?"), None, 8, "end"),  # it forms in a running batch
        ]
        requests = Requests(backend)
        generations = {}
        for name, prompt, adapter_name, tokens, then in plan:
            emit = lambda event, name=name: requests.events.put((name, event))  # noqa: E731
            generations[name] = Generation(prompt, adapter_name, Sampling(tokens, temperature=0.0), 1, emit)
            backend.submit(generations[name])
            requests.wait((lambda log, name=name: requests.deltas(name) >= 1) if then == "token" else requests.done(name))
        requests.wait(requests.done(*(name for name, *_ in plan)))
        long, short = prefix_cache.common_prefix([generations["a"].prompt, generations["b"].prompt]), prefix_cache.common_prefix(
            [generations["a"].prompt, generations["c"].prompt]
        )
        assert short >= backend_module.MIN_OPENING and long > short
        # Each join splits the joining batch, then the running one: formed, shrunk, grown again, gone,
        # formed again in a running batch of three.
        assert splits == [(0, long), (0, long), (0, short), (long, short), (0, long), (short, long), (long, 0), (0, long), (0, long)], (long, short, splits)
        assert _as_a_plain_forward(backend, requests, seen, generations) > len(plan)
    finally:
        backend.stop()


def test_rows_joining_together_hold_their_cached_opening_once_and_predict_as_a_plain_forward(
    base_dir: Path, adapter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that join in one prefill and begin with an opening the prefix cache holds take it
    once, for all of them, and prefill only their own tails; a conversation's next turn holds the
    rest of its cached prompt as its own columns; rows for another adapter, or with nothing
    cached, copy what they have as before. Every step's logits against a plain forward pass."""
    from tracefix.router import embedded as backend_module

    seen = _rows_logits(monkeypatch)
    joined: list[tuple[int, int, int]] = []  # (rows, opening held, own columns) of each joining batch
    real_merge = backend_module._Batch.merge

    def merge(batch: Any, other: Any, config: Any, limit: int) -> None:
        joined.append((len(other.rows), other.opening, other.mask.shape[1] - other.opening))
        real_merge(batch, other, config, limit)

    monkeypatch.setattr(backend_module._Batch, "merge", merge)
    backend = _backend(base_dir, adapter, tmp_path / "models", max_batch=8)
    try:
        first = _chat(backend, "Where is my booking ABC123?")
        plan = {
            "first": (first, None, 6),
            "b": (_chat(backend, "Where is my booking ABC124?"), None, 12),
            "c": (_chat(backend, "Cancel XYZ789 for me."), None, 9),
            "next turn": (_chat(backend, "Where is my booking ABC123?", "It is confirmed.", "And my bags?"), None, 10),
            "other adapter": (_chat(backend, "Where is my booking ABC125?"), ADAPTER, 7),
        }
        requests = Requests(backend)
        generations = {}

        def submit(name: str) -> None:
            prompt, adapter_name, tokens = plan[name]
            generations[name] = Generation(prompt, adapter_name, Sampling(tokens, temperature=0.0), 1, lambda event: requests.events.put((name, event)))
            backend.submit(generations[name])

        submit("first")
        requests.wait(requests.done("first"))  # its prompt is cached now
        with backend._lock:  # the generation thread waits: the next three join in one prefill
            for name in ("b", "c", "next turn"):
                submit(name)
        requests.wait(lambda log: all(requests.deltas(name) >= 1 for name in ("b", "c", "next turn")))
        with backend._lock:
            submit("other adapter")
        requests.wait(requests.done(*plan))
        opening = prefix_cache.common_prefix([plan[name][0] for name in ("b", "c", "next turn")])
        assert opening >= backend_module.MIN_OPENING
        # The three held their opening once and each its own tokens: "next turn" its first turn's
        # cached tokens past the opening and its new ones, the others their tails.
        own = len(plan["next turn"][0]) - opening
        assert joined[:2] == [(1, 0, len(first)), (3, opening, own)], joined
        assert joined[2][:2] == (1, 0)  # another adapter's row: nothing shared
        assert _as_a_plain_forward(backend, requests, seen, generations) > len(plan)
        # The next turn took its whole first turn from the cache, not only the opening.
        assert backend.prefixes.lookup(None, plan["next turn"][0] + [7])[1] == len(plan["next turn"][0])
    finally:
        backend.stop()


def test_only_rows_of_one_adapter_without_the_gate_share_a_long_enough_opening(base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoConfig

    from tracefix.router import embedded as backend_module
    from tracefix.router.backend import GateSpec

    config = AutoConfig.from_pretrained(base_dir)
    opening = list(range(100, 100 + backend_module.MIN_OPENING))

    def row(prompt: list[int], adapter: str | None = None, gate: GateSpec | None = None) -> Any:
        return backend_module._Row(Generation(prompt, adapter, Sampling(4), 1, print, gate), 0, None)

    alike = [row(opening + [1, 2]), row(opening + [1, 3]), row(opening + [4])]
    assert backend_module.shared_opening(alike, config) == len(opening)
    assert backend_module.shared_opening(alike[:1], config) == 0  # one row: nothing to share
    assert backend_module.shared_opening([*alike, row(opening + [5], ADAPTER)], config) == 0  # another adapter's keys differ
    assert backend_module.shared_opening([row(opening + [1], gate=GateSpec(base_dir, (ADAPTER,)))] * 2, config) == 0
    assert backend_module.shared_opening([row(opening[1:] + [1]), row(opening[1:] + [2])], config) == 0  # under MIN_OPENING
    monkeypatch.setattr(backend_module, "SHARED_OPENING", False)
    assert backend_module.shared_opening(alike, config) == 0
    monkeypatch.setattr(backend_module, "SHARED_OPENING", True)
    config.layer_types, config.sliding_window = ["sliding_attention"] * config.num_hidden_layers, 8
    assert backend_module.shared_opening(alike, config) == 0  # a sliding window keeps only its part of an opening


MIXED = "Hi 😀 café 日本語, and then some more."


def _events(backend: EmbeddedBackend, tokens: list[int], sampling: Sampling, incremental: bool) -> list[Any]:
    """What one row sends when it samples ``tokens`` one by one, its text grown token by token or
    (``incremental`` off) decoded whole at every step."""
    backend.incremental = incremental
    events: list[Any] = []
    row = _Row(Generation([], None, sampling, 1, events.append), 0, None)
    for token in tokens:
        backend._advance(row, token)
        if row.finished:
            break
    return events


def test_a_rows_text_grows_token_by_token_into_what_decoding_all_its_tokens_gives(base_dir: Path, tmp_path: Path) -> None:
    """The text a row streams and ends with, for whole characters split across tokens (an emoji,
    CJK), a stop string, the end token and a length that ends inside a character."""
    backend = EmbeddedBackend(str(base_dir), tmp_path / "models")
    try:
        assert backend.incremental  # SmolLM2's fast tokenizer
        tokens = backend.tokenizer.encode(MIXED, add_special_tokens=False)
        split = next(index for index in range(1, len(tokens)) if backend.tokenizer.decode(tokens[:index]).endswith("\ufffd"))
        end = backend.tokenizer.eos_token_id
        cases = {
            "length": (tokens, Sampling(len(tokens)), "length", MIXED),
            "end token": ([*tokens, end], Sampling(len(tokens) + 5), "stop", MIXED),
            "stop string": (tokens, Sampling(len(tokens) + 5, stop=("café",)), "stop", "Hi 😀 "),
            "length inside a character": (tokens, Sampling(split), "length", backend.tokenizer.decode(tokens[:split])),
        }
        for case, (sampled, sampling, reason, text) in cases.items():
            ends = []
            for incremental in (True, False):  # chunks may end elsewhere: the incremental text holds back a space with a split character
                *deltas, finished = _events(backend, sampled, sampling, incremental)
                ends.append(finished)
                assert (finished.reason, finished.text) == (reason, text), (case, incremental)
                assert all(isinstance(delta, Delta) for delta in deltas) and "".join(delta.text for delta in deltas) == text, (case, incremental)
                assert all("\ufffd" not in delta.text for delta in deltas[:-1]), (case, incremental)  # never half a character mid-stream
            assert ends[0] == ends[1], case
        assert cases["length inside a character"][3].endswith("\ufffd")
    finally:
        backend.stop()


def test_a_request_waiting_for_room_is_not_overtaken_by_a_smaller_one(base_dir: Path, adapter: Path, tmp_path: Path) -> None:
    backend = _backend(base_dir, adapter, tmp_path / "models", max_batch=2)
    try:
        requests = Requests(backend)
        requests.submit("running", _chat(backend, "Where is my booking ABC123?"), None, Sampling(40, temperature=0.0))
        requests.wait(lambda log: requests.deltas("running") >= 2)
        # Two rows wanted, one free: it waits for the running request to end ...
        requests.submit("pair", _chat(backend, "Hi."), None, Sampling(6, temperature=0.5, seed=3), n=2)
        # ... and a one-row request behind it, which would fit now, waits behind it.
        requests.submit("single", _chat(backend, "Cancel XYZ789."), ADAPTER, Sampling(3, temperature=0.0))
        requests.wait(lambda log: len(requests.finished("pair")) == 2 and requests.done("running", "single")(log))
        assert requests.first(Finished, "running") < requests.first(Delta, "pair") < requests.first(Delta, "single")
    finally:
        backend.stop()


def test_stopping_fails_the_running_and_the_waiting_requests(base_dir: Path, adapter: Path, tmp_path: Path) -> None:
    backend = _backend(base_dir, adapter, tmp_path / "models", max_batch=1)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    started = threading.Event()

    def sink(name: str) -> Any:
        def emit(event: Any) -> None:
            if isinstance(event, Delta):
                started.set()
            events.put((name, event))

        return emit

    backend.submit(Generation(_chat(backend, "Where is my booking?"), None, Sampling(500, temperature=0.0), 1, sink("running")))
    backend.submit(Generation(_chat(backend, "Hi."), None, Sampling(5, temperature=0.0), 1, sink("waiting")))
    assert started.wait(60)
    backend.stop()
    failed = {}
    deadline = time.monotonic() + 30
    while len(failed) < 2 and time.monotonic() < deadline:
        name, event = events.get(timeout=30)
        assert not isinstance(event, Finished), f"{name} finished after stop"
        if isinstance(event, Failed):
            failed[name] = event.message
    assert failed == {"running": "the router is shutting down", "waiting": "the router is shutting down"}
    assert not backend.alive
