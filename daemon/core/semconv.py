"""Names and shapes of the OpenTelemetry GenAI semantic conventions that several layers read.

The collector reads evaluation events for outcomes, the store selects them, the analysis turns
mapped ones into labels: all from here, so no layer imports a higher one for a constant.
"""

from __future__ import annotations

from typing import Any

import orjson

EVALUATION_EVENT = "gen_ai.evaluation.result"


def event_attributes(attributes: Any, body: Any = None) -> dict[str, Any]:
    """An evaluation event's attributes; older event APIs put a log record's payload in its body."""
    attributes = attributes if isinstance(attributes, dict) else {}
    return {**body, **attributes} if isinstance(body, dict) else attributes


def decoded(value: Any) -> Any:
    """An attribute value as stored or exported: JSON text parsed; anything else, or text that is no JSON, as it is."""
    if isinstance(value, (str, bytes)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value
