"""Environment families, one per built-in capability, registered through the entry point group
``tracefix.environments`` exactly as a user's family would be."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from trainer.environment import Family

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tracefix.environments"


def load_families() -> dict[str, Family]:
    """Every registered family by name; a plugin that fails to load is logged and skipped."""
    families: dict[str, Family] = {}
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda item: item.name):
        try:
            family = entry_point.load()()
        except Exception:  # a broken plugin must not hide the others
            log.exception("environment family %s failed to load", entry_point.name)
            continue
        families[family.name] = family
    return families
