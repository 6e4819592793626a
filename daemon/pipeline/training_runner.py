"""The train job: turn each environment that is ready into a trained, evaluated adapter, in a
subprocess (`trainer.train_job`) bounded in memory and time.

An environment is ready when the gate validated it, or rejected it only because the base is too
weak and a warm start is configured, or passed its checks while validation is off. Each becomes one
run (the capability's next adapter version): its progress is read from the run directory while it
trains; its verdict is `candidate` (an adapter row is written, the capability moves to
`candidate`), `rejected_by_eval` (the capability cools down) or `failed`. A stopped daemon kills the
run and leaves it `queued`; after a restart it resumes from its checkpoints.

Before any environment, an agent that fails often gets its generalist (`daemon/pipeline/generalist.py`):
a run of kind `generalist` learns the successful runs of its tools by imitation. The agent's
environments wait while it is on its way, and once it is live each targeted run starts from its
weights (the request's `starts_from`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracefix.daemon.core import generalist
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.pipeline.generalist import CONVERSATIONS, GeneralistStage, Render
from tracefix.daemon.pipeline.model_subprocess import ModelSubprocess, Stopped, TimedOut, error_tail
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.core import tracks
from tracefix.daemon.core.contracts import GeneralistRequest, TargetedRequest, training_result
from tracefix.daemon.core.states import AdapterState, CapabilityState, EnvironmentStatus, RunStatus, TrainingVerdict
from tracefix.daemon.pipeline import replay_judge
from tracefix.trainer.environment import load_tools
from tracefix.daemon.store.store import AnalysisStore

log = logging.getLogger(__name__)

class TrainingRunner:
    def __init__(self, store: AnalysisStore, runs: RunStore, settings: Settings, render: Render | None = None) -> None:
        self.store = store
        self.runs = runs
        self.settings = settings
        self.directory = settings.data_dir / "runs"
        self.subprocess = ModelSubprocess()
        self._pass_lock = threading.Lock()
        self.generalist = GeneralistStage(runs, store, settings, render)
        self._told: set[int] = set()  # environments whose wait for re-selection was logged

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
            # A run left queued first; then a generalist the agent wants (it comes first: targeted
            # adapters start from it); then the oldest environment that is ready.
            run = self.runs.next_queued() or self.generalist.next_run(self.directory, self._generalist_config())
            if run is None:
                environment = self.runs.environment_to_train(
                    self.settings.validation.enabled, training.warm_start_examples > 0, self._waits
                )
                if environment is None:
                    return None
                starts_from = self._live_generalist(environment.get("service_name"))
                run = self.runs.create_run(
                    environment, self._config(environment), str(self.directory), starts_from["adapter_id"] if starts_from else None
                )
            return self._execute(run)
        finally:
            self._pass_lock.release()

    def _generalist_config(self) -> dict[str, Any]:
        """A generalist's [training]: the daemon's, with [generalist] epochs over the conversations."""
        return {**train_config(self.settings), "warm_start_epochs": self.settings.generalist.epochs}

    def _generalists(self, service: str | None, states: tuple[str, ...]) -> list[dict[str, Any]]:
        """The generalist adapters in `states` that serve `service`'s agent (for an environment pooled
        over all agents, None: every one)."""
        wanted = generalist.capability(service) if service else None
        return [item for state in states for item in self.runs.generalists(state) if wanted is None or item["capability"] == wanted]

    def _waits(self, environment: dict[str, Any]) -> bool:
        """Whether a ready environment waits: for its agent's generalist; or, selected before that
        generalist went live, until the selection on the generalist's own traffic selects its
        capability again (the gap the base had may be one the generalist does not)."""
        if self.generalist.holds_targeted(environment.get("service_name")):
            return True
        live = self._live_generalist(environment.get("service_name"))
        if live is None or live.get("routed_since_ns") is None:
            return False
        if _ns(environment["created_at"]) >= live["routed_since_ns"]:
            return False
        window = self.settings.analysis.selection_window
        latest = self.store.track_stats(environment["capability"], window)
        # Only a pass computed after the generalist went live counts: one from before it judged the
        # base's traffic, and still says "selected" at the moment the generalist goes live.
        if latest and latest["selected"] and _ns(latest["computed_at"]) >= live["routed_since_ns"]:
            return False
        if environment["environment_id"] not in self._told:
            self._told.add(environment["environment_id"])
            log.info("environment %d (%s) was selected before %s@v%d went live; it waits until the generalist's own traffic selects it",
                     environment["environment_id"], environment["capability"], live["capability"], live["version"])  # fmt: skip
        return True

    def _live_generalist(self, service: str | None) -> dict[str, Any] | None:
        """The live generalist a targeted adapter of `service`'s environment starts from: the agent's,
        or for a pooled environment the only one live (None when there are several: which agent's
        would be a guess)."""
        live = self._generalists(service, (AdapterState.LIVE,))
        return live[0] if len(live) == 1 else None

    def _config(self, environment: dict[str, Any]) -> dict[str, Any]:
        """The run's [training]: the daemon's, with the hint share validation found."""
        config = train_config(self.settings)
        if environment["status"] == EnvironmentStatus.VALIDATED:
            config["hint_share"] = (environment.get("validation") or {}).get("hint_share", 0.0)
        return config

    def _generalist_request(self, run: dict[str, Any]) -> dict[str, Any]:
        return GeneralistRequest(
            kind="generalist", run_id=run["run_id"], capability=run["capability"], version=run["version"], agent=run["agent"],
            training=run["config"], conversations=str(Path(run["directory"]) / CONVERSATIONS), margin=self.settings.generalist.margin,
            **job_settings(self.settings),
        ).model_dump(mode="json")  # fmt: skip

    def _request(self, run: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
        validation = environment.get("validation") or {}
        validated = environment["status"] == EnvironmentStatus.VALIDATED
        return TargetedRequest(
            starts_from=self._starts_from(run["starts_from"]) if run.get("starts_from") is not None else None,
            run_id=run["run_id"], capability=run["capability"], version=run["version"], family=environment["family"],
            difficulty=validation.get("difficulty", environment["difficulty"]) if validated else environment["difficulty"],
            tools=environment["tools"], training=run["config"], replay=self.runs.replay_cases(run["capability"]),
            **job_settings(self.settings),
        ).model_dump(mode="json")  # fmt: skip

    def _starts_from(self, adapter_id: int) -> dict[str, Any] | None:
        """What a targeted run starting from the generalist `adapter_id` is told of it: its weights, and
        its run's conversations (those it learned from are rehearsed in the warm start; on those it was
        scored on, the targeted adapter must keep its next actions)."""
        adapter = self.runs.adapter(adapter_id)
        if adapter is None:
            return None
        run = self.runs.run(adapter["run_id"])
        conversations = Path(run["directory"]) / CONVERSATIONS if run else None
        settings = self.settings.generalist
        return {
            "adapter_id": adapter["adapter_id"], "name": f"{adapter['capability']}@v{adapter['version']}", "path": adapter["path"],
            "conversations": str(conversations) if conversations and conversations.exists() else None,
            "rehearsal_share": settings.rehearsal_share, "retention_margin": settings.retention_margin,
        }  # fmt: skip

    def _execute(self, run: dict[str, Any]) -> int | None:
        run_id = run["run_id"]
        if run.get("kind") == "generalist":
            if not self.runs.set_run_status(run_id, RunStatus.QUEUED, RunStatus.RUNNING):
                return None
            try:
                return self._train(run, self._generalist_request(run))
            except Exception as error:  # a run never stays 'running' behind a daemon-side error
                log.exception("training run %d", run_id)
                return self._fail(run, f"{type(error).__name__}: {error}")
        environment = self.runs.environment(run["environment_id"])
        if environment is None:
            self.runs.set_run_status(run_id, RunStatus.QUEUED, RunStatus.FAILED, error=f"environment {run['environment_id']} is gone")
            return run_id
        if not self.runs.set_run_status(run_id, RunStatus.QUEUED, RunStatus.RUNNING):
            return None
        try:
            return self._train(run, self._request(run, environment))
        except Exception as error:  # a run never stays 'running' behind a daemon-side error
            log.exception("training run %d", run_id)
            return self._fail(run, f"{type(error).__name__}: {error}")

    def _train(self, run: dict[str, Any], body: dict[str, Any]) -> int | None:
        run_id = run["run_id"]
        self._move(run["capability"], CapabilityState.TRAINING, f"training run {run_id} (adapter v{run['version']}) started")
        directory = Path(run["directory"])
        directory.mkdir(parents=True, exist_ok=True)
        request = directory / "request.json"
        request.write_text(json.dumps(body, indent=2))
        on = f"environment {run['environment_id']}" if run["environment_id"] is not None else f"{run['agent']}'s successful runs"
        log.info("training run %d: %s v%d on %s", run_id, run["capability"], run["version"], on)
        try:
            returncode = self.subprocess.run(
                "tracefix.trainer.train_job", ["--request", str(request), "--run-dir", str(directory)],
                directory / "stderr.log", self.settings.training.timeout_s,
            )  # fmt: skip
        except Stopped:
            self.runs.set_run_status(run_id, RunStatus.RUNNING, RunStatus.QUEUED)
            return None
        except TimedOut as error:
            return self._fail(run, f"training {error}")
        if returncode != 0:
            return self._fail(run, f"training exited with {returncode}: {error_tail(directory / 'stderr.log')}")
        try:
            parsed = training_result((directory / "result.json").read_text())
        except (OSError, ValueError) as error:
            return self._fail(run, f"the training job exited without a usable result: {error}")
        result = parsed.model_dump(mode="json")
        # The run replayed real failures; its answers are judged here, by this daemon's labelers.
        tools = load_tools(body["tools"]) if body.get("tools") else []
        result["evaluation"] = evaluation = replay_judge.judged(
            parsed.evaluation, tracks.capability_of(run["capability"]), tools, self.settings.capabilities
        )
        if parsed.verdict == TrainingVerdict.CANDIDATE:
            manifest = Path(str(parsed.adapter)) / "manifest.json"
            digest = hashlib.sha256(manifest.read_bytes()).hexdigest()
            adapter_id = self.runs.add_candidate(run, str(parsed.adapter), digest, result)
            if adapter_id is None:
                return None  # the run was taken back (stopped) while its result was being read
            self._move(run["capability"], CapabilityState.CANDIDATE, f"adapter {adapter_id} (v{run['version']}) is a candidate: {_gain(evaluation)}")
        else:
            self.runs.set_run_status(run_id, RunStatus.RUNNING, RunStatus.REJECTED_BY_EVAL, result)
            reason = f"run {run_id} rejected by evaluation: {'; '.join(evaluation.get('reasons') or ['no reason given'])}"
            self.store.start_cooldown(run["capability"], reason, self.settings.trigger.cooldown_hours)
        log.info("training run %d: %s (%s)", run_id, parsed.verdict, _gain(evaluation))
        return run_id

    def _fail(self, run: dict[str, Any], error: str) -> int:
        self.runs.set_run_status(run["run_id"], RunStatus.RUNNING, RunStatus.FAILED, error=error)
        back = CapabilityState.ENVIRONMENT if run.get("kind") != "generalist" else CapabilityState.HEALTHY
        self._move(run["capability"], back, f"training run {run['run_id']} failed: {error.splitlines()[-1]}")
        log.warning("training run %d failed: %s", run["run_id"], error)
        return run["run_id"]

    def _move(self, capability: str, to_state: str, reason: str) -> None:
        """A capability's state follows its run (a generalist's row is made by its first run)."""
        state = self.store.states().get(capability)
        if state is None and generalist.is_generalist(capability):
            state = {"state": CapabilityState.HEALTHY, "consecutive": 0, "last_pass_id": 0}
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
    }


def _gain(evaluation: dict[str, Any]) -> str:
    if evaluation.get("kind") == "next_action":
        base, adapter = evaluation["base"]["matched"], evaluation["adapter"]["matched"]
        return f"next action {adapter['rate']:.2f} vs base {base['rate']:.2f} on {evaluation['turns']} turns of {evaluation['conversations']} held-out conversations"
    target = evaluation["target"]
    return f"success {target['adapter']['success_rate']:.2f} vs base {target['base']['success_rate']:.2f} on {evaluation['seeds'][1]} held-out seeds"


def _ns(moment: datetime) -> int:
    """A stored timestamp (naive ones are UTC) in nanoseconds since the epoch."""
    return int((moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp() * 1e9)
