"""The path every transport shares: decode an export request, hand its rows to the writer, count it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tracefix.collectors.otlp import Decoded, Limits, decode_logs, decode_spans
from tracefix.daemon.core import metrics
from tracefix.daemon.store.writer import BatchedWriter

Signal = Literal["traces", "logs"]


@dataclass(slots=True)
class Pending:
    """A decoded request whose rows wait for their commit."""

    signal: Signal
    transport: str
    decoded: Decoded
    future: Future

    def response(self) -> ExportTraceServiceResponse | ExportLogsServiceResponse:
        """The OTLP response, with partial_success when some rows were rejected."""
        accepted = self.decoded.accepted
        metrics.SPANS_ACCEPTED.labels(self.transport, self.signal).inc(accepted)
        rejected, message = self.decoded.rejected_count, self.decoded.rejection_message()
        if self.signal == "traces":
            response = ExportTraceServiceResponse()
            if rejected:
                response.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))
            return response
        response = ExportLogsServiceResponse()
        if rejected:
            response.partial_success.CopyFrom(
                ExportLogsPartialSuccess(rejected_log_records=rejected, error_message=message)
            )
        return response


class Ingestor:
    """Decodes OTLP requests from any transport and submits them to the batched writer."""

    def __init__(self, writer: BatchedWriter, limits: Limits) -> None:
        self.writer = writer
        self.limits = limits

    def traces(self, request: ExportTraceServiceRequest, transport: str) -> Pending:
        decoded = decode_spans(request, self.limits)
        return self._submit("traces", transport, decoded)

    def logs(self, request: ExportLogsServiceRequest, transport: str) -> Pending:
        decoded = decode_logs(request, self.limits)
        return self._submit("logs", transport, decoded)

    def _submit(self, signal: Signal, transport: str, decoded: Decoded) -> Pending:
        metrics.SPANS_RECEIVED.labels(transport, signal).inc(decoded.accepted + decoded.rejected_count)
        for reason, count in decoded.rejected.items():
            metrics.SPANS_REJECTED.labels(transport, signal, reason).inc(count)
        if signal == "traces":
            future = self.writer.submit(spans=decoded.columns)
        else:
            future = self.writer.submit(logs=decoded.columns)
        return Pending(signal, transport, decoded, future)
