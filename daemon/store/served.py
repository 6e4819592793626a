"""What the router served, read back from its own spans: outcomes per expert for the canary and the
watch, requests, tokens and gate shares for the routing page."""

from __future__ import annotations

from typing import Any

from tracefix.daemon.store.store import Store

ROUTER_SERVICE = "tracefix-router"  # service.name of the router's spans
_EXPERT = """json_extract_string(attributes, '$."tracefix.router.adapter"')"""
_INPUT = """coalesce(TRY_CAST(json_extract_string(attributes, '$."gen_ai.usage.input_tokens"') AS BIGINT), 0)"""
_OUTPUT = """coalesce(TRY_CAST(json_extract_string(attributes, '$."gen_ai.usage.output_tokens"') AS BIGINT), 0)"""
SHARE_PREFIX = "tracefix.router.share."


def routed_outcomes(store: Store, capability: str, since_ns: int, until_ns: int | None = None) -> list[dict[str, Any]]:
    """Per expert that served `capability`'s traffic since `since_ns` (and before `until_ns` when
    given): failures and total among its trajectories with an outcome."""
    return store.query(
        """
        WITH routed AS (
            SELECT DISTINCT t.trajectory_id, json_extract_string(s.attributes, '$."tracefix.router.adapter"') AS expert
            FROM spans s JOIN trajectories t ON list_contains(t.trace_ids, s.trace_id)
            WHERE s.service_name = ? AND s.start_time_unix_nano >= ? AND s.start_time_unix_nano < ?
              AND json_extract_string(s.attributes, '$."tracefix.router.capability"') = ?
        )
        SELECT expert, count(*) FILTER (WHERE o.outcome = 'failure') AS failures, count(*) AS total
        FROM routed JOIN trajectory_outcomes o USING (trajectory_id)
        WHERE o.outcome IN ('success', 'failure') AND expert IS NOT NULL
        GROUP BY expert
        """,
        [ROUTER_SERVICE, since_ns, until_ns if until_ns is not None else 2**63 - 1, capability],
    )


def served_rows(store: Store, since_ns: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Since `since_ns`: requests and tokens per expert, the same per minute, and the gate's mean
    expert shares weighted by generated tokens."""
    experts = store.query(
        f"SELECT {_EXPERT} AS expert, count(*) AS requests, sum({_INPUT}) AS prompt_tokens, sum({_OUTPUT}) AS completion_tokens "
        "FROM spans WHERE service_name = ? AND start_time_unix_nano >= ? GROUP BY expert ORDER BY requests DESC",
        [ROUTER_SERVICE, since_ns],
    )
    series = store.query(
        f"SELECT time_bucket(INTERVAL 1 MINUTE, make_timestamp(CAST(start_time_unix_nano // 1000 AS BIGINT))) AS minute, "
        f"{_EXPERT} AS expert, count(*) AS requests, sum({_INPUT} + {_OUTPUT}) AS tokens "
        "FROM spans WHERE service_name = ? AND start_time_unix_nano >= ? GROUP BY minute, expert ORDER BY minute, expert",
        [ROUTER_SERVICE, since_ns],
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
        [ROUTER_SERVICE, since_ns, SHARE_PREFIX],
    )
    return experts, series, shares
