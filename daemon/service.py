"""The daemon process: store, writer, OTLP receivers, background jobs and the API, started and stopped together."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler

from collectors.grpc_receiver import GrpcReceiver
from collectors.http_receiver import HttpReceiver
from collectors.ingest import Ingestor
from collectors.otlp import Limits
from collectors.trajectories import Assembler
from daemon import metrics
from daemon.api import create_api
from daemon.settings import Settings
from daemon.store import Store
from daemon.writer import BatchedWriter

log = logging.getLogger(__name__)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot bind {host}:{port} ({error.strerror}); is another tracefix running?") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


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
            collector.max_attribute_value_bytes, collector.max_attributes_per_span, collector.max_events_per_span
        )
        self.ingestor = Ingestor(self.writer, limits)
        self.assembler = Assembler(self.store, settings.assembler, settings.outcome)
        self.http_receiver = HttpReceiver(self.ingestor, collector.max_body_bytes, collector.token)
        self.grpc_receiver: GrpcReceiver | None = None
        self.scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self.api = create_api(self)
        self.endpoints: dict[str, str] = {}
        self._job_errors: dict[str, str] = {}

    def health(self) -> tuple[bool, list[str]]:
        problems = [f"job {job} failing: {error}" for job, error in self._job_errors.items()]
        if not self.writer.running:
            problems.append("writer thread is not running")
        return not problems, problems

    def _job(self, name: str, function: Any) -> Any:
        def run() -> None:
            try:
                function()
                self._job_errors.pop(name, None)
            except Exception as error:  # a failing job is logged and counted; the next run retries
                log.exception("job %s failed", name)
                metrics.JOB_FAILURES.labels(name).inc()
                self._job_errors[name] = str(error)

        return run

    def _assemble(self) -> None:
        self.assembler.run_pass()
        metrics.ASSEMBLER_LAG.set(max(0, self.writer.committed_batch - self.assembler.position[0]))

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM, then drain: receivers stop, queued rows commit, the file closes."""
        collector, api = self.settings.collector, self.settings.api
        sockets: list[socket.socket] = []
        apps: dict[int, Any] = {}
        try:
            api_socket = _bind(api.host, api.port)
            sockets.append(api_socket)
            apps[api_socket.getsockname()[1]] = self.api
            self.endpoints["api"] = f"http://{api.host}:{api_socket.getsockname()[1]}"
            if collector.http_port:
                http_socket = _bind(collector.host, collector.http_port)
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
            self.scheduler.add_job(
                self._job("assemble", self._assemble),
                "interval",
                seconds=self.settings.assembler.interval_s,
                id="assemble",
            )
            self.scheduler.start()
            log.info("tracefix daemon serving %s", self.endpoints)
            config = uvicorn.Config(
                _PortDispatch(apps), lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=10
            )
            uvicorn.Server(config).run(sockets=sockets)
        finally:
            self.shutdown(sockets)

    def shutdown(self, sockets: list[socket.socket]) -> None:
        if self.grpc_receiver is not None:
            self.grpc_receiver.stop()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self.writer.stop()
        for sock in sockets:
            sock.close()
        self.store.close()
        log.info("tracefix daemon stopped")
