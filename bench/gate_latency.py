"""Per-token latency of the token-level gate (routing mode ``gate``) against the base model alone and
against one adapter merged into the base (what ``fixed`` routing serves), greedy generation.

Variants, all in float32 (on the CPU, or the GPU with ``--device cuda``), timed on the same prompt:
- base: the plain model;
- merged: one LoRA adapter merged into the weights (same cost as the base by construction);
- peft: one LoRA adapter, unmerged (PEFT's own forward);
- gate: ``--adapters`` LoRA adapters mixed per token by an untrained gate (the cost does not depend
  on the gate's weights).

Each variant generates ``--tokens`` tokens (EOS suppressed) and one token, ``--runs`` times, the
variants taking turns; decode latency per token = (t(tokens) − t(1)) / (tokens − 1), so the
prompt's prefill is not counted. Medians over the runs; prints one JSON line.

    python bench/gate_latency.py --model tiny
    python bench/gate_latency.py --model smollm2-135m --cache .tracefix/models
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from tracefix.trainer.gate import GatedExperts  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402

PROMPT = [{"role": "user", "content": "Cancel my reservation R-4821 and tell me the refund amount."}]


def load(name: str, cache: Path) -> tuple[Any, Any]:
    """The model to measure: "tiny" (the tests' 2-layer random Llama) or anything ``models.load`` takes."""
    if name != "tiny":
        return models.load(name, cache)
    from transformers import AutoTokenizer

    gguf = models.embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    directory = models.tiny_random_model(Path(tempfile.mkdtemp(prefix="tiny-")), tokenizer)
    return models.load(str(directory), cache)


def with_adapters(base: Any, count: int, rank: int, seed: int) -> Any:
    """A PEFT model over a copy of ``base`` with ``count`` LoRA adapters (q/k/v/o) whose B matrices
    are random, so every delta is real work and changes the output."""
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(copy.deepcopy(base), config, adapter_name="adapter0")
    for index in range(1, count):
        model.add_adapter(f"adapter{index}", config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    return model.eval()


def timed(generate: Any, prompt: dict[str, torch.Tensor], tokens: int, pad: int) -> float:
    _synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        output = generate(**prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=pad)
    _synchronize()
    elapsed = time.perf_counter() - started
    assert output.shape[1] - prompt["input_ids"].shape[1] == tokens
    return elapsed


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(variants: dict[str, Any], prompt: dict[str, torch.Tensor], tokens: int, runs: int, pad: int) -> dict[str, Any]:
    """Decode ms per token for each variant; the variants take turns within every run, so a change
    in the machine's load hits all of them alike."""
    decode: dict[str, list[float]] = {name: [] for name in variants}
    total: dict[str, list[float]] = {name: [] for name in variants}
    for generate in variants.values():  # warm-up
        timed(generate, prompt, tokens, pad)
    for _ in range(runs):
        for name, generate in variants.items():
            full = timed(generate, prompt, tokens, pad)
            first = timed(generate, prompt, 1, pad)
            decode[name].append((full - first) / (tokens - 1) * 1000)
            total[name].append(full / tokens * 1000)
    return {
        name: {
            "decode_ms_per_token": round(statistics.median(decode[name]), 3),
            "runs_ms": [round(value, 3) for value in decode[name]],
            "end_to_end_ms_per_token": round(statistics.median(total[name]), 3),
        }
        for name in variants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help='"tiny", "smollm2-135m" or a model directory')
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    parser.add_argument("--device", default="cpu", help='"cpu" or "cuda"')
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)

    base, tokenizer = load(arguments.model, Path(arguments.cache))
    base = base.to(arguments.device)
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = {name: tensor.to(arguments.device) for name, tensor in prompt.items()}
    experts = with_adapters(base, arguments.adapters, arguments.rank, seed=2)
    variants = {
        "base": base.generate,
        "merged": with_adapters(base, 1, arguments.rank, seed=1).merge_and_unload().generate,
        "peft": with_adapters(base, 1, arguments.rank, seed=1).generate,
        "gate": GatedExperts(experts, [f"adapter{index}" for index in range(arguments.adapters)]).generate,
    }
    results = measure(variants, prompt, arguments.tokens, arguments.runs, tokenizer.pad_token_id)
    reference = results["base"]["decode_ms_per_token"]
    print(
        json.dumps(
            {
                "model": arguments.model,
                "device": arguments.device,
                "adapters": arguments.adapters,
                "rank": arguments.rank,
                "tokens": arguments.tokens,
                "prompt_tokens": int(prompt["input_ids"].shape[1]),
                "runs": arguments.runs,
                "threads": torch.get_num_threads(),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
                **results,
                "ratio_to_base": {name: round(value["decode_ms_per_token"] / reference, 3) for name, value in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
