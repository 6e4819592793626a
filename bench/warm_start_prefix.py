"""One warm-start update, with the batch's common opening run once (trainer/shared_prefix.py) vs the
plain pass it replaces (each demonstration over its whole length, gradients accumulated), on the
embedded SmolLM2-135M with the demo's LoRA and real demonstrations of an environment:

    python bench/warm_start_prefix.py                        # tool_call_precision on the airline tools
    python bench/warm_start_prefix.py --batches 2 4 --repeats 5 --threads 2

Prints, per batch size, the median seconds of one update (forward and backward) both ways, their
ratio, and the tokens each way runs; the loss of both is printed too (they must agree). A third
column times the shared opening with the gradient stopped at it (`[training]
warm_start_opening_gradient = false`: the opening runs without autograd), with its speed-up over
the exact shared pass. A fourth times the exact shared pass with every position's logits
computed (`output_layer.SCORED_ONLY` off: how it ran before only the labelled positions went
through the output layer), and the last column says whether its LoRA gradients equal the shared
pass's to the bit in every repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import airline_model  # noqa: E402
from tracefix.daemon.core.settings import TrainingSettings  # noqa: E402
from tracefix.trainer.recipes import lora_config  # noqa: E402
from tracefix.trainer.rollouts import demonstration  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 4])
    airline_model.add_arguments(parser)
    arguments = parser.parse_args()

    import torch
    from peft import get_peft_model

    from tracefix.trainer import output_layer
    from tracefix.trainer.shared_prefix import shared_prefix_length, shared_prefix_loss

    tokenizer, base, environment = airline_model.load(arguments)
    model = get_peft_model(base, lora_config(TrainingSettings()))
    model.train()

    def batch(seeds: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return airline_model.collate([demonstration(tokenizer, environment.instance(seed)).sequence() for seed in seeds])

    print(f"{arguments.capability} on the airline tools, {arguments.model}, {arguments.threads} threads, {arguments.repeats} repeats")
    print(
        "| demonstrations per update | plain: s per update | shared prefix: s per update | ratio | tokens run (plain → shared)"
        " | loss (plain, shared) | gradient stopped at the opening: s per update | its ratio to shared"
        " | shared, every position through the output layer: s per update | its ratio to shared | gradients equal to the bit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in arguments.batches:
        plain_times, shared_times, stopped_times, every_times, bitwise = [], [], [], [], []
        for repeat in range(arguments.repeats):
            ids, mask, labels = batch(range(100_000 + repeat * size, 100_000 + (repeat + 1) * size))
            labelled = int((labels[:, 1:] != -100).sum())
            model.zero_grad()
            started = time.perf_counter()
            plain = 0.0
            for row in range(size):  # the plain pass: each row alone, its gradient accumulated
                length = int(mask[row].sum())
                loss = shared_prefix_loss(model, ids[row : row + 1, :length], mask[row : row + 1, :length], labels[row : row + 1, :length], labelled)
                loss.backward()
                plain += loss.item()
            plain_times.append(time.perf_counter() - started)
            model.zero_grad()
            started = time.perf_counter()
            shared = shared_prefix_loss(model, ids, mask, labels)
            shared.backward()
            shared_times.append(time.perf_counter() - started)
            gradients = [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]
            model.zero_grad()
            output_layer.SCORED_ONLY = False
            started = time.perf_counter()
            shared_prefix_loss(model, ids, mask, labels).backward()
            every_times.append(time.perf_counter() - started)
            output_layer.SCORED_ONLY = True
            every = [parameter.grad for parameter in model.parameters() if parameter.grad is not None]
            bitwise.append(len(every) == len(gradients) and all(torch.equal(a, b) for a, b in zip(every, gradients, strict=True)))
            model.zero_grad()
            started = time.perf_counter()
            shared_prefix_loss(model, ids, mask, labels, opening_gradient=False).backward()
            stopped_times.append(time.perf_counter() - started)
            prefix = shared_prefix_length(ids, mask, labels)
            tokens = (int(mask.sum()), prefix + int(mask.sum()) - size * prefix)
        plain_s, shared_s, stopped_s, every_s = (statistics.median(times) for times in (plain_times, shared_times, stopped_times, every_times))
        print(
            f"| {size} | {plain_s:.2f} | {shared_s:.2f} | {plain_s / shared_s:.2f}× | {tokens[0]} → {tokens[1]}"
            f" | {plain:.4f}, {shared.item():.4f} | {stopped_s:.2f} | {shared_s / stopped_s:.2f}× | {every_s:.2f} | {every_s / shared_s:.2f}× | {'yes' if all(bitwise) else 'no'} |"
        )


if __name__ == "__main__":
    main()
