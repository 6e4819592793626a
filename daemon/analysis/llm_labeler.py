"""An LLM labeler and the capability-discovery step, for any OpenAI-compatible chat endpoint.

DESIGN.md section 1, step 1: besides the rule detectors, an LLM labels arbitrary capabilities
(NA / PRESENT / LACKING) in repeated runs, so the statistics can apply the consistency vote
(selected in at least 8 of 10 runs), and proposes new capabilities from contrasted failed and
successful transcripts (the paper's discovery step).

Rules this module keeps:

- The model answers strict JSON, validated with jsonschema (``LABEL_SCHEMA``, ``DISCOVERY_SCHEMA``).
  ```json fences and ``<think>`` blocks are stripped first; nothing else is repaired. Invalid output
  (not JSON, a schema violation, an evidence turn outside the transcript) is retried up to
  ``max_retries`` times with a corrective message, then recorded as ``Label.ERROR`` — a label is
  never guessed.
- The labeling prompt does not reveal the trajectory's outcome: a labeler that knew the run failed
  would say LACKING more often on failures and inflate the contrast Δ it is meant to measure.
- ``LLMLabeler.label`` never raises for model or endpoint trouble: an unreachable endpoint, an HTTP
  error or invalid output becomes ``Judgement(Label.ERROR, reason, (), 0.0)`` (ERROR is excluded
  from statistics), so one bad pass does not stop analysis. ``label_runs`` stops calling an
  endpoint that is unavailable and returns ERROR for the remaining runs of that trajectory.
- Transport errors, HTTP 408/429 and 5xx are retried (within ``max_retries``); other HTTP errors
  (400, 401, 404 …) are not, since repeating the same request cannot fix them.
- ``LLMLabeler.version`` hashes the prompt templates, the model and the capability (name and
  description): changing any of them relabels.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import jsonschema
import orjson

from daemon.analysis.capabilities import Capability, Judgement, Label, ToolCall, Trajectory, Turn
from daemon.core.settings import CAPABILITY_NAME, ConfigError, CustomCapability, LLMSettings  # noqa: F401 (re-exported)

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


# ---------------------------------------------------------------------------------------------
# Client


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
    return _one_line(message, 300)


class ChatClient:
    """A minimal chat-completions client: one POST per call, errors become LLMUnavailable."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: LLMSettings, environ: Mapping[str, str] | None = None) -> ChatClient:
        environ = os.environ if environ is None else environ
        api_key = environ.get(settings.api_key_env) or None
        return cls(settings.base_url, settings.model, api_key=api_key, timeout_s=settings.timeout_s)

    def complete(self, messages: Sequence[Mapping[str, str]], temperature: float, seed: int | None) -> str:
        """The assistant message's text ("" when it has none); raises LLMUnavailable."""
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
                f"malformed response from {self.url}: no choices[0].message in {_one_line(response.text, 200)!r}",
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
# Transcript rendering


def _one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 20)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    return f"{head} … [{len(text) - len(head) - len(tail)} characters omitted] … {tail}"


def _compact_json(text: str | None) -> str:
    """JSON text without insignificant whitespace; other text unchanged."""
    if text is None:
        return ""
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            return orjson.dumps(orjson.loads(stripped)).decode()
        except orjson.JSONDecodeError:
            pass
    return stripped


def _looks_failed(content: str) -> bool:
    if content.lstrip().startswith("{"):
        try:
            value = orjson.loads(content)
        except orjson.JSONDecodeError:
            return False
        return isinstance(value, dict) and bool(value.get("error"))
    return False


def _call_text(name: str, arguments: Any, limit: int) -> str:
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode() if arguments is not None else "{}"
    return f"{name}({_cut_middle(_compact_json(arguments) or '{}', limit)})"


def _indent(text: str) -> str:
    """Multi-line content continues on indented lines, so every [n] starts a line."""
    lines = text.splitlines() or [""]
    return "\n".join([lines[0], *("    " + line for line in lines[1:])])


def _cut_lines(lines: list[str], budget: int) -> list[str]:
    """Keep the first and last lines within `budget` characters; say what was left out."""
    total = sum(len(line) + 1 for line in lines)
    if total <= budget:
        return lines
    half = max((budget - 60) // 2, 0)
    head: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > half:
            break
        head.append(line)
        used += len(line) + 1
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > half:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    omitted = lines[len(head) : len(lines) - len(tail)]
    chars = sum(len(line) + 1 for line in omitted)
    return [*head, f"… [{len(omitted)} lines, {chars} characters omitted from the middle] …", *tail]


def render_transcript(trajectory: Trajectory, max_chars: int = 12000) -> str:
    """A compact numbered rendering: the declared tools, then `[n] role: …` per turn.

    `[n]` is the turn's index in ``trajectory.turns`` (the number the model cites as evidence).
    Assistant tool calls read `→ name({args})`, tool results `tool name ← result`, failures `✗ error`.
    Executed tool calls that have no tool message are shown under their assistant turn as `↳`.
    Beyond `max_chars` the middle of the conversation is cut, keeping its start and its end.
    """
    per_turn = max(200, max_chars // 5)
    per_args = max(120, max_chars // 20)
    header = [
        f"Trajectory: {trajectory.trajectory_id} (service {trajectory.service_name}, "
        f"{len(trajectory.turns)} turns numbered [0]–[{max(len(trajectory.turns) - 1, 0)}])"
    ]
    if trajectory.tools:
        inferred = trajectory.tools_source == "inferred"
        source = " (inferred from the calls; no definitions were recorded)" if inferred else ""
        header.append(f"Tools declared by the agent{source}:")
        names = sorted(trajectory.tools)
        for name in names[:40]:
            description = _one_line((trajectory.tools[name].description or "").split("\n")[0], 140)
            header.append(f"- {name}: {description}" if description else f"- {name}")
        if len(names) > 40:
            header.append(f"- … and {len(names) - 40} more")
    else:
        header.append("Tools declared by the agent: none recorded")

    # Which tool each tool message answers, and which executed calls have no message of their own.
    requested = {
        call.get("id"): call.get("name", "?")
        for turn in trajectory.turns
        for call in (turn.tool_calls or [])
        if isinstance(call, dict) and call.get("id")
    }
    by_id: dict[str, ToolCall] = {call.call_id: call for call in trajectory.tool_calls if call.call_id}
    answered = {turn.tool_call_id for turn in trajectory.turns if turn.role == "tool" and turn.tool_call_id}
    unclaimed = [call for call in trajectory.tool_calls if not call.call_id or call.call_id not in answered]
    claimed_for_turn: dict[int, ToolCall] = {}
    for index, turn in enumerate(trajectory.turns):
        if turn.role == "tool" and not turn.tool_call_id:
            # A result without a call id answers the earliest unclaimed call made before it.
            for call in unclaimed:
                before = call.message_position is None or call.message_position < index
                if before:
                    claimed_for_turn[index] = call
                    unclaimed.remove(call)
                    break
    inline: dict[int | None, list[ToolCall]] = {}
    for call in unclaimed:
        position = call.message_position
        if position is not None and not 0 <= position < len(trajectory.turns):
            position = None
        inline.setdefault(position, []).append(call)

    def executed(call: ToolCall) -> str:
        mark = " ✗ error" if call.failed else ""
        shown = call.result if call.result else (call.error or "")
        result = _cut_middle(_compact_json(shown), per_turn)
        return f"    ↳ {_call_text(call.name, call.arguments, per_args)}{mark} ← {result}"

    lines: list[str] = []
    for index, turn in enumerate(trajectory.turns):
        content = (turn.content or "").strip()
        if turn.role == "assistant":
            calls = [
                _call_text(call.get("name", "?"), call.get("arguments"), per_args)
                for call in (turn.tool_calls or [])
                if isinstance(call, dict)
            ]
            text = f"[{index}] assistant"
            if content:
                text += f": {_cut_middle(content, per_turn)}"
            if calls:
                text += " → " + "; ".join(calls)
            if not content and not calls:
                text += ": (empty)"
            lines.append(_indent(text))
        elif turn.role == "tool":
            call = by_id.get(turn.tool_call_id or "") or claimed_for_turn.get(index)
            name = requested.get(turn.tool_call_id) or (call.name if call else None) or "?"
            failed = call.failed if call is not None else _looks_failed(content)
            shown = content or (call.error if call is not None and call.error else "") or "(empty)"
            mark = " ✗ error" if failed else ""
            lines.append(_indent(f"[{index}] tool {name}{mark} ← {_cut_middle(_compact_json(shown), per_turn)}"))
        else:
            lines.append(_indent(f"[{index}] {turn.role}: {_cut_middle(content, per_turn) or '(empty)'}"))
        for call in inline.get(index, []):
            lines.append(executed(call))
    if inline.get(None):
        lines.append("Tool calls not tied to a message:")
        lines.extend(executed(call) for call in inline[None])

    header.append("Conversation:")
    head = "\n".join(header)
    body = _cut_lines("\n".join(lines).split("\n"), max(max_chars - len(head) - 1, 400))
    return head + "\n" + "\n".join(body)


# ---------------------------------------------------------------------------------------------
# Prompts, schemas and the ask-validate-retry loop

LABEL_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "label": {"enum": ["NA", "PRESENT", "LACKING"]},
        "reason": {"type": "string", "minLength": 1},
        "evidence_turns": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 50},
    },
    "required": ["label", "reason", "evidence_turns"],
}

DISCOVERY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "capabilities": {
            "type": "array",
            "maxItems": 50,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 100},
                    "description": {"type": "string", "minLength": 1},
                },
                "required": ["name", "description"],
            },
        }
    },
    "required": ["capabilities"],
}

_LABEL_VALIDATOR = jsonschema.Draft202012Validator(LABEL_SCHEMA)
_DISCOVERY_VALIDATOR = jsonschema.Draft202012Validator(DISCOVERY_SCHEMA)

LABEL_SYSTEM = (
    "You audit transcripts of an LLM agent that talks to a user and calls tools. You judge one "
    "capability at a time and answer with one strict JSON object, nothing else."
)

LABEL_PROMPT = """Capability: {name}
Definition: {description}

{transcript}

Judge this transcript for the capability above:
- "NA": the task in this transcript did not need the capability.
- "PRESENT": the task needed it and the agent exercised it correctly.
- "LACKING": the task needed it and the agent did not exercise it, or did it wrongly.
Judge what the agent did, not how the conversation ended; you are not told whether the run succeeded.
Cite as evidence the [n] numbers of the turns that support your verdict (an empty list when nothing applies).

Answer with exactly this JSON object and nothing else:
{{"label": "NA" | "PRESENT" | "LACKING", "reason": "<one line>", "evidence_turns": [<turn numbers>]}}"""

CORRECTION_PROMPT = """Your answer could not be used: {problem}.
Answer again with exactly one JSON object and nothing else, of this form:
{form}"""

LABEL_FORM = '{"label": "NA" | "PRESENT" | "LACKING", "reason": "<one line>", "evidence_turns": [<turn numbers>]}'

DISCOVERY_SYSTEM = (
    "You analyse transcripts of an LLM agent that talks to a user and calls tools, to find the "
    "capabilities whose absence makes it fail. You answer with one strict JSON object, nothing else."
)

DISCOVERY_PROMPT = """Below are {n_failed} FAILED and {n_success} SUCCESSFUL runs of the same agent.

{samples}

Compare the failed runs with the successful ones. Name up to {limit} general capabilities that the agent
lacks in the failed runs and shows (or does not need) in the successful runs, ordered by how many failures
each explains. A capability is a general skill (for example: verifying preconditions before changing state,
recovering from a tool error), not a fact about one task, and it must be judgeable from a single transcript.
Each description says what the agent must do, so a reader can decide NA, PRESENT or LACKING from it.{known}

Answer with exactly this JSON object and nothing else:
{{"capabilities": [{{"name": "<snake_case_name>", "description": "<one or two sentences>"}}]}}"""

DISCOVERY_FORM = '{"capabilities": [{"name": "<snake_case_name>", "description": "<one or two sentences>"}]}'

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

T = TypeVar("T")


def strip_fences(text: str) -> str:
    """The JSON text of a reply: without <think>…</think> and without a ```json … ``` fence."""
    text = _THINK.sub("", text).strip()
    match = _FENCE.search(text)
    return match.group(1).strip() if match else text


def _parse(reply: str, validator: jsonschema.Draft202012Validator) -> Any:
    """The reply's JSON value, valid against the schema; raises ValueError with the problem."""
    text = strip_fences(reply)
    if not text:
        raise ValueError("the reply is empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg} at char {error.pos}): {_one_line(text, 80)!r}") from None
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        raise ValueError(f"schema violation at {where or 'top level'}: {_one_line(error.message, 160)}")
    return value


def _ask(
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
    raise LLMOutputError(problem, max_retries + 1, _one_line(reply, 300))


def _version(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Labeler


class LLMLabeler:
    """Labels one capability with an LLM; ``label_runs`` gives one judgement per repeated run."""

    def __init__(self, client: ChatClient, capability_name: str, description: str, settings: LLMSettings) -> None:
        self.client = client
        self.capability_name = capability_name
        self.description = description
        self.settings = settings
        self.name = f"llm.{settings.model}"
        self.version = _version(
            LABEL_SYSTEM, LABEL_PROMPT, CORRECTION_PROMPT, LABEL_FORM, settings.model, capability_name, description
        )

    def messages(self, trajectory: Trajectory) -> list[dict[str, str]]:
        transcript = render_transcript(trajectory, self.settings.max_transcript_chars)
        prompt = LABEL_PROMPT.format(name=self.capability_name, description=self.description, transcript=transcript)
        return [{"role": "system", "content": LABEL_SYSTEM}, {"role": "user", "content": prompt}]

    def _validator(self, turns: list[Turn]) -> Callable[[str], Judgement]:
        def validate(reply: str) -> Judgement:
            value = _parse(reply, _LABEL_VALIDATOR)
            evidence = list(dict.fromkeys(value["evidence_turns"]))
            outside = [number for number in evidence if number >= len(turns)]
            if outside:
                last = f"[0]–[{len(turns) - 1}]" if turns else "none"
                raise ValueError(f"evidence turn {outside[0]} is not in the transcript (turns {last})")
            spans = tuple(dict.fromkeys(turns[number].span_id for number in evidence if turns[number].span_id))
            reason = _one_line(value["reason"], 300) or "(no reason given)"
            return Judgement(Label(value["label"]), reason, spans, 1.0)

        return validate

    def _run(self, trajectory: Trajectory, seed: int) -> Judgement:
        """One run; raises LLMUnavailable, returns ERROR for invalid output."""
        try:
            return _ask(
                self.client,
                self.messages(trajectory),
                temperature=self.settings.temperature,
                seed=seed,
                max_retries=self.settings.max_retries,
                validate=self._validator(trajectory.turns),
                form=LABEL_FORM,
            )
        except LLMOutputError as error:
            return Judgement(Label.ERROR, _one_line(f"invalid output: {error}", 300), (), 0.0)

    def label(self, trajectory: Trajectory, seed: int = 0) -> Judgement:
        """One run. Endpoint or output trouble gives ERROR with the reason; it never raises for it."""
        try:
            return self._run(trajectory, seed)
        except LLMUnavailable as error:
            return Judgement(Label.ERROR, _one_line(f"llm unavailable: {error.reason}", 300), (), 0.0)

    def label_runs(self, trajectory: Trajectory) -> list[Judgement]:
        """`settings.runs` runs with seeds 0..runs-1; once the endpoint is unavailable the rest are ERROR too."""
        judgements: list[Judgement] = []
        for seed in range(self.settings.runs):
            try:
                judgements.append(self._run(trajectory, seed))
            except LLMUnavailable as error:
                failed = Judgement(Label.ERROR, _one_line(f"llm unavailable: {error.reason}", 300), (), 0.0)
                judgements.extend([failed] * (self.settings.runs - seed))
                break
        return judgements


# ---------------------------------------------------------------------------------------------
# Discovery


def snake_case(text: str) -> str:
    """'Tool-Calling Precision' / 'toolCallingPrecision' → 'tool_calling_precision' (at most 64 characters)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text.strip())
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    text = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").lower()
    return text[:64].rstrip("_")


def _sample(items: Sequence[Trajectory], count: int, rng: random.Random) -> list[Trajectory]:
    if len(items) <= count:
        return list(items)
    chosen = sorted(rng.sample(range(len(items)), count))
    return [items[index] for index in chosen]


def discovery_messages(
    successes: Sequence[Trajectory],
    failures: Sequence[Trajectory],
    max_capabilities: int,
    settings: LLMSettings,
    *,
    known: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """The discovery prompt over the given (already sampled) failed and successful runs."""
    count = len(failures) + len(successes)
    per_sample = max(1000, (2 * settings.max_transcript_chars) // max(count, 1))
    blocks = [
        f"=== FAILED run {index} of {len(failures)} ===\n{render_transcript(trajectory, per_sample)}"
        for index, trajectory in enumerate(failures, 1)
    ]
    blocks += [
        f"=== SUCCESSFUL run {index} of {len(successes)} ===\n{render_transcript(trajectory, per_sample)}"
        for index, trajectory in enumerate(successes, 1)
    ]
    known_text = ""
    if known:
        listed = "\n".join(f"- {name}: {_one_line(text, 160)}" for name, text in sorted(known.items()))
        known_text = f"\nThese capabilities are already tracked; do not propose them again:\n{listed}"
    prompt = DISCOVERY_PROMPT.format(
        n_failed=len(failures),
        n_success=len(successes),
        samples="\n\n".join(blocks),
        limit=max_capabilities,
        known=known_text,
    )
    return [{"role": "system", "content": DISCOVERY_SYSTEM}, {"role": "user", "content": prompt}]


def discover_capabilities(
    client: ChatClient,
    successes: Sequence[Trajectory],
    failures: Sequence[Trajectory],
    max_capabilities: int = 10,
    settings: LLMSettings | None = None,
    *,
    known: Mapping[str, str] | None = None,
    samples_per_outcome: int = 4,
    seed: int = 0,
) -> list[dict[str, str]]:
    """Propose capabilities whose absence explains failures: [{"name", "description"}], at most max_capabilities.

    Shows up to `samples_per_outcome` failed and successful transcripts (a seeded sample), asks for
    strict JSON, normalises names to snake_case, drops duplicates and names in `known`. Invalid output
    is retried `settings.max_retries` times, then LLMOutputError is raised; endpoint trouble raises
    LLMUnavailable.
    """
    settings = settings or LLMSettings()
    if not failures:
        raise ValueError("discovery needs at least one failed trajectory")
    if max_capabilities < 1:
        raise ValueError("max_capabilities must be at least 1")
    rng = random.Random(seed)
    failed = _sample(failures, samples_per_outcome, rng)
    succeeded = _sample(successes, samples_per_outcome, rng)
    known_names = set(known or ())

    def validate(reply: str) -> list[dict[str, str]]:
        value = _parse(reply, _DISCOVERY_VALIDATOR)
        found: dict[str, dict[str, str]] = {}
        for item in value["capabilities"]:
            name = snake_case(item["name"])
            if not CAPABILITY_NAME.match(name):
                raise ValueError(f"capability name {item['name']!r} gives no usable snake_case name")
            description = _one_line(item["description"], 600)
            if name in known_names or name in found:
                continue
            found[name] = {"name": name, "description": description}
        return list(found.values())[:max_capabilities]

    return _ask(
        client,
        discovery_messages(succeeded, failed, max_capabilities, settings, known=known),
        temperature=settings.temperature,
        seed=seed,
        max_retries=settings.max_retries,
        validate=validate,
        form=DISCOVERY_FORM,
    )


# ---------------------------------------------------------------------------------------------
# Registry glue


def llm_capabilities(
    settings: LLMSettings, builtin_descriptions: Mapping[str, str], client: ChatClient | None = None
) -> list[Capability]:
    """One Capability per `settings.custom` entry, labeled by the LLM; [] when disabled.

    A custom name equal to a built-in one is a ConfigError: built-ins keep their rule labelers.
    """
    if not settings.enabled or not settings.custom:
        return []
    clashes = sorted(capability.name for capability in settings.custom if capability.name in builtin_descriptions)
    if clashes:
        raise ConfigError(
            f"llm.custom capabilities {', '.join(clashes)} clash with built-in capabilities; "
            "choose another name"
        )
    client = client or ChatClient.from_settings(settings)
    return [
        Capability(
            name=capability.name,
            description=capability.description,
            labeler=LLMLabeler(client, capability.name, capability.description, settings),
            environment_family=capability.environment_family,
            builtin=False,
        )
        for capability in settings.custom
    ]
