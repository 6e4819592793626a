"""What the generalist benchmarks share: a generalist training run's directory (its
``request.json`` and ``conversations.json``, as the daemon wrote them) and the model it trained,
loaded as its train job loads it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import TrainingSettings


def add_arguments(parser: argparse.ArgumentParser, repeats: int) -> None:
    parser.add_argument("--run", type=Path, required=True, help="a generalist run's directory")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--cache", type=Path, default=Path(".tracefix/models"), help="the converted model cache")


def load(arguments: argparse.Namespace) -> tuple[TrainingSettings, Any, Any, list[Any], list[Any]]:
    """(training settings, policy model with a fresh adapter, tokenizer, conversations learned from,
    held-out conversations) of ``add_arguments``' run."""
    from tracefix.trainer import model as models
    from tracefix.trainer.conversations import read_conversations
    from tracefix.trainer.recipes import load_policy

    request = json.loads((arguments.run / "request.json").read_text())
    config = TrainingSettings.model_validate(request["training"])
    model, tokenizer = load_policy(models.resolve(request["model"]["name"], arguments.cache), config)
    train, held_out = read_conversations(arguments.run / "conversations.json")
    return config, model, tokenizer, train, held_out
