"""One capability trained the way the daemon trains it, on the GPU: a DuckDB store holding one
checked environment (a capability over the airline agent's tools), the demo's training settings
scaled for a GPU, and the daemon's ``TrainingRunner`` running its training subprocess
(``python -m tracefix.trainer.train_job``, with ``[training] memory_mb`` and ``device`` as configured) to a
verdict. Prints PASS or FAIL for each check, then one JSON line with what it measured:

    run          the run ends as a candidate or rejected by evaluation, not failed
    device       it trained on the device asked for, with the address-space limit only on the CPU
    warm_start   every warm-start update is reported (seconds per update)
    grpo         every GRPO step is reported and made an update where its groups had variance; the
                 clipped surrogate binds from the second pass (seconds per step)
    evaluation   base, adapter and warm start alone scored on the same held-out seeds: what GRPO
                 added, paired

    python bench/gpu_training.py                      # on the GPU, with the settings of GPU below
    python bench/gpu_training.py --model DIR --set device=cpu warm_start_examples=2 steps=2 \
        groups_per_step=1 group_size=2 eval_seeds=2   # the same path on the CPU, small

``bench/gpu_check.sh`` runs it. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.demo.settings import DEMO  # noqa: E402
from tracefix.daemon.core.progress import read_progress  # noqa: E402
from tracefix.daemon.core.settings import ModelSettings, Settings, StoreSettings, TrainingSettings  # noqa: E402
from tracefix.daemon.pipeline.training_runner import TrainingRunner  # noqa: E402
from tracefix.daemon.store.runs import RunStore  # noqa: E402
from tracefix.daemon.store.store import AnalysisStore, Store  # noqa: E402
from examples.airline.tools import TOOLS as AIRLINE_TOOLS  # noqa: E402
from tracefix.trainer import model as models  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402
from bench.grpo_settings import parse_variant  # noqa: E402

# The demo's training settings (`examples/demo/settings.py`), scaled for a GPU: GRPO at `[training]`'s own
# learning rate, 16 steps of 8 groups × 8 rollouts, 100 held-out seeds.
GPU = {
    "device": "cuda", "threads": 0, "steps": 16, "groups_per_step": 8, "group_size": 8, "micro_batch": 8,
    "learning_rate": 1e-4, "eval_seeds": 100, "eval_margin": 0.0,
}  # fmt: skip


def run_once(arguments: argparse.Namespace) -> dict[str, Any]:
    """The run's record (status, config, result, progress) after the daemon's runner trained it."""
    work = Path(arguments.work)
    shutil.rmtree(work / "state", ignore_errors=True)
    family = load_families()[arguments.capability]
    environment = Environment(family, load_tools(AIRLINE_TOOLS), family.levels[0])
    store = Store(StoreSettings(path=work / "state" / "tracefix.duckdb"))
    try:
        analysis = AnalysisStore(store)
        analysis.add_environment(family.capability, environment.spec(), "airline", AIRLINE_TOOLS, None, "checked", {"passed": True})
        analysis.transition(family.capability, "healthy", "environment", "environment 1 checked", 0, 0)
        training = TrainingSettings(**{**DEMO["training"], **GPU, "save_steps": 10_000, **arguments.set})
        settings = Settings(
            store=StoreSettings(path=store.path),
            model=ModelSettings(name=arguments.model, cache_dir=str(Path(arguments.cache).resolve()), max_new_tokens=arguments.max_new_tokens),
            training=training,
        )
        settings.validation.enabled = False
        runs = RunStore(store)
        run_id = TrainingRunner(analysis, runs, settings).run_pass()
        if run_id is None:
            raise SystemExit("the runner found no environment to train")
        run = runs.run(run_id)
        return {**run, "progress": read_progress(run["directory"])}
    finally:
        store.close()


def checks(run: dict[str, Any], device: str) -> tuple[list[tuple[str, bool, str]], dict[str, Any]]:
    """Each check's (name, passed, detail), and the figures measured."""
    result = run.get("result") or {}
    progress = run.get("progress") or []
    config = run["config"]
    warm = [record for record in progress if record.get("phase") == "warm_start"]
    steps = [record for record in progress if record.get("phase") == "grpo"]
    evaluation = [record for record in progress if record.get("phase") == "evaluation"]
    updates = [step for step in steps if step["groups"] > step["zero_variance_groups"]]
    figures = {
        "device": result.get("device"), "memory_limit_mb": result.get("memory_limit_mb"), "peak_gpu_mb": result.get("peak_gpu_mb"),
        "warm_start_s_per_update": round(warm[-1]["elapsed_s"] / len(warm), 2) if warm else None,
        "grpo_s_per_step": round(steps[-1]["elapsed_s"] / len(steps), 2) if steps else None,
        "grpo_rollouts": steps[-1]["rollouts"] if steps else 0,
        "clip_fraction_max": max((step["clip_fraction_max"] for step in updates), default=0.0),
        "kl_last": steps[-1]["kl"] if steps else None,
        "run_s": result.get("seconds"),
        "held_out": result.get("evaluation", {}).get("target"),
        "grpo_added": result.get("evaluation", {}).get("grpo_added"),
    }  # fmt: skip
    found = [
        ("run", run["status"] in ("candidate", "rejected_by_eval"), f"{run['status']}{': ' + run['error'] if run.get('error') else ''}"),
        ("device", figures["device"] == device and (figures["memory_limit_mb"] is None) == (device == "cuda"),
         f"trained on {figures['device']}, address-space limit {figures['memory_limit_mb']} MB"),
        ("warm_start", bool(warm) and len(warm) == warm[-1]["max_steps"], f"{len(warm)} updates, {figures['warm_start_s_per_update']} s each"),
        ("grpo", len(steps) == config["steps"] and bool(updates) and (config["num_iterations"] < 2 or figures["clip_fraction_max"] > 0),
         f"{len(steps)} steps ({len(updates)} with an update), {figures['grpo_rollouts']} rollouts, {figures['grpo_s_per_step']} s a step, "
         f"clip fraction up to {figures['clip_fraction_max']}"),
        ("evaluation", bool(figures["grpo_added"]) and figures["grpo_added"]["seeds"] == config["eval_seeds"] and len(evaluation) >= 3,
         _evaluation_text(figures)),
    ]  # fmt: skip
    return found, figures


def _evaluation_text(figures: dict[str, Any]) -> str:
    target, added = figures["held_out"], figures["grpo_added"]
    if not target or not added:
        return "no evaluation"
    return (
        f"base {target['base']['success_rate']:.2f} → adapter {target['adapter']['success_rate']:.2f} on {added['seeds']} seeds; "
        f"GRPO added {added['difference']:+.2f} [{added['interval'][0]:+.2f}, {added['interval'][1]:+.2f}] "
        f"({added['after_only']} won, {added['before_only']} lost)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=".tracefix/gpu-training", help="store, runs and model cache go here")
    parser.add_argument("--capability", default="tool_call_precision")
    parser.add_argument("--model", default=models.EMBEDDED)
    parser.add_argument("--cache", default=".tracefix/models")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="[training] settings over the ones above")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    arguments = parser.parse_args()
    arguments.set = parse_variant(["--set", *arguments.set])[1]
    if arguments.capability not in load_families():
        raise SystemExit(f"--capability {arguments.capability!r}: one of {', '.join(sorted(load_families()))}")
    Path(arguments.work).mkdir(parents=True, exist_ok=True)
    run = run_once(arguments)
    found, figures = checks(run, run["config"]["device"])
    for name, passed, detail in found:
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)
    print(json.dumps({"settings": run["config"], **figures}))
    sys.exit(0 if all(passed for _, passed, _ in found) else 1)


if __name__ == "__main__":
    main()
