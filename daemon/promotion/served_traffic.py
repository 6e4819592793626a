"""What the router served, read back from its own spans in the store: requests and tokens per
expert, the same per minute, and the token-level gate's expert shares (each gate-routed span
carries ``tracefix.router.share.<expert>``, the gate's mean weight over its generated tokens).
Routing-decision latency comes from the router's Prometheus histogram."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tracefix.daemon.store.served import served_rows
from tracefix.daemon.store.store import Store

def served(store: Store, window_s: float) -> dict[str, Any]:
    experts, series, shares = served_rows(store, int((time.time() - window_s) * 1e9))
    return {
        "window_s": window_s,
        "experts": [{**row, "prompt_tokens": int(row["prompt_tokens"] or 0), "completion_tokens": int(row["completion_tokens"] or 0)} for row in experts],
        "series": [
            {"at": row["minute"].isoformat(), "expert": row["expert"], "requests": row["requests"], "tokens": int(row["tokens"] or 0)}
            for row in series
        ],
        "token_shares": [row for row in shares if row["share"] is not None],
    }


def routing_latency(text: str | None) -> dict[str, float] | None:
    """p50/p95 of the router's routing decisions (ms), interpolated in the histogram buckets of its
    Prometheus exposition `text` (None: the router did not answer)."""
    if text is None:
        return None
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "tracefix_router_routing_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    if not buckets or max(buckets.values()) == 0:
        return None
    return {"routing_p50_ms": _quantile(buckets, 0.5) * 1000, "routing_p95_ms": _quantile(buckets, 0.95) * 1000}


def _quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus' histogram_quantile: linear inside the bucket the rank falls in."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            return previous_bound + (bound - previous_bound) * ((rank - previous_count) / (count - previous_count) if count > previous_count else 0)
        previous_bound, previous_count = bound, count
    return previous_bound
