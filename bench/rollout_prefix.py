"""Greedy held-out rollouts (what the evaluation, the replay and the validation gate run), or with
``--temperature`` sampled ones (GRPO's, seeded), on the embedded SmolLM2-135M and a real
environment, in the ways the trainer's generation has had:

- ``re-prefilled``: every row's whole prompt prefilled every turn;
- ``opening copied per row``: the episodes' common opening prefilled once and its key/value cache
  copied for every row (trainer/prefix_cache.py as it was; still the path of a sliding-window model);
- ``shared, split prefill, turns anew``: the opening shared by the rows and attended through the
  split (trainer/opening_attention.py's ``split_attention``) by every query, each turn's tails
  prefilled anew;
- ``shared, turns anew``: a turn's prefill attends through SDPA over the whole keys
  (``whole_attention``), its decode steps through the split;
- ``carried, rows to the longest``: also a batch's cache carried from turn to turn, only what is
  new in each prefilled (trainer/rollouts.py), every row decoded until the longest turn of the
  batch ends, as ``generate`` does;
- ``opening shared``: what the trainer runs, in which a row leaves the batch when its turn ends
  (trainer/decode.py).

    python bench/rollout_prefix.py                                  # tool_call_precision, airline tools
    python bench/rollout_prefix.py --episodes 8 32 --repeats 3 --threads 2
    python bench/rollout_prefix.py --adapter RUN/trials/sft+grpo/warm_start.safetensors \
        --ways "shared, turns anew" "carried, rows to the longest" "opening shared"

The base model answers in one turn on most seeds; ``--adapter`` (a LoRA weights file of the default
``[training]`` LoRA settings, e.g. a demo run's warm start) plays the episodes of a trained policy,
which read, then act, over several turns, whose prefills are longer.

Prints, per batch size, the median seconds of one batch of whole episodes each way, the ratios to
the last way, and whether all ways produced the same conversations (they must, up to float
rounding: a near-tie between two tokens can go either way).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import airline_model  # noqa: E402
from tracefix.trainer import decode, opening_attention, rollouts  # noqa: E402
from tracefix.trainer.rollouts import Sampling, generate_rollouts  # noqa: E402

WAYS = ("re-prefilled", "opening copied per row", "shared, split prefill, turns anew", "shared, turns anew", "carried, rows to the longest", "opening shared")


@contextlib.contextmanager
def _way(way: str) -> Iterator[None]:
    """Run ``generate_rollouts`` the given way: the trainer's code with the opening treated as not
    shareable (copied per row, what it does for a sliding-window model) or not prefilled at all."""
    minimum, shareable, whole, carry, let_go = rollouts.MIN_PREFIX, opening_attention.shareable, opening_attention.whole_attention, rollouts.CARRY_TURNS, decode.LET_GO
    if way != "opening shared":
        decode.LET_GO = False
    if way == "re-prefilled":
        rollouts.MIN_PREFIX = 10**9
    elif way == "opening copied per row":
        opening_attention.shareable = lambda opening: False
    elif way not in ("opening shared", "carried, rows to the longest"):
        rollouts.CARRY_TURNS = False
        if way == "shared, split prefill, turns anew":
            opening_attention.whole_attention = opening_attention.split_attention
    try:
        yield
    finally:
        rollouts.MIN_PREFIX, opening_attention.shareable, opening_attention.whole_attention, rollouts.CARRY_TURNS, decode.LET_GO = minimum, shareable, whole, carry, let_go


def with_adapter(model: Any, path: Path) -> Any:
    """``model`` with the LoRA weights at ``path`` (the default ``[training]`` LoRA settings); weights
    of another model or rank stop the bench rather than load in part."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.trainer.recipes import lora_config

    model = get_peft_model(model, lora_config(TrainingSettings()))
    weights = load_file(str(path))
    if set(weights) != set(get_peft_model_state_dict(model)):
        raise SystemExit(f"--adapter {path}: not LoRA weights of this model with the default LoRA settings")
    set_peft_model_state_dict(model, weights)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy; above 0, sampled as GRPO samples, seeded")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), metavar="WAY", help=f"of: {', '.join(WAYS)} (the last is compared with)")
    parser.add_argument("--adapter", type=Path, metavar="FILE", help="LoRA weights (.safetensors) to play with, default LoRA settings")
    airline_model.add_arguments(parser)
    arguments = parser.parse_args()

    tokenizer, model, environment = airline_model.load(arguments)
    if arguments.adapter:
        model = with_adapter(model, arguments.adapter)
    sampling = Sampling(arguments.max_new_tokens, arguments.temperature)
    decoding = f"sampled at temperature {arguments.temperature}" if arguments.temperature > 0 else "greedy"

    def run(seeds: range, way: str) -> tuple[float, list[list[dict]]]:
        with _way(way):
            started = time.perf_counter()
            produced = generate_rollouts(model, tokenizer, [environment.instance(seed) for seed in seeds], sampling)
            return time.perf_counter() - started, [item.rollout.messages for item in produced]

    print(f"{arguments.capability} on the airline tools, {arguments.model}, {arguments.threads} threads, {decoding}, {arguments.max_new_tokens} new tokens per turn, {arguments.repeats} repeats")
    ways = [way for way in WAYS if way in arguments.ways]
    print("| episodes per batch | " + " | ".join(f"{way}: s per batch" for way in ways) + f" | ratios to {ways[-1]} | same conversations |")
    print("|---" * (len(ways) + 3) + "|")
    for size in arguments.episodes:
        times: dict[str, list[float]] = {way: [] for way in ways}
        same = 0
        for repeat in range(arguments.repeats):
            seeds = range(200_000 + repeat * size, 200_000 + (repeat + 1) * size)
            produced = {}
            for way in ways:
                seconds, produced[way] = run(seeds, way)
                times[way].append(seconds)
            same += sum(len({repr(conversation) for conversation in row}) == 1 for row in zip(*produced.values(), strict=True))
        medians = {way: statistics.median(values) for way, values in times.items()}
        last = medians[ways[-1]]
        print(
            f"| {size} | " + " | ".join(f"{medians[way]:.2f}" for way in ways)
            + " | " + ", ".join(f"{medians[way] / last:.2f}×" for way in ways[:-1]) + f" | {same}/{size * arguments.repeats} |"
        )


if __name__ == "__main__":
    main()
