"""Does a warm start on the `tool_call_precision` environment carry over to the agent's real
openings? Trains the warm start on the environment (airline tools), then answers the first turn of
real airline conversations (the agent's system prompt with its tools, the customer's opening)
greedily with the base model and with the adapter, and counts answers holding a parseable tool call.

    python bench/tool_call_transfer.py --warm-start 24 --conversations 24
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.airline.database import Database  # noqa: E402
from examples.airline.instructions import SYSTEM_INSTRUCTIONS  # noqa: E402
from examples.airline.tasks import make_tasks  # noqa: E402
from examples.airline.tools import TOOLS  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools, parse_assistant, render_system_prompt  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from tracefix.daemon.core.settings import TrainingSettings  # noqa: E402
from tracefix.trainer.recipes import train  # noqa: E402


def tool_calls(model: Any, tokenizer: Any, openings: list[str], system: str, max_new_tokens: int) -> int:
    """How many greedy first answers to `openings` hold a parseable tool call."""
    import torch

    hits = 0
    for opening in openings:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": opening}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = ids if torch.is_tensor(ids) else ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        hits += bool(parse_assistant({"role": "assistant", "content": text}).calls)
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--output", default=".tracefix/bench-transfer")
    parser.add_argument("--warm-start", type=int, default=24)
    parser.add_argument("--warm-start-epochs", type=int, default=2)
    parser.add_argument("--warm-start-lr", type=float, default=1e-3)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    import torch

    torch.set_num_threads(arguments.threads)
    tools = load_tools(TOOLS)
    config = TrainingSettings(
        recipe="sft", steps=0, warm_start_examples=arguments.warm_start, warm_start_epochs=arguments.warm_start_epochs,
        warm_start_learning_rate=arguments.warm_start_lr, max_new_tokens=arguments.max_new_tokens, threads=arguments.threads,
    )  # fmt: skip
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    environment = Environment(load_families()["tool_call_precision"], tools)
    trained = train(environment, model_dir, Path(arguments.output), config)
    model, tokenizer, report = trained.model, trained.tokenizer, trained.report
    openings = [task.opening for task in make_tasks(Database.generate(0), arguments.conversations, 0)]
    system = render_system_prompt(SYSTEM_INSTRUCTIONS, tools).lstrip()  # as the router renders the agent's request
    with model.disable_adapter():
        base = tool_calls(model, tokenizer, openings, system, arguments.max_new_tokens)
    adapter = tool_calls(model, tokenizer, openings, system, arguments.max_new_tokens)
    print(json.dumps({"openings": len(openings), "base_tool_calls": base, "adapter_tool_calls": adapter, "warm_start": report["warm_start"]}))


if __name__ == "__main__":
    main()
