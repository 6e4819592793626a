"""A model process on cores it shares: OpenMP's wait policy under other processes' load.

The loop's model processes share the machine's cores: a training job's intra-op threads beside a
router that is generating, the daemon's analysis, a test run. This times one teacher-forced
next-action pass (`trainer/next_action.py`, as a generalist's evaluation and a targeted run's
retention check run it) on the embedded SmolLM2-135M with a fresh LoRA, in a fresh process per
measurement, beside 0, 1 or 2 busy single-thread processes that multiply decode-sized matrices
(`[1 × 576] @ [576 × 1536]`, as a router writing one token at a time), once with OpenMP's default
wait policy and once with ``OMP_WAIT_POLICY=PASSIVE`` (what tracefix sets for its training and
validation jobs: daemon/core/threads.py):

    python bench/shared_cores.py                        # 4 conversations, loads 0 1 2, 3 repeats
    python bench/shared_cores.py --loads 0 1 --repeats 5 --threads 2

The conversations are airline conversations of the example agent's instructions and tools, four
agent turns each, about 2,230 tokens: the length of the demo generalist's held-out ones. Prints the
median seconds per (load, policy), the ratio to the same policy with no load, and passive/default.
``--json`` prints one line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
POLICIES = {"default": None, "passive": "PASSIVE"}


def conversations(count: int) -> list[list[dict[str, str]]]:
    """`count` airline conversations rendered as the model sees them: three tool calls with their
    results, then a reply."""
    import random

    from examples.airline.instructions import SYSTEM_INSTRUCTIONS
    from examples.airline.tools import TOOLS
    from tracefix.router.protocol import stored_prompt_messages

    tools = [{"tool_name": tool["name"], "description": tool["description"], "parameters": json.dumps(tool["parameters"])} for tool in TOOLS]
    draw = random.Random(0)
    made = []
    for index in range(count):
        user_id, reservation_id = f"U-{draw.randint(1000, 9999)}", f"R-{draw.randint(10000, 99999)}"
        flight = {"flight": "HAT001", "date": "2026-05-20", "cabin": "economy", "price": 300 + index}
        user = {"user_id": user_id, "name": "Ada Lovelace", "email": "ada@example.com", "membership": "gold",
                "reservations": [reservation_id, "R-12345", "R-54321"], "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}}  # fmt: skip
        reservation = {"reservation_id": reservation_id, "user_id": user_id, "origin": "SFO", "destination": "JFK", "flights": [flight] * 3,
                       "passengers": [{"first_name": "Ada", "last_name": "Lovelace", "dob": "1990-01-01"}] * 2, "status": "confirmed",
                       "payment": {"method": "card", "amount": 598.34}}  # fmt: skip
        messages = [{"role": "system", "content": SYSTEM_INSTRUCTIONS},
                    {"role": "user", "content": f"Hi, I am {user_id} and I want to change reservation {reservation_id} to a later flight."}]  # fmt: skip
        calls = [("get_user", {"user_id": user_id}, user), ("get_reservation", {"reservation_id": reservation_id}, reservation),
                 ("search_flights", {"origin": "SFO", "destination": "JFK", "date": "2026-05-21"}, {"flights": [flight] * 5})]  # fmt: skip
        for name, arguments, result in calls:
            call_id = f"c{len(messages)}"
            messages.append({"role": "assistant", "content": "", "tool_calls": json.dumps([{"id": call_id, "name": name, "arguments": arguments}])})
            messages.append({"role": "tool", "content": json.dumps(result), "tool_call_id": call_id})
        messages.append({"role": "assistant", "content": "I found flight HAT001 on 2026-05-21 for the same price. Shall I change it?"})
        made.append(stored_prompt_messages(messages, tools))
    return made


def measure(arguments: argparse.Namespace) -> float:
    """Seconds of one next-action pass (in this process, as the child of `main`)."""
    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.trainer import model as models
    from tracefix.trainer.next_action import next_actions
    from tracefix.trainer.recipes import load_policy
    from tracefix.trainer.rollouts import Sampling

    config = TrainingSettings(threads=arguments.threads)
    model, tokenizer = load_policy(models.resolve(arguments.model, Path(arguments.cache)), config)
    scored = conversations(arguments.conversations)
    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    started = time.perf_counter()
    next_actions(model, tokenizer, scored, sampling)
    return time.perf_counter() - started


def busy(seconds: float) -> None:
    """One thread multiplying decode-sized matrices for `seconds` (the load beside the measurement)."""
    import torch

    torch.set_num_threads(1)
    weights, row = torch.randn(576, 1536), torch.randn(1, 576)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(200):
            row @ weights


def timed(arguments: argparse.Namespace, load: int, policy: str | None) -> float:
    """One measurement in a fresh process (the wait policy is read when OpenMP starts) beside `load`
    busy processes."""
    environment = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    if policy:
        environment["OMP_WAIT_POLICY"] = policy
    me = [sys.executable, str(Path(__file__).resolve())]
    loads = [subprocess.Popen([*me, "--busy", "3600"], cwd=REPO, env=environment) for _ in range(load)]
    try:
        options = ["--threads", str(arguments.threads), "--conversations", str(arguments.conversations), "--model", arguments.model, "--cache", arguments.cache]
        done = subprocess.run([*me, "--measure", *options], cwd=REPO, env=environment, capture_output=True, text=True, check=True)
        return float(done.stdout.strip().splitlines()[-1])
    finally:
        for process in loads:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--busy", type=float, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.busy is not None:
        busy(arguments.busy)
        return
    if arguments.measure:
        print(f"{measure(arguments):.2f}")
        return
    seconds: dict[tuple[int, str], list[float]] = {(load, name): [] for load in arguments.loads for name in POLICIES}
    for _ in range(arguments.repeats):  # interleaved: drift in the machine falls on every cell alike
        for load, name in seconds:
            seconds[(load, name)].append(timed(arguments, load, POLICIES[name]))
    table = {key: statistics.median(values) for key, values in seconds.items()}
    rows = []
    for load in arguments.loads:
        default, passive = table[(load, "default")], table[(load, "passive")]
        base = arguments.loads[0]
        rows.append({"load": load, "default_s": round(default, 1), "passive_s": round(passive, 1),
                     "default_vs_unloaded": round(default / table[(base, "default")], 2), "passive_vs_unloaded": round(passive / table[(base, "passive")], 2),
                     "passive_over_default": round(passive / default, 2)})  # fmt: skip
    if arguments.json:
        print(json.dumps({"threads": arguments.threads, "conversations": arguments.conversations, "repeats": arguments.repeats, "rows": rows}))
        return
    print(f"next-action pass, {arguments.conversations} conversations, {arguments.threads} threads, median of {arguments.repeats}")
    print("| busy processes beside it | default wait (s) | × unloaded | PASSIVE (s) | × unloaded | PASSIVE / default |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['load']} | {row['default_s']} | {row['default_vs_unloaded']} | {row['passive_s']} | {row['passive_vs_unloaded']} | {row['passive_over_default']} |")


if __name__ == "__main__":
    main()
