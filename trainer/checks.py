"""Checks an environment must pass before it is offered for training: the ground-truth solution
scores 1.0 on every seed, and policies that do nothing useful score low."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tracefix.trainer.environment import Environment, noop_policy, random_policy, rollout, solution_policy

FLOOR = 0.3  # the mean reward a no-op or random policy must stay under


@dataclass(slots=True)
class CheckReport:
    family: str
    seeds: int
    solution_min: float
    solution_mean: float
    solution_failures: list[int] = field(default_factory=list)
    noop_mean: float = 0.0
    random_mean: float = 0.0
    errors: list[str] = field(default_factory=list)
    # Per tool with a learned result shape: how well the simulated results fit what the agent's own
    # tool returns, as simulated and as dressed in that shape (trainer.result_shapes.conformance).
    shapes: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (
            not self.errors
            and not self.solution_failures
            and self.noop_mean < FLOOR
            and self.random_mean < FLOOR
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "seeds": self.seeds,
            "passed": self.passed,
            "solution": {"min": self.solution_min, "mean": self.solution_mean, "failed_seeds": self.solution_failures[:20]},
            "noop_mean": self.noop_mean,
            "random_mean": self.random_mean,
            "floor": FLOOR,
            "errors": self.errors[:20],
            "result_shapes": self.shapes,
        }


def check(environment: Environment, seeds: int = 100, first_seed: int = 0) -> CheckReport:
    """Replay the solution, a no-op policy and a random policy on `seeds` seeds."""
    solution, noop, random_rewards, failures, errors = [], [], [], [], []
    fits: dict[str, list[tuple[float, float]]] = {}
    for seed in range(first_seed, first_seed + seeds):
        try:
            instance = environment.instance(seed)
            result = rollout(instance, solution_policy(instance)).reward
            solution.append(result)
            for tool, before, after in instance.shaped:
                fits.setdefault(tool, []).append((before, after))
            if result < 1.0:
                failures.append(seed)
            noop.append(rollout(environment.instance(seed), noop_policy).reward)
            random_rewards.append(rollout(environment.instance(seed), random_policy(seed)).reward)
        except Exception as error:  # a family bug is a failed check with its reason, not a crash
            errors.append(f"seed {seed}: {type(error).__name__}: {error}")
    return CheckReport(
        family=environment.family.name,
        seeds=seeds,
        solution_min=min(solution, default=0.0),
        solution_mean=round(statistics.fmean(solution), 4) if solution else 0.0,
        solution_failures=failures,
        noop_mean=round(statistics.fmean(noop), 4) if noop else 0.0,
        random_mean=round(statistics.fmean(random_rewards), 4) if random_rewards else 0.0,
        errors=errors,
        shapes={
            tool: {"results": len(pairs), "fit_simulated": round(statistics.fmean(p[0] for p in pairs), 3),
                   "fit_dressed": round(statistics.fmean(p[1] for p in pairs), 3)}
            for tool, pairs in sorted(fits.items())
        },  # fmt: skip
    )
