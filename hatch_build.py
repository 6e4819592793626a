"""The wheel's layout: the five packages, top-level folders in this repository, installed under
`tracefix/` (tracefix/__init__.py), with config.toml as the packaged defaults. An editable install
copies none of them: it puts the repository on sys.path, where tracefix/__init__.py finds them."""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGES = ("collectors", "daemon", "trainer", "router", "dashboard")


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        for package in PACKAGES:
            build_data["force_include"][package] = f"tracefix/{package}"
        build_data["force_include"]["config.toml"] = "tracefix/daemon/default_config.toml"
