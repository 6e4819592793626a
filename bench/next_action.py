"""Next-action scoring, teacher-forced first (trainer/next_action.py: a turn the model writes as the
reference is read off one pass over its conversation, only the departures decoded) against decoding
every turn from its prompt, on a generalist run's held-out conversations, for the base and for the
run's adapter:

    python bench/next_action.py --run <data>/runs/run-1 --repeats 3

``--run`` is a generalist training run's directory (its ``conversations.json``, its ``request.json``
for the training settings, its ``adapter``). Prints, for base and adapter, the median seconds of
scoring all held-out turns each way, the ratio, how many turns the forced way decoded, and whether
the two ways matched the same turns (turn by turn: they may differ only on a near-tie).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import generalist_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    generalist_run.add_arguments(parser, repeats=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()

    import torch

    from tracefix.trainer.conversations import conversation_sequence
    from tracefix.trainer.next_action import agent_spans, forced_turns, next_actions
    from tracefix.trainer.rollouts import Sampling

    config, model, tokenizer, _, held_out = generalist_run.load(arguments)
    model.load_adapter(str(arguments.run / "adapter"), adapter_name="trained")
    model.set_adapter("trained")
    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    laid = [conversation_sequence(tokenizer, messages, config.max_length) for messages in held_out]
    sequences, spans = [ids for ids, _ in laid], [agent_spans(mask) for _, mask in laid]
    print(f"{len(held_out)} held-out conversations, {sum(map(len, spans))} agent turns, "
          f"{statistics.mean(map(len, sequences)):.0f} tokens on average; {torch.get_num_threads()} threads, {next(model.parameters()).dtype}")  # fmt: skip

    figures = {}
    for name in ("base", "adapter"):
        timings: dict[str, list[float]] = {"forced": [], "every turn": []}
        results = {}
        for _ in range(arguments.repeats):
            for way, forced in (("forced", True), ("every turn", False)):
                with model.disable_adapter() if name == "base" else nullcontext():
                    started = time.perf_counter()
                    results[way] = next_actions(model, tokenizer, held_out, sampling, forced=forced)
                    timings[way].append(time.perf_counter() - started)
        with model.disable_adapter() if name == "base" else nullcontext():
            decoded = forced_turns(model, tokenizer, sequences, spans, sampling.max_new_tokens).decoded
        pairs = [(a.match, b.match) for x, y in zip(results["forced"], results["every turn"]) for a, b in zip(x, y) if a and b]
        same = sum(a == b for a, b in pairs)
        hits = {way: sum(item.match for row in found for item in row if item) for way, found in results.items()}
        forced_s, every_s = statistics.median(timings["forced"]), statistics.median(timings["every turn"])
        figures[name] = {"forced_s": round(forced_s, 1), "every_turn_s": round(every_s, 1), "ratio": round(every_s / forced_s, 2),
                         "decoded": decoded, "turns": len(pairs), "same_match": same, "matched": hits}  # fmt: skip
        print(f"{name}: forced {forced_s:.1f} s, every turn {every_s:.1f} s ({every_s / forced_s:.2f}×); "
              f"decoded {decoded} of {len(pairs)} turns; matched {hits['forced']} vs {hits['every turn']}, the same on {same} of {len(pairs)} turns")  # fmt: skip
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
