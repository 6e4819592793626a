"""LLM labels off the critical path: the analysis pass labels the rule capabilities and computes the
statistics at once, while `LLMJudging` judges the LLM's capabilities beside it, concurrently, newest
first, within [llm] concurrency and calls_per_minute, and shows its progress in /api/status.

The model is a real OpenAI-compatible HTTP server on 127.0.0.1 (tests/test_llm_labeler.py's fixture
replayer) that sleeps before answering: for a set delay, and for as long as a test holds it. The
store is a real DuckDB file with trajectories assembled from real OTLP; the daemon tests run
`tracefix daemon` as a process.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse

from tracefix.collectors.trajectories import Assembler
from tracefix.daemon.analysis import llm_client
from tracefix.daemon.analysis.analyzer import Analyzer
from tracefix.daemon.analysis.judging import LLMJudging
from tracefix.daemon.analysis.llm_client import CallBudget, ChatClient
from tracefix.daemon.analysis.llm_labeler import llm_capabilities
from tracefix.daemon.analysis.registry import build_registry
from tracefix.daemon.core.settings import (
    AnalysisSettings, AssemblerSettings, CapabilitySettings, LLMSettings, OutcomeSettings, StoreSettings, WriterSettings,
)  # fmt: skip
from tracefix.daemon.store.store import Store
from tracefix.daemon.store.writer import BatchedWriter
from examples.traffic import generate, send
from tests.conftest import REPO, RunningDaemon, make_daemon, wait_for
from tests.otlp_builders import commit_json_spans, json_span, new_span_id, new_trace_id
from tests.test_llm_labeler import FixtureServer

CUSTOM = "keeps_the_user_informed"  # answered by tests/fixtures/llm/judging_keeps_the_user_informed.json
DESCRIPTION = "Tells the user what it did and what happens next."
RULE = "tool_call_precision"
MODEL = "qwen2.5-7b-instruct"
_TRAJECTORY = re.compile(r"Trajectory: (\S+)")


class SlowServer(FixtureServer):
    """The fixture replayer, answering after `delay_s` and not before `release()` while held; it
    counts the requests in flight at once and records when each arrived (time.monotonic)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self._held = threading.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.arrivals: list[float] = []

    def hold(self) -> None:
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    async def chat(self, request: Request) -> JSONResponse:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.arrivals.append(time.monotonic())
        try:
            await asyncio.sleep(self.delay_s)
            while self._held.is_set():
                await asyncio.sleep(0.02)
            return await super().chat(request)
        finally:
            with self.lock:
                self.in_flight -= 1

    def judged_ids(self) -> list[str]:
        """The trajectory of each request, in the order they arrived."""
        with self.lock:
            return [_TRAJECTORY.search(prompt).group(1) for prompt in self.prompts()]


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    server = SlowServer().start()
    yield server
    server.release()
    server.stop()


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_client, "RETRY_BACKOFF_S", 0.0)


# -- in process: a store, the analyzer, and the judging of one custom capability ------------------


def commit_and_assemble(store: Store, batches: list[list[dict[str, Any]]]) -> None:
    """Each batch of JSON spans committed by a real writer, then assembled, in turn."""
    writer = BatchedWriter(store, WriterSettings())
    writer.start()
    assembler = Assembler(store, AssemblerSettings(), OutcomeSettings(), lambda: writer.committed_batch)
    try:
        for spans in batches:
            commit_json_spans(writer, spans)
            assembler.run_until_idle()
    finally:
        writer.stop()


def assembled_store(path: Path, count: int) -> tuple[Store, list[str]]:
    """`count` trajectories, each assembled in a batch of its own: ids oldest first."""
    store = Store(StoreSettings(path=path))
    commit_and_assemble(store, [
        [json_span(new_trace_id(), new_span_id(), "invoke_agent", attributes={"tracefix.outcome": "failure" if index % 2 else "success"})]
        for index in range(count)
    ])  # fmt: skip
    rows = store.query("SELECT trajectory_id FROM trajectories ORDER BY updated_batch")
    return store, [row["trajectory_id"] for row in rows]


def judging_for(store: Store, server: SlowServer, budget: CallBudget | None = None, **llm: Any) -> tuple[Analyzer, LLMJudging]:
    """The analyzer of the built-in rules plus CUSTOM (labeled by the LLM at `server`), and its judging."""
    settings = LLMSettings(
        enabled=True, base_url=server.base_url, model=MODEL, custom=[{"name": CUSTOM, "description": DESCRIPTION}], **llm
    )
    client = ChatClient(server.base_url, MODEL, timeout_s=30, budget=budget or CallBudget(settings.calls_per_minute))
    registry = build_registry(CapabilitySettings())
    for capability in llm_capabilities(settings, {c.name: c.description for c in registry}, client):
        registry.add(capability)
    analyzer = Analyzer(store, registry, AnalysisSettings(error_retry_s=3600))
    return analyzer, LLMJudging(analyzer, settings)


def judged_in_store(store: Store) -> list[str]:
    return [row["trajectory_id"] for row in store.query("SELECT trajectory_id FROM labels WHERE capability = ?", [CUSTOM])]


def test_the_analysis_pass_calls_no_llm_and_the_judging_takes_the_newest_trajectories_first(
    tmp_path: Path, slow_server: SlowServer
) -> None:
    store, oldest_first = assembled_store(tmp_path / "tracefix.duckdb", 5)
    analyzer, judging = judging_for(store, slow_server, concurrency=1, runs=1)
    try:
        analysis = analyzer.run_pass()
        assert slow_server.requests == []  # rule labels and statistics never wait for the model
        assert analysis.labeled == 5 and judged_in_store(store) == []
        labeled = store.query("SELECT DISTINCT trajectory_id FROM labels WHERE capability = ?", [RULE])
        assert {row["trajectory_id"] for row in labeled} == set(oldest_first)
        assert {row["capability"] for row in store.query("SELECT capability FROM capability_stats")} >= {RULE}

        assert judging.run_pass() == 5
        assert slow_server.judged_ids() == oldest_first[::-1]  # newest first
        assert sorted(judged_in_store(store)) == sorted(oldest_first)
        assert judging.status()["pending"] == 0 and judging.status()["judged"] == 5
        assert judging.run_pass() == 0 and len(slow_server.requests) == 5  # nothing judged twice

        analyzer.run_pass()  # the statistics count the judgements written meanwhile
        stats = {row["capability"]: row for row in store.query("SELECT * FROM capability_stats WHERE window_name = 'all' "
                                                               "AND pass_id = (SELECT max(pass_id) FROM capability_stats)")}  # fmt: skip
        assert stats[CUSTOM]["needed_success"] + stats[CUSTOM]["needed_failure"] == 5
    finally:
        judging.stop()
        store.close()


def test_a_trajectory_reassembled_after_its_judgement_is_judged_again_and_only_it(tmp_path: Path, slow_server: SlowServer) -> None:
    store, oldest_first = assembled_store(tmp_path / "tracefix.duckdb", 3)
    analyzer, judging = judging_for(store, slow_server, concurrency=1, runs=1)
    try:
        analyzer.run_pass()
        assert judging.run_pass() == 3 and judging.run_pass() == 0
        # A late span of the oldest trajectory's trace: the assembler updates that trajectory.
        trace_id = store.query("SELECT trace_ids FROM trajectories WHERE trajectory_id = ?", [oldest_first[0]])[0]["trace_ids"][0]
        commit_and_assemble(store, [[json_span(trace_id, new_span_id(), "chat", attributes={"gen_ai.operation.name": "chat"})]])
        assert judging.run_pass() == 1
        assert slow_server.judged_ids() == oldest_first[::-1] + [oldest_first[0]]
    finally:
        judging.stop()
        store.close()


def test_the_calls_per_minute_budget_holds_over_its_window(tmp_path: Path, slow_server: SlowServer) -> None:
    store, _ = assembled_store(tmp_path / "tracefix.duckdb", 8)
    budget = CallBudget(3, window_s=1.0)  # [llm] calls_per_minute = 3, over a one-second window
    _, judging = judging_for(store, slow_server, budget, concurrency=4, runs=1)
    try:
        started = time.monotonic()
        assert judging.run_pass() == 8
        arrivals = slow_server.arrivals
        assert len(arrivals) == 8 and budget.recent() == 8
        # Calls 0-2 at once, 3-5 a window later, 6-7 two windows later: never 4 in one window.
        assert all(arrivals[index + 3] - arrivals[index] >= 0.9 for index in range(len(arrivals) - 3)), arrivals
        assert arrivals[-1] - started >= 1.9
        assert slow_server.most_in_flight <= 3
    finally:
        judging.stop()
        store.close()


def test_a_stopped_pass_returns_at_once_and_a_restart_judges_only_what_was_not_judged(
    tmp_path: Path, slow_server: SlowServer
) -> None:
    store, ids = assembled_store(tmp_path / "tracefix.duckdb", 8)
    try:
        slow_server.delay_s = 2.0
        _, judging = judging_for(store, slow_server, concurrency=2, runs=1)
        passes: list[int] = []
        thread = threading.Thread(target=lambda: passes.append(judging.run_pass()), daemon=True)
        thread.start()
        wait_for(lambda: len(judged_in_store(store)) >= 2 and slow_server.in_flight == 2, timeout_s=20, poll_s=0.05)
        stopping = time.monotonic()
        judging.stop()  # two requests are in flight, two seconds from their answers
        thread.join(5)
        assert not thread.is_alive() and time.monotonic() - stopping < 1.5  # it did not wait for them
        judged = judged_in_store(store)
        assert passes == [len(judged)] and 2 <= len(judged) < 8
        assert judging.run_pass() == 0  # a stopped judging takes no new work

        slow_server.delay_s = 0.0
        asked_before = len(slow_server.requests)
        _, restarted = judging_for(store, slow_server, concurrency=2, runs=1)  # the daemon started again
        assert restarted.run_pass() == 8 - len(judged)
        asked_after = slow_server.judged_ids()[asked_before:]
        assert sorted(asked_after) == sorted(set(ids) - set(judged))  # each once, none judged before
        assert sorted(judged_in_store(store)) == sorted(ids)
        restarted.stop()
    finally:
        store.close()


# -- the daemon: /api/status, `tracefix status`, the dashboard ------------------------------------


def judging_daemon(directory: Path, base_url: str, **llm: Any) -> RunningDaemon:
    """A daemon with the LLM labeler on for CUSTOM at `base_url` (started by the caller)."""
    daemon = make_daemon(
        directory,
        analysis={"interval_s": 0.5, **llm.pop("analysis", {})},
        llm={"enabled": True, "base_url": base_url, "model": MODEL, "timeout_s": 60, **llm},
    )
    custom = f'\n[[llm.custom]]\nname = "{CUSTOM}"\ndescription = "{DESCRIPTION}"\n'
    daemon.config_path.write_text(daemon.config_path.read_text() + custom)
    return daemon


def counted(daemon: RunningDaemon, capability: str) -> int:
    """Trajectories the latest statistics count for `capability` (window 'all')."""
    item = next(item for item in daemon.get("/api/capabilities")["items"] if item["name"] == capability)
    window = item["windows"].get("all") or {}
    return sum(window.get(key) or 0 for key in ("n_success", "n_failure", "n_unknown"))


def status_cli(daemon: RunningDaemon) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tracefix.daemon.app.cli", "status", "--config", str(daemon.config_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def test_rule_labels_and_statistics_come_first_while_a_slow_llm_judges_concurrently_beside_them(
    tmp_path: Path, slow_server: SlowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_server.delay_s = 0.05
    slow_server.hold()  # the model answers nothing until released
    daemon = judging_daemon(tmp_path, slow_server.base_url, concurrency=3, runs=2).start()
    try:
        # Outcomes on the root spans: outcome logs committed after the spans reassemble a trajectory,
        # and one judged before that is rightly judged again, which would make the counts below race.
        send(generate(12, seed=11, failure_rate=0.4, gaps="none"), daemon.http_url, "http/protobuf", "attribute")
        assert daemon.wait_analyzed(timeout_s=60) is not None
        wait_for(lambda: counted(daemon, RULE) == 12)
        assert counted(daemon, CUSTOM) == 0
        # Three requests at once, no more, while every trajectory waits for its judgement.
        llm = wait_for(lambda: (block := daemon.status()["llm"])["in_flight"] == 3 and block["pending"] == 12 and block)
        assert slow_server.in_flight == 3 and llm["judged"] == 0 and llm["concurrency"] == 3
        trajectory = daemon.get("/api/trajectories", limit=1)["items"][0]["trajectory_id"]
        labeled = {label["capability"] for label in daemon.get(f"/api/trajectories/{trajectory}")["labels"]}
        assert RULE in labeled and CUSTOM not in labeled
        assert "llm labels: 12 pending, 3 in flight, 0 judged" in status_cli(daemon)

        slow_server.release()
        try:
            llm = wait_for(lambda: (block := daemon.status()["llm"])["pending"] == 0 and block["judged"] == 12 and block, timeout_s=60)
        except TimeoutError as error:  # where the judging stood, for the failure's diagnosis
            raise AssertionError(
                f"judging unfinished: {daemon.status()['llm']}; the model server has {slow_server.in_flight} in flight "
                f"of {len(slow_server.requests)} requests; daemon log: {daemon.log_path.read_text()[-2000:]}"
            ) from error
        assert slow_server.most_in_flight == 3  # bounded, and concurrent
        assert len(slow_server.requests) == 12 * 2  # two runs each, nothing judged twice
        assert llm["endpoint_answering"] is True and llm["last_error"] is None
        # All 24 calls were made; those of the last minute are at most all of them (a slow machine may take longer).
        assert llm["calls"] == 24 and 0 < llm["calls_last_minute"] <= 24 and 0 < llm["judged_last_minute"] <= 12
        wait_for(lambda: counted(daemon, CUSTOM) == 12)  # the next statistics count the judgements
        output = status_cli(daemon)
        assert "llm labels: 0 pending, 0 in flight, 12 judged by this daemon" in output
        assert "budget 60 calls/min, concurrency 3" in output and "llm endpoint: answering" in output

        from streamlit.testing.v1 import AppTest

        monkeypatch.setenv("TRACEFIX_CONFIG", str(daemon.config_path))
        page = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60).run()
        assert not page.exception, [item.value for item in page.exception]
        assert any(caption.value.startswith("LLM labels: 0 pending, 0 in flight, 12 judged") for caption in page.caption)
    finally:
        slow_server.release()
        daemon.stop()


def test_an_endpoint_that_is_down_shows_its_error_and_its_pairs_are_judged_once_it_answers(tmp_path: Path) -> None:
    server = SlowServer()  # its port is bound but nothing listens yet: connection refused
    daemon = judging_daemon(
        tmp_path, server.base_url, concurrency=2, runs=1, max_retries=0, analysis={"error_retry_s": 1.0}
    ).start()
    try:
        send(generate(6, seed=12, failure_rate=0.5, gaps="none"), daemon.http_url, "http/protobuf", "log")
        daemon.wait_analyzed(timeout_s=60)
        wait_for(lambda: counted(daemon, RULE) == 6)  # the rules do not wait for the endpoint
        llm = wait_for(lambda: (block := daemon.status()["llm"])["last_error"] and block)
        assert llm["last_error"]["message"].startswith(f"llm unavailable: cannot reach {server.base_url}/chat/completions")
        assert "refused" in llm["last_error"]["message"].lower()
        assert llm["endpoint_answering"] is False and llm["last_answer_at"] is None and llm["judged"] == 0
        assert daemon.status()["healthy"]  # the daemon itself is fine
        output = status_cli(daemon)
        assert "llm endpoint: NOT answering (no answer yet)" in output and "llm unavailable: cannot reach" in output

        server.start()  # the endpoint comes back: pairs in ERROR and those never tried are judged
        llm = wait_for(
            lambda: (block := daemon.status()["llm"])["pending"] == 0 and block["errored"] == 0 and block["judged"] == 6 and block,
            timeout_s=60,
        )
        assert llm["endpoint_answering"] is True
        assert sorted(set(server.judged_ids())) == sorted(item["trajectory_id"] for item in daemon.get("/api/trajectories")["items"])
    finally:
        daemon.stop()
        if server.thread.is_alive():
            server.stop()
        else:
            server.sock.close()


def test_a_daemon_stopped_while_the_model_holds_its_requests_exits_at_once(tmp_path: Path, slow_server: SlowServer) -> None:
    slow_server.hold()
    daemon = judging_daemon(tmp_path, slow_server.base_url, concurrency=2, runs=1, timeout_s=60).start()
    send(generate(4, seed=13, failure_rate=0.5, gaps="none"), daemon.http_url, "http/protobuf", "log")
    wait_for(lambda: slow_server.in_flight == 2)
    stopping = time.monotonic()
    assert daemon.stop(timeout_s=60) == 0
    assert time.monotonic() - stopping < 10  # not the 60 s the requests in flight may take
