"""One generalist warm-start update (two stored conversations, their common opening run once), the
tails attending that opening by the cascade (trainer/opening_attention.py, ``cascade_attention``)
against the opening's cache copied for every row behind a causal mask, interleaved in one process:

    python bench/generalist_update.py --run <data>/runs/run-1 --repeats 5

``--run`` is a generalist training run's directory (its ``conversations.json`` and ``request.json``);
the update trains on its first two conversations. Prints each way's seconds per update (forward and
backward) and their median ratio, the two losses, and how far the LoRA gradients differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import generalist_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    generalist_run.add_arguments(parser, repeats=5)
    arguments = parser.parse_args()

    import torch

    from bench.airline_model import collate
    from tracefix.trainer import shared_prefix
    from tracefix.trainer.conversations import conversation_sequence

    config, model, tokenizer, train, _ = generalist_run.load(arguments)
    sequences = [conversation_sequence(tokenizer, messages, config.max_length) for messages in train[:2]]
    input_ids, mask, labels = collate(sequences)
    print(f"conversations of {[len(ids) for ids, _ in sequences]} tokens, opening {shared_prefix.shared_prefix_length(input_ids, mask, labels)}; "
          f"{torch.get_num_threads()} threads, {next(model.parameters()).dtype}")  # fmt: skip

    def update() -> tuple[float, dict[str, torch.Tensor]]:
        loss = shared_prefix.shared_prefix_loss(model, input_ids, mask, labels)
        loss.backward()
        gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.requires_grad}
        model.zero_grad(set_to_none=True)
        return loss.item(), gradients

    update()  # warm-up
    seconds: dict[bool, list[float]] = {True: [], False: []}
    results = {}
    for _ in range(arguments.repeats):
        for cascade in (True, False):
            shared_prefix.CASCADE = cascade
            started = time.perf_counter()
            results[cascade] = update()
            seconds[cascade].append(time.perf_counter() - started)
    cascaded, copied = statistics.median(seconds[True]), statistics.median(seconds[False])
    ours, theirs = results[True][1], results[False][1]
    largest = max((ours[name] - theirs[name]).abs().max().item() for name in ours)
    print(f"cascade {cascaded:.2f} s {[round(value, 2) for value in seconds[True]]}; copied {copied:.2f} s {[round(value, 2) for value in seconds[False]]}; "
          f"{copied / cascaded:.2f}×")  # fmt: skip
    print(f"loss {results[True][0]:.7f} and {results[False][0]:.7f}; LoRA gradients differ by at most {largest:.2g}")


if __name__ == "__main__":
    main()
