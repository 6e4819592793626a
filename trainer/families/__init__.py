"""Environment families, one per built-in capability, registered through the entry point group
``tracefix.environments`` exactly as a user's family would be."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from tracefix.trainer.environment import Environment, Family, load_tools

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


class UnknownFamily(ValueError):
    """No registered environment family has that name, or trains that capability."""


def find_family(families: Mapping[str, Family], capability: str | None = None, name: str | None = None) -> Family:
    """The family called `name` when a name is given (a capability's configured environment_family, a
    stored environment's family), else the first that trains `capability`; UnknownFamily names the known ones."""
    if name is not None:
        found = families.get(name)
    else:
        found = next((family for family in families.values() if family.capability == capability), None)
    if found is None:
        missing = f"unknown environment family {name!r}" if name is not None else f"no environment family trains {capability!r}"
        raise UnknownFamily(f"{missing}; known: {', '.join(sorted(families)) or 'none'}")
    return found


def build_environment(record: Mapping[str, Any], families: Mapping[str, Family] | None = None) -> Environment:
    """The environment a stored environment or a job request describes: its family (by name) on its tool
    definitions, at its difficulty (1 when it names none). UnknownFamily or ValueError say why it cannot be built."""
    family = find_family(load_families() if families is None else families, name=record["family"])
    return Environment(family, load_tools(record["tools"]), int(record.get("difficulty", 1)))
