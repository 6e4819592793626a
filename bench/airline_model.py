"""What the prefix benchmarks share: the embedded model (or another) on a number of CPU threads,
and one capability's environment on the example airline agent's tools."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from examples.airline.tools import TOOLS as AIRLINE_TOOLS
from tracefix.trainer import model as models
from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.families import load_families


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=".tracefix/models")


def load(arguments: argparse.Namespace) -> tuple[Any, Any, Environment]:
    """(tokenizer, float32 model, environment) for ``add_arguments``' options."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(arguments.threads)
    model_dir = models.resolve(arguments.model, Path(arguments.cache))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return tokenizer, model, environment(arguments.capability)


def environment(capability: str) -> Environment:
    """One capability's environment on the example airline agent's tools."""
    return Environment(load_families()[capability], load_tools(AIRLINE_TOOLS))


def collate(rows: list[tuple[list[int], list[int]]]) -> tuple[Any, Any, Any]:
    """Right-padded ids, attention mask and labels (−100 off the policy's tokens) of (token ids,
    policy mask) rows, as the trainer collates a warm-start batch."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for row, (tokens, policy) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        labels[row, : len(tokens)] = torch.tensor([token if keep else -100 for token, keep in zip(tokens, policy, strict=True)])
    return ids, mask, labels
