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


def _client_call(config_path: Path | None, method: str, path: str, body: Any = None, **params: Any) -> Any:
    from daemon.client import ApiError, DaemonClient, DaemonUnavailable

    client = DaemonClient(_settings(config_path))
    try:
        if method == "GET":
            return client.get(path, **{key: value for key, value in params.items() if value is not None})
        return client.post(path, body)
    except (DaemonUnavailable, ApiError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None else f" [{low:.2f}–{high:.2f}]"


@main.command()
@config_option
@json_option
@click.option("--window", default=None, help="Statistics window to show (default: the selection window).")
def capabilities(config_path: Path | None, as_json: bool, window: str | None) -> None:
    """Per-capability gap statistics, selection and trigger state."""
    data = _client_call(config_path, "GET", "/api/capabilities")
    items = data["items"]
    if as_json:
        _print_json(items)
        return
    from rich.console import Console
    from rich.table import Table

    settings = _settings(config_path)
    window = window or settings.analysis.selection_window
    table = Table(title=f"capabilities (window: {window})")
    for column in ("rank", "capability", "state", "ER+ (succ.)", "ER- (fail.)", "Δ", "coverage", "failures", "failure rate"):
        table.add_column(column)
    for item in items:
        stats = item["windows"].get(window) or {}
        style = "bold red" if item["selected"] else None
        table.add_row(
            str(item["rank"] or ""),
            item["name"],
            item["state"],
            _rate(stats.get("er_plus")) + _interval(stats.get("er_plus_low"), stats.get("er_plus_high")),
            _rate(stats.get("er_minus")) + _interval(stats.get("er_minus_low"), stats.get("er_minus_high")),
            _rate(stats.get("delta")),
            _rate(stats.get("coverage")),
            f"{stats.get('lacking_failure', 0)}/{stats.get('needed_failure', 0)}",
            _rate(stats.get("failure_rate")) + _interval(stats.get("failure_rate_low"), stats.get("failure_rate_high")),
            style=style,
        )
    console = Console()
    console.print(table)
    for item in items:
        if item["selected"] or item["state"] != "healthy":
            console.print(f"[bold]{item['name']}[/bold] {item['state']}: {item['state_reason']}")
        request = item.get("open_training_request")
        if request:
            console.print(
                f"  training request #{request['request_id']} {request['status']} ({request['source']}, "
                f"{request['created_at']}): {request['reason']}"
            )


@main.command()
@config_option
@json_option
@click.option("--capability", default=None, help="Show this capability's label and evidence.")
@click.option("--label", type=click.Choice(["NA", "PRESENT", "LACKING"]), default=None)
@click.option("--outcome", type=click.Choice(["success", "failure", "unknown"]), default=None)
@click.option("--service", default=None, help="Only this agent (service.name).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--offset", default=0, type=click.IntRange(0))
def trajectories(
    config_path: Path | None,
    as_json: bool,
    capability: str | None,
    label: str | None,
    outcome: str | None,
    service: str | None,
    limit: int,
    offset: int,
) -> None:
    """List trajectories, with a capability's label and the evidence for it."""
    if label and not capability:
        raise click.UsageError("--label needs --capability")
    data = _client_call(
        config_path, "GET", "/api/trajectories",
        capability=capability, label=label, outcome=outcome, service=service, limit=limit, offset=offset,
    )  # fmt: skip
    if as_json:
        _print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{data['total']} trajectories (showing {len(data['items'])} from {offset})")
    for column in ("trajectory", "agent", "outcome", "tool calls", *(("label", "evidence") if capability else ())):
        table.add_column(column, overflow="fold")
    for item in data["items"]:
        row = [item["trajectory_id"], item["service_name"], item["outcome"], str(item["n_tool_calls"])]
        if capability:
            spans = ", ".join(item["span_ids"] or [])
            row += [item["label"] or "", f"{item['reason']}" + (f" (span {spans})" if spans else "")]
        table.add_row(*row)
    Console().print(table)


@main.command()
@config_option
@click.option("--capability", default=None, help="Only this capability (default: all).")
def relabel(config_path: Path | None, capability: str | None) -> None:
    """Drop stored labels so the next analysis pass labels again (after a detector change)."""
    data = _client_call(config_path, "POST", "/api/relabel", {"capability": capability})
    click.echo(f"removed {data['labels_removed']} labels; the next analysis pass relabels")


@main.command()
@config_option
@json_option
@click.option("--samples", default=4, show_default=True, type=click.IntRange(1, 20))
def discover(config_path: Path | None, as_json: bool, samples: int) -> None:
    """Propose new capabilities from contrasted failed and successful runs, with the [llm] endpoint."""
    data = _client_call(config_path, "POST", "/api/capabilities/discover", {"samples": samples})
    if as_json:
        _print_json(data)
        return
    for proposal in data["capabilities"]:
        click.echo(f"{proposal['name']}: {proposal['description']}")
    click.echo(data["hint"], err=True)


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
