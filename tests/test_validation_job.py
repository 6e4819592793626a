"""The validation gate against a real model, run by the daemon's validate job in a subprocess, and by
`tracefix envs validate` in the foreground.

The model is a tiny random Llama with SmolLM2's tokenizer (built in seconds): it scores 0, so the
gate rejects it after trying the hint remedies, which is exactly what must be stored and shown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import torch  # noqa: F401  (installed by make test: never skipped)
import transformers  # noqa: F401  (installed by make test: never skipped)

from tracefix.daemon.core.settings import CapabilitySettings, ModelSettings, Settings, StoreSettings, ValidationSettings  # noqa: E402
from tracefix.daemon.store.store import AnalysisStore, Store  # noqa: E402
from tracefix.daemon.pipeline.validator import Validator  # noqa: E402
from examples.traffic import SERVICE_NAME, generate, send  # noqa: E402
from tests.conftest import REPO, make_daemon, wait_for  # noqa: E402
from tracefix.trainer.environment import Environment, load_tools  # noqa: E402
from tracefix.trainer.families import load_families  # noqa: E402

RETAIL = REPO / "tests" / "fixtures" / "tools" / "retail.json"
DEFINITIONS = json.loads(RETAIL.read_text())
FAMILY = load_families()["tool_call_precision"]
TINY_GATE = {"seeds": 3, "group_size": 2}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Store, AnalysisStore, int]]:
    """A real DuckDB file holding one checked environment (tool_call_precision on the retail tools)."""
    store = Store(StoreSettings(path=tmp_path / "tracefix.duckdb"))
    analysis = AnalysisStore(store)
    environment = Environment(FAMILY, load_tools(DEFINITIONS), FAMILY.levels[0])
    environment_id = analysis.add_environment(
        FAMILY.capability, environment.spec(), "shop", DEFINITIONS, None, "checked", {"passed": True}
    )
    yield store, analysis, environment_id
    store.close()


def _settings(store: Store, tiny_model: Path, **gate: object) -> Settings:
    return Settings(
        store=StoreSettings(path=store.path),
        model=ModelSettings(name=str(tiny_model), max_new_tokens=8, threads=1),
        validation=ValidationSettings(**{**TINY_GATE, **gate}),
    )


def _environment(analysis: AnalysisStore, environment_id: int) -> dict:
    return next(item for item in analysis.environments() if item["environment_id"] == environment_id)


def _has_loaded_torch(process: psutil.Process) -> bool:
    """Whether the gate's process has mapped torch's library: it is past its start, into its work."""
    try:
        return any("libtorch" in mapped.path for mapped in process.memory_maps())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _gate_processes() -> list[psutil.Process]:
    return [child for child in psutil.Process().children() if "tracefix.trainer.validate_job" in " ".join(child.cmdline())]


def test_the_daemon_rejects_a_random_base_model_on_a_planted_gap_with_the_report_stored(
    tmp_path: Path, tiny_model: Path
) -> None:
    daemon = make_daemon(
        tmp_path,
        analysis={"interval_s": 0.5},
        model={"name": str(tiny_model), "max_new_tokens": 8, "threads": 1},
        validation={"enabled": True, **TINY_GATE},
    ).start()
    try:
        send(generate(300, seed=11, failure_rate=0.4, gaps="precondition_verification=0.7:0.05"),
             daemon.http_url, "http/protobuf", "log")  # fmt: skip
        deadline = time.monotonic() + 90
        environments: list[dict] = []
        while time.monotonic() < deadline:
            environments = daemon.get("/api/environments")["items"]
            if environments and all(item["status"] in ("validated", "rejected", "failed") for item in environments):
                break
            time.sleep(0.5)
    finally:
        daemon.stop()
    assert [item["capability"] for item in environments] == [f"precondition_verification.{SERVICE_NAME}"], environments
    environment = environments[0]
    report = environment["validation"]
    assert environment["status"] == "rejected", report
    assert environment["validated_at"] is not None
    # Which tools change state is the daemon's settings' word, stored with the tools the family built on.
    marks = {tool["name"]: tool["state_changing"] for tool in environment["tools"]}
    assert any(marks.values()) and marks == {name: CapabilitySettings().changes_state(name) for name in marks}
    assert report["passed"] is False and report["model"] == str(tiny_model)
    assert [attempt["hint_share"] for attempt in report["attempts"]] == [0.0, 0.25, 0.5]
    assert all(attempt["verdict"] == "too_weak" for attempt in report["attempts"])
    assert report["rollouts"] == 3 * 3 * 2
    assert (tmp_path / "validation" / f"environment-{environment['environment_id']}.request.json").exists()


def test_a_validation_running_past_its_timeout_is_killed_and_failed(
    store: tuple[Store, AnalysisStore, int], tiny_model: Path
) -> None:
    database, analysis, environment_id = store
    validator = Validator(analysis, _settings(database, tiny_model, timeout_s=0.5))
    assert validator.run_pass() == environment_id
    environment = _environment(analysis, environment_id)
    assert environment["status"] == "failed"
    assert environment["validation"] == {"passed": False, "error": "validation timed out after 0.5 s"}
    assert not _gate_processes()


def test_a_model_that_cannot_be_loaded_fails_with_the_reason_from_stderr(
    store: tuple[Store, AnalysisStore, int], tmp_path: Path
) -> None:
    database, analysis, environment_id = store
    validator = Validator(analysis, _settings(database, tmp_path / "no-model"))
    assert validator.run_pass() == environment_id
    environment = _environment(analysis, environment_id)
    error = environment["validation"]["error"]
    assert environment["status"] == "failed"
    assert error.startswith("validation exited with 1:") and "config.json" in error.splitlines()[-1]


def test_stopping_kills_a_running_validation_and_leaves_the_environment_checked(
    store: tuple[Store, AnalysisStore, int], tiny_model: Path
) -> None:
    database, analysis, environment_id = store
    validator = Validator(analysis, _settings(database, tiny_model, seeds=500))
    results: list[int | None] = []
    worker = threading.Thread(target=lambda: results.append(validator.run_pass()))
    worker.start()
    deadline = time.monotonic() + 20
    while not _gate_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    running = _gate_processes()
    assert running and _environment(analysis, environment_id)["status"] == "validating"
    assert validator.run_pass() is None and len(_gate_processes()) == 1  # one gate run at a time
    wait_for(lambda: any(_has_loaded_torch(process) for process in running), timeout_s=60)  # well into the gate's work
    validator.stop()
    worker.join(15)
    assert not worker.is_alive() and results == [None]
    assert not any(process.is_running() and process.status() != psutil.STATUS_ZOMBIE for process in running)
    environment = _environment(analysis, environment_id)
    assert environment["status"] == "checked" and environment["validation"] is None
    assert validator.run_pass() is None  # a stopped validator starts nothing new


def test_environments_left_validating_by_a_killed_daemon_are_checked_again(
    store: tuple[Store, AnalysisStore, int], tiny_model: Path
) -> None:
    database, analysis, environment_id = store
    assert analysis.set_environment_status(environment_id, "checked", "validating")
    assert Validator(analysis, _settings(database, tiny_model)).recover() == 1
    assert _environment(analysis, environment_id)["status"] == "checked"
    assert analysis.environment_to_validate()["environment_id"] == environment_id


def test_envs_validate_prints_the_attempts_and_exits_1_when_the_gate_rejects(tmp_path: Path, tiny_model: Path) -> None:
    config = tmp_path / "tracefix.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "tracefix.duckdb"}"\n[model]\nmax_new_tokens = 8\nthreads = 1\n')
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "envs", "validate", "tool_call_precision", "--tools", str(RETAIL),
         "--seeds", "2", "--group-size", "2", "--model", str(tiny_model), "--config", str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("too_weak") == 3
    assert "50%" in result.stdout and "REJECTED" in result.stdout and "12 rollouts" in result.stdout


REQUEST = {
    "family": FAMILY.name,
    "difficulty": 1,
    "tools": DEFINITIONS,
    "model": {"name": "model", "cache_dir": "cache", "max_new_tokens": 8, "threads": 1},
    "gate": ValidationSettings(**TINY_GATE).model_dump(mode="json"),
}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "cannot read request"),
        (json.dumps(["a list"]), "is not a JSON object"),
        (json.dumps({"family": "x"}), "lacks difficulty, tools, model, gate"),
        (json.dumps({**REQUEST, "model": {"name": "x"}}), "lacks model.cache_dir, model.max_new_tokens"),
        (json.dumps({**REQUEST, "family": "juggling"}), "unknown environment family 'juggling'"),
        (json.dumps({**REQUEST, "tools": [{"nameless": 1}]}), "tool definition without a name"),
    ],
    ids=["not-json", "not-an-object", "missing-fields", "missing-model-fields", "unknown-family", "bad-tools"],
)
def test_a_malformed_request_exits_non_zero_with_a_clear_reason(tmp_path: Path, text: str, reason: str) -> None:
    request, report = tmp_path / "request.json", tmp_path / "report.json"
    request.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.trainer.validate_job", "--request", str(request), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("validation failed: ") and reason in last, result.stderr
    assert "Traceback" not in result.stderr and not report.exists()


def test_a_memory_limit_too_small_for_the_model_is_reported_as_such(tmp_path: Path) -> None:
    request, report = tmp_path / "request.json", tmp_path / "report.json"
    request.write_text(json.dumps({**REQUEST, "gate": {**REQUEST["gate"], "memory_mb": 256}}))
    result = subprocess.run(
        [sys.executable, "-m", "tracefix.trainer.validate_job", "--request", str(request), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and not report.exists()
    assert result.stderr.strip().splitlines()[-1].startswith(
        "validation failed: out of memory under the 256 MB limit ([validation] memory_mb)"
    ), result.stderr
