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
DATABASE_MEMORY = Gauge("tracefix_database_memory_bytes", "Memory DuckDB's buffer manager holds (bounded by [store] memory_limit)")
TRAJECTORIES = Gauge("tracefix_trajectories", "Assembled trajectories by outcome", ["outcome"])
ASSEMBLER_SECONDS = Histogram("tracefix_assembler_pass_seconds", "Duration of one trajectory assembly pass")
ASSEMBLER_LAG = Gauge("tracefix_assembler_lag_batches", "Committed ingest batches not yet assembled")
JOB_FAILURES = Counter("tracefix_job_failures", "Background job runs that raised", ["job"])
JOB_RUNS = Counter("tracefix_job_runs", "Background job runs that finished without raising", ["job"])
LABELS = Counter("tracefix_labels", "Capability labels written")
LABEL_ERRORS = Counter("tracefix_label_errors", "Labeler exceptions (the pair is labeled NA)", ["labeler"])
ANALYSIS_SECONDS = Histogram(
    "tracefix_analysis_pass_seconds", "Duration of one labeling + statistics pass", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
)
CAPABILITY_ER_MINUS = Gauge("tracefix_capability_lacking_rate_failures", "ER-: LACKING share of needed, failed runs", ["capability"])
CAPABILITY_ER_PLUS = Gauge("tracefix_capability_lacking_rate_successes", "ER+: LACKING share of needed, successful runs", ["capability"])
CAPABILITY_DELTA = Gauge("tracefix_capability_delta", "ER- minus ER+", ["capability"])
CAPABILITY_COVERAGE = Gauge("tracefix_capability_coverage", "LACKING-on-failed over all failed runs", ["capability"])
CAPABILITY_STATE = Gauge("tracefix_capability_state", "1 for the capability's current trigger state", ["capability", "state"])
TRAINING_REQUESTS = Counter("tracefix_training_requests", "Training requests emitted", ["capability", "source"])
ROUTER_RECONCILED = Gauge(
    "tracefix_router_reconciled", "1 when the promote job's last reconciliation with the router succeeded, 0 while the router cannot be reached or refuses"
)
ADAPTER_ROLLBACKS = Counter(
    "tracefix_adapter_rollbacks", "Adapters rolled back automatically, by the stage that judged them (canary or live)", ["capability", "stage"]
)
