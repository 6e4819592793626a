"""Peak memory and time of one GRPO update on the airline agent's openings, the group's opening run
once and its rollouts in micro-batches, against the plain computation (every row prompt +
completion in one batch).

Each variant runs in a child process of its own under an address-space limit (``--limit-gb``, as
the training subprocess runs under ``[training] memory_mb``): it loads SmolLM2-135M with a fresh
LoRA, plays one group of ``--group-size`` episodes of the capability's environment (half of them
guided by a forced solution prefix, so that the episodes are as long as real ones), and makes one
optimisation pass. The advantages are set to ±1 so that the update always runs: memory and time do
not depend on their values. Peak resident memory is the child's ``ru_maxrss``, read separately for
the rollouts and for the update (a fresh child per variant; the update's figure is the peak of the
whole process, rollouts included).

    python bench/grpo_memory.py --group-size 8 --micro-batches 1 2 8 --plain
    python bench/grpo_memory.py --group-size 8 --micro-batches 2 --every-position
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plain_backward(model: Any, prompt: list[int], completions: list[Any], tokens: int, epsilon: float) -> None:
    """The computation the shared-prefix loss replaces: all rows prompt + completion, one batch."""
    import torch

    width = len(prompt) + max(len(item.ids) for item in completions)
    ids = torch.zeros((len(completions), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, item in enumerate(completions):
        ids[row, : len(prompt) + len(item.ids)] = torch.tensor(prompt + item.ids)
        attention[row, : len(prompt) + len(item.ids)] = 1
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    total = torch.zeros(())
    for row, item in enumerate(completions):
        own = logprobs[row, len(prompt) - 1 : len(prompt) - 1 + len(item.ids)]
        ratio = torch.exp(own - own.detach())
        surrogate = torch.minimum(ratio * item.advantage, ratio.clamp(1 - epsilon, 1 + epsilon) * item.advantage)
        total = total - surrogate[torch.tensor(item.mask, dtype=torch.bool)].sum()
    (total / tokens).backward()


def child(arguments: argparse.Namespace) -> dict[str, Any]:
    from tracefix.daemon.core.settings import TrainingSettings
    from examples.airline.tools import TOOLS
    from tracefix.trainer import model as models
    from tracefix.trainer.environment import Environment, load_tools
    from tracefix.trainer.families import load_families
    from tracefix.trainer.grpo import take_rollouts
    from tracefix.trainer.jobs import limit_memory
    from tracefix.trainer.policy_loss import Completion, group_backward
    from tracefix.trainer.recipes import load_policy

    limit_memory(int(arguments.limit_gb * 1024))
    config = TrainingSettings(
        recipe="guided_grpo", group_size=arguments.group_size, groups_per_step=1, micro_batch=arguments.micro_batch or 1,
        max_new_tokens=arguments.max_new_tokens, threads=arguments.threads, warm_start_examples=0,
    )  # fmt: skip
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    model, tokenizer = load_policy(model_dir, config)
    environment = Environment(load_families()[arguments.capability], load_tools(TOOLS))
    started = time.monotonic()
    rollouts = take_rollouts(model, tokenizer, environment, config, step=0, guided_share=0.5)
    rollout_s, rollout_peak = time.monotonic() - started, _peak_mb()
    prompt = rollouts[0].prompt_ids
    completions = [Completion(item.completion_ids, item.env_mask, (-1.0) ** index) for index, item in enumerate(rollouts)]
    tokens = sum(sum(item.mask) for item in completions)
    model.train()
    started = time.monotonic()
    if arguments.micro_batch:
        group_backward(model, prompt, completions, tokens, arguments.micro_batch)
    else:
        plain_backward(model, prompt, completions, tokens, config.clip_epsilon)
    update_s, peak_mb = time.monotonic() - started, _peak_mb()
    every: dict[str, Any] = {}
    if arguments.every_position and arguments.micro_batch:
        from tracefix.trainer import output_layer

        gradients = [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]
        model.zero_grad()
        for item in completions:
            item.old = None  # as fresh: the first pass over the rollouts, like the one above
        output_layer.SCORED_ONLY = False
        started = time.monotonic()
        group_backward(model, prompt, completions, tokens, arguments.micro_batch)
        output_layer.SCORED_ONLY = True
        every_s = time.monotonic() - started
        again = [parameter.grad for parameter in model.parameters() if parameter.grad is not None]
        equal = len(again) == len(gradients) and all(a.equal(b) for a, b in zip(again, gradients, strict=True))
        model.zero_grad()  # and once more the policy's tokens only, now that the process is warm as well
        for item in completions:
            item.old = None
        started = time.monotonic()
        group_backward(model, prompt, completions, tokens, arguments.micro_batch)
        every = {"every_position_update_s": round(every_s, 1), "second_update_s": round(time.monotonic() - started, 1), "bitwise_equal": equal}
    return {
        "variant": f"shared opening, micro-batch {arguments.micro_batch}" if arguments.micro_batch else "plain (one batch, opening per row)",
        "group_size": arguments.group_size, "prompt_tokens": len(prompt),
        "completion_tokens": [len(item.completion_ids) for item in rollouts], "policy_tokens": tokens,
        "rollouts_s": round(rollout_s, 1), "rollouts_peak_mb": round(rollout_peak), "update_s": round(update_s, 1),
        "peak_mb": round(peak_mb), "limit_gb": arguments.limit_gb, **every,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", default="precondition_verification")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--plain", action="store_true", help="also measure the plain computation")
    parser.add_argument(
        "--every-position", action="store_true",
        help="also time each shared variant's update with every position through the output layer (as before only the policy's"
        " tokens went through it), on the same rollouts, and check that the gradients are equal to the bit",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--limit-gb", type=float, default=8.0, help="address-space limit of each child")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--micro-batch", type=int, default=None, help=argparse.SUPPRESS)  # a child's variant (0 = plain)
    arguments = parser.parse_args()
    if arguments.micro_batch is not None:
        print(json.dumps(child(arguments)))
        return
    variants = [*arguments.micro_batches, *([0] if arguments.plain else [])]
    results = []
    for micro_batch in variants:
        command = [sys.executable, __file__, *sys.argv[1:], "--micro-batch", str(micro_batch)]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            results.append({"variant": micro_batch or "plain", "failed": tail, "limit_gb": arguments.limit_gb})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    print("| variant | prompt tokens | completion tokens | update peak RSS | update time |\n|---|---|---|---|---|")
    for item in results:
        if "failed" in item:
            print(f"| {item['variant']} | | | failed under {item['limit_gb']} GB: {item['failed']} | |")
        else:
            every = (
                f" and {item['second_update_s']} s (every position through the output layer: {item['every_position_update_s']} s;"
                f" gradients equal to the bit: {item['bitwise_equal']})" if "bitwise_equal" in item else ""
            )  # fmt: skip
            print(f"| {item['variant']} | {item['prompt_tokens']} | {sum(item['completion_tokens'])} | {item['peak_mb'] / 1024:.2f} GB | {item['update_s']} s{every} |")


if __name__ == "__main__":
    main()
