"""One training run, start to verdict: warm start and GRPO on the capability's environment, held-out
evaluation against the base, and the adapter saved with its manifest. A run that starts from its
agent's generalist rehearses the generalist's conversations in its warm start, is evaluated against
the generalist instead of the bare base, and must keep the generalist's next actions on the
conversations the generalist was scored on (``retention``). Run by the daemon as a
subprocess (bounded memory, killable, resumable from its checkpoints):

    python -m tracefix.trainer.train_job --request REQUEST.json --run-dir RUN_DIR

Progress goes to ``RUN_DIR/progress.jsonl`` (one JSON record per step, flushed), the outcome to
``RUN_DIR/result.json`` (written atomically): verdict ``candidate`` or ``rejected_by_eval`` with the
evaluation report, and the adapter directory. The adapter is written whole or not at all. A start
on a run directory whose job already finished returns that outcome and does no work again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tracefix.daemon.core.contracts import training_request
from tracefix.daemon.core.settings import TrainingSettings
from tracefix.daemon.core.states import TrainingVerdict
from tracefix.trainer.adapters import AdapterRejected, base_model_hash, save_adapter, verify_adapter
from tracefix.trainer.environment import Environment
from tracefix.trainer.evaluation import compare
from tracefix.trainer.families import build_environment, load_families
from tracefix.trainer.model import training_device
from tracefix.trainer.conversations import read_conversations
from tracefix.trainer.next_action import compare_next_actions
from tracefix.trainer.recipes import Rehearsal, train
from tracefix.trainer.replay import replay
from tracefix.trainer.rollouts import Sampling
from tracefix.trainer.jobs import RequestError, exit_with_parent, limit_memory, read_request, run_job, write_atomically



def parsed(request: dict[str, Any]) -> dict[str, Any]:
    """The request as the contract types it (``daemon.core.contracts``): every field present and of
    its type, defaults filled in; a `RequestError` naming each wrong field."""
    try:
        return training_request(request).model_dump(mode="json")
    except ValueError as error:
        raise RequestError(str(error)) from None


def finished_result(request: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The outcome of this run's job when an earlier start of it already finished: its
    ``result.json``, or, when the job was killed after publishing the adapter and before writing
    that file, the result rebuilt from the adapter's manifest. None when there is work left.

    A daemon stopped in the moment its job finished requeues the run; this keeps the rerun from
    training and evaluating again, and from failing on its own immutable adapter."""
    path = run_dir / "result.json"
    if path.is_file():
        try:
            result = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            result = None  # written atomically, so only a foreign file reads badly: redo the run
        if isinstance(result, dict) and result.get("run_id") == request["run_id"]:
            return result
    directory = run_dir / "adapter"
    if not directory.exists():
        return None
    try:
        manifest = verify_adapter(directory)
    except AdapterRejected as error:
        raise RequestError(f"{directory} is left from an earlier start of this run and does not verify: {error}") from error
    if (manifest.get("capability"), manifest.get("version")) != (request["capability"], request["version"]):
        raise RequestError(f"{directory} holds {manifest.get('capability')} v{manifest.get('version')}, not this run's adapter")
    metrics = manifest["metrics"]
    return {
        "run_id": request["run_id"],
        "capability": request["capability"],
        "verdict": TrainingVerdict.CANDIDATE,
        "evaluation": metrics["evaluation"],
        "training": {"recipe": manifest["recipe"], **{key: metrics[key] for key in ("tried", "warm_start", "rollouts", "imitation") if key in metrics}},
        "steps": metrics.get("steps"),
        "seconds": None,
        "adapter": str(directory),
        "recovered_from": "adapter manifest",
    }


def training_settings(request: dict[str, Any]) -> TrainingSettings:
    try:
        return TrainingSettings.model_validate(request["training"])
    except ValidationError as error:
        raise RequestError(f"bad [training] settings: {error}") from error


def run_training(request: dict[str, Any], run_dir: Path, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train, evaluate and (when it earns it) save the adapter; returns the result record."""
    from tracefix.trainer import model as models

    request = parsed(request)
    started = time.monotonic()
    families = load_families()
    environment = build_environment(request, families)
    family, tools = environment.family, environment.tools
    model_settings = request["model"]
    model_dir = models.resolve(model_settings["name"], Path(model_settings["cache_dir"]))
    config = training_settings(request)
    generalist = request.get("starts_from") or None
    starts_from = Path(generalist["path"]) if generalist else None
    learned_from, held_out = generalist_conversations(generalist)
    rehearsal = Rehearsal(tuple(tuple(messages) for messages in learned_from), float(generalist.get("rehearsal_share", 0.0))) if generalist else None
    trained = train(environment, model_dir, run_dir, config, progress, starts_from, rehearsal)
    model, tokenizer, report = trained.model, trained.tokenizer, trained.report

    evaluation = request["evaluation"]
    others = {}
    for name, other in families.items():
        if name != family.name and evaluation.get("interference", True):
            try:
                others[other.capability] = Environment(other, tools)
            except ValueError:
                continue  # this tool set cannot host that family
    seeds = range(evaluation["seeds"])
    sampling = Sampling(config.new_tokens, 0.0, max_length=config.max_length)
    evaluating = time.monotonic()

    def on_part(part: str) -> None:
        if progress:
            progress({"phase": "evaluation", "part": part, "elapsed_s": round(time.monotonic() - evaluating, 1)})

    verdict = compare(
        model, model, tokenizer, environment, others, seeds, sampling, evaluation["margin"], on_part, trained.warm_started, trained.started_from
    )
    if generalist:
        verdict["reference"] = generalist["name"]
    if generalist and held_out and trained.started_from is not None:
        on_part(f"next actions on the generalist's {len(held_out)} held-out conversations")
        verdict["retention"] = retention(model, tokenizer, held_out, sampling, trained.started_from, float(generalist.get("retention_margin", 0.05)))
        if verdict["retention"]["forgets"]:
            verdict["verdict"] = TrainingVerdict.REJECTED_BY_EVAL
            verdict["reasons"].append(verdict["retention"]["reason"])
    cases = request.get("replay") or []
    if cases:
        on_part(f"replay of {len(cases)} failed openings")
    verdict["replay"] = replay(model, tokenizer, cases, tools, sampling)  # answers; the daemon judges them
    result: dict[str, Any] = {
        "run_id": request["run_id"],
        "capability": request["capability"],
        "verdict": verdict["verdict"],
        "evaluation": verdict,
        "training": {key: value for key, value in report.items() if key not in ("steps", "device")},
        "steps": len(report["steps"]),
        "device": report["device"],
        "seconds": round(time.monotonic() - started, 1),
        "adapter": None,
    }
    if report["device"] == "cuda":
        import torch

        result["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
    if verdict["verdict"] == TrainingVerdict.CANDIDATE:
        directory = run_dir / "adapter"
        manifest = {
            "capability": request["capability"],
            "version": request["version"],
            "environment": environment.spec(),
            "base_model": model_settings["name"],
            "base_model_hash": base_model_hash(model_dir),
            "recipe": report["recipe"],
            "training": config.model_dump(mode="json"),
            "starts_from": request.get("starts_from"),
            "metrics": {
                "evaluation": verdict, "tried": report["tried"], "warm_start": report["warm_start"], "rollouts": report["rollouts"],
                "steps": len(report["steps"]),
            },  # fmt: skip
            "created_at": datetime.now(timezone.utc).isoformat(),
        }
        save_adapter(model, directory, manifest)
        result["adapter"] = str(directory)
    return result


def generalist_conversations(starts_from: dict[str, Any] | None) -> tuple[list[Any], list[Any]]:
    """The conversations the generalist a run starts from learned from and was scored on (its run's
    ``conversations.json``); none when the run starts fresh or the request names no file.
    RequestError when the file named cannot be read."""
    path = (starts_from or {}).get("conversations")
    return read_conversations(path) if path else ([], [])


def retention(model: Any, tokenizer: Any, held_out: list[Any], sampling: Sampling, generalist: dict[str, Any], margin: float) -> dict[str, Any]:
    """Whether a targeted adapter keeps its generalist's next actions on the conversations the
    generalist was scored on: both scored turn by turn (``trainer.next_action``); ``forgets`` when
    the adapter's accuracy is below the generalist's by more than `margin`."""
    scored = compare_next_actions(model, tokenizer, held_out, sampling, reference=generalist)
    kept, own = scored["base"]["matched"]["rate"], scored["adapter"]["matched"]["rate"]
    forgets = own < kept - margin
    reason = f"next actions on the generalist's held-out conversations {own:.2f} < the generalist's {kept:.2f} by more than {margin:.2f}"
    return {"generalist": scored["base"], "adapter": scored["adapter"], "difference": scored["difference"], "turns": scored["turns"],
            "margin": margin, "forgets": forgets, "reason": reason if forgets else None}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracefix.trainer.train_job", description="Train, evaluate and save one adapter.")
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    arguments = parser.parse_args(argv)

    def body() -> None:
        request = parsed(read_request(arguments.request, ()))
        generalist = request["kind"] == "generalist"
        # The device first: on a GPU no address-space limit can be set (limit_memory).
        memory_limit_mb = limit_memory(request.get("memory_mb"), training_device(training_settings(request).device))
        exit_with_parent()
        arguments.run_dir.mkdir(parents=True, exist_ok=True)
        finished = finished_result(request, arguments.run_dir)
        if finished is not None:
            write_atomically(arguments.run_dir / "result.json", finished)
            return
        with (arguments.run_dir / "progress.jsonl").open("a") as log:

            def progress(record: dict[str, Any]) -> None:
                log.write(json.dumps(record) + "\n")
                log.flush()

            if generalist:
                from tracefix.trainer.imitation import run_generalist

                result = run_generalist(request, arguments.run_dir, progress)
            else:
                result = run_training(request, arguments.run_dir, progress)
        write_atomically(arguments.run_dir / "result.json", {**result, "memory_limit_mb": memory_limit_mb})

    return run_job("training", body, "[training] memory_mb")

if __name__ == "__main__":
    sys.exit(main())
