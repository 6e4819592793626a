"""GRPO settings compared after one warm start: what each adds, paired, on validation seeds.

One supervised warm start (the demo's: 96 demonstrations × 2 epochs) is trained once on a
capability's environment over the airline agent's tools and kept on disk. Then each variant
(`--variant NAME key=value …`, keys of `[training]`) runs GRPO from exactly those weights, and its
adapter and the warm start are scored greedy on the same validation seeds (`--seeds`, from 2000:
disjoint from the held-out seeds below `eval_seeds`, the warm start's and the training seeds). The
table gives each variant's paired difference (Newcombe's interval, McNemar's exact p), the
won/lost seeds, the KL to the warm start at each step, how far the adapter moved from it (the L2
norm of the change in its LoRA weights) and its GRPO time. Validation seeds, not held-out ones, so
that choosing settings here does not tune the number the demo reports.

    python bench/grpo_settings.py --variant demo --variant lr1e-3 learning_rate=1e-3 \
        --variant t0.7 temperature=0.7 --variant 6-steps steps=6 --variant 4-groups groups_per_step=4

`--repeats N` runs each variant N times with `[training] seed` 0 … N−1 (its rollouts drawn anew, the
training seeds the same) and adds a summary per variant: the median paired difference, the runs
whose interval lies above zero and the seeds won and lost over all runs. One run's difference is
within noise of another's at this scale; the summary is what to compare.

After the tables it prints the warm start's failed seeds by reward and instance kind: what the
variants have to fix.

With `save_steps=K` among a variant's settings, the run's kept checkpoints (the last two) other than
the weights it ended on are scored too, on the same seeds: `--variant 32-steps steps=32 save_steps=16`
gives what GRPO had added after 16 steps and after 32, in one run. With `keep_best=true` the run
ends on the checkpoint that scored best on `[training]`'s validation seeds (disjoint from these);
the table lists those scores and the step kept.

The warm start is reused when `--output` already holds it (delete the directory to train it again).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.demo.settings import DEMO  # noqa: E402
from tracefix.daemon.core.settings import TrainingSettings  # noqa: E402
from examples.airline.tools import TOOLS as AIRLINE_TOOLS  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.evaluation import paired, play  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from tracefix.trainer.grpo import adapter_weights, checkpoint_step, complete_checkpoints, lora_state  # noqa: E402
from tracefix.trainer.recipes import train  # noqa: E402
from tracefix.trainer.rollouts import Sampling  # noqa: E402

FIRST_SEED = 2000  # validation seeds: above any held-out range, far below the warm start's and training's


def settings(overrides: dict[str, Any], max_new_tokens: int) -> TrainingSettings:
    """The demo's training settings (sft+grpo), with ``overrides``."""
    return TrainingSettings(**{**DEMO["training"], "max_new_tokens": max_new_tokens, "save_steps": 10_000, **overrides})


def parse_variant(words: list[str]) -> tuple[str, dict[str, Any]]:
    """``NAME key=value …``; values are JSON (numbers, true/false, lists) or plain strings. A NAME
    that is an option (``--warm``, ``--set``) names the settings in errors by itself."""
    name, overrides = words[0], {}
    where = name if name.startswith("--") else f"--variant {name}"
    for word in words[1:]:
        key, separator, value = word.partition("=")
        if not separator:
            raise SystemExit(f"{where}: {word!r} is not key=value")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    try:  # a wrong key or value stops here, before any training
        settings(overrides, 96)
    except ValidationError as error:
        raise SystemExit(f"{where}: {error}") from None
    return name, overrides


def airline_environment(capability: str) -> Environment:
    """The capability's environment over the airline agent's tools; an unknown name stops the bench."""
    families = load_families()
    if capability not in families:
        raise SystemExit(f"--capability {capability!r}: one of {', '.join(sorted(families))}")
    return Environment(families[capability], load_tools(AIRLINE_TOOLS))


def greedy(model: Any, tokenizer: Any, environment: Environment, seeds: Sequence[int], config: TrainingSettings) -> tuple[list[float], list[bool]]:
    """Each seed's reward and success for the policy, greedy."""
    return play(model, tokenizer, environment, seeds, Sampling(config.new_tokens, 0.0, max_length=config.max_length))


def warm_start(arguments: argparse.Namespace, environment: Environment, model_dir: Path, seeds: range) -> dict[str, Any]:
    """Train (or load) the warm start and score it on ``seeds``."""
    output = Path(arguments.output)
    record = output / "warm.json"
    if record.exists():
        return json.loads(record.read_text())
    started = time.monotonic()
    config = settings({**arguments.warm_settings, "recipe": "sft", "steps": 0}, arguments.max_new_tokens)
    trained = train(environment, model_dir, output / "warm", config)
    rewards, successes = greedy(trained.model, trained.tokenizer, environment, seeds, config)
    found = {"rewards": rewards, "success": successes, "warm_start": trained.report["warm_start"], "seconds": round(time.monotonic() - started, 1)}
    record.write_text(json.dumps(found))
    return found


def variant(arguments: argparse.Namespace, environment: Environment, model_dir: Path, seeds: range, name: str, overrides: dict[str, Any], warm: dict[str, Any]) -> dict[str, Any]:
    """GRPO from the warm start's weights with ``overrides``; scored on ``seeds`` against it."""
    output = Path(arguments.output)
    directory = output / "variants" / name
    shutil.rmtree(directory, ignore_errors=True)
    trial = directory / "trials" / "sft+grpo"
    trial.mkdir(parents=True)
    for suffix in ("safetensors", "json"):  # sft+grpo resumes from a finished warm start
        shutil.copy(output / "warm" / "trials" / "sft" / f"warm_start.{suffix}", trial / f"warm_start.{suffix}")
    config = settings(overrides, arguments.max_new_tokens)
    started = time.monotonic()
    trained = train(environment, model_dir, directory, config, progress=lambda record: print(json.dumps(record), file=sys.stderr, flush=True))
    trained_s = time.monotonic() - started
    rewards, successes = greedy(trained.model, trained.tokenizer, environment, seeds, config)
    steps = trained.report["steps"]
    start = load_file(str(trial / "warm_start.safetensors"))
    moved = math.sqrt(sum(float(((tensor.cpu() - start[name]) ** 2).sum()) for name, tensor in lora_state(trained.model).items()))
    chosen = trained.report["tried"][-1]
    ended_on = chosen.get("kept_step", len(steps))  # keep_best: the step whose weights were kept
    along = []  # the run's other checkpoints that are kept (save_steps), scored the same way
    for checkpoint in complete_checkpoints(directory / "checkpoints" / "sft+grpo"):
        if (step := checkpoint_step(checkpoint)) != ended_on:
            with adapter_weights(trained.model, load_file(str(checkpoint / "adapter_model.safetensors"))):
                along.append({"step": step, "paired": paired(warm["success"], greedy(trained.model, trained.tokenizer, environment, seeds, config)[1])})
    return {
        "variant": name, "settings": overrides, "paired": paired(warm["success"], successes),
        "mean_reward": round(sum(rewards) / len(rewards), 4), "grpo_minutes": round(trained_s / 60, 1),
        "updates": sum(step["groups"] > step["zero_variance_groups"] for step in steps), "steps": len(steps),
        "rollouts": trained.report["rollouts"], "screen_failed": [step["screen_failed"] for step in steps],
        "step_success": [step["success_rate"] for step in steps], "step_kl": [step["kl"] for step in steps],
        "moved": round(moved, 4), "along": along, "kept_step": ended_on,
        "checkpoints": [{key: item[key] for key in ("step", "seeds", "success_rate", "mean_reward")} for item in chosen.get("checkpoints", [])],
    }  # fmt: skip


def failures(warm: dict[str, Any], environment: Environment, seeds: range) -> str:
    """The warm start's failed seeds by reward (the family's reward table says what each value stands
    for) and, where the family's instances have kinds (``stated``/``lookup``), by kind."""
    found: dict[float, Counter[str]] = {}
    for seed, reward, success in zip(seeds, warm["rewards"], warm["success"], strict=True):
        if not success:
            found.setdefault(reward, Counter())[str(getattr(environment.instance(seed), "kind", "-"))] += 1
    parts = [
        f"{reward:.1f} × {sum(kinds.values())} ({', '.join(f'{kind} {count}' for kind, count in kinds.most_common())})"
        for reward, kinds in sorted(found.items())
    ]
    return "Warm start's failed seeds by reward: " + ("; ".join(parts) or "none") + "."


def difference(found: dict[str, Any]) -> str:
    """A paired comparison's difference with its 95 % interval: ``+0.12 [+0.01, +0.23]``."""
    return f"{found['difference']:+.2f} [{found['interval'][0]:+.2f}, {found['interval'][1]:+.2f}]"


def table(warm: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    seeds = len(warm["success"])
    lines = [
        f"Warm start: {sum(warm['success'])}/{seeds} validation seeds, mean reward {sum(warm['rewards']) / seeds:.2f}.",
        "",
        "| variant | settings | GRPO steps (with an update) | rollouts | KL to the warm start by step | adapter moved (L2) | after GRPO | won / lost |"
        " paired difference [95 %] | McNemar p | mean reward | GRPO minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        found = row["paired"]
        settings_text = ", ".join(f"{key} = {value}" for key, value in row["settings"].items()) or "the demo's"
        lines.append(
            f"| {row['variant']} | {settings_text} | {row['steps']} ({row['updates']}) | {row['rollouts']} | "
            f"{', '.join(f'{kl:.3g}' for kl in row['step_kl'])} | {row['moved']:.2f} | {found['after']:.2f} | "
            f"{found['after_only']} / {found['before_only']} | {difference(found)} | "
            f"{found['mcnemar_p']:.2f} | {row['mean_reward']:.2f} | {row['grpo_minutes']:.1f} |"
        )
    chose = [row for row in rows if row["checkpoints"]]
    if chose:
        lines += ["", "`keep_best`: the validation seeds of `[training]` (disjoint from the seeds above) by step, and the step kept:", ""]
        for row in chose:
            scores = ", ".join(f"{item['step']}: {item['success_rate']:.2f} ({item['mean_reward']:.2f})" for item in row["checkpoints"])
            lines.append(f"- {row['variant']} ({row['checkpoints'][0]['seeds']} seeds, success (mean reward)): {scores}; kept step {row['kept_step']}")
    along = [(row["variant"], point) for row in rows for point in row["along"]]
    if along:
        lines += ["", "The same runs at their other kept checkpoints (`save_steps`), scored on the same seeds:", "",
                  "| variant | after step | after GRPO | won / lost | paired difference [95 %] | McNemar p |", "|---|---|---|---|---|---|"]  # fmt: skip
        for name, point in along:
            found = point["paired"]
            lines.append(
                f"| {name} | {point['step']} | {found['after']:.2f} | {found['after_only']} / {found['before_only']} | "
                f"{difference(found)} | {found['mcnemar_p']:.2f} |"
            )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """Per variant over its repeats: the median paired difference, the runs whose interval lies
    above zero, and the seeds won and lost in all of them."""
    lines = ["| variant | runs | median paired difference | runs above zero | won / lost over all runs |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(row["repeat_of"] for row in rows):
        found = [row["paired"] for row in rows if row["repeat_of"] == name]
        median = statistics.median(item["difference"] for item in found)
        above = sum(item["interval"][0] > 0 for item in found)
        won, lost = sum(item["after_only"] for item in found), sum(item["before_only"] for item in found)
        lines.append(f"| {name} | {len(found)} | {median:+.2f} | {above} / {len(found)} | {won} / {lost} |")
    return "\n".join(lines)


def repeated(variants: list[tuple[str, dict[str, Any]]], repeats: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(run name, variant name, settings) for each variant's ``repeats`` runs, ``seed`` 0 … N−1."""
    if repeats == 1:
        return [(name, name, overrides) for name, overrides in variants]
    return [(f"{name}-s{seed}", name, {**overrides, "seed": seed}) for name, overrides in variants for seed in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME [key=value ...]")
    parser.add_argument("--seeds", type=int, default=48, help="validation seeds, from 2000")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, [training] seed 0 … N−1")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--warm", nargs="+", default=[], metavar="key=value", help="[training] settings of the warm start (default: the demo's)")
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--output", default=".tracefix/bench-grpo-settings")
    arguments = parser.parse_args()
    variants = [parse_variant(words) for words in arguments.variant]
    arguments.warm_settings = parse_variant(["--warm", *arguments.warm])[1]
    if arguments.repeats < 1:
        raise SystemExit(f"--repeats {arguments.repeats}: at least 1")
    if arguments.repeats > 1 and (named := [name for name, overrides in variants if "seed" in overrides]):
        raise SystemExit(f"--variant {named[0]}: sets seed, which --repeats chooses")
    environment = airline_environment(arguments.capability)
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    seeds = range(FIRST_SEED, FIRST_SEED + arguments.seeds)
    Path(arguments.output).mkdir(parents=True, exist_ok=True)
    warm = warm_start(arguments, environment, model_dir, seeds)
    rows = []
    for name, repeat_of, overrides in repeated(variants, arguments.repeats):
        rows.append({**variant(arguments, environment, model_dir, seeds, name, overrides, warm), "repeat_of": repeat_of})
        print(json.dumps(rows[-1]), flush=True)
    print(table(warm, rows))
    print()
    print(failures(warm, environment, seeds))
    if arguments.repeats > 1:
        print()
        print(summary(rows))


if __name__ == "__main__":
    main()
