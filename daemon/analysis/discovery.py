"""Discovery: proposing new capabilities from contrasted failed and successful runs (the paper's discovery step)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from tracefix.daemon.analysis.capabilities import Trajectory
from tracefix.daemon.analysis.llm_client import ChatClient, ask, one_line, parse_reply
from tracefix.daemon.analysis.transcript import render_transcript
from tracefix.daemon.core.settings import CAPABILITY_NAME, LLMSettings

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

_DISCOVERY_VALIDATOR = jsonschema.Draft202012Validator(DISCOVERY_SCHEMA)

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
        listed = "\n".join(f"- {name}: {one_line(text, 160)}" for name, text in sorted(known.items()))
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
        value = parse_reply(reply, _DISCOVERY_VALIDATOR)
        found: dict[str, dict[str, str]] = {}
        for item in value["capabilities"]:
            name = snake_case(item["name"])
            if not CAPABILITY_NAME.match(name):
                raise ValueError(f"capability name {item['name']!r} gives no usable snake_case name")
            description = one_line(item["description"], 600)
            if name in known_names or name in found:
                continue
            found[name] = {"name": name, "description": description}
        return list(found.values())[:max_capabilities]

    return ask(
        client,
        discovery_messages(succeeded, failed, max_capabilities, settings, known=known),
        temperature=settings.temperature,
        seed=seed,
        max_retries=settings.max_retries,
        validate=validate,
        form=DISCOVERY_FORM,
    )
