"""The dashboard's link to the daemon: which configuration it runs with and where the API is.

The dashboard never opens DuckDB (only the daemon may write it); everything goes through the API,
with the daemon's own client (daemon/app/client.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tracefix.daemon.app.client import daemon_url
from tracefix.daemon.core.settings import Settings, load_settings

# `tracefix dashboard --config PATH` hands the path to the app as `-- --config PATH`; tests and
# other launchers may name it in this variable instead.
CONFIG_ENV = "TRACEFIX_CONFIG"

# What the message of an unreachable daemon tells the person at the dashboard to do.
START_ADVICE = "start it with `tracefix up` (or start the dashboard with the --config the daemon runs with)"


def config_path(argv: Sequence[str], environ: dict[str, str] | None = None) -> Path | None:
    """The configuration file named by `--config PATH` (or `--config=PATH`) in argv, else by $TRACEFIX_CONFIG."""
    for index, argument in enumerate(argv):
        if argument == "--config" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if argument.startswith("--config="):
            return Path(argument.partition("=")[2])
    value = (os.environ if environ is None else environ).get(CONFIG_ENV)
    return Path(value) if value else None


def load(argv: Sequence[str]) -> Settings:
    """The settings the daemon runs with; raises daemon.core.settings.ConfigError with a readable message."""
    return load_settings(config_path(argv))


def api_url(settings: Settings) -> str:
    """[dashboard] api_url, else the daemon's own [api] address (loopback when it binds every interface)."""
    if settings.dashboard.api_url:
        return settings.dashboard.api_url.rstrip("/")
    return daemon_url(settings)
