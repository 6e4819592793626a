"""The LLM labeler: an LLM judges one capability NA / PRESENT / LACKING in repeated runs, for each [[llm.custom]] entry.

DESIGN.md section 1, step 1: besides the rule detectors, an LLM labels arbitrary capabilities
(NA / PRESENT / LACKING) in repeated runs, so the statistics can apply the consistency vote
(selected in at least 8 of 10 runs).

Rules this module keeps:

- The reply is strict JSON against ``LABEL_SCHEMA``; invalid output (not JSON, a schema violation,
  an evidence turn outside the transcript) that outlasts the corrective retries is recorded as
  ``Label.ERROR`` — a label is never guessed.
- The labeling prompt does not reveal the trajectory's outcome: a labeler that knew the run failed
  would say LACKING more often on failures and inflate the contrast Δ it is meant to measure.
- ``LLMLabeler.label`` never raises for model or endpoint trouble: an unreachable endpoint, an HTTP
  error or invalid output becomes ``Judgement(Label.ERROR, reason, (), 0.0)`` (ERROR is excluded
  from statistics), so one bad pass does not stop analysis. ``label_runs`` stops calling an
  endpoint that is unavailable and returns ERROR for the remaining runs of that trajectory.
- ``LLMLabeler.version`` hashes the prompt templates, the model and the capability (name and
  description): changing any of them relabels.
- ``LLMLabeler.deferred``: the analysis pass leaves these capabilities to ``LLMJudging``
  (judging.py), which judges them concurrently within ``[llm] concurrency`` and ``calls_per_minute``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from tracefix.daemon.analysis.capabilities import Capability, Judgement, Label, Trajectory, Turn
from tracefix.daemon.analysis.llm_client import (
    CORRECTION_PROMPT,
    ChatClient,
    LLMOutputError,
    LLMUnavailable,
    ask,
    one_line,
    parse_reply,
)
from tracefix.daemon.analysis.transcript import render_transcript
from tracefix.daemon.core.settings import ConfigError, LLMSettings

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

_LABEL_VALIDATOR = jsonschema.Draft202012Validator(LABEL_SCHEMA)

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

LABEL_FORM = '{"label": "NA" | "PRESENT" | "LACKING", "reason": "<one line>", "evidence_turns": [<turn numbers>]}'


def _version(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]



class LLMLabeler:
    """Labels one capability with an LLM; ``label_runs`` gives one judgement per repeated run."""

    # Judged beside the analysis pass (daemon/analysis/judging.py), never inside it: a model takes
    # seconds a call, and rule labels and statistics must not wait for it.
    deferred = True

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
            value = parse_reply(reply, _LABEL_VALIDATOR)
            evidence = list(dict.fromkeys(value["evidence_turns"]))
            outside = [number for number in evidence if number >= len(turns)]
            if outside:
                last = f"[0]–[{len(turns) - 1}]" if turns else "none"
                raise ValueError(f"evidence turn {outside[0]} is not in the transcript (turns {last})")
            spans = tuple(dict.fromkeys(turns[number].span_id for number in evidence if turns[number].span_id))
            reason = one_line(value["reason"], 300) or "(no reason given)"
            return Judgement(Label(value["label"]), reason, spans, 1.0)

        return validate

    def _run(self, trajectory: Trajectory, seed: int) -> Judgement:
        """One run; raises LLMUnavailable, returns ERROR for invalid output."""
        try:
            return ask(
                self.client,
                self.messages(trajectory),
                temperature=self.settings.temperature,
                seed=seed,
                max_retries=self.settings.max_retries,
                validate=self._validator(trajectory.turns),
                form=LABEL_FORM,
            )
        except LLMOutputError as error:
            return Judgement(Label.ERROR, one_line(f"invalid output: {error}", 300), (), 0.0)

    def label(self, trajectory: Trajectory, seed: int = 0) -> Judgement:
        """One run. Endpoint or output trouble gives ERROR with the reason; it never raises for it."""
        try:
            return self._run(trajectory, seed)
        except LLMUnavailable as error:
            return Judgement(Label.ERROR, one_line(f"llm unavailable: {error.reason}", 300), (), 0.0)

    def label_runs(self, trajectory: Trajectory) -> list[Judgement]:
        """`settings.runs` runs with seeds 0..runs-1; once the endpoint is unavailable the rest are ERROR too."""
        judgements: list[Judgement] = []
        for seed in range(self.settings.runs):
            try:
                judgements.append(self._run(trajectory, seed))
            except LLMUnavailable as error:
                failed = Judgement(Label.ERROR, one_line(f"llm unavailable: {error.reason}", 300), (), 0.0)
                judgements.extend([failed] * (self.settings.runs - seed))
                break
        return judgements



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
