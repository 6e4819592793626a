"""Train one adapter on the CPU with the real SmolLM2-135M and measure what it changes.

The capability's environment is built on an example agent's tools (`--tools`: the traffic
generator's, examples/traffic.py, or the airline demo's, examples/airline/tools.py). The base
and the adapter are scored on held-out seeds (greedy), with 95 % intervals; with ``--baseline`` the
same rollout budget is also spent on plain GRPO over a mix of all built-in environments (the
paper's "GRPO on target" baseline) and scored the same way.

    python bench/train_cpu.py --capability tool_call_precision --warm-start 48 --steps 6 --eval-seeds 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.airline.tools import TOOLS as AIRLINE_TOOLS  # noqa: E402
from examples.traffic import TOOLS as TRAFFIC_TOOLS  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.environment import Environment, Family, Instance, Tool, load_tools  # noqa: E402
from tracefix.trainer.evaluation import score  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from tracefix.trainer.recipes import train  # noqa: E402
from tracefix.daemon.core.settings import TrainingSettings  # noqa: E402
from tracefix.trainer.rollouts import Sampling  # noqa: E402


TOOL_SETS = {"traffic": TRAFFIC_TOOLS, "airline": AIRLINE_TOOLS}


class Mixed(Family):
    """All built-in families at once, one per seed: the target agent's task mix."""

    name = capability = "mixed"

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def build(self, tools: list[Tool], seed: int, difficulty: int) -> Instance:  # type: ignore[override]
        return self.families[seed % len(self.families)].instance(tools, seed, difficulty)


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(arguments.threads)
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    tools = load_tools(TOOL_SETS[arguments.tools])
    families = load_families()
    target = Environment(families[arguments.capability], tools)
    sampling = Sampling(arguments.max_new_tokens, 0.0)
    seeds = range(arguments.eval_seeds)
    config = TrainingSettings(
        recipe=arguments.recipe,
        steps=arguments.steps,
        micro_batch=arguments.micro_batch,
        num_iterations=arguments.num_iterations,
        guided_share=arguments.guided_share,
        eval_seeds=arguments.eval_seeds,
        group_size=arguments.group_size,
        groups_per_step=arguments.groups,
        max_new_tokens=arguments.max_new_tokens,
        warm_start_examples=arguments.warm_start,
        warm_start_epochs=arguments.warm_start_epochs,
        warm_start_batch=arguments.warm_start_batch,
        warm_start_learning_rate=arguments.warm_start_lr,
        learning_rate=arguments.learning_rate,
        hint_share=arguments.hint_share,
        save_steps=10_000,
        threads=arguments.threads,
        dtype=arguments.dtype,
        seed=arguments.seed,
    )
    output = Path(arguments.output)
    started = time.monotonic()
    trained = train(target, model_dir, output / "adapter", config, progress=lambda record: print(json.dumps(record), flush=True))
    model, tokenizer, report = trained.model, trained.tokenizer, trained.report
    trained_s = time.monotonic() - started
    with model.disable_adapter():
        base = score(model, tokenizer, target, seeds, sampling)
    adapter = score(model, tokenizer, target, seeds, sampling)
    # Families with several kinds of instance (tool_call_precision: stated, lookup): the adapter on each.
    kinds: dict[str, list[int]] = {}
    for seed in seeds:
        kind = getattr(target.instance(seed), "kind", None)
        if kind is not None:
            kinds.setdefault(kind, []).append(seed)
    result: dict[str, Any] = {
        "capability": arguments.capability,
        "tools": arguments.tools,
        "model": arguments.model,
        "config": config.model_dump(mode="json"),
        "recipe": report["recipe"],
        "tried": report["tried"],
        "train_seconds": round(trained_s, 1),
        "warm_start": report["warm_start"],
        "rollouts": report["rollouts"],
        "grpo_seconds": report["steps"][-1]["elapsed_s"] if report["steps"] else 0.0,
        "rollouts_per_s": round(report["rollouts"] / report["steps"][-1]["elapsed_s"], 3) if report["steps"] else 0.0,
        "base": base,
        "adapter": adapter,
        "adapter_by_kind": {kind: score(model, tokenizer, target, chosen, sampling) for kind, chosen in kinds.items()} if len(kinds) > 1 else {},
        "gain_points": round(100 * (adapter.success_rate - base.success_rate), 1),
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    if arguments.baseline:
        mixed = Environment(Mixed([families[name] for name in sorted(families)]), tools)
        # The same budget of episodes: the adapter's rollouts plus its demonstrations.
        episodes = report["rollouts"] + config.warm_start_examples
        per_step = config.groups_per_step * config.group_size
        plain = config.model_copy(
            update={"recipe": "grpo", "warm_start_examples": 0, "hint_share": 0.0, "steps": max(1, -(-episodes // per_step))}
        )
        baseline = train(mixed, model_dir, output / "baseline", plain)
        result["baseline"] = {
            "rollouts": baseline.report["rollouts"],
            "score": score(baseline.model, baseline.tokenizer, target, seeds, sampling),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--tools", choices=sorted(TOOL_SETS), default="traffic", help="whose tool definitions the environment uses")
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--output", default=".tracefix/bench-train")
    parser.add_argument("--recipe", default="sft+grpo", choices=["auto", "sft", "sft+grpo", "guided_grpo", "grpo"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--micro-batch", type=int, default=2, help="rollouts per forward and backward pass of a GRPO update")
    parser.add_argument("--num-iterations", type=int, default=2, help="optimisation passes over each step's rollouts")
    parser.add_argument("--guided-share", type=float, default=0.5, help="guided_grpo: share of each group with a forced solution prefix")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--warm-start", type=int, default=48, help="ground-truth demonstrations for the warm start")
    parser.add_argument("--warm-start-epochs", type=int, default=2)
    parser.add_argument("--warm-start-batch", type=int, default=2, help="demonstrations per warm-start update")
    parser.add_argument("--warm-start-lr", type=float, default=1e-3)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--hint-share", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--eval-seeds", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="[training] seed: the adapter's initialisation, the demonstrations' order and sampling")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="the base model's dtype ([training] dtype)")
    parser.add_argument("--baseline", action="store_true", help="also spend the same rollouts on plain GRPO over all environments")
    arguments = parser.parse_args()
    import shutil

    shutil.rmtree(arguments.output, ignore_errors=True)
    result = run(arguments)
    print(json.dumps(result, default=lambda value: asdict(value) if is_dataclass(value) else str(value), indent=2))


if __name__ == "__main__":
    main()
