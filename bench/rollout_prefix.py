"""Greedy held-out rollouts (what the evaluation, the replay and the validation gate run) three
ways, on the embedded SmolLM2-135M and a real environment: every row's whole prompt prefilled
every turn; the episodes' common opening prefilled once and its key/value cache copied for every
row (trainer/prefix_cache.py as it was); and the opening prefilled once and shared by the rows,
its attention split (trainer/opening_attention.py, what the trainer runs):

    python bench/rollout_prefix.py                                  # tool_call_precision, airline tools
    python bench/rollout_prefix.py --episodes 8 32 --repeats 3 --threads 2

Prints, per batch size, the median seconds of one batch of whole episodes each way, the ratios
to the shared opening, and whether all three produced the same conversations (they must, up to
float rounding).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import airline_model  # noqa: E402
from trainer import opening_attention, rollouts  # noqa: E402
from trainer.rollouts import Sampling, generate_rollouts  # noqa: E402

WAYS = ("re-prefilled", "opening copied per row", "opening shared")


@contextlib.contextmanager
def _way(way: str) -> Iterator[None]:
    """Run ``generate_rollouts`` the given way: the trainer's code with the opening treated as not
    shareable (copied per row, what it does for a sliding-window model) or not prefilled at all."""
    minimum, shareable = rollouts.MIN_PREFIX, opening_attention.shareable
    if way == "re-prefilled":
        rollouts.MIN_PREFIX = 10**9
    elif way == "opening copied per row":
        opening_attention.shareable = lambda opening: False
    try:
        yield
    finally:
        rollouts.MIN_PREFIX, opening_attention.shareable = minimum, shareable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    airline_model.add_arguments(parser)
    arguments = parser.parse_args()

    tokenizer, model, environment = airline_model.load(arguments)
    sampling = Sampling(arguments.max_new_tokens, 0.0)

    def run(seeds: range, way: str) -> tuple[float, list[list[dict]]]:
        with _way(way):
            started = time.perf_counter()
            produced = generate_rollouts(model, tokenizer, [environment.instance(seed) for seed in seeds], sampling)
            return time.perf_counter() - started, [item.rollout.messages for item in produced]

    print(f"{arguments.capability} on the airline tools, {arguments.model}, {arguments.threads} threads, greedy, {arguments.max_new_tokens} new tokens per turn, {arguments.repeats} repeats")
    print("| episodes per batch | " + " | ".join(f"{way}: s per batch" for way in WAYS) + " | ratios to shared | same conversations |")
    print("|---|---|---|---|---|---|")
    for size in arguments.episodes:
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        same = 0
        for repeat in range(arguments.repeats):
            seeds = range(200_000 + repeat * size, 200_000 + (repeat + 1) * size)
            produced = {}
            for way in WAYS:
                seconds, produced[way] = run(seeds, way)
                times[way].append(seconds)
            same += sum(len({repr(conversation) for conversation in row}) == 1 for row in zip(*produced.values(), strict=True))
        medians = {way: statistics.median(values) for way, values in times.items()}
        shared = medians["opening shared"]
        print(
            f"| {size} | " + " | ".join(f"{medians[way]:.2f}" for way in WAYS)
            + f" | {medians['re-prefilled'] / shared:.2f}×, {medians['opening copied per row'] / shared:.2f}× | {same}/{size * arguments.repeats} |"
        )


if __name__ == "__main__":
    main()
