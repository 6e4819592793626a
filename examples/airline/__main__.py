"""Command line: ``python -m examples.airline --router http://127.0.0.1:8000/v1 --collector http://127.0.0.1:4318
--conversations 20 --rate 0.5 --seed 7 [--policy llm|scripted] [--skip-confirmation 0.5]``."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence

from examples.airline.outcomes import Outcome
from examples.airline.runner import RouterUnavailable, RunConfig, run_conversations


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability between 0 and 1")
    return value


def _parser() -> argparse.ArgumentParser:
    defaults = RunConfig()
    parser = argparse.ArgumentParser(
        prog="python -m examples.airline",
        description="Run the example airline customer-service agent against simulated customers, traced over OTLP.",
    )
    parser.add_argument("--router", default=defaults.router, help="OpenAI-compatible base URL (the tracefix router)")
    parser.add_argument("--collector", default=defaults.collector, help="OTLP/HTTP collector root; '' sends nothing")
    parser.add_argument("--conversations", type=int, default=defaults.conversations, help="how many conversations")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="conversations started per second (0: no pacing)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="fixes the database, tasks and replies")
    parser.add_argument("--policy", choices=("llm", "scripted"), default=defaults.policy, help="who writes the agent's turns")
    parser.add_argument("--skip-confirmation", type=_probability, default=0.0,
                        help="scripted: chance a conversation changes a booking without asking the customer")  # fmt: skip
    parser.add_argument("--skip-read", type=_probability, default=0.0,
                        help="scripted: chance a cancellation skips reading the reservation")  # fmt: skip
    parser.add_argument("--model", default=defaults.model, help="model name sent to the router")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="most tokens per model answer")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="sampling temperature")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="most model calls per conversation")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="conversations in flight at once")
    parser.add_argument("--verbose", action="store_true", help="print one line per finished conversation")
    parser.add_argument("--json", action="store_true", help="print every outcome and the summary as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.conversations < 0 or args.max_turns < 1 or args.concurrency < 1:
        print("error: --conversations must be ≥ 0, --max-turns and --concurrency ≥ 1", file=sys.stderr)
        return 2

    printing = threading.Lock()  # outcomes arrive from several worker threads

    def report(outcome: Outcome) -> None:
        if args.verbose:
            verdict = "pass" if outcome.success else "fail"
            with printing:
                print(f"{outcome.conversation_id} {outcome.goal:<18} {verdict} {outcome.explanation}", file=sys.stderr)

    config = RunConfig(
        conversations=args.conversations, router=args.router, collector=args.collector or None, rate=args.rate,
        seed=args.seed, policy=args.policy, skip_confirmation=args.skip_confirmation, skip_read=args.skip_read,
        model=args.model, max_tokens=args.max_tokens, temperature=args.temperature, max_turns=args.max_turns,
        concurrency=args.concurrency,
    )  # fmt: skip
    try:
        outcomes = run_conversations(config, on_outcome=report)
    except RouterUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "summary": outcomes.summary(), "conversations": len(outcomes), "successes": outcomes.successes,
            "success_rate": outcomes.success_rate, "exported_spans": outcomes.exported_spans,
            "failed_spans": outcomes.failed_spans, "outcomes": [outcome.as_dict() for outcome in outcomes],
        }, indent=2))  # fmt: skip
    else:
        print(outcomes.summary())
    return 1 if outcomes.failed_spans else 0


if __name__ == "__main__":
    sys.exit(main())
