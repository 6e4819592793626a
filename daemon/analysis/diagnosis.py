"""What the capability statistics cannot say by themselves: failed runs that no capability explains
while only the rule labelers judge. The text is built here, once; the CLI and dashboard render it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracefix.daemon.core.settings import Settings

RULES_ONLY = "rules_only_unexplained_failures"
CAPABILITIES_DOC = "docs/capabilities.md"
# What turns on a labeler that sees meaning, not only form.
SETTINGS = ("[llm] enabled = true", "[llm] base_url", "[[llm.custom]]", "[[capabilities.evaluations]]")


def failed_runs(items: Sequence[Mapping[str, Any]], window: str) -> int:
    """Failed trajectories in `window` as the latest analysis pass counted them (0 before the first)."""
    return max((((item.get("windows") or {}).get(window) or {}).get("n_failure") or 0 for item in items), default=0)


def capability_diagnosis(items: Sequence[Mapping[str, Any]], settings: Settings) -> dict[str, Any] | None:
    """A diagnosis when enough runs failed, no capability is selected and only rules label them; else None.

    `items` are the capabilities as `GET /api/capabilities` lists them.
    """
    if settings.llm.enabled or settings.capabilities.evaluations:
        return None
    if any(item.get("selected") for item in items):
        return None
    failed = failed_runs(items, settings.analysis.selection_window)
    if failed < settings.analysis.min_failures:
        return None
    runs = "failed run" if failed == 1 else "failed runs"
    message = (
        f"{failed} {runs}, yet no capability is selected: the rule labelers see format, grounding, confirmation, "
        "loops and stated numbers, not whether the agent chose the right option or obeyed a policy's substance. "
        "To label what they cannot see, turn on the LLM labeler (`[llm] enabled = true`, `base_url` = any "
        "OpenAI-compatible endpoint, your capabilities as `[[llm.custom]]`) or map your evaluators to "
        f"capabilities (`[[capabilities.evaluations]]`, see {CAPABILITIES_DOC})."
    )
    return {
        "kind": RULES_ONLY,
        "failed": failed,
        "window": settings.analysis.selection_window,
        "message": message,
        "settings": list(SETTINGS),
        "docs": CAPABILITIES_DOC,
    }
