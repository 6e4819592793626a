"""The validate job: run the validation gate against the base model for each checked environment,
in a subprocess (`trainer.validate_job`) bounded in memory and time, and store the verdict.

validated: the base's rewards can teach (possibly with hints or another difficulty);
rejected: they cannot on any remedy tried; failed: the run itself failed (the error is stored).
A stopped daemon kills the subprocess and leaves the environment `checked`, to be validated again.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.states import EnvironmentStatus
from tracefix.daemon.store.store import AnalysisStore
from tracefix.daemon.pipeline.model_subprocess import ModelSubprocess, Stopped, TimedOut, error_tail

log = logging.getLogger(__name__)

class Validator:
    def __init__(self, store: AnalysisStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.directory = settings.data_dir / "validation"
        self.subprocess = ModelSubprocess()
        self._pass_lock = threading.Lock()

    def recover(self) -> int:
        """At start: environments a killed daemon left `validating` go back to `checked`."""
        requeued = self.store.requeue_validating()
        if requeued:
            log.info("%d interrupted validations will run again", requeued)
        return requeued

    def run_pass(self) -> int | None:
        """Validate the oldest checked environment, if any; returns its id once a verdict is stored.
        A pass that finds another one running returns at once."""
        if not self.settings.validation.enabled or self.subprocess.stopping.is_set():
            return None
        if not self._pass_lock.acquire(blocking=False):
            return None
        try:
            return self._validate_next()
        finally:
            self._pass_lock.release()

    def _validate_next(self) -> int | None:
        environment = self.store.environment_to_validate()
        if environment is None:
            return None
        environment_id = environment["environment_id"]
        if not self.store.set_environment_status(environment_id, EnvironmentStatus.CHECKED, EnvironmentStatus.VALIDATING):
            return None
        log.info("validating environment %d (%s) with %s", environment_id, environment["family"], self.settings.model.name)
        try:
            outcome = self._run(environment)
        except BaseException:
            self.store.set_environment_status(environment_id, EnvironmentStatus.VALIDATING, EnvironmentStatus.CHECKED)
            raise
        if outcome is None:  # stopped: validated again after a restart
            self.store.set_environment_status(environment_id, EnvironmentStatus.VALIDATING, EnvironmentStatus.CHECKED)
            return None
        status, report = outcome
        self.store.set_environment_status(environment_id, EnvironmentStatus.VALIDATING, status, report)
        log.info("environment %d %s: %s", environment_id, status, _summary(report))
        return environment_id

    def stop(self) -> None:
        """Kill a running validation (SIGTERM, then SIGKILL); its environment stays `checked`."""
        self.subprocess.stop()

    def _request(self, environment: dict[str, Any]) -> dict[str, Any]:
        model = self.settings.model
        cache_dir = self.settings.model_cache_dir
        return {
            "environment_id": environment["environment_id"],
            "family": environment["family"],
            "difficulty": environment["difficulty"],
            "tools": environment["tools"],
            "model": {**model.model_dump(mode="json"), "cache_dir": str(cache_dir)},
            "gate": self.settings.validation.model_dump(mode="json"),
        }

    def _run(self, environment: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """(status, report) of one gate run; None when it was stopped."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"environment-{environment['environment_id']}"
        request, report, errors = (Path(f"{stem}{suffix}") for suffix in (".request.json", ".report.json", ".log"))
        request.write_text(json.dumps(self._request(environment), indent=2))
        report.unlink(missing_ok=True)
        try:
            returncode = self.subprocess.run(
                "tracefix.trainer.validate_job", ["--request", str(request), "--report", str(report)],
                errors, self.settings.validation.timeout_s,
            )  # fmt: skip
        except Stopped:
            return None
        except TimedOut as error:
            return EnvironmentStatus.FAILED, {"passed": False, "error": f"validation {error}"}
        if returncode != 0:
            return EnvironmentStatus.FAILED, {"passed": False, "error": f"validation exited with {returncode}: {error_tail(errors)}"}
        result = json.loads(report.read_text())
        return (EnvironmentStatus.VALIDATED if result["passed"] else EnvironmentStatus.REJECTED), result


def _summary(report: dict[str, Any]) -> str:
    if "error" in report:
        return report["error"]
    verdicts = ", ".join(attempt["verdict"] for attempt in report["attempts"])
    remedy = f"; {report['remedy']}" if report["passed"] and report["remedy"] else ""
    return f"{report['rollouts']} rollouts in {report['seconds']:g} s, attempts: {verdicts}{remedy}"
