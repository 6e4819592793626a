"""The daemon ↔ trainer contract, typed once: what a training request holds, and what its result does.

The daemon (``daemon.pipeline.training_runner``, and ``tracefix train`` in the foreground) builds a
request with these models and writes it as ``request.json``; the trainer (``trainer.train_job``)
reads it back through the same models, so a field either side gets wrong is refused with its name
before any model is loaded. A targeted run trains on an environment (its family, difficulty and the
agent's tools); a generalist run (``kind = "generalist"``) learns from the agent's successful
conversations. Both carry the [training] and [model] settings the daemon runs with. A run's replay of
real failures comes back as answers, which the daemon judges (daemon/pipeline/replay_judge.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from tracefix.daemon.core.settings import ModelSettings, TrainingSettings
from tracefix.daemon.core.states import TrainingVerdict


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvaluationPart(_Part):
    """How the candidate is evaluated on held-out seeds."""

    seeds: int = Field(ge=1)
    margin: float
    interference: bool = True


class StartsFrom(_Part):
    """The generalist a targeted run starts from: its weights, and its run's conversations (those it
    learned from are rehearsed; on those it was scored on, the targeted adapter must keep its next
    actions)."""

    adapter_id: int
    name: str
    path: str
    conversations: str | None = None
    rehearsal_share: float = Field(0.0, ge=0, lt=1)
    retention_margin: float = Field(0.05, ge=0)


class _Job(_Part):
    run_id: int | None
    capability: str = Field(min_length=1, description="The track the adapter is served under (daemon.core.tracks).")
    version: int = Field(ge=1)
    training: TrainingSettings
    model: ModelSettings
    evaluation: EvaluationPart
    memory_mb: int | None = None


class TargetedRequest(_Job):
    """Train one capability's adapter on its environment."""

    kind: Literal["targeted"] = "targeted"
    family: str
    difficulty: int = Field(ge=0)
    tools: list[dict[str, Any]]
    replay: list[dict[str, Any]] = []
    starts_from: StartsFrom | None = None


class GeneralistRequest(_Job):
    """Learn an agent's generalist from its successful conversations."""

    kind: Literal["generalist"]
    agent: str = Field(min_length=1)
    conversations: str
    margin: float


TrainingRequest = Annotated[TargetedRequest | GeneralistRequest, Field(discriminator="kind")]
_REQUEST: TypeAdapter[TargetedRequest | GeneralistRequest] = TypeAdapter(TrainingRequest)


def training_request(data: Any) -> TargetedRequest | GeneralistRequest:
    """The request in `data` (a request without a kind is a targeted one); a ValueError naming every
    field that is missing or wrong."""
    if isinstance(data, dict) and "kind" not in data:
        data = {**data, "kind": "targeted"}
    try:
        return _REQUEST.validate_python(data)
    except ValidationError as error:
        wrong = "; ".join(f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors())
        raise ValueError(f"bad training request: {wrong}") from None


class TrainingResult(BaseModel):
    """What a training job leaves in ``result.json`` for the daemon: its verdict, the evaluation
    report (the held-out comparison, or a generalist's next actions), what training did, and the
    adapter's directory when it is a candidate. Fields beyond these (the device, peak GPU memory,
    how a result was recovered) are kept as they come."""

    model_config = ConfigDict(extra="allow", frozen=True)

    run_id: int | None
    capability: str
    verdict: TrainingVerdict
    evaluation: dict[str, Any]
    training: dict[str, Any]
    adapter: str | None = None
    steps: int | None = None
    seconds: float | None = None

    @model_validator(mode="after")
    def _candidate_has_adapter(self) -> TrainingResult:
        if self.verdict == TrainingVerdict.CANDIDATE and not self.adapter:
            raise ValueError("a candidate names its adapter's directory")
        return self


def training_result(text: str) -> TrainingResult:
    """The job's ``result.json``; a ValueError saying what is wrong with it."""
    try:
        return TrainingResult.model_validate_json(text)
    except ValidationError as error:
        wrong = "; ".join(f"{'.'.join(str(part) for part in item['loc']) or 'result'}: {item['msg']}" for item in error.errors())
        raise ValueError(f"unusable training result: {wrong}") from None
