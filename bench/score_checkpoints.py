"""Saved adapter weights scored greedy on a range of seeds, each paired with the first.

A run's checkpoints and its starting weights, scored on seeds the run never chose by: whether a
choice made on `[training]`'s few validation seeds holds on more of them. Each `NAME=PATH` is a
LoRA adapter's weights, a `.safetensors` file or a checkpoint folder holding
`adapter_model.safetensors`; the first is the baseline the others are paired with (Newcombe's
interval, McNemar's exact p), on the same seeds.

    python bench/score_checkpoints.py --seeds 99856:99896 \
        warm=.tracefix/bench-grpo-settings/variants/RUN/trials/sft+grpo/warm_start.safetensors \
        step30=.tracefix/bench-grpo-settings/variants/RUN/checkpoints/sft+grpo/checkpoint-30

The settings are `bench/grpo_settings.py`'s (the demo's training settings with `--max-new-tokens`)
and the environment is the capability's on the example airline agent's tools, as there. With
`--request` they are a training run's instead: its `request.json` names the environment the run
trained and evaluated on (its family, tool definitions and difficulty) and its `[training]`
settings, so a daemon run's adapter (`tracefix demo`, `bench/demo_loop.py`) is scored on the
openings it learned:

    R=.tracefix/bench-demo/data/runs/run-1
    python bench/score_checkpoints.py --request $R/request.json --seeds 99696:99896 \
        warm=$R/trials/sft+grpo/warm_start.safetensors grpo=$R/adapter

The seeds scored lie below the demonstrations' and training's (from `train_seed_offset -
warm_start_examples` up), which are refused.

Scoring 200 seeds takes about a quarter of an hour per weights file on two cores. With `--scores DIR`
each seed's result is kept there per weights file (by the sha256 of its bytes, the base model's, the
capability and the decoding settings) and only seeds not yet scored are played, so a new run is
paired with a baseline scored before, or a range extended, without playing anything twice. Greedy
decoding makes a seed's result a function of those, up to float rounding where the seeds batched
with it differ (a near-tie between two tokens can then go the other way); delete the folder when the
environment's code changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpo_settings import airline_environment, difference, greedy, settings  # noqa: E402
from tracefix.daemon.core.settings import TrainingSettings  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.adapters import base_model_hash  # noqa: E402
from tracefix.trainer.evaluation import paired  # noqa: E402
from tracefix.trainer.families import build_environment  # noqa: E402
from tracefix.trainer.grpo import adapter_weights, lora_state  # noqa: E402
from tracefix.trainer.jobs import write_atomically  # noqa: E402
from tracefix.trainer.recipes import load_policy  # noqa: E402


def seed_range(text: str) -> range:
    """``FIRST:END`` (END excluded) as a range of at least one seed."""
    first, separator, end = text.partition(":")
    try:
        seeds = range(int(first), int(end))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIRST:END") from None
    if not separator or not seeds:
        raise argparse.ArgumentTypeError(f"{text!r}: FIRST:END with END above FIRST")
    return seeds


def weights(text: str) -> tuple[str, Path]:
    """``NAME=PATH``, the path a weights file (or a checkpoint folder's) that exists."""
    name, separator, path = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH")
    found = Path(path)
    if found.is_dir():
        found = found / "adapter_model.safetensors"
    if not found.is_file():
        raise argparse.ArgumentTypeError(f"{name}: no weights at {found}")
    return name, found


def opening_tools(environment: Any) -> str:
    """A digest of the environment's tool definitions in the order its openings list them (another
    order is another opening, and other results)."""
    listing = json.dumps([tool.to_openai() for tool in environment.tools], sort_keys=True)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def run_environment(path: Path) -> tuple[Any, TrainingSettings]:
    """The environment and ``[training]`` settings of a training run's ``request.json``."""
    try:
        request = json.loads(path.read_text())
        return build_environment(request), TrainingSettings.model_validate(request["training"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--request {path}: not a training run's request ({type(error).__name__}: {error})") from None


class Scores:
    """Each seed's (reward, success) for one weights file under fixed settings, kept in a JSON file
    named by the sha256 of what decides them; without a folder, nothing is kept."""

    def __init__(self, folder: Path | None, weights_file: Path, settings_key: dict[str, Any]) -> None:
        self.path: Path | None = None
        self.key: dict[str, Any] = {}
        self.seeds: dict[int, tuple[float, bool]] = {}
        if folder is None:
            return
        with open(weights_file, "rb") as handle:
            key = self.key = {**settings_key, "weights": hashlib.file_digest(handle, "sha256").hexdigest()}
        self.path = folder / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]}.json"
        if self.path.exists():
            try:
                kept = json.loads(self.path.read_text())
                if kept["key"] == key:
                    self.seeds = {int(seed): (float(reward), bool(success)) for seed, (reward, success) in kept["seeds"].items()}
            except (ValueError, KeyError, TypeError) as error:
                raise SystemExit(f"{self.path} is not a scores file ({type(error).__name__}: {error}); delete it") from None

    def missing(self, seeds: range) -> list[int]:
        return [seed for seed in seeds if seed not in self.seeds]

    def add(self, seeds: list[int], rewards: list[float], successes: list[bool]) -> None:
        self.seeds.update({seed: (reward, success) for seed, reward, success in zip(seeds, rewards, successes, strict=True)})
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, {"key": self.key, "seeds": {str(seed): list(value) for seed, value in sorted(self.seeds.items())}})

    def of(self, seeds: range) -> tuple[list[float], list[bool]]:
        return [self.seeds[seed][0] for seed in seeds], [self.seeds[seed][1] for seed in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("weights", nargs="+", type=weights, metavar="NAME=PATH", help="the first is the baseline")
    parser.add_argument("--seeds", type=seed_range, required=True, metavar="FIRST:END")
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--scores", type=Path, metavar="DIR", help="keep each seed's result here and reuse it")
    parser.add_argument(
        "--request", type=Path, metavar="FILE", help="a training run's request.json: its environment and [training] settings"
    )  # fmt: skip
    arguments = parser.parse_args()
    if len({name for name, _ in arguments.weights}) < len(arguments.weights):
        raise SystemExit("each NAME once")
    if arguments.request:
        environment, config = run_environment(arguments.request)
    else:
        environment, config = airline_environment(arguments.capability), settings({}, arguments.max_new_tokens)
    if arguments.seeds.stop > (trained_from := config.train_seed_offset - config.warm_start_examples):
        raise SystemExit(f"--seeds: from {trained_from} up the seeds are the demonstrations' and training's; score below it")
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    model, tokenizer = load_policy(model_dir, config)
    expected = set(lora_state(model))
    states = {name: load_file(str(path)) for name, path in arguments.weights}
    for name, path in arguments.weights:  # all checked before any is scored
        if set(states[name]) != expected:  # another model's or rank's adapter would load partly, silently
            raise SystemExit(f"{name}: {path} is not an adapter of this model and [training]'s LoRA settings")
    settings_key = {
        "model": base_model_hash(model_dir), "capability": environment.family.capability, "max_new_tokens": config.new_tokens,
        "tools": opening_tools(environment), "difficulty": environment.difficulty,
        "max_length": config.max_length, "lora": [config.lora_r, config.lora_alpha, sorted(config.lora_targets)],
    }  # fmt: skip
    rows = []
    for name, path in arguments.weights:
        started = time.monotonic()
        scores = Scores(arguments.scores, path, settings_key)
        if missing := scores.missing(arguments.seeds):
            with adapter_weights(model, states[name]):
                scores.add(missing, *greedy(model, tokenizer, environment, missing, config))
        rewards, successes = scores.of(arguments.seeds)
        rows.append({"name": name, "rewards": rewards, "success": successes})
        print(json.dumps({"name": name, "seconds": round(time.monotonic() - started, 1), "played": len(missing),
                          "success_rate": sum(successes) / len(successes)}), flush=True)  # fmt: skip
    print(f"\nSeeds {arguments.seeds.start}–{arguments.seeds.stop - 1} ({len(arguments.seeds)}), greedy:\n")
    print("| weights | success | mean reward | won / lost | paired difference [95 %] | McNemar p |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        found = paired(rows[0]["success"], row["success"])
        print(f"| {row['name']} | {found['after']:.2f} | {sum(row['rewards']) / len(row['rewards']):.2f} |"
              f" {found['after_only']} / {found['before_only']} | {difference(found)} | {found['mcnemar_p']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
