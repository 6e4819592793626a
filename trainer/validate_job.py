"""The validation gate against the real base model, run as a subprocess of the daemon so that its
memory (RLIMIT_AS) and time are bounded and it can be killed:

    python -m tracefix.trainer.validate_job --request REQUEST.json --report REPORT.json

The request carries the family name, difficulty, tool definitions, model settings (name,
cache_dir, max_new_tokens, threads) and gate settings; the report is the gate's report plus the
model, the elapsed seconds and the number of rollouts, written atomically. An error exits
non-zero with a one-line reason as the last line of stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import ValidationSettings
from tracefix.trainer.environment import Family, Instance, Tool
from tracefix.trainer.families import build_environment
from tracefix.trainer.jobs import RequestError, allocation_failed, exit_with_parent, limit_memory, quiet_deprecations, write_atomically
from tracefix.trainer.jobs import read_request as read_request_keys
from tracefix.trainer.model import ModelUnavailable
from tracefix.trainer.precision import UnsupportedDtype
from tracefix.trainer.rollouts import Sampling, play_in_batches
from tracefix.trainer.validation import HintedInstance, validate

MODEL_KEYS = ("name", "cache_dir", "max_new_tokens", "threads")
GATE_KEYS = ("seeds", "group_size", "mean_low", "mean_high", "min_std", "min_variance_groups", "hint_shares")


def run_gate(
    family: Family,
    tools: Sequence[Tool],
    model_settings: Mapping[str, Any],
    gate_settings: Mapping[str, Any],
    difficulty: int | None = None,
) -> dict[str, Any]:
    """Load the base model and run the validation gate with it, sampling at temperature 1.0, each
    attempt's rollouts in lockstep passes of ``BATCH`` (the trainer's rollouts: the opening
    prefilled once, a row leaving the batch when its turn ends)."""
    import torch

    from tracefix.trainer import model as models
    from tracefix.trainer.evaluation import BATCH

    started = time.monotonic()
    if model_settings["threads"]:
        torch.set_num_threads(model_settings["threads"])
    network, tokenizer = models.load(model_settings["name"], Path(model_settings["cache_dir"]), model_settings.get("dtype", "float32"))
    sampling = Sampling(model_settings["max_new_tokens"], temperature=1.0)
    rollouts = 0

    def play(instances: Sequence[Instance], _indices: Sequence[int]) -> list[float]:
        nonlocal rollouts
        plain = [instance.inner if isinstance(instance, HintedInstance) else instance for instance in instances]
        hinted = [isinstance(instance, HintedInstance) for instance in instances]
        played = play_in_batches(network, tokenizer, plain, sampling, BATCH, hinted, seed=rollouts)
        rollouts += len(instances)
        return [item.rollout.reward for item in played]

    settings = ValidationSettings(**{key: gate_settings[key] for key in GATE_KEYS})
    report = validate(family, tools, play, settings, difficulty)
    return {
        **report.to_dict(),
        "model": model_settings["name"],
        "seconds": round(time.monotonic() - started, 1),
        "rollouts": rollouts,
    }


def read_request(path: Path) -> dict[str, Any]:
    """The request, with every field the gate needs present."""
    request = read_request_keys(path, ())
    missing = [key for key in ("family", "difficulty", "tools", "model", "gate") if key not in request]
    for section, keys in (("model", MODEL_KEYS), ("gate", (*GATE_KEYS, "memory_mb"))):
        if isinstance(request.get(section), dict):
            missing += [f"{section}.{key}" for key in keys if key not in request[section]]
        elif section in request:
            missing.append(f"{section} (an object)")
    if missing:
        raise RequestError(f"request {path} lacks {', '.join(missing)}")
    return request


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tracefix.trainer.validate_job", description="Run the validation gate for one environment."
    )
    parser.add_argument("--request", type=Path, required=True, help="request JSON written by the daemon")
    parser.add_argument("--report", type=Path, required=True, help="where the report JSON goes")
    arguments = parser.parse_args(argv)
    memory_mb = None
    quiet_deprecations()
    try:
        request = read_request(arguments.request)
        memory_mb = request["gate"]["memory_mb"]
        limit_memory(memory_mb)
        exit_with_parent()
        environment = build_environment(request)
        report = run_gate(environment.family, environment.tools, request["model"], request["gate"], environment.difficulty)
        write_atomically(arguments.report, report)
    except (RequestError, ModelUnavailable, UnsupportedDtype) as error:
        reason = str(error)
    except Exception as error:
        # Under RLIMIT_AS an allocation raises MemoryError (torch's a RuntimeError: allocation_failed),
        # and a shared library that does not fit "failed to map segment".
        if isinstance(error, MemoryError) or "failed to map" in str(error) or allocation_failed(error):
            reason = f"out of memory under the {memory_mb} MB limit ([validation] memory_mb): {error}"
        elif isinstance(error, (ValueError, OSError)):
            reason = str(error)
        else:  # unexpected: the traceback for diagnosis, the reason last
            traceback.print_exc()
            reason = f"{type(error).__name__}: {error}"
    else:
        return 0
    print(f"validation failed: {reason}", file=sys.stderr)
    return 1

if __name__ == "__main__":
    sys.exit(main())
