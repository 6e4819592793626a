"""The router's statistics as GET /api/routing reports them, read tolerantly: the routing snapshot may
sit at the top level or under `snapshot`/`router`/`routing`, and per-expert counters may be a list
of records or a mapping of expert name to counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SNAPSHOT_KEYS = ("snapshot", "router", "routing")
EXPERT_KEYS = ("experts", "per_expert", "counts")


def snapshot_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """The router's routing snapshot (mode, fixed, gate, capabilities, adapters), nested or top level."""
    for key in SNAPSHOT_KEYS:
        value = data.get(key)
        if isinstance(value, dict) and "mode" in value:
            return value
    return dict(data) if "mode" in data else {}


def expert_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-expert counters as rows with an `expert` name and a `tokens` total, from a list of records
    or a mapping of expert name to counters."""
    raw = next((data[key] for key in EXPERT_KEYS if data.get(key)), None)
    if isinstance(raw, Mapping):
        records = [{"expert": name, **(value if isinstance(value, Mapping) else {"requests": value})} for name, value in raw.items()]
    elif isinstance(raw, list):
        records = [{**item, "expert": item.get("expert") or item.get("name") or "?"} for item in raw if isinstance(item, Mapping)]
    else:
        records = []
    for record in records:
        if "tokens" not in record:
            record["tokens"] = (record.get("prompt_tokens") or 0) + (record.get("completion_tokens") or 0)
    return records
