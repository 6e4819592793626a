"""Greedy held-out rollouts (what the evaluation, the replay and the validation gate run) with the
episodes' common opening prefilled once (trainer/prefix_cache.py) vs re-prefilled for every row and
every turn, on the embedded SmolLM2-135M and a real environment:

    python bench/rollout_prefix.py                                  # tool_call_precision, airline tools
    python bench/rollout_prefix.py --episodes 8 16 --repeats 3 --threads 2

Prints, per batch size, the median seconds of one batch of whole episodes both ways, their ratio,
and whether the two produced the same conversations (they must, up to float rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import airline_model  # noqa: E402
from trainer import rollouts  # noqa: E402
from trainer.rollouts import Sampling, generate_rollouts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    airline_model.add_arguments(parser)
    arguments = parser.parse_args()

    tokenizer, model, environment = airline_model.load(arguments)
    sampling = Sampling(arguments.max_new_tokens, 0.0)
    shared_minimum = rollouts.MIN_PREFIX

    def run(seeds: range, shared: bool) -> tuple[float, list[list[dict]]]:
        rollouts.MIN_PREFIX = shared_minimum if shared else 10**9
        started = time.perf_counter()
        produced = generate_rollouts(model, tokenizer, [environment.instance(seed) for seed in seeds], sampling)
        return time.perf_counter() - started, [item.rollout.messages for item in produced]

    print(f"{arguments.capability} on the airline tools, {arguments.model}, {arguments.threads} threads, greedy, {arguments.max_new_tokens} new tokens per turn, {arguments.repeats} repeats")
    print("| episodes per batch | re-prefilled: s per batch | opening once: s per batch | ratio | same conversations |")
    print("|---|---|---|---|---|")
    for size in arguments.episodes:
        plain_times, shared_times, same = [], [], 0
        for repeat in range(arguments.repeats):
            seeds = range(200_000 + repeat * size, 200_000 + (repeat + 1) * size)
            plain_seconds, plain = run(seeds, shared=False)
            shared_seconds, shared = run(seeds, shared=True)
            plain_times.append(plain_seconds)
            shared_times.append(shared_seconds)
            same += sum(a == b for a, b in zip(plain, shared, strict=True))
        plain_median, shared_median = statistics.median(plain_times), statistics.median(shared_times)
        print(
            f"| {size} | {plain_median:.2f} | {shared_median:.2f} | {plain_median / shared_median:.2f}× |"
            f" {same}/{size * arguments.repeats} |"
        )
    rollouts.MIN_PREFIX = shared_minimum


if __name__ == "__main__":
    main()
