"""The train job: turn each environment that is ready into a trained, evaluated adapter, in a
subprocess (`trainer.train_job`) bounded in memory and time.

An environment is ready when the gate validated it, or rejected it only because the base is too
weak and a warm start is configured, or passed its checks while validation is off. Each becomes one
run (the capability's next adapter version): its progress is read from the run directory while it
trains; its verdict is `candidate` (an adapter row is written, the capability moves to
`candidate`), `rejected_by_eval` (the capability cools down) or `failed`. A stopped daemon kills the
run and leaves it `queued`; after a restart it resumes from its checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

from daemon.store.runs import RunStore
from daemon.core.settings import Settings
from daemon.store.store import AnalysisStore
from daemon.pipeline.model_subprocess import ModelSubprocess, Stopped, TimedOut, error_tail

log = logging.getLogger(__name__)

class TrainingRunner:
    def __init__(self, store: AnalysisStore, runs: RunStore, settings: Settings) -> None:
        self.store = store
        self.runs = runs
        self.settings = settings
        self.directory = settings.data_dir / "runs"
        self.subprocess = ModelSubprocess()
        self._pass_lock = threading.Lock()

    def recover(self) -> int:
        requeued = self.runs.requeue_running()
        if requeued:
            log.info("%d interrupted training runs will resume", requeued)
        return requeued

    def stop(self) -> None:
        self.subprocess.stop()

    def run_pass(self) -> int | None:
        """Run the oldest queued run, or queue one for the oldest ready environment; returns the run id
        once a verdict is stored. A pass that finds another one running returns at once."""
        training = self.settings.training
        if not training.enabled or self.subprocess.stopping.is_set():
            return None
        if not self._pass_lock.acquire(blocking=False):
            return None
        try:
            run = self.runs.next_queued()
            if run is None:
                environment = self.runs.environment_to_train(
                    self.settings.validation.enabled, training.warm_start_examples > 0
                )
                if environment is None:
                    return None
                run = self.runs.create_run(environment, self._config(environment), str(self.directory))
            return self._execute(run)
        finally:
            self._pass_lock.release()

    def _config(self, environment: dict[str, Any]) -> dict[str, Any]:
        """The run's [training]: the daemon's, with the hint share validation found."""
        config = train_config(self.settings)
        if environment["status"] == "validated":
            config["hint_share"] = (environment.get("validation") or {}).get("hint_share", 0.0)
        return config

    def _request(self, run: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
        validation = environment.get("validation") or {}
        validated = environment["status"] == "validated"
        return {
            "run_id": run["run_id"],
            "capability": run["capability"],
            "version": run["version"],
            "family": environment["family"],
            "difficulty": validation.get("difficulty", environment["difficulty"]) if validated else environment["difficulty"],
            "tools": environment["tools"],
            "training": run["config"],
            "replay": self.runs.replay_cases(run["capability"]),
            **job_settings(self.settings),
        }

    def _execute(self, run: dict[str, Any]) -> int | None:
        run_id = run["run_id"]
        environment = self.runs.environment(run["environment_id"])
        if environment is None:
            self.runs.set_run_status(run_id, "queued", "failed", error=f"environment {run['environment_id']} is gone")
            return run_id
        if not self.runs.set_run_status(run_id, "queued", "running"):
            return None
        try:
            return self._train(run, environment)
        except Exception as error:  # a run never stays 'running' behind a daemon-side error
            log.exception("training run %d", run_id)
            return self._fail(run, f"{type(error).__name__}: {error}")

    def _train(self, run: dict[str, Any], environment: dict[str, Any]) -> int | None:
        run_id = run["run_id"]
        self._move(run["capability"], "training", f"training run {run_id} (adapter v{run['version']}) started")
        directory = Path(run["directory"])
        directory.mkdir(parents=True, exist_ok=True)
        request = directory / "request.json"
        request.write_text(json.dumps(self._request(run, environment), indent=2))
        log.info("training run %d: %s v%d on environment %d", run_id, run["capability"], run["version"], environment["environment_id"])
        try:
            returncode = self.subprocess.run(
                "trainer.train_job", ["--request", str(request), "--run-dir", str(directory)],
                directory / "stderr.log", self.settings.training.timeout_s,
            )  # fmt: skip
        except Stopped:
            self.runs.set_run_status(run_id, "running", "queued")
            return None
        except TimedOut as error:
            return self._fail(run, f"training {error}")
        if returncode != 0:
            return self._fail(run, f"training exited with {returncode}: {error_tail(directory / 'stderr.log')}")
        result = json.loads((directory / "result.json").read_text())
        evaluation = result["evaluation"]
        if result["verdict"] == "candidate":
            manifest = Path(result["adapter"]) / "manifest.json"
            digest = hashlib.sha256(manifest.read_bytes()).hexdigest()
            adapter_id = self.runs.add_candidate(run, result["adapter"], digest, result)
            if adapter_id is None:
                return None  # the run was taken back (stopped) while its result was being read
            self._move(run["capability"], "candidate", f"adapter {adapter_id} (v{run['version']}) is a candidate: {_gain(evaluation)}")
        else:
            self.runs.set_run_status(run_id, "running", "rejected_by_eval", result)
            reason = f"run {run_id} rejected by evaluation: {'; '.join(evaluation['reasons'])}"
            self.store.start_cooldown(run["capability"], reason, self.settings.trigger.cooldown_hours)
        log.info("training run %d: %s (%s)", run_id, result["verdict"], _gain(evaluation))
        return run_id

    def _fail(self, run: dict[str, Any], error: str) -> int:
        self.runs.set_run_status(run["run_id"], "running", "failed", error=error)
        self._move(run["capability"], "environment", f"training run {run['run_id']} failed: {error.splitlines()[-1]}")
        log.warning("training run %d failed: %s", run["run_id"], error)
        return run["run_id"]

    def _move(self, capability: str, to_state: str, reason: str) -> None:
        state = self.store.states().get(capability)
        if state is not None:
            self.store.transition(capability, state["state"], to_state, reason, state["consecutive"], state["last_pass_id"])


def train_config(settings: Settings) -> dict[str, Any]:
    """[training] as the trainer reads it, with what it takes from [model] filled in."""
    training, model = settings.training, settings.model
    config = training.model_dump(mode="json")
    config["max_new_tokens"] = training.max_new_tokens or model.max_new_tokens
    config["threads"] = training.threads or model.threads
    return config


def job_settings(settings: Settings) -> dict[str, Any]:
    """The model, evaluation and memory parts of a training request."""
    model, training = settings.model, settings.training
    cache_dir = settings.model_cache_dir
    return {
        "model": {**model.model_dump(mode="json"), "cache_dir": str(cache_dir)},
        "evaluation": {"seeds": training.eval_seeds, "margin": training.eval_margin, "interference": training.eval_interference},
        "memory_mb": training.memory_mb,
        # The replay judges adapter answers with the labelers as this daemon configures them.
        "capabilities": settings.capabilities.model_dump(mode="json"),
    }


def _gain(evaluation: dict[str, Any]) -> str:
    target = evaluation["target"]
    return f"success {target['adapter']['success_rate']:.2f} vs base {target['base']['success_rate']:.2f} on {evaluation['seeds'][1]} held-out seeds"
