"""Your evaluators as labels: ``gen_ai.evaluation.result`` events mapped to capabilities.

A ``[[capabilities.evaluations]]`` entry names an evaluation (an LLM judge, a Phoenix or Langfuse
check) and the capability it judges. Where such an evaluation arrived, it is that capability's
label for the run; where it never arrived, the capability's own labeler decides (a capability the
mapping introduces is then NA).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from tracefix.daemon.analysis.capabilities import Capability, CapabilityRegistry, Evaluation, Judgement, Label, Labeler, Trajectory
from tracefix.daemon.core.semconv import EVALUATION_EVENT, decoded, event_attributes
from tracefix.daemon.core.settings import EvaluationMapping

_VERSION = "1"  # of the mapping rules below; a change relabels every mapped capability
_MAX_REASON = 1000


def _score(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def read_evaluation(attributes: dict[str, Any], span_id: str | None, time_unix_nano: int) -> Evaluation | None:
    """The evaluation an event's attributes describe; None when it names no evaluation."""
    name = attributes.get("gen_ai.evaluation.name")
    if not isinstance(name, str) or not name.strip():
        return None
    label = attributes.get("gen_ai.evaluation.score.label")
    explanation = attributes.get("gen_ai.evaluation.explanation")
    return Evaluation(
        name=name.strip(),
        label=str(label) if label is not None and not isinstance(label, (dict, list)) else None,
        score=_score(attributes.get("gen_ai.evaluation.score.value")),
        explanation=str(explanation).strip() if explanation is not None and str(explanation).strip() else None,
        span_id=span_id or None,
        time_unix_nano=int(time_unix_nano or 0),
    )


def span_evaluations(span_id: str, end_time_unix_nano: int, events: Any) -> list[Evaluation]:
    """The evaluations among a span's events (stored as JSON); the span is their evidence."""
    found = []
    for event in decoded(events) or []:
        if not isinstance(event, dict) or event.get("name") != EVALUATION_EVENT:
            continue
        evaluation = read_evaluation(
            event_attributes(event.get("attributes")), span_id, event.get("time_unix_nano") or end_time_unix_nano
        )
        if evaluation is not None:
            found.append(evaluation)
    return found


def log_evaluation(span_id: str | None, time_unix_nano: int, attributes: Any, body: Any) -> Evaluation | None:
    """The evaluation of one gen_ai.evaluation.result log record (attributes and body stored as JSON)."""
    return read_evaluation(event_attributes(decoded(attributes), decoded(body)), span_id, time_unix_nano)


def _verdict(mapping: EvaluationMapping, evaluation: Evaluation) -> tuple[Label, bool] | None:
    """The mapping's label for this evaluation and whether its label decided (else its score); None when neither does."""
    label = (evaluation.label or "").strip().lower()
    if label:
        for labels, verdict in (
            (mapping.lacking_labels, Label.LACKING),
            (mapping.present_labels, Label.PRESENT),
            (mapping.na_labels, Label.NA),
        ):
            if label in {item.strip().lower() for item in labels}:
                return verdict, True
    if evaluation.score is not None and mapping.lacking_below is not None:
        return (Label.LACKING if evaluation.score < mapping.lacking_below else Label.PRESENT), False
    return None


def _reason(evaluation: Evaluation, mapping: EvaluationMapping, by_label: bool) -> str:
    """The evaluator's explanation, prefixed with the evaluation's name; what decided when it gave none."""
    if evaluation.explanation:
        text = evaluation.explanation
    elif by_label:
        text = f"label {evaluation.label!r}"
    else:
        side = "below" if evaluation.score < mapping.lacking_below else "at or above"  # type: ignore[operator]
        text = f"score {evaluation.score:g}, {side} {mapping.lacking_below:g}"
    reason = f"{evaluation.name}: {text}"
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"


class EvaluationLabeler:
    """A capability's label from the mapped evaluations of a run, else from `fallback` (or NA without one).

    It keeps the fallback's name, so its labels replace the fallback's; its version adds the
    mapping's, so a changed mapping relabels.
    """

    def __init__(self, capability: str, mappings: Sequence[EvaluationMapping], fallback: Labeler | None = None) -> None:
        self.capability = capability
        self.mappings = {mapping.name: mapping for mapping in mappings}
        self.fallback = fallback
        rules = [mapping.model_dump(exclude={"description"}) for mapping in mappings]
        digest = hashlib.sha256(orjson.dumps(rules, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]
        own = f"evaluations.{_VERSION}.{digest}"
        self.name = fallback.name if fallback is not None else "evaluations"
        self.version = f"{fallback.version}+{own}" if fallback is not None else own

    def decided(self, trajectory: Trajectory) -> Judgement | None:
        """The latest mapped evaluation that decides, as a judgement; None when none arrived or decides."""
        chosen: tuple[int, int, Evaluation, EvaluationMapping, tuple[Label, bool]] | None = None
        for order, evaluation in enumerate(trajectory.evaluations):
            mapping = self.mappings.get(evaluation.name)
            verdict = _verdict(mapping, evaluation) if mapping is not None else None
            if verdict is not None and (chosen is None or (evaluation.time_unix_nano, order) >= chosen[:2]):
                chosen = (evaluation.time_unix_nano, order, evaluation, mapping, verdict)  # type: ignore[assignment]
        if chosen is None:
            return None
        _, _, evaluation, mapping, (label, by_label) = chosen
        evidence = (evaluation.span_id,) if evaluation.span_id else ()
        return Judgement(label, _reason(evaluation, mapping, by_label), evidence)

    def _undecided(self, trajectory: Trajectory) -> Judgement:
        arrived = [evaluation for evaluation in trajectory.evaluations if evaluation.name in self.mappings]
        if not arrived:
            names = " or ".join(sorted(self.mappings))
            return Judgement(Label.NA, f"no {names} evaluation arrived")
        last = arrived[-1]
        shown = repr(last.label) if last.label else f"score {last.score}" if last.score is not None else "nothing"
        return Judgement(Label.NA, f"{last.name} gave no verdict: {shown} decides nothing in its mapping")

    def label(self, trajectory: Trajectory) -> Judgement:
        decided = self.decided(trajectory)
        if decided is not None:
            return decided
        return self.fallback.label(trajectory) if self.fallback is not None else self._undecided(trajectory)

    def label_runs(self, trajectory: Trajectory) -> list[Judgement]:
        """One judgement per run of the fallback (an LLM repeats runs); an evaluation's verdict is the same in each."""
        decided = self.decided(trajectory)
        repeats = hasattr(self.fallback, "label_runs")
        if decided is not None:
            # Every run sees the evaluation, so the consistency vote counts it in each of them.
            runs = getattr(getattr(self.fallback, "settings", None), "runs", 1) if repeats else 1
            return [decided] * max(1, runs)
        if repeats:
            return self.fallback.label_runs(trajectory)  # type: ignore[union-attr]
        return [self.label(trajectory)]


def label_with_evaluations(registry: CapabilityRegistry, mappings: Iterable[EvaluationMapping]) -> None:
    """Let each mapped evaluation label its capability: wrap a registered capability's labeler, or
    register the capability when no plugin or [[llm.custom]] entry has it."""
    by_capability: dict[str, list[EvaluationMapping]] = {}
    for mapping in mappings:
        by_capability.setdefault(mapping.capability, []).append(mapping)
    for name, mapped in by_capability.items():
        if name in registry:
            capability = registry[name]
            capability.labeler = EvaluationLabeler(name, mapped, capability.labeler)
            continue
        description = next((mapping.description for mapping in mapped if mapping.description), "")
        evaluations = ", ".join(dict.fromkeys(mapping.name for mapping in mapped))
        registry.add(
            Capability(
                name=name,
                description=description or f"as judged by the {evaluations} evaluation",
                labeler=EvaluationLabeler(name, mapped),
                environment_family=None,
                builtin=False,
            )
        )
