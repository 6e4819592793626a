"""The daemon process: store, writer, OTLP receivers, background jobs and the API, started and stopped together."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from typing import Any

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler

from tracefix.collectors.grpc_receiver import GrpcReceiver
from tracefix.collectors.http_receiver import HttpReceiver
from tracefix.collectors.ingest import Ingestor
from tracefix.collectors.otlp import Limits
from tracefix.collectors.trajectories import Assembler
from tracefix.daemon.core import generalist, metrics, tracks
from tracefix.daemon.analysis.analyzer import Analyzer
from tracefix.daemon.analysis.judging import LLMJudging
from tracefix.daemon.app.api import create_api
from tracefix.daemon.analysis.registry import build_registry
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.sockets import bind
from tracefix.daemon.core.states import CAPABILITY_STATES, CapabilityState
from tracefix.daemon.store.store import AnalysisStore, Store
from tracefix.daemon.pipeline.synthesis import Synthesizer
from tracefix.daemon.analysis.trigger import Trigger
from tracefix.daemon.promotion.lifecycle import Promotion
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.promotion.router_client import RouterAdmin
from tracefix.daemon.pipeline.training_runner import TrainingRunner
from tracefix.daemon.pipeline.gate_runner import GateRunner
from tracefix.daemon.pipeline.validator import Validator
from tracefix.daemon.store.writer import BatchedWriter
from tracefix.router.protocol import stored_prompt_messages

log = logging.getLogger(__name__)

# A stage of the pipeline that did something hands on at once to the stages after it (and to
# itself, for what else is queued) instead of leaving them to their next interval: a gap's
# environment is validated, trained and taken to the router without 10-second waits between.
FOLLOWING = {
    "analyze": ("judge",),  # new trajectories' rule labels are in: the LLM judges them now
    "trigger": ("synthesize",),
    "synthesize": ("validate",),
    "validate": ("validate", "train"),
    "train": ("train", "promote"),
}


class _PortDispatch:
    """One ASGI server for several listening sockets: each local port maps to its application."""

    def __init__(self, apps: dict[int, Any]) -> None:
        self.apps = apps

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        server = scope.get("server") or (None, None)
        app = self.apps.get(server[1])
        if app is None:  # lifespan events carry no server; every app here is stateless for them
            return
        await app(scope, receive, send)


class Daemon:
    """Everything that runs inside `tracefix daemon`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.monotonic()
        self.store = Store(settings.store)
        self.writer = BatchedWriter(self.store, settings.writer)
        collector = settings.collector
        limits = Limits(
            collector.max_attribute_value_bytes, collector.max_attributes_per_span, collector.max_events_per_span,
            collector.max_links_per_span, collector.max_name_bytes,
        )  # fmt: skip
        self.ingestor = Ingestor(self.writer, limits)
        self.assembler = Assembler(
            self.store, settings.assembler, settings.outcome, lambda: self.writer.committed_batch,
            capability_evaluations=[mapping.name for mapping in settings.capabilities.evaluations],
        )  # fmt: skip
        self.registry = build_registry(settings.capabilities, settings.llm)
        self.analysis_store = AnalysisStore(self.store)
        self.analyzer = Analyzer(self.store, self.registry, settings.analysis, settings.capabilities)
        self.judging = LLMJudging(self.analyzer, settings.llm)
        self.trigger = Trigger(self.store, self.registry, settings.analysis, settings.trigger, settings.capabilities)
        self.synthesizer = Synthesizer(self.analysis_store, self.registry, settings.capabilities)
        self.validator = Validator(self.analysis_store, settings)
        self.runs = RunStore(self.store)
        self.training = TrainingRunner(self.analysis_store, self.runs, settings, render=stored_prompt_messages)
        self.promotion = Promotion(self.store, settings, describe=self.describe, instructions=self.instructions)
        self.router_admin = RouterAdmin(settings)
        self.gates = GateRunner(self.promotion, self.runs, settings, self.router_admin)
        self.last_analysis: dict[str, Any] | None = None
        self.http_receiver = HttpReceiver(self.ingestor, collector.max_body_bytes, collector.token)
        self.grpc_receiver: GrpcReceiver | None = None
        self.scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self.api = create_api(self)
        self.endpoints: dict[str, str] = {}
        self._job_errors: dict[str, str] = {}
        self._runners: dict[str, Any] = {}  # job id -> its wrapped pass (``_schedule``), for ``wake``
        self._woken: list[threading.Thread] = []
        self._woken_lock = threading.Lock()
        self._draining = threading.Event()
        # Jobs that move capability states take turns; the store's compare-and-set guards the rest.
        self._state_lock = threading.Lock()

    def describe(self, name: str) -> str:
        """What the router's classifier reads about a track (and the dashboard about a generalist): its
        capability's description, which an agent's track shares with every other agent's."""
        agent = generalist.agent_of(name)
        if agent:
            return f"the generalist of {agent}: what its successful runs do"
        capability = tracks.capability_of(name)
        return self.registry[capability].description if capability in self.registry else name

    def instructions(self, name: str) -> list[str]:
        """The digests of the system instructions of a track's agent, by which the router recognises
        its requests when they name no agent (none for a bare capability)."""
        agent = tracks.agent_of(name)
        return [tracks.instructions_key(text) for text in self.analysis_store.instructions_of(agent)] if agent else []

    def health(self) -> tuple[bool, list[str]]:
        problems = [f"job {job} failing: {error}" for job, error in self._job_errors.items()]
        if not self.writer.running:
            problems.append("writer thread is not running")
        return not problems, problems

    def _job(self, name: str, function: Any) -> Any:
        def run() -> None:
            try:
                did = function()
                self._job_errors.pop(name, None)
                metrics.JOB_RUNS.labels(name).inc()
            except Exception as error:  # a failing job is logged and counted; the next run retries
                log.exception("job %s failed", name)
                metrics.JOB_FAILURES.labels(name).inc()
                self._job_errors[name] = str(error)
                return
            if did:
                for following in FOLLOWING.get(name, ()):
                    self.wake(following)

        return run

    def wake(self, job_id: str) -> None:
        """Run the job's pass now, on a thread of its own, instead of at its next interval (nothing
        once the daemon drains, or for a job it does not run). Each pass guards itself against
        another running (the state lock, a pass lock, the promotion's turn), as its scheduled
        instances already rely on. (Moving the job's next run time in the scheduler instead lost
        the analysis job's schedule under load.)"""
        runner = self._runners.get(job_id)
        if runner is None or self._draining.is_set():
            return
        thread = threading.Thread(target=runner, name=f"wake-{job_id}", daemon=True)
        with self._woken_lock:
            self._woken = [item for item in self._woken if item.is_alive()] + [thread]
        thread.start()

    def _serialized(self, function: Any) -> Any:
        def run() -> Any:
            with self._state_lock:
                return function()

        return run

    def _assemble(self) -> None:
        # Ingest first: while exporters are sending, assemble in small passes so no pass holds
        # the interpreter long enough to stall a request; catch up fully once ingest is quiet.
        settings = self.settings.assembler
        if self.writer.busy(settings.idle_s):
            self.assembler.run_pass(settings.busy_traces_per_pass)
        else:
            for _ in range(50):
                if not self.assembler.run_pass():
                    break
        metrics.ASSEMBLER_LAG.set(max(0, self.writer.committed_batch - self.assembler.assembled_batch))

    def _analyze(self) -> int:
        result = self.analyzer.run_pass()
        self.last_analysis = {
            "pass_id": result.pass_id,
            "labeled": result.labeled,
            "seconds": round(result.seconds, 3),
            "at": time.time(),
        }
        return result.labeled

    def _retention(self) -> None:
        cutoff = time.time_ns() - int(self.settings.retention.span_days * 86400 * 1e9)
        spans, logs = self.analysis_store.delete_spans_before(cutoff)
        if spans or logs:
            log.info("retention removed %d spans and %d log records", spans, logs)

    def capability_overview(self) -> list[dict[str, Any]]:
        """Each capability with its state, open training request and latest statistics per window."""
        stats: dict[str, dict[str, Any]] = {}
        for row in self.analysis_store.stats():
            stats.setdefault(row["capability"], {})[row["window_name"]] = row
        selection = self.settings.analysis.selection_window
        by_capability = self.capability_tracks()
        items = []
        for capability in self.registry:
            own = by_capability.get(capability.name, [])
            # The furthest track along the pipeline speaks for the capability; each agent's is listed.
            state = max(own, key=lambda track: (CAPABILITY_STATES.index(track["state"]) if track["state"] in CAPABILITY_STATES else 0), default={})
            windows = stats.get(capability.name, {})
            chosen = windows.get(selection, {})
            items.append(
                {
                    "name": capability.name,
                    "description": capability.description,
                    "labeler": capability.labeler.name,
                    "labeler_version": capability.labeler.version,
                    "environment_family": capability.environment_family,
                    "builtin": capability.builtin,
                    "state": state.get("state", CapabilityState.HEALTHY),
                    "state_since": state.get("state_since"),
                    "state_reason": state.get("state_reason", "not analyzed yet"),
                    "state_agent": state.get("agent"),
                    "selected": bool(chosen.get("selected")) or any(track["selected"] for track in own),
                    "rank": chosen.get("rank"),
                    "open_training_request": state.get("open_training_request"),
                    "windows": windows,
                    "tracks": own,
                }
            )
        items.sort(key=lambda item: (item["rank"] is None, item["rank"] or 0, item["name"]))
        return items

    def capability_tracks(self, agent: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Per capability, its tracks (``daemon.core.tracks``: one agent's loop each; `agent`'s only
        when given) with their state, open training request and whether the agent's own statistics
        select it now."""
        window = self.settings.analysis.selection_window
        rows = [row for row in self.analysis_store.stats(agent=agent) if row["window_name"] == window]
        selected = {tracks.name(row["capability"], row["agent"]): bool(row["selected"]) for row in rows}
        states = self.analysis_store.states()
        names = set(self.registry.names())
        wanted = None if agent is None else tracks.safe(agent)
        found: dict[str, list[dict[str, Any]]] = {}
        for track in sorted(set(states) | set(selected)):
            capability, owner = tracks.capability_of(track), tracks.agent_of(track)
            if capability not in names or (wanted is not None and owner != wanted):
                continue
            state = states.get(track, {})
            found.setdefault(capability, []).append(
                {
                    "track": track,
                    "agent": owner,
                    "state": state.get("state", CapabilityState.HEALTHY),
                    "state_since": state.get("state_since"),
                    "state_reason": state.get("reason", "not analyzed yet"),
                    "selected": selected.get(track, False),
                    "open_training_request": self.analysis_store.open_training_request(track),
                }
            )
        return found

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM, then drain: receivers stop, queued rows commit, the file closes."""
        collector, api = self.settings.collector, self.settings.api
        # DuckDB's commit reacquires the GIL while scanning the Arrow batch; with the default 5 ms
        # switch interval every reacquisition waits behind request decoding (commits ran 7x slower).
        sys.setswitchinterval(0.0005)
        sockets: list[socket.socket] = []
        apps: dict[int, Any] = {}
        try:
            api_socket = bind(api.host, api.port)
            sockets.append(api_socket)
            apps[api_socket.getsockname()[1]] = self.api
            self.endpoints["api"] = f"http://{api.host}:{api_socket.getsockname()[1]}"
            if collector.http_port:
                http_socket = bind(collector.host, collector.http_port)
                sockets.append(http_socket)
                apps[http_socket.getsockname()[1]] = self.http_receiver.app
                self.endpoints["otlp_http"] = f"http://{collector.host}:{http_socket.getsockname()[1]}"
            self.writer.start()
            if collector.grpc_port:
                self.grpc_receiver = GrpcReceiver(
                    self.ingestor,
                    collector.host,
                    collector.grpc_port,
                    collector.max_body_bytes,
                    collector.token,
                    collector.grpc_workers,
                )
                self.grpc_receiver.start()
                self.endpoints["otlp_grpc"] = f"{collector.host}:{self.grpc_receiver.port}"
            self._schedule()
            self.scheduler.start()
            log.info("tracefix daemon serving %s", self.endpoints)
            if self.settings.collector.open_to_anyone:
                log.warning(
                    "the collector on %s accepts traces from anyone who can reach it ([collector] accept_anyone = true, no token):"
                    " what they send becomes training data", self.settings.collector.host,
                )  # fmt: skip
            # uvicorn re-raises the signal it caught once it has stopped serving; with these
            # handlers in place that is a no-op, so the drain below always runs.
            for stop_signal in (signal.SIGINT, signal.SIGTERM):
                signal.signal(stop_signal, self._stop_requested)
            config = uvicorn.Config(
                _PortDispatch(apps), lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=10
            )
            uvicorn.Server(config).run(sockets=sockets)
        finally:
            self.shutdown(sockets)

    def _schedule(self) -> None:
        """The periodic jobs (started by ``run``); ``FOLLOWING`` wakes some of them early."""
        self.validator.recover()
        self.training.recover()
        analysis, promotion = self.settings.analysis.interval_s, self.settings.promotion.interval_s
        jobs = (  # (id, what it runs, its interval, instances at once)
            ("assemble", self._assemble, self.settings.assembler.interval_s, 1),
            ("analyze", self._analyze, analysis, 1),
            ("trigger", self._serialized(self.trigger.run_pass), analysis, 1),
            ("synthesize", self._serialized(self.synthesizer.run_pass), analysis, 1),
            # Not serialized: a gate run takes minutes and moves no capability state. A second
            # instance returns at once while one runs, instead of a "skipped" warning each interval.
            ("validate", self.validator.run_pass, analysis, 2),
            # Moves capability states with compare-and-set; a run takes minutes, so not serialized.
            ("train", self.training.run_pass, analysis, 2),
            ("promote", lambda: self.promotion.run_pass(self.router_admin), promotion, 1),
            # A gate run takes minutes; a second instance returns at once while one runs.
            ("gate", self.gates.run_pass, promotion, 2),
            ("retention", self._retention, self.settings.retention.interval_s, 1),
        )
        if self.judging.capabilities:
            # LLM labels, judged beside the analysis; a pass runs as long as there is work, and a
            # second instance returns at once while one runs, instead of a "skipped" warning.
            jobs += (("judge", self.judging.run_pass, analysis, 2),)
        for job_id, function, seconds, instances in jobs:
            self._runners[job_id] = self._job(job_id, function)
            self.scheduler.add_job(self._runners[job_id], "interval", seconds=seconds, id=job_id, max_instances=instances)

    def _stop_requested(self, signum: int, frame: Any) -> None:
        log.info("received %s; draining", signal.Signals(signum).name)

    def shutdown(self, sockets: list[socket.socket]) -> None:
        self._draining.set()  # no more woken passes
        if self.grpc_receiver is not None:
            self.grpc_receiver.stop()
        self.validator.stop()  # else the scheduler would wait for a model run to finish
        self.judging.stop()  # nor for the LLM's judgements in flight
        self.training.stop()
        self.gates.stop()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        with self._woken_lock:
            woken = list(self._woken)
        for thread in woken:
            thread.join()
        self.writer.stop()
        self.router_admin.close()
        for sock in sockets:
            sock.close()
        self.store.close()
        log.info("tracefix daemon stopped")
