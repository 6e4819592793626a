"""The gate-training subprocess: ``python -m tracefix.trainer.gate_job --request R --output G``.

Trains the token-level gate (routing mode ``gate``) for exactly the live adapters named in the
request. Its data are successful synthetic trajectories: each live adapter's environment's
ground-truth solutions, with the assistant tokens labelled by that adapter's slot, and solutions of
the other families on the same tools labelled base (slot 0). The base model and every adapter stay
frozen; the gate weights are saved tagged with the adapter versions they route between, so the
router refuses them for any other live set. A report goes next to them (``<output>.json``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracefix.trainer.jobs import RequestError, exit_with_parent, limit_memory, read_request, run_job, write_atomically

REQUIRED = ("model", "adapters", "examples_per_adapter", "steps")


def trajectories(request: dict[str, Any], tokenizer: Any) -> list[tuple[list[dict[str, Any]], int]]:
    """(messages, slot) of successful solutions: each adapter's own family on its slot; families
    without a live adapter, on the first adapter's tools, on the base slot."""
    from tracefix.trainer.environment import Environment
    from tracefix.trainer.families import build_environment, load_families
    from tracefix.trainer.rollouts import demonstration

    families = load_families()
    per_family = int(request["examples_per_adapter"])
    plans: list[tuple[Environment, int]] = []
    for slot, adapter in enumerate(request["adapters"], start=1):
        plans.append((build_environment(adapter, families), slot))
    live = {adapter["family"] for adapter in request["adapters"]}
    tools = plans[0][0].tools  # the first adapter's
    for name, family in sorted(families.items()):
        if name not in live and family.unusable(tools) is None:
            plans.append((Environment(family, tools), 0))
    found = []
    for environment, slot in plans:
        for seed in range(per_family):
            rollout = demonstration(tokenizer, environment.instance(seed)).rollout
            if rollout.success:
                found.append((rollout.messages, slot))
    return found


def train(request: dict[str, Any], output: Path) -> dict[str, Any]:
    from tracefix.trainer.gate import GatedExperts
    from tracefix.trainer import model as models
    from tracefix.trainer.adapters import load_adapter
    from tracefix.trainer.gate_training import examples_from_trajectories, train_gate

    settings = request["model"]
    network, tokenizer = models.load(settings["name"], Path(settings["cache_dir"]))
    names = [adapter["name"] for adapter in request["adapters"]]
    for adapter in request["adapters"]:
        network = load_adapter(network, Path(adapter["path"]), adapter["name"])
    gated = GatedExperts(network, names, seed=int(request.get("seed", 0)))
    examples = examples_from_trajectories(tokenizer, trajectories(request, tokenizer), int(request.get("max_length", 2048)))
    report = train_gate(
        gated, tokenizer, examples, steps=int(request["steps"]), lr=float(request.get("lr", 1e-2)),
        balance_weight=float(request.get("balance_weight", 0.01)), seed=int(request.get("seed", 0)),
    )  # fmt: skip
    gated.save(output)
    return {"adapters": names, "gate": str(output), **report}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracefix.trainer.gate_job", description="Train the token-level gate for the live adapters.")
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    arguments = parser.parse_args(argv)

    def body() -> None:
        request = read_request(arguments.request, REQUIRED)
        if not request["adapters"]:
            raise RequestError("a gate needs at least one live adapter")
        limit_memory(request.get("memory_mb"))
        exit_with_parent()
        report = train(request, arguments.output)
        write_atomically(arguments.output.with_suffix(".json"), report)

    return run_job("gate training", body, "[gate] memory_mb")

if __name__ == "__main__":
    sys.exit(main())
