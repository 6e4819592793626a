"""What the `tracefix` commands share: the --config and --json options, settings that fail as a clear
error, JSON output, the API call that turns a failure into one line, and how statistics print."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import click
import orjson

from tracefix.daemon.core.settings import ConfigError, Settings, load_settings

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file overriding the embedded config.toml.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def settings_from(config_path: Path | None) -> Settings:
    try:
        return load_settings(config_path)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def print_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def log_to_stderr() -> None:
    """INFO lines of the service itself; the clients it uses log only their warnings (one line per
    HTTP request to the router would bury what matters)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def client_call(config_path: Path | None, method: str, path: str, body: Any = None, **params: Any) -> Any:
    from tracefix.daemon.app.client import ApiError, DaemonClient, DaemonUnavailable

    client = DaemonClient(settings_from(config_path))
    try:
        if method == "GET":
            return client.get(path, **{key: value for key, value in params.items() if value is not None})
        return client.post(path, body)
    except (DaemonUnavailable, ApiError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()


MISSING = "—"  # a statistic without data (ER+ when no successful run needed the capability)


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def rate_text(value: float | None) -> str:
    return MISSING if missing(value) else f"{value:.2f}"


def interval_text(low: float | None, high: float | None) -> str:
    return "" if missing(low) or missing(high) else f" [{low:.2f}–{high:.2f}]"


def rank_text(value: int | None) -> str:
    return MISSING if missing(value) else str(value)
