"""Failed runs that no rule explains: `GET /api/capabilities` and `tracefix capabilities` say what the
rules cannot see and which settings add a labeler that can, exactly when only rules label the runs.

The traffic is the demo agent's (examples/traffic.py) over real OTLP, with no gap planted: 30 of its
60 runs fail, and every capability lacks with the same small chance in failed and successful runs.
It is recorded once; each configuration runs a real daemon on its own copy of that database.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tracefix.daemon.app import cli_common as cli
from examples.traffic import generate, send
from tests.conftest import REPO, RunningDaemon, free_port, make_daemon

RUNS, FAILURE_RATE = 60, 0.5
FAILED = round(RUNS * FAILURE_RATE)
SETTINGS = ("[llm] enabled = true", "base_url", "[[llm.custom]]", "[[capabilities.evaluations]]", "docs/capabilities.md")


def _record(directory: Path, gaps: str, seed: int) -> Path:
    """Send the demo agent's runs to a daemon, let it analyze them, stop it; the database stays."""
    daemon = make_daemon(directory, analysis={"interval_s": 0.5}).start()
    try:
        send(generate(RUNS, seed=seed, failure_rate=FAILURE_RATE, gaps=gaps), daemon.http_url, "http/protobuf", "log")
        daemon.wait_analyzed(timeout_s=60)
    finally:
        daemon.stop()
    return directory / "tracefix.duckdb"


@pytest.fixture(scope="module")
def unexplained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database of 60 runs, 30 failed, with no gap any rule could find."""
    return _record(tmp_path_factory.mktemp("unexplained"), "none", seed=21)


@contextmanager
def daemon_on(database: Path, directory: Path, extra_toml: str = "", **sections: dict[str, Any]) -> Iterator[RunningDaemon]:
    """A daemon with `sections` (and `extra_toml` appended to its config) on a copy of `database`, analyzed."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(database, directory / "tracefix.duckdb")
    daemon = make_daemon(directory, analysis={"interval_s": 0.5, **sections.pop("analysis", {})}, **sections)
    if extra_toml:
        daemon.config_path.write_text(daemon.config_path.read_text() + extra_toml)
    daemon.start()
    try:
        daemon.wait_analyzed(timeout_s=60)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def diagnosed(unexplained: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """Rules only, and exactly [analysis] min_failures failed runs."""
    with daemon_on(unexplained, tmp_path_factory.mktemp("diagnosed"), analysis={"min_failures": FAILED}) as daemon:
        yield daemon


def _cli(daemon: RunningDaemon, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "capabilities", *arguments, "--config", str(daemon.config_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def test_failures_no_rule_explains_get_a_diagnosis_naming_the_settings_that_add_a_labeler(diagnosed: RunningDaemon) -> None:
    response = diagnosed.get("/api/capabilities")
    items, diagnosis = response["items"], response["diagnosis"]
    assert {item["name"] for item in items} == set(diagnosed.status()["capabilities"])  # the list is unchanged
    assert not any(item["selected"] for item in items)
    assert diagnosis["kind"] == "rules_only_unexplained_failures"
    assert diagnosis["failed"] == FAILED == diagnosed.status()["outcomes"]["failure"]
    assert diagnosis["message"].startswith(f"{FAILED} failed runs, yet no capability is selected")
    for setting in SETTINGS:
        assert setting in diagnosis["message"], setting
    assert {"[llm] enabled = true", "[[llm.custom]]", "[[capabilities.evaluations]]"} <= set(diagnosis["settings"])


def test_cli_prints_the_diagnosis_below_its_table_and_in_its_json(diagnosed: RunningDaemon) -> None:
    expected = diagnosed.get("/api/capabilities")["diagnosis"]
    shown = json.loads(_cli(diagnosed, "--json").stdout)
    assert shown["diagnosis"] == expected
    assert {item["name"] for item in shown["items"]} == set(diagnosed.status()["capabilities"])
    table = _cli(diagnosed).stdout
    flat = " ".join(table.split())
    assert " ".join(expected["message"].split()) in flat  # [llm] and [[llm.custom]] printed, not eaten as markup
    assert table.index("└") < table.index(f"{FAILED} failed runs, yet")  # below the table
    # No capability is selected: every rank is missing and reads "—", never None or nan.
    ranks = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    assert [rank for rank in ranks if rank] == ["—"] * len(shown["items"]), table
    assert "None" not in table and "nan" not in table


def test_no_diagnosis_with_fewer_failed_runs_than_min_failures(unexplained: Path, tmp_path: Path) -> None:
    with daemon_on(unexplained, tmp_path, analysis={"min_failures": FAILED + 1}) as daemon:
        response = daemon.get("/api/capabilities")
        assert response["diagnosis"] is None
        assert not any(item["selected"] for item in response["items"])
        assert "failed runs, yet" not in _cli(daemon).stdout


def test_no_diagnosis_when_the_llm_labeler_is_enabled(unexplained: Path, tmp_path: Path) -> None:
    llm = {"enabled": True, "base_url": f"http://127.0.0.1:{free_port()}/v1"}
    with daemon_on(unexplained, tmp_path, analysis={"min_failures": FAILED}, llm=llm) as daemon:
        response = daemon.get("/api/capabilities")
        assert response["diagnosis"] is None
        assert not any(item["selected"] for item in response["items"])


def test_no_diagnosis_when_an_evaluator_is_mapped_to_a_capability(unexplained: Path, tmp_path: Path) -> None:
    mapping = (
        '[[capabilities.evaluations]]\nname = "policy_adherence"\ncapability = "policy_adherence"\n'
        'description = "Follows the airline policy"\nlacking_labels = ["violated"]\npresent_labels = ["followed"]\n'
    )
    with daemon_on(unexplained, tmp_path, mapping, analysis={"min_failures": FAILED}) as daemon:
        response = daemon.get("/api/capabilities")
        assert response["diagnosis"] is None
        assert "policy_adherence" in {item["name"] for item in response["items"]}  # the mapping was read
        assert not any(item["selected"] for item in response["items"])


def test_no_diagnosis_when_a_capability_is_selected(tmp_path_factory: pytest.TempPathFactory) -> None:
    database = _record(tmp_path_factory.mktemp("gap"), "precondition_verification=0.9:0.0", seed=22)
    with daemon_on(database, tmp_path_factory.mktemp("selected"), analysis={"min_failures": 20}) as daemon:
        response = daemon.get("/api/capabilities")
        selected = [item["name"] for item in response["items"] if item["selected"]]
        assert selected == ["precondition_verification"]
        assert max(item["windows"]["all"]["n_failure"] for item in response["items"]) == FAILED
        assert response["diagnosis"] is None


def test_missing_statistics_read_as_a_dash_in_the_cli_table() -> None:
    for missing in (None, math.nan):
        assert cli.rate_text(missing) == "—"
        assert cli.rank_text(missing) == "—"
        assert cli.interval_text(missing, 0.4) == cli.interval_text(0.1, missing) == ""
    assert cli.rate_text(0.254) == "0.25" and cli.rank_text(2) == "2" and cli.interval_text(0.1, 0.4) == " [0.10–0.40]"
