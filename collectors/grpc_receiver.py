"""OTLP/gRPC receiver: TraceService/Export and LogsService/Export on one grpcio server.

Requests are taken as raw bytes and parsed here, so a malformed message is answered with
INVALID_ARGUMENT and a reason instead of grpcio's generic deserialization failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracefix.collectors.ingest import Ingestor, Pending
from tracefix.collectors.otlp import PayloadError, parse_logs_protobuf, parse_traces_protobuf
from tracefix.daemon.core import metrics
from tracefix.daemon.store.writer import Overloaded, WriterStopped
from tracefix.daemon.core.auth import bearer_matches

_COMMIT_TIMEOUT_S = 60.0


class GrpcReceiver:
    """Serves OTLP over gRPC; `start` binds, `stop` drains in-flight requests first."""

    def __init__(self, ingestor: Ingestor, host: str, port: int, max_body_bytes: int, token: str, workers: int) -> None:
        self.ingestor = ingestor
        self.token = token
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracefix-grpc"),
            options=[
                ("grpc.max_receive_message_length", max_body_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        handlers = {
            "opentelemetry.proto.collector.trace.v1.TraceService": {
                "Export": self._handler("traces", parse_traces_protobuf, ingestor.traces, ExportTraceServiceResponse)
            },
            "opentelemetry.proto.collector.logs.v1.LogsService": {
                "Export": self._handler("logs", parse_logs_protobuf, ingestor.logs, ExportLogsServiceResponse)
            },
        }
        for service, methods in handlers.items():
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot bind OTLP/gRPC to {host}:{port}; is the port in use?")

    def start(self) -> None:
        self.server.start()

    def stop(self, grace_s: float = 10.0) -> None:
        self.server.stop(grace_s).wait()

    def _handler(
        self,
        signal: str,
        parse: Callable[[bytes], Any],
        ingest: Callable[[Any, str], Pending],
        empty_response: type,
    ) -> grpc.RpcMethodHandler:
        def export(body: bytes, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if not self._authorized(context):
                    code = grpc.StatusCode.UNAUTHENTICATED
                    context.abort(code, "missing or wrong bearer token; set the exporter header authorization: Bearer <token>")
                try:
                    pending = ingest(parse(body), "grpc")
                except PayloadError as error:
                    code = grpc.StatusCode.INVALID_ARGUMENT
                    context.abort(code, str(error))
                except (Overloaded, WriterStopped) as error:
                    # UNAVAILABLE is retryable for OTLP exporters.
                    code = grpc.StatusCode.UNAVAILABLE
                    context.abort(code, str(error))
                try:
                    pending.future.result(timeout=_COMMIT_TIMEOUT_S)
                except Exception as error:
                    code = grpc.StatusCode.UNAVAILABLE
                    context.abort(code, f"could not store the request: {error}")
                return pending.response()
            finally:
                metrics.REQUESTS.labels("grpc", signal, code.name).inc()
                metrics.REQUEST_SECONDS.labels("grpc", signal).observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=lambda message: message.SerializeToString()
        )

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        if not self.token:
            return True
        return bearer_matches(dict(context.invocation_metadata()).get("authorization", ""), self.token)
