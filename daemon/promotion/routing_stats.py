"""What the router served, read back from its own spans in the store: requests and tokens per
expert, the same per minute, and the token-level gate's expert shares (each gate-routed span
carries ``tracefix.router.share.<expert>``, the gate's mean weight over its generated tokens).
Routing-decision latency comes from the router's Prometheus histogram."""

from __future__ import annotations

import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from daemon.promotion.canary import ROUTER_SERVICE
from daemon.store.store import Store

_EXPERT = """json_extract_string(attributes, '$."tracefix.router.adapter"')"""
_INPUT = """coalesce(TRY_CAST(json_extract_string(attributes, '$."gen_ai.usage.input_tokens"') AS BIGINT), 0)"""
_OUTPUT = """coalesce(TRY_CAST(json_extract_string(attributes, '$."gen_ai.usage.output_tokens"') AS BIGINT), 0)"""
SHARE_PREFIX = "tracefix.router.share."


def served(store: Store, window_s: float) -> dict[str, Any]:
    since = int((time.time() - window_s) * 1e9)
    experts = store.query(
        f"SELECT {_EXPERT} AS expert, count(*) AS requests, sum({_INPUT}) AS prompt_tokens, sum({_OUTPUT}) AS completion_tokens "
        "FROM spans WHERE service_name = ? AND start_time_unix_nano >= ? GROUP BY expert ORDER BY requests DESC",
        [ROUTER_SERVICE, since],
    )
    series = store.query(
        f"SELECT time_bucket(INTERVAL 1 MINUTE, make_timestamp(CAST(start_time_unix_nano // 1000 AS BIGINT))) AS minute, "
        f"{_EXPERT} AS expert, count(*) AS requests, sum({_INPUT} + {_OUTPUT}) AS tokens "
        "FROM spans WHERE service_name = ? AND start_time_unix_nano >= ? GROUP BY minute, expert ORDER BY minute, expert",
        [ROUTER_SERVICE, since],
    )
    shares = store.query(
        f"""
        WITH gated AS (
            SELECT attributes, {_OUTPUT} AS tokens FROM spans
            WHERE service_name = ? AND start_time_unix_nano >= ? AND {_EXPERT} = 'gate'
        ), keyed AS (SELECT unnest(json_keys(attributes)) AS key, attributes, tokens FROM gated)
        SELECT substr(key, {len(SHARE_PREFIX) + 1}) AS expert,
               sum(TRY_CAST(json_extract_string(attributes, '$."' || key || '"') AS DOUBLE) * tokens) / nullif(sum(tokens), 0) AS share
        FROM keyed WHERE starts_with(key, ?) GROUP BY expert ORDER BY expert
        """,
        [ROUTER_SERVICE, since, SHARE_PREFIX],
    )
    return {
        "window_s": window_s,
        "experts": [{**row, "prompt_tokens": int(row["prompt_tokens"] or 0), "completion_tokens": int(row["completion_tokens"] or 0)} for row in experts],
        "series": [
            {"at": row["minute"].isoformat(), "expert": row["expert"], "requests": row["requests"], "tokens": int(row["tokens"] or 0)}
            for row in series
        ],
        "token_shares": [row for row in shares if row["share"] is not None],
    }


def routing_latency(metrics_url: str) -> dict[str, float] | None:
    """p50/p95 of the router's routing decisions (ms), interpolated in its histogram buckets."""
    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
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
