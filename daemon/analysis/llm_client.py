"""The OpenAI-compatible chat client, and the ask-validate-retry loop that gets strict JSON out of it.

Rules this module keeps:

- The model answers strict JSON, validated with jsonschema by the caller's schema.
  ```json fences and ``<think>`` blocks are stripped first; nothing else is repaired. Invalid output
  is retried up to ``max_retries`` times with a corrective message, then ``LLMOutputError`` is
  raised; the caller decides what a failure means (the labeler records ``Label.ERROR``).
- Transport errors, HTTP 408/429 and 5xx are retried (within ``max_retries``); other HTTP errors
  (400, 401, 404 …) are not, since repeating the same request cannot fix them.
- Every HTTP call, corrective retries included, first waits for its turn in the client's
  ``CallBudget`` (``[llm] calls_per_minute``), which the client's threads share.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import jsonschema
import orjson

from tracefix.daemon.core.settings import LLMSettings

# Seconds slept before retrying after a transport error or a retryable HTTP status (times 2**attempt).
RETRY_BACKOFF_S = 0.25


class LLMUnavailable(Exception):
    """The endpoint could not give an answer (unreachable, timeout, HTTP error, malformed body)."""

    def __init__(self, reason: str, *, status: int | None = None, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retryable = retryable


class LLMOutputError(Exception):
    """The model answered, but not with valid output, even after the corrective retries."""

    def __init__(self, reason: str, attempts: int, reply: str = "") -> None:
        super().__init__(f"{reason} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.reason = reason
        self.attempts = attempts
        self.reply = reply


class CallsStopped(Exception):
    """The budget was closed (the daemon is stopping): no call is made, and nothing is judged from it."""


class CallBudget:
    """At most `calls` calls started in any `window_s` seconds (0 = unlimited), shared by threads.

    ``acquire`` blocks until a call may start and records it; ``close`` wakes every waiter with
    CallsStopped, and ChatClient.complete gives up on the answer it waits for: a stopping daemon
    waits out neither the budget nor a slow model.
    """

    def __init__(self, calls: int, window_s: float = 60.0) -> None:
        self.calls = calls
        self.window_s = window_s
        self._started: deque[float] = deque()  # monotonic start times within the last max(window, 60 s)
        self.total = 0  # calls started since the budget was made
        self._changed = threading.Condition()
        self._closed = False

    def _forget_before(self, now: float) -> None:
        keep = max(self.window_s, 60.0)
        while self._started and self._started[0] <= now - keep:
            self._started.popleft()

    def acquire(self) -> None:
        """Wait for a free place in the window, then count this call; raises CallsStopped once closed."""
        with self._changed:
            while True:
                if self._closed:
                    raise CallsStopped("the LLM budget is closed: the daemon is stopping")
                now = time.monotonic()
                self._forget_before(now)
                in_window = [start for start in self._started if start > now - self.window_s] if self.calls else []
                if not self.calls or len(in_window) < self.calls:
                    self._started.append(now)
                    self.total += 1
                    return
                self._changed.wait(in_window[-self.calls] + self.window_s - now)  # until the oldest leaves

    @property
    def closed(self) -> bool:
        return self._closed

    def recent(self, seconds: float = 60.0) -> int:
        """Calls started in the last `seconds` (at most max(window_s, 60))."""
        with self._changed:
            now = time.monotonic()
            return sum(1 for start in self._started if start > now - seconds)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


def one_line(text: str, limit: int) -> str:
    """The text on one line (whitespace runs become one space), cut to `limit` characters with "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_message(response: httpx.Response) -> str:
    """The message of an OpenAI-style ({"error": {"message"}}), vLLM-style or FastAPI-style error body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    message: Any = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or body.get("message") or body.get("detail")
    if not message:
        message = response.text or response.reason_phrase
    if not isinstance(message, str):
        message = json.dumps(message)
    return one_line(message, 300)


class ChatClient:
    """A minimal chat-completions client: one POST per call, within its budget; errors become LLMUnavailable.

    Thread-safe (httpx's client is). It remembers when the endpoint last answered and last failed.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        budget: CallBudget | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self.timeout_s = timeout_s
        self.budget = budget or CallBudget(0)
        self.answered_at: float | None = None  # unix time of the last usable answer (HTTP status below 400)
        self.failed_at: float | None = None  # unix time of the last call that got none (LLMUnavailable)

    @classmethod
    def from_settings(cls, settings: LLMSettings, environ: Mapping[str, str] | None = None) -> ChatClient:
        environ = os.environ if environ is None else environ
        api_key = environ.get(settings.api_key_env) or None
        return cls(
            settings.base_url, settings.model, api_key=api_key, timeout_s=settings.timeout_s,
            budget=CallBudget(settings.calls_per_minute),
        )  # fmt: skip

    def complete(self, messages: Sequence[Mapping[str, str]], temperature: float, seed: int | None) -> str:
        """The assistant message's text ("" when it has none); waits for the budget; raises LLMUnavailable
        (or CallsStopped once the budget is closed)."""
        self.budget.acquire()
        # The POST runs on a daemon thread of its own: once the budget is closed (the daemon stops),
        # the caller gives up on a slow answer at once instead of holding the exit for timeout_s.
        outcome: list[Any] = []
        call = threading.Thread(target=self._post, args=(messages, temperature, seed, outcome), name="llm-call", daemon=True)
        call.start()
        while call.is_alive():
            if self.budget.closed:
                raise CallsStopped("the LLM budget is closed: the daemon is stopping")
            call.join(0.1)
        if isinstance(outcome[0], LLMUnavailable):
            self.failed_at = time.time()
            raise outcome[0]
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        self.answered_at = time.time()
        return outcome[0]

    def _post(
        self, messages: Sequence[Mapping[str, str]], temperature: float, seed: int | None, outcome: list[Any]
    ) -> None:
        """Appends the assistant message's text, or the exception the call raised, to `outcome`."""
        try:
            outcome.append(self._ask_endpoint(messages, temperature, seed))
        except BaseException as error:  # handed to the caller's thread, which raises it
            outcome.append(error)

    def _ask_endpoint(self, messages: Sequence[Mapping[str, str]], temperature: float, seed: int | None) -> str:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(message) for message in messages],
            "temperature": temperature,
            "seed": seed,
            "response_format": {"type": "json_object"},
        }
        try:
            response = self._http.post(self.url, content=orjson.dumps(payload))
        except httpx.TimeoutException:
            raise LLMUnavailable(f"timeout after {self.timeout_s:g}s: POST {self.url}") from None
        except httpx.TransportError as error:
            raise LLMUnavailable(f"cannot reach {self.url}: {error or type(error).__name__}") from None
        if response.status_code >= 400:
            status = response.status_code
            raise LLMUnavailable(
                f"HTTP {status} from {self.url}: {_error_message(response)}",
                status=status,
                retryable=status >= 500 or status in (408, 429),
            )
        try:
            body = response.json()
            message = body["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise LLMUnavailable(
                f"malformed response from {self.url}: no choices[0].message in {one_line(response.text, 200)!r}",
                retryable=False,
            ) from None
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else ""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Asking for strict JSON

CORRECTION_PROMPT = """Your answer could not be used: {problem}.
Answer again with exactly one JSON object and nothing else, of this form:
{form}"""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

T = TypeVar("T")


def strip_fences(text: str) -> str:
    """The JSON text of a reply: without <think>…</think> and without a ```json … ``` fence."""
    text = _THINK.sub("", text).strip()
    match = _FENCE.search(text)
    return match.group(1).strip() if match else text


def parse_reply(reply: str, validator: jsonschema.Draft202012Validator) -> Any:
    """The reply's JSON value, valid against the schema; raises ValueError with the problem."""
    text = strip_fences(reply)
    if not text:
        raise ValueError("the reply is empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg} at char {error.pos}): {one_line(text, 80)!r}") from None
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        raise ValueError(f"schema violation at {where or 'top level'}: {one_line(error.message, 160)}")
    return value


def ask(
    client: ChatClient,
    messages: list[dict[str, str]],
    *,
    temperature: float,
    seed: int | None,
    max_retries: int,
    validate: Callable[[str], T],
    form: str,
) -> T:
    """Ask, validate, and retry (corrective message on invalid output, plain repeat on transport errors).

    Raises LLMUnavailable (endpoint trouble that outlasted the retries, or a non-retryable HTTP error)
    or LLMOutputError (invalid output after 1 + max_retries attempts).
    """
    conversation = list(messages)
    problem, reply = "", ""
    for attempt in range(max_retries + 1):
        try:
            reply = client.complete(conversation, temperature, seed)
        except LLMUnavailable as error:
            if not error.retryable or attempt == max_retries:
                raise
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
            continue
        try:
            return validate(reply)
        except ValueError as error:
            problem = str(error)
        conversation = [
            *conversation,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": CORRECTION_PROMPT.format(problem=problem, form=form)},
        ]
    raise LLMOutputError(problem, max_retries + 1, one_line(reply, 300))

