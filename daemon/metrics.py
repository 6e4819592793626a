"""Prometheus metrics of tracefix itself, served at /metrics by the daemon and the collector."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SPANS_RECEIVED = Counter(
    "tracefix_spans_received", "Spans received by the collectors", ["transport", "signal"]
)
SPANS_ACCEPTED = Counter(
    "tracefix_spans_accepted", "Spans (or log records) committed or recognised as duplicates", ["transport", "signal"]
)
SPANS_DUPLICATE = Counter("tracefix_spans_duplicate", "Rows skipped because an earlier delivery stored them", ["signal"])
SPANS_REJECTED = Counter(
    "tracefix_spans_rejected", "Spans (or log records) rejected, by reason", ["transport", "signal", "reason"]
)
REQUESTS = Counter("tracefix_ingest_requests", "Export requests by outcome", ["transport", "signal", "status"])
REQUEST_SECONDS = Histogram(
    "tracefix_ingest_request_seconds",
    "Export request latency, from receipt to durable acknowledgement",
    ["transport", "signal"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
COMMIT_SECONDS = Histogram(
    "tracefix_commit_seconds",
    "Duration of one group commit",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
COMMIT_ROWS = Histogram(
    "tracefix_commit_rows", "Rows per group commit", buckets=(1, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)
)
COMMIT_FAILURES = Counter("tracefix_commit_failures", "Group commits the database refused")
WRITER_QUEUE = Gauge("tracefix_writer_queue_rows", "Rows waiting for a commit")
DATABASE_BYTES = Gauge("tracefix_database_bytes", "Size of the DuckDB file and its WAL")
TRAJECTORIES = Gauge("tracefix_trajectories", "Assembled trajectories by outcome", ["outcome"])
ASSEMBLER_SECONDS = Histogram("tracefix_assembler_pass_seconds", "Duration of one trajectory assembly pass")
ASSEMBLER_LAG = Gauge("tracefix_assembler_lag_batches", "Committed ingest batches not yet assembled")
JOB_FAILURES = Counter("tracefix_job_failures", "Background job runs that raised", ["job"])
