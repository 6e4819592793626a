"""The `tracefix` command line: a thin client of the daemon and its API."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from daemon.settings import ConfigError, Settings, load_settings

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file overriding the embedded config.toml.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _settings(config_path: Path | None) -> Settings:
    try:
        return load_settings(config_path)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def _print_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def _serve(config_path: Path | None) -> None:
    from daemon.service import Daemon
    from daemon.store import StoreError

    settings = _settings(config_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        Daemon(settings).run()
    except (StoreError, OSError) as error:
        raise click.ClickException(str(error)) from None


@click.group()
def main() -> None:
    """tracefix: finds what your agent fails at, trains an adapter for it, serves it."""


@main.command()
@config_option
def daemon(config_path: Path | None) -> None:
    """Run the daemon: OTLP receivers, store, background jobs and the API."""
    _serve(config_path)


@main.command()
@config_option
def up(config_path: Path | None) -> None:
    """Start tracefix (the daemon with its receivers and API) in the foreground."""
    _serve(config_path)


@main.command()
@config_option
def demo(config_path: Path | None) -> None:
    """Run the demo: for now, start the daemon so an agent can send it traces."""
    _serve(config_path)


@main.command()
@config_option
@json_option
def status(config_path: Path | None, as_json: bool) -> None:
    """Counts and health of the running daemon."""
    from daemon.client import ApiError, DaemonClient, DaemonUnavailable

    client = DaemonClient(_settings(config_path))
    try:
        data = client.get("/api/status")
    except (DaemonUnavailable, ApiError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()
    if as_json:
        _print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    health = "[green]healthy[/green]" if data["healthy"] else "[red]degraded[/red]: " + "; ".join(data["problems"])
    console.print(f"tracefix {data['version']}  {health}  up {data['uptime_s']} s")
    console.print(f"database {data['database']['path']} ({data['database']['bytes'] / 1e6:.1f} MB, "
                  f"schema v{data['database']['schema_version']})")
    table = Table("what", "count")
    for name, value in {**data["counts"], **{f"outcome {k}": v for k, v in data["outcomes"].items()}}.items():
        table.add_row(name, str(value))
    console.print(table)
    for name, url in data["endpoints"].items():
        console.print(f"{name}: {url}")


@main.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@config_option
@json_option
def import_(file: Path, config_path: Path | None, as_json: bool) -> None:
    """Load an OTLP/JSON file (one export request per line, or one document) through the collector."""
    from collectors.importer import ImportFailed, import_file

    settings = _settings(config_path)
    host = settings.collector.host if settings.collector.host not in ("0.0.0.0", "::") else "127.0.0.1"
    if not settings.collector.http_port:
        raise click.ClickException("the OTLP/HTTP receiver is disabled ([collector] http_port = 0)")
    try:
        report = import_file(file, f"http://{host}:{settings.collector.http_port}", settings.collector.token)
    except ImportFailed as error:
        raise click.ClickException(str(error)) from None
    summary = {
        "requests": report.requests,
        "spans": report.spans,
        "logs": report.logs,
        "rejected": report.rejected,
        "errors": report.errors,
    }
    if as_json:
        _print_json(summary)
    else:
        click.echo(
            f"imported {report.requests} requests: {report.spans} spans, {report.logs} log records, "
            f"{report.rejected} rejected"
        )
        for error in report.errors:
            click.echo(f"  {error}", err=True)
    if report.errors and not report.requests:
        sys.exit(1)


if __name__ == "__main__":
    main()
