"""Held-out evaluation: base vs adapter on seeds the trainer never saw, greedy decoding, with 95 %
intervals, on the capability's own environment and on the other capabilities' (interference).

An adapter is a candidate only when its success rate beats the base's by the configured margin on
its own environment and no other environment gets worse beyond the base's interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tracefix.daemon.core.intervals import Z95, mcnemar_p, paired_difference, wilson
from tracefix.daemon.core.states import TrainingVerdict
from tracefix.trainer.environment import Environment
from tracefix.trainer.grpo import adapter_weights
from tracefix.trainer.rollouts import Sampling, play_in_batches

def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (0.0, 1.0)
    mean = statistics.fmean(values)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    return max(0.0, mean - half), min(1.0, mean + half)


@dataclass(slots=True)
class Score:
    seeds: int
    success_rate: float
    success_interval: tuple[float, float]
    mean_reward: float
    reward_interval: tuple[float, float]

    @classmethod
    def of(cls, rewards: list[float], successes: list[bool]) -> Score:
        wins = sum(successes)
        return cls(
            len(rewards),
            round(wins / len(rewards), 4) if rewards else 0.0,
            tuple(round(value, 4) for value in wilson(wins, len(rewards))),  # type: ignore[arg-type]
            round(statistics.fmean(rewards), 4) if rewards else 0.0,
            tuple(round(value, 4) for value in mean_interval(rewards)),  # type: ignore[arg-type]
        )


# Episodes per lockstep pass. A pass costs about the steps of its longest episode, each step little
# more for more rows: 48 seeds of the demo's held-out evaluation took 82 s in one pass of 48 where
# passes of 32 and 16 took 96 s (a trained policy; 36 s against 47 s for the base model). Two cores.
BATCH = 48


def score(model: Any, tokenizer: Any, environment: Environment, seeds: Sequence[int], sampling: Sampling, batch: int = BATCH) -> Score:
    """Greedy rollouts on ``seeds``, ``batch`` episodes per lockstep pass."""
    return Score.of(*play(model, tokenizer, environment, seeds, sampling, batch))


def play(
    model: Any, tokenizer: Any, environment: Environment, seeds: Sequence[int], sampling: Sampling, batch: int = BATCH
) -> tuple[list[float], list[bool]]:
    """Each seed's reward and success, greedy, ``batch`` episodes per lockstep pass."""
    greedy = Sampling(sampling.max_new_tokens, 0.0, max_turns=sampling.max_turns, max_length=sampling.max_length)
    played = play_in_batches(model, tokenizer, [environment.instance(seed) for seed in seeds], greedy, batch)
    return [item.rollout.reward for item in played], [item.rollout.success for item in played]


def paired(before: Sequence[bool], after: Sequence[bool]) -> dict[str, Any]:
    """Success on the same seeds before and after a change: the counts of each kind of pair, the
    difference of the rates with its 95 % interval (Newcombe, paired) and McNemar's exact p."""
    after_only = sum(b and not a for a, b in zip(before, after, strict=True))
    before_only = sum(a and not b for a, b in zip(before, after, strict=True))
    both = sum(a and b for a, b in zip(before, after, strict=True))
    neither = len(before) - after_only - before_only - both
    delta, low, high = paired_difference(after_only, before_only, both, neither)
    return {
        "seeds": len(before), "before": round(sum(before) / max(len(before), 1), 4), "after": round(sum(after) / max(len(after), 1), 4),
        "after_only": after_only, "before_only": before_only, "both": both, "neither": neither,
        "difference": round(delta, 4), "interval": [round(low, 4), round(high, 4)], "mcnemar_p": round(mcnemar_p(after_only, before_only), 4),
    }  # fmt: skip


@dataclass(slots=True)
class Comparison:
    environment: str
    base: Score
    adapter: Score

    @property
    def gain(self) -> float:
        return round(self.adapter.success_rate - self.base.success_rate, 4)

    @property
    def worse(self) -> bool:
        """The adapter's success rate fell below the base's interval."""
        return self.adapter.success_rate < self.base.success_interval[0]

    def to_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "base": asdict(self.base), "adapter": asdict(self.adapter), "gain": self.gain, "worse": self.worse}


def compare(
    base_model: Any,
    adapter_model: Any,
    tokenizer: Any,
    target: Environment,
    others: Mapping[str, Environment],
    seeds: range,
    sampling: Sampling,
    margin: float,
    on_part: Callable[[str], None] | None = None,
    warm_started: Mapping[str, Any] | None = None,
    reference: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation report and its verdict: "candidate" or "rejected_by_eval" with the reasons.

    ``base_model`` and ``adapter_model`` may be the same PEFT model: the base is then scored with
    its adapters disabled — or, given ``reference`` (the LoRA weights the adapter started from: its
    agent's generalist), with those, the model the adapter would replace; the report's ``base``
    arms are then that model's. ``on_part`` hears what is scored next ("tool_call_precision: base").
    With ``warm_started`` (the adapter's LoRA weights before GRPO), those weights are also scored
    on the target's seeds and the report's ``grpo_added`` compares them seed by seed with the final
    adapter: what GRPO added to the warm start."""
    outcomes: dict[str, list[bool]] = {}

    def adapter_score(environment: Environment) -> Score:
        rewards, successes = play(adapter_model, tokenizer, environment, seeds, sampling)
        outcomes[environment.family.capability] = successes
        return Score.of(rewards, successes)

    def both(environment: Environment) -> tuple[Score, Score]:
        if on_part:
            on_part(f"{environment.family.capability}: base")
        if base_model is adapter_model and reference is not None:
            with adapter_weights(adapter_model, dict(reference)):
                base = score(adapter_model, tokenizer, environment, seeds, sampling)
        elif base_model is adapter_model and hasattr(adapter_model, "disable_adapter"):
            with adapter_model.disable_adapter():
                base = score(adapter_model, tokenizer, environment, seeds, sampling)
        else:
            base = score(base_model, tokenizer, environment, seeds, sampling)
        if on_part:
            on_part(f"{environment.family.capability}: adapter")
        return base, adapter_score(environment)

    own = Comparison(target.family.capability, *both(target))
    grpo_added = None
    if warm_started is not None:
        if on_part:
            on_part(f"{target.family.capability}: warm start alone")
        with adapter_weights(adapter_model, warm_started):
            before = play(adapter_model, tokenizer, target, seeds, sampling)[1]
        grpo_added = paired(before, outcomes[target.family.capability])
    interference = [Comparison(name, *both(environment)) for name, environment in others.items()]
    reasons = []
    if own.gain < margin:
        reasons.append(f"success {own.adapter.success_rate:.2f} vs base {own.base.success_rate:.2f}: gain {own.gain:+.2f} < margin {margin:.2f}")
    reasons += [f"{item.environment} got worse: {item.adapter.success_rate:.2f} < base interval {item.base.success_interval}" for item in interference if item.worse]
    return {
        "verdict": TrainingVerdict.REJECTED_BY_EVAL if reasons else TrainingVerdict.CANDIDATE,
        "reasons": reasons,
        "margin": margin,
        "seeds": [seeds.start, seeds.stop],
        "target": own.to_dict(),
        "grpo_added": grpo_added,
        "interference": [item.to_dict() for item in interference],
    }
