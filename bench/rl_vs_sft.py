"""Where reinforcement learning should beat imitation, measured: the four training recipes at an
equal budget of episodes, on capabilities that are multi-turn decisions.

For each capability (default: precondition_verification, read → confirm → write; error_recovery,
retry after a failed call) and each recipe, one adapter is trained from the base with the same
number of episodes, demonstrations counting as episodes:

- ``sft``: all the budget as verified demonstrations;
- ``sft+grpo``: half as demonstrations, half as GRPO rollouts from the warm start;
- ``guided_grpo``: all as GRPO rollouts, ``--guided-share`` of each group from a forced solution prefix;
- ``grpo``: all as plain GRPO rollouts (the paper's "GRPO on target" baseline).

Each adapter is scored greedy on the same held-out seeds (success rate, Wilson 95 % interval);
with ``--repeats`` > 1 each cell is trained again with another training seed and the median is
reported. The environment uses the example airline agent's tools.

    python bench/rl_vs_sft.py --episodes 96 --eval-seeds 32 --repeats 3
    python bench/rl_vs_sft.py --capabilities precondition_verification --episodes 48 --repeats 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracefix.daemon.core.intervals import wilson  # noqa: E402
from tracefix.daemon.core.settings import RECIPES, TrainingSettings  # noqa: E402
from examples.airline.tools import TOOLS as AIRLINE_TOOLS  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.evaluation import play  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from tracefix.trainer.recipes import train  # noqa: E402
from tracefix.trainer.rollouts import Sampling  # noqa: E402


def budget(recipe: str, episodes: int, per_step: int) -> dict[str, int]:
    """Demonstrations and GRPO steps that spend ``episodes`` in this recipe."""
    if recipe == "sft":
        return {"warm_start_examples": episodes, "steps": 0}
    if recipe == "sft+grpo":
        return {"warm_start_examples": episodes // 2, "steps": max(1, (episodes - episodes // 2) // per_step)}
    return {"warm_start_examples": 0, "steps": max(1, episodes // per_step)}


def cell(arguments: argparse.Namespace, model_dir: Path, environment: Environment, recipe: str, repeat: int) -> dict[str, Any]:
    per_step = arguments.groups * arguments.group_size
    spent = budget(recipe, arguments.episodes, per_step)
    config = TrainingSettings(
        recipe=recipe, group_size=arguments.group_size, groups_per_step=arguments.groups, max_new_tokens=arguments.max_new_tokens,
        learning_rate=arguments.learning_rate, warm_start_learning_rate=arguments.warm_start_lr, guided_share=arguments.guided_share,
        num_iterations=arguments.num_iterations, micro_batch=arguments.micro_batch, eval_seeds=arguments.eval_seeds,
        save_steps=10_000, threads=arguments.threads, seed=repeat, **spent,
        resample_groups=0,  # dynamic sampling would play more rollouts than the budget's
    )  # fmt: skip
    directory = Path(arguments.output) / environment.family.capability / f"{recipe}-{repeat}"
    shutil.rmtree(directory, ignore_errors=True)
    started = time.monotonic()
    trained = train(environment, model_dir, directory, config, progress=lambda record: print(json.dumps(record), file=sys.stderr, flush=True))
    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    _, successes = play(trained.model, trained.tokenizer, environment, range(arguments.eval_seeds), sampling)
    wins = sum(successes)
    episodes = spent["warm_start_examples"] + trained.report["rollouts"]
    return {
        "capability": environment.family.capability, "recipe": recipe, "repeat": repeat, "episodes": episodes,
        "demonstrations": spent["warm_start_examples"], "rollouts": trained.report["rollouts"], "success": wins,
        "seeds": len(successes), "rate": round(wins / len(successes), 4), "interval": [round(v, 4) for v in wilson(wins, len(successes))],
        "seconds": round(time.monotonic() - started, 1),
        "clip_fraction_max": max((step.get("clip_fraction_max", 0.0) for step in trained.report["steps"]), default=None),
    }  # fmt: skip


def table(cells: list[dict[str, Any]]) -> str:
    """Markdown: per capability and recipe, the median success over repeats (its cell's interval)."""
    lines = ["| capability | recipe | episodes (demos + rollouts) | held-out success, median of repeats | 95 % interval | repeats | minutes |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for capability in dict.fromkeys(item["capability"] for item in cells):
        for recipe in RECIPES:
            runs = sorted((item for item in cells if item["capability"] == capability and item["recipe"] == recipe), key=lambda item: item["rate"])
            if not runs:
                continue
            middle = runs[len(runs) // 2]
            lines.append(
                f"| {capability} | {recipe} | {middle['episodes']} ({middle['demonstrations']} + {middle['rollouts']}) | "
                f"{statistics.median(item['rate'] for item in runs):.2f} ({middle['success']}/{middle['seeds']}) | "
                f"[{middle['interval'][0]:.2f}, {middle['interval'][1]:.2f}] | {len(runs)} | "
                f"{statistics.median(item['seconds'] for item in runs) / 60:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capabilities", nargs="+", default=["precondition_verification", "error_recovery"])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--episodes", type=int, default=96, help="episodes per adapter: demonstrations plus GRPO rollouts")
    parser.add_argument("--repeats", type=int, default=3, help="training seeds per cell (the median is reported)")
    parser.add_argument("--eval-seeds", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--num-iterations", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--warm-start-lr", type=float, default=1e-3)
    parser.add_argument("--guided-share", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--output", default=".tracefix/bench-rl-vs-sft")
    parser.add_argument("--json", type=Path, default=None, help="also write every cell as JSON here")
    arguments = parser.parse_args()

    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    tools = load_tools(AIRLINE_TOOLS)
    families = load_families()
    cells = []
    for capability in arguments.capabilities:
        environment = Environment(families[capability], tools)
        for recipe in arguments.recipes:
            for repeat in range(arguments.repeats):
                cells.append(cell(arguments, model_dir, environment, recipe, repeat))
                print(json.dumps(cells[-1]), flush=True)
                if arguments.json:
                    arguments.json.write_text(json.dumps(cells, indent=2))
    print(table(cells))


if __name__ == "__main__":
    main()
