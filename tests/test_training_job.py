"""The daemon's train job, end to end with a real (tiny) model in real subprocesses: a gap planted in
OTLP traffic becomes an environment, the gate rejects the weak base, training warm-starts, runs
GRPO, evaluates on held-out seeds and leaves a verified candidate adapter, visible in the API, with
no manual step. Then the verdicts that keep an adapter out, and a stopped run resuming.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import trl  # noqa: F401  (installed by make test: never skipped)

from tracefix.daemon.store.runs import RunStore  # noqa: E402
from tracefix.daemon.core.settings import ModelSettings, Settings, StoreSettings, TrainingSettings  # noqa: E402
from tracefix.daemon.store.store import AnalysisStore, Store  # noqa: E402
from tracefix.daemon.pipeline.training_runner import TrainingRunner  # noqa: E402
from examples.traffic import SERVICE_NAME, generate, send  # noqa: E402
from tests.conftest import REPO, make_daemon  # noqa: E402
from tracefix.trainer.adapters import base_model_hash, verify_adapter  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402

DEFINITIONS = json.loads((REPO / "tests" / "fixtures" / "tools" / "retail.json").read_text())
FAMILY = load_families()["tool_call_precision"]
TINY_TRAINING = {
    "recipe": "sft+grpo", "steps": 1, "group_size": 2, "groups_per_step": 1, "warm_start_examples": 2, "warm_start_epochs": 1,
    "warm_start_batch": 1, "eval_seeds": 3, "eval_margin": 0.0, "eval_interference": False, "save_steps": 1,
}  # fmt: skip


def test_a_planted_gap_ends_as_a_verified_candidate_adapter_with_no_manual_step(tmp_path: Path, tiny_model: Path) -> None:
    daemon = make_daemon(
        tmp_path,
        analysis={"interval_s": 0.5},
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        validation={"enabled": True, "seeds": 2, "group_size": 2},
        training=TINY_TRAINING,
    ).start()
    try:
        send(generate(300, seed=11, failure_rate=0.4, gaps="precondition_verification=0.7:0.05"),
             daemon.http_url, "http/protobuf", "log")  # fmt: skip
        deadline = time.monotonic() + 300
        runs: list[dict] = []
        while time.monotonic() < deadline:
            runs = daemon.get("/api/runs")["items"]
            if runs and runs[0]["status"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        environment = daemon.get("/api/environments")["items"][0]
        adapters = daemon.get("/api/adapters")["items"]
        capability = daemon.get("/api/capabilities/precondition_verification")
        run = daemon.get(f"/api/runs/{runs[0]['run_id']}") if runs else {}
    finally:
        daemon.stop()
    # The job's log holds what went wrong, not library noise (deprecations, dataset progress bars).
    job_log = (Path(run["directory"]) / "stderr.log").read_text()
    assert not any(noise in job_log for noise in ("deprecated", "examples/s", "it/s]")), job_log[-3000:]
    # The gate rejected the random base as too weak, so the run warm-started.
    assert environment["status"] == "rejected" and all(a["verdict"] == "too_weak" for a in environment["validation"]["attempts"])
    assert [item["status"] for item in runs] == ["candidate"], runs
    assert run["config"]["warm_start_examples"] == 2 and run["result"]["training"]["warm_start"]["examples"] == 2
    assert run["result"]["training"]["warm_start"]["updates"] == 2  # one demonstration per update, as configured
    assert run["result"]["training"]["recipe"] == "sft+grpo"  # a warm start, then GRPO steps
    # Progress in order: each warm-start update, keep_best's score of the warm start, the GRPO step
    # and its checkpoint's score, then each part of the evaluation.
    phases = [record.get("phase") for record in run["progress"]]
    assert phases == ["warm_start", "warm_start", "checkpoint", "grpo", "checkpoint", *["evaluation"] * 4], run["progress"]
    assert [(record["step"], record["max_steps"]) for record in run["progress"][:2]] == [(1, 2), (2, 2)]
    assert all(record["loss"] >= 0 for record in run["progress"][:2])
    assert run["progress"][3]["step"] == 1
    assert {"mean_reward", "success_rate", "zero_variance_groups", "loss", "elapsed_s"} <= set(run["progress"][3])
    assert [record["step"] for record in run["progress"][2:5:2]] == [0, 1]
    assert run["progress"][4]["best_step"] == run["result"]["training"]["tried"][0]["kept_step"]
    cases = run["result"]["evaluation"]["replay"]["cases"]
    assert [record["part"] for record in run["progress"][5:]] == [
        "precondition_verification: base", "precondition_verification: adapter",
        "precondition_verification: warm start alone", f"replay of {cases} failed openings",
    ]  # fmt: skip
    # What GRPO added to the warm start, seed by seed on the held-out seeds.
    added = run["result"]["evaluation"]["grpo_added"]
    assert added["seeds"] == 3 and added["both"] + added["neither"] + added["after_only"] + added["before_only"] == 3
    assert added["after"] == run["result"]["evaluation"]["target"]["adapter"]["success_rate"]
    assert added["interval"][0] <= added["difference"] <= added["interval"][1] and 0 <= added["mcnemar_p"] <= 1
    target = run["result"]["evaluation"]["target"]
    replayed = run["result"]["evaluation"]["replay"]
    assert replayed["cases"] > 0 and len(replayed["items"]) == replayed["cases"]
    assert {item["base"] for item in replayed["items"]} <= {"NA", "PRESENT", "LACKING"}
    assert target["base"]["seeds"] == 3 and len(target["adapter"]["success_interval"]) == 2
    # Trained where [training] device = "auto" found room: here the CPU, under the address-space limit.
    assert (run["result"]["device"], run["result"]["memory_limit_mb"]) == ("cpu", TrainingSettings().memory_mb)
    # One adapter row, version 1, whose files verify against the base model they were trained on.
    # The agent's own track of the capability (daemon.core.tracks): its adapter serves that agent.
    track = f"precondition_verification.{SERVICE_NAME}"
    assert [(item["capability"], item["version"], item["state"]) for item in adapters] == [(track, 1, "candidate")]
    manifest = verify_adapter(Path(adapters[0]["path"]), base_model_hash(tiny_model))
    assert manifest["capability"] == track and manifest["environment"]["family"] == "precondition_verification"
    assert manifest["recipe"] == "sft+grpo"
    assert capability["state"] == "candidate"
    assert [t["to_state"] for t in capability["transitions"][:3]] == ["candidate", "training", "environment"]


@pytest.fixture
def runner_store(tmp_path: Path) -> Iterator[tuple[Store, AnalysisStore, RunStore]]:
    """A real DuckDB file with one checked environment and its capability in state `environment`."""
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    analysis = AnalysisStore(store)
    environment = Environment(FAMILY, load_tools(DEFINITIONS), FAMILY.levels[0])
    analysis.add_environment(FAMILY.capability, environment.spec(), "shop", DEFINITIONS, None, "checked", {"passed": True})
    analysis.transition(FAMILY.capability, "healthy", "environment", "environment 1 checked", 0, 0)
    yield store, analysis, RunStore(store)
    store.close()


def _runner(store: Store, analysis: AnalysisStore, runs: RunStore, model: Path, **training: object) -> TrainingRunner:
    settings = Settings(
        store=StoreSettings(path=store.path),
        model=ModelSettings(name=str(model), max_new_tokens=8, threads=1),
        training=TrainingSettings(**{**TINY_TRAINING, **training}),
    )
    settings.validation.enabled = False
    return TrainingRunner(analysis, runs, settings)


def test_an_adapter_that_does_not_beat_the_base_by_the_margin_is_rejected_by_eval(
    runner_store: tuple[Store, AnalysisStore, RunStore], tiny_model: Path
) -> None:
    store, analysis, runs = runner_store
    runner = _runner(store, analysis, runs, tiny_model, eval_margin=1.0)
    run_id = runner.run_pass()
    run = runs.run(run_id)
    assert run["status"] == "rejected_by_eval" and run["finished_at"] is not None
    assert "gain +0.00 < margin 1.00" in run["result"]["evaluation"]["reasons"][0]
    assert runs.adapters() == [] and not (Path(run["directory"]) / "adapter").exists()
    assert analysis.states()[FAMILY.capability]["state"] == "cooldown"


def test_a_crashed_run_is_failed_with_its_error_and_leaves_no_adapter(
    runner_store: tuple[Store, AnalysisStore, RunStore], tmp_path: Path
) -> None:
    store, analysis, runs = runner_store
    runner = _runner(store, analysis, runs, tmp_path / "missing-model")
    run = runs.run(runner.run_pass())
    assert run["status"] == "failed" and "config.json" in run["error"]
    assert runs.adapters() == []
    assert analysis.states()[FAMILY.capability]["state"] == "environment"
    assert runner.run_pass() is None  # the environment has had its run


def test_a_run_on_a_gpu_that_is_not_there_fails_with_the_reason_instead_of_training_on_the_cpu(
    runner_store: tuple[Store, AnalysisStore, RunStore], tiny_model: Path
) -> None:
    import torch

    store, analysis, runs = runner_store
    run = runs.run(_runner(store, analysis, runs, tiny_model, device="cuda").run_pass())
    if torch.cuda.is_available():  # on a GPU machine the same run trains there, with no address-space limit
        assert run["status"] in ("candidate", "rejected_by_eval"), run
        assert (run["result"]["device"], run["result"]["memory_limit_mb"]) == ("cuda", None)
    else:
        assert run["status"] == "failed" and "[training] device = 'cuda'" in run["error"] and "sees no usable GPU" in run["error"], run
        assert runs.adapters() == []


def test_a_daemon_side_error_fails_the_run_instead_of_leaving_it_running(
    runner_store: tuple[Store, AnalysisStore, RunStore], tiny_model: Path
) -> None:
    store, analysis, runs = runner_store
    runner = _runner(store, analysis, runs, tiny_model)
    runner.directory.mkdir(parents=True, exist_ok=True)
    (runner.directory / "run-1").write_text("a file where the run directory belongs")
    run = runs.run(runner.run_pass())
    assert run["run_id"] == 1 and run["status"] == "failed" and "FileExistsError" in run["error"]
    assert analysis.states()[FAMILY.capability]["state"] == "environment"


def _training_processes() -> list[psutil.Process]:
    return [child for child in psutil.Process().children() if "tracefix.trainer.train_job" in " ".join(child.cmdline())]


def test_a_run_stopped_with_the_daemon_is_requeued_and_resumes_from_its_checkpoint(
    runner_store: tuple[Store, AnalysisStore, RunStore], tiny_model: Path
) -> None:
    import threading

    store, analysis, runs = runner_store
    runner = _runner(store, analysis, runs, tiny_model, recipe="grpo", steps=3, warm_start_examples=0)
    worker = threading.Thread(target=runner.run_pass)
    worker.start()
    # The job is frozen (SIGSTOP) the moment its first checkpoint is complete, so the stop below
    # always lands mid-run, however fast the machine finishes the remaining steps.
    first = runner.directory / "run-1" / "checkpoints" / "grpo" / "checkpoint-1" / "trainer_state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not first.exists():
        time.sleep(0.01)
    frozen = _training_processes()
    for process in frozen:
        process.suspend()
    runner.stop()
    worker.join(timeout=30)
    assert first.exists() and len(frozen) == 1 and not _training_processes()
    assert not (runner.directory / "run-1" / "result.json").exists()
    assert runs.run(1)["status"] == "queued"
    # A new daemon picks the queued run up again; it resumes instead of starting over.
    again = _runner(store, analysis, runs, tiny_model, recipe="grpo", steps=3, warm_start_examples=0)
    assert again.run_pass() == 1
    finished = runs.run(1)
    assert finished["status"] == "candidate", finished["error"]
    assert finished["result"]["training"]["resumed_from"].startswith("checkpoint-")
    records = [json.loads(line) for line in (Path(finished["directory"]) / "progress.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records if record.get("phase") == "grpo"]
    assert steps[-1] == 3 and sorted(set(steps)) == [1, 2, 3]


def _unjudged(result: dict) -> dict:
    """A result without its replay (the job's answers, or the daemon's judgement of them)."""
    return {**result, "evaluation": {key: value for key, value in result["evaluation"].items() if key != "replay"}}


def test_a_job_that_already_finished_is_not_run_again(runner_store: tuple[Store, AnalysisStore, RunStore], tiny_model: Path) -> None:
    """A daemon stopped the moment its job finished requeues the run: the job's second start returns
    the first one's outcome instead of training again and failing on its own immutable adapter."""
    import subprocess
    import sys

    store, analysis, runs = runner_store
    run = runs.run(_runner(store, analysis, runs, tiny_model).run_pass())
    assert run["status"] == "candidate", run["error"]
    directory = Path(run["directory"])
    command = [sys.executable, "-m", "tracefix.trainer.train_job", "--request", str(directory / "request.json"), "--run-dir", str(directory)]
    progress = (directory / "progress.jsonl").read_text()
    adapter = (directory / "adapter" / "manifest.json").read_bytes()

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    # The job's result, as the daemon stored it but for the replay: the job returns its answers,
    # the daemon stored them judged.
    written = json.loads((directory / "result.json").read_text())
    assert _unjudged(written) == _unjudged(run["result"])
    assert "answers" in written["evaluation"]["replay"] and "reproducible" in run["result"]["evaluation"]["replay"]
    assert (directory / "progress.jsonl").read_text() == progress  # nothing trained or evaluated again

    # Killed after publishing the adapter, before writing result.json: the result comes from the manifest.
    (directory / "result.json").unlink()
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    rebuilt = json.loads((directory / "result.json").read_text())
    assert rebuilt["verdict"] == "candidate" and rebuilt["adapter"] == run["result"]["adapter"]
    assert _unjudged(rebuilt)["evaluation"] == _unjudged(run["result"])["evaluation"] and rebuilt["steps"] == run["result"]["steps"]
    assert rebuilt["training"]["recipe"] == run["result"]["training"]["recipe"] and rebuilt["recovered_from"] == "adapter manifest"
    assert (directory / "progress.jsonl").read_text() == progress
    assert (directory / "adapter" / "manifest.json").read_bytes() == adapter

    # An adapter left there that does not verify is refused with the reason, never published.
    (directory / "result.json").unlink()
    (directory / "adapter" / "adapter_model.safetensors").write_bytes(b"tampered")
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "does not verify" in again.stderr.splitlines()[-1]
    assert not (directory / "result.json").exists()


def test_tracefix_train_runs_one_in_the_foreground_on_a_tools_file(tmp_path: Path, tiny_model: Path) -> None:
    import os
    import subprocess
    import sys

    environ = {
        **os.environ, "TRACEFIX_STORE_PATH": str(tmp_path / "tracefix.duckdb"), "TRACEFIX_TRAINING_GROUP_SIZE": "2",
        "TRACEFIX_TRAINING_GROUPS_PER_STEP": "1", "TRACEFIX_TRAINING_EVAL_INTERFERENCE": "false",
        "TRACEFIX_TRAINING_EVAL_MARGIN": "0", "TRACEFIX_MODEL_MAX_NEW_TOKENS": "8", "TRACEFIX_TRAINING_RECIPE": "sft+grpo",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "tracefix.daemon.app.cli", "train", "tool_call_precision", "--tools", str(REPO / "tests" / "fixtures" / "tools" / "retail.json"),
        "--model", str(tiny_model), "--steps", "1", "--warm-start", "1", "--eval-seeds", "2", "--output", str(tmp_path / "run"), "--json",
    ]  # fmt: skip
    shown = subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    result = json.loads(shown.stdout)
    assert result["verdict"] == "candidate" and result["evaluation"]["target"]["base"]["seeds"] == 2
    verify_adapter(Path(result["adapter"]), base_model_hash(tiny_model))
    # The same run directory again: the adapter version exists and is never overwritten.
    again = subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "exists" in again.stderr
    # Recipe 'auto' from the command line, told in words: every recipe tried on the validation
    # seeds, the one kept, and what GRPO added when the kept one warm-started first.
    auto = [*command[: command.index("--output")], "--output", str(tmp_path / "auto"), "--recipe", "auto"]
    told = subprocess.run([item for item in auto if item != "--json"], cwd=REPO, env={**environ, "TRACEFIX_TRAINING_VALIDATION_SEEDS": "2"},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert told.returncode == 0, told.stderr[-2000:]
    lines = told.stdout.splitlines()
    kept, _, where = next(line for line in lines if line.startswith("recipe: ")).removeprefix("recipe: ").partition(" ")
    assert kept in ("sft", "sft+grpo", "guided_grpo", "grpo") and where == "(trained on cpu)"
    scored = [line.split(":")[0].strip() for line in lines if "validation success" in line and "after GRPO step" not in line]
    assert scored == ["sft", "sft+grpo", "guided_grpo", "grpo"]
    # keep_best (the default): each recipe with GRPO scored its start and its one step, and kept one
    chosen = [line.strip() for line in lines if "after GRPO step" in line]
    assert [line.split(":")[0] for line in chosen] == ["sft+grpo", "guided_grpo", "grpo"]
    assert all(" step 0: " in line and ", 1: " in line and "(2 seeds); kept step " in line for line in chosen), chosen
    assert any(line.startswith("GRPO added") for line in lines) == (kept == "sft+grpo")


def test_a_runs_progress_is_told_by_its_phase() -> None:
    """The warm start and the evaluation take most of a CPU run: their records say where the run
    stands, and the GRPO charts keep to the GRPO steps (records from before phases were recorded
    count as GRPO steps)."""
    from tracefix.daemon.core.progress import grpo_steps, progress_text

    warm = {"phase": "warm_start", "step": 3, "max_steps": 96, "loss": 0.5, "elapsed_s": 61.2}
    step = {"step": 2, "max_steps": 4, "mean_reward": 0.25, "elapsed_s": 10.0}
    evaluation = {"phase": "evaluation", "part": "tool_call_precision: base", "elapsed_s": 5.0}
    assert progress_text(warm) == "warm start, update 3/96, loss 0.500, 61 s"
    assert progress_text(step) == "GRPO step 2/4, reward 0.25, 10 s"
    assert progress_text({**step, "phase": "grpo", "max_steps": None, "mean_reward": None}, steps=8) == "GRPO step 2/8, reward n/a, 10 s"
    assert progress_text(evaluation) == "evaluating (tool_call_precision: base), 5 s into the evaluation"
    passes = {**step, "phase": "grpo", "clip_fraction_max": 0.125, "kl": 0.0031}
    assert progress_text(passes) == "GRPO step 2/4, reward 0.25, clipped 12%, KL 0.0031, 10 s"
    scored = {"phase": "checkpoint", "step": 5, "max_steps": 30, "success_rate": 0.625, "mean_reward": 0.7, "best_step": 0, "elapsed_s": 70.0}
    assert progress_text(scored) == "GRPO checkpoint after step 5: validation success 0.62 (best so far: step 0), 70 s"
    trying = {"phase": "recipe", "recipe": "guided_grpo", "elapsed_s": 30.0}
    assert progress_text(trying) == "trying recipe guided_grpo, 30 s"
    assert progress_text({**trying, "validation": {"success_rate": 0.375}}) == "recipe guided_grpo: validation success 0.38, 30 s"
    assert grpo_steps([warm, step, scored, {**step, "phase": "grpo", "step": 3}, evaluation]) == [step, {**step, "phase": "grpo", "step": 3}]
