"""What the server and the routing table need of any backend (`Backend`), with the request and
event types both backends share and the helpers both use to render prompts and stream text. The
backends are the embedded one (`router.embedded`: the model in process) and `router.vllm` (in front
of a vLLM server)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one request samples; ``temperature`` 0 is greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of one choice."""

    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """One choice ended: ``reason`` is "stop" (end of turn or a stop string) or "length"."""

    choice: int
    reason: str
    text: str
    tokens: int
    shares: dict[str, float] | None = None  # gate-routed: mean expert weight over its generated tokens


@dataclass(frozen=True, slots=True)
class Failed:
    """Generation failed for the whole request; ``status`` is the HTTP status that says why."""

    message: str
    status: int = 500


Event = Delta | Finished | Failed


@dataclass(frozen=True, slots=True)
class GateSpec:
    """Trained gate weights and the adapters they mix, in slot order."""

    path: Path
    adapters: tuple[str, ...]


@dataclass(eq=False)
class Generation:
    """One chat completion request as the generation thread sees it: ``adapter`` is an adapter name
    or None for the base model; with ``gate`` set, the gate mixes its adapters token by token."""

    prompt: list[int]
    adapter: str | None
    sampling: Sampling
    n: int
    emit: Callable[[Event], None]
    gate: GateSpec | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class AdapterConflict(ValueError):
    """An adapter name is already loaded; versions are immutable, so load under a new version."""


class BackendUnavailable(RuntimeError):
    """The model server behind the router cannot answer now (503) or answered nonsense (502)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class Backend(Protocol):
    """What the server and the routing table use of a backend: `router.embedded.EmbeddedBackend`,
    or `router.vllm.VllmBackend` in front of a vLLM server."""

    model_dir: Path
    max_batch: int
    supports_gate: bool  # the token-level gate mixes adapters inside one forward pass
    loaded: dict[str, Path]

    @property
    def context_tokens(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    @property
    def health(self) -> str: ...

    def load(self, name: str, directory: Path) -> None: ...

    def unload(self, name: str) -> None: ...

    def check_gate(self, gate: GateSpec) -> None: ...

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def token_id(self, text: str) -> int: ...

    def next_token_scores(self, prompt: list[int], token_ids: Sequence[int]) -> list[float]: ...

    def submit(self, generation: Generation) -> None: ...

    def stop(self) -> None: ...


def chat_token_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of a conversation in the model's chat template, ending with the assistant prompt."""
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError as error:
        raise ValueError(f"the model's chat template refused the messages: {error}") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def first_token_id(tokenizer: Any, text: str) -> int:
    """The first token of `text`, as the model would write it at the start of its answer."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"{text!r} has no tokens")
    return ids[0]


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` not to send yet: an unfinished UTF-8 character, or the start
    of a stop string that the next tokens may complete."""
    held = 1 if text.endswith("\ufffd") else 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return held
