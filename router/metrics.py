"""Prometheus metrics of the router, served at its /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "tracefix_router_requests", "Chat completion requests by serving expert and outcome", ["expert", "status"]
)
TOKENS = Counter("tracefix_router_tokens", "Prompt and completion tokens by expert", ["expert", "kind"])
ROUTING_SECONDS = Histogram(
    "tracefix_router_routing_seconds",
    "Time to decide a request's expert, by what decided it",
    ["reason"],
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
SWAPS = Counter("tracefix_router_swaps", "Adapter load requests: loaded (routing switched) or refused", ["outcome"])
SWAP_SECONDS = Histogram(
    "tracefix_router_swap_seconds",
    "From an adapter load request to routing switched to it",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
GATE_TOKENS = Counter(
    "tracefix_router_gate_tokens", "Completion tokens of gate-routed requests, shared out by the gate's per-token expert weights", ["expert"]
)
IN_FLIGHT = Gauge("tracefix_router_in_flight", "Chat completion requests being served")
PREFILL_TOKENS = Counter(
    "tracefix_router_prefill_tokens",
    "Prompt tokens of the embedded backend, by where their keys and values came from: the prefix cache, or prefilled",
    ["source"],
)
PREFIX_CACHE_BYTES = Gauge("tracefix_router_prefix_cache_bytes", "Memory held by the embedded backend's prefix cache")
BATCH_ROWS = Gauge("tracefix_router_batch_rows", "Sequences in the embedded backend's running batch")
BATCH_WAITING = Gauge("tracefix_router_waiting_requests", "Requests waiting to join the embedded backend's batch")
