"""The `tracefix` command line: a thin client of the daemon and its API. The processes (daemon, router,
dashboard, up, logs, demo), status and import are here; the other command groups in their own
modules (cli_analysis, cli_training, cli_adapters), on the helpers of cli_common."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tracefix.daemon.app import cli_adapters, cli_analysis, cli_training
from tracefix.daemon.app.cli_common import config_option, json_option, log_to_stderr, print_json, settings_from
from tracefix.daemon.core.settings import ConfigError


def _serve(config_path: Path | None) -> None:
    from tracefix.daemon.app.service import Daemon
    from tracefix.daemon.store.store import StoreError
    from tracefix.trainer.precision import UnsupportedDtype, check_settings

    settings = settings_from(config_path)
    log_to_stderr()
    try:
        check_settings(settings.model.dtype, settings.training.dtype, settings.training.device)
        Daemon(settings).run()
    except (StoreError, OSError, UnsupportedDtype) as error:
        raise click.ClickException(str(error)) from None


@click.group()
def main() -> None:
    """tracefix: finds what your agent fails at, trains an adapter for it, serves it."""


@main.command()
@config_option
def daemon(config_path: Path | None) -> None:
    """Run the daemon: OTLP receivers, store, background jobs and the API."""
    _serve(config_path)


@main.command(name="router")
@config_option
def router_(config_path: Path | None) -> None:
    """Run the router in the foreground: the OpenAI-compatible API serving the base model and the live adapters."""
    from tracefix.router.routing import RoutingError
    from tracefix.router.server import serve
    from tracefix.trainer.model import ModelUnavailable
    from tracefix.trainer.precision import UnsupportedDtype

    settings = settings_from(config_path)
    log_to_stderr()
    try:
        serve(settings)
    except (ConfigError, RoutingError, ModelUnavailable, UnsupportedDtype, OSError) as error:
        raise click.ClickException(str(error)) from None


@main.command(name="dashboard")
@config_option
def dashboard_(config_path: Path | None) -> None:
    """Run the dashboard (Streamlit) on the [dashboard] host and port; it reads the daemon API."""
    import importlib.util
    import os

    from tracefix.dashboard.launch import streamlit_argv

    settings = settings_from(config_path)
    if importlib.util.find_spec("streamlit") is None:
        raise click.ClickException("the dashboard needs Streamlit: pip install streamlit altair")
    argv = streamlit_argv(settings.dashboard, config_path)
    click.echo(f"tracefix dashboard on http://{settings.dashboard.host}:{settings.dashboard.port}", err=True)
    sys.stderr.flush()
    # Streamlit replaces this process, so signals (Ctrl-C, a supervisor's SIGTERM) reach it directly.
    os.execv(argv[0], argv)


@main.command()
@config_option
@click.option(
    "--without", "without", multiple=True, type=click.Choice(["router", "dashboard"]),
    help="Do not start this process (repeatable); the daemon always runs.",
)  # fmt: skip
def up(config_path: Path | None, without: tuple[str, ...]) -> None:
    """Start the daemon, the router and the dashboard, supervised: each is restarted when it crashes,
    all stop on Ctrl-C or SIGTERM. Logs: tracefix logs NAME."""
    import importlib.util

    from tracefix.daemon.app import supervisor

    settings = settings_from(config_path)
    names = [name for name in supervisor.NAMES if name not in without]
    if "dashboard" in names and importlib.util.find_spec("streamlit") is None:
        click.echo("dashboard skipped: Streamlit is not installed (pip install streamlit altair)", err=True)
        names.remove("dashboard")
    sys.exit(supervisor.run(settings, config_path, names, lambda line: click.echo(line, err=True)))


@main.command()
@click.argument("name", type=click.Choice(["daemon", "vllm", "router", "dashboard"]))
@config_option
@click.option("--lines", "-n", default=50, show_default=True, help="How many of the last lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing lines as they are written (Ctrl-C stops).")
def logs(name: str, config_path: Path | None, lines: int, follow: bool) -> None:
    """Show the log of a process started by `tracefix up`."""
    import time

    from tracefix.daemon.app.supervisor import log_directory, tail

    path = log_directory(settings_from(config_path)) / f"{name}.log"
    if not path.exists():
        raise click.ClickException(f"no log at {path}: has `tracefix up` run with this configuration?")
    click.echo(tail(path, lines))
    if not follow:
        return
    with path.open("rb") as handle:
        handle.seek(0, 2)
        try:
            while True:
                line = handle.readline()
                if line:
                    click.echo(line.decode("utf-8", "replace"), nl=False)
                else:
                    time.sleep(0.25)
        except KeyboardInterrupt:
            pass


@main.command()
@config_option
@click.option("--auto-approve", is_flag=True, help="Approve each candidate as soon as it is ready (unattended runs).")
@click.option("--minutes", type=float, default=None, help="Stop after this many minutes (default: run until Ctrl-C).")
@click.option("--fast", is_flag=True, help="Smaller settings for a quick look: no validation gate, fewer demonstrations and held-out seeds.")
@click.option("--policy", type=click.Choice(["mixed", "llm", "scripted"]), default="mixed", show_default=True,
              help="The example deployment: the model-driven agent behind the router next to scripted flows (mixed), "
                   "the model-driven agent alone (llm), or scripted flows with planted flaws (scripted, no model).")  # fmt: skip
@click.option("--rate", type=float, default=0.5, show_default=True, help="Conversations the example deployment starts per second.")
@click.option("--after", type=click.IntRange(min=0), default=0,
              help="Stop once this many model-driven conversations have finished after the adapters went live (0: keep going).")
@click.option("--adapters", type=click.IntRange(min=1), default=1, show_default=True,
              help="Adapters to take live, one selected capability after another, before 'after' is measured.")  # fmt: skip
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write what the run measured (stages with their times, the gap, the evaluation, before vs after) here as JSON.")  # fmt: skip
@click.option("--serve-while-training", is_flag=True,
              help="Keep the model-driven agent's conversations going while an adapter trains (by default they wait: "
                   "on a small CPU serving and training halve each other).")  # fmt: skip
def demo(
    config_path: Path | None, auto_approve: bool, minutes: float | None, fast: bool, policy: str, rate: float, after: int,
    adapters: int, report: Path | None, serve_while_training: bool,
) -> None:
    """Run the whole improvement loop on this machine, narrated: the stack, an example agent's
    traffic, the gap, the environment, training, your approval, the canary, before and after."""
    try:  # the demo drives the example agent of a source checkout (examples/), which the wheel does not ship
        from examples.demo import run as run_demo
    except ImportError as error:
        raise click.ClickException(
            f"tracefix demo runs the example airline agent in the repository's examples/ folder ({error}): run `make demo` in a clone"
        ) from None
    try:
        status = run_demo(
            config_path, fast, auto_approve, minutes, policy, rate, lambda line: click.echo(line, err=True), after, report,
            not serve_while_training, adapters,
        )
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    sys.exit(status)


def _llm_lines(llm: dict[str, Any]) -> list[str]:
    """`tracefix status`'s lines on the LLM labels judged beside the analysis: progress, budget, endpoint."""
    import time

    def ago(at: float) -> str:
        return f"{max(0.0, time.time() - at):.0f} s ago"

    pending = "?" if llm["pending"] is None else llm["pending"]
    budget = f"{llm['calls_per_minute']} calls/min" if llm["calls_per_minute"] else "unlimited calls"
    lines = [
        f"llm labels: {pending} pending, {llm['in_flight']} in flight, {llm['judged']} judged by this daemon "
        f"({llm['judged_last_minute']} in the last minute, {llm['calls_last_minute']} calls; "
        f"budget {budget}, concurrency {llm['concurrency']})"
    ]
    if llm["endpoint_answering"] is None:
        lines.append("llm endpoint: not called yet")
    elif llm["endpoint_answering"]:
        lines.append(f"llm endpoint: answering (last answer {ago(llm['last_answer_at'])})")
    else:
        last = f"last answer {ago(llm['last_answer_at'])}" if llm["last_answer_at"] else "no answer yet"
        lines.append(f"llm endpoint: NOT answering ({last}); judgements resume when it does")
    if llm["last_error"]:
        lines.append(f"llm last error, {ago(llm['last_error']['at'])}: {llm['last_error']['message']}")
    return lines


@main.command()
@config_option
@json_option
def status(config_path: Path | None, as_json: bool) -> None:
    """Counts and health of the running daemon."""
    from tracefix.daemon.app.client import ApiError, DaemonClient, DaemonUnavailable

    client = DaemonClient(settings_from(config_path))
    try:
        data = client.get("/api/status")
    except (DaemonUnavailable, ApiError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()
    if as_json:
        print_json(data)
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
    for line in _llm_lines(data["llm"]) if data.get("llm") else []:
        console.print(line, markup=False, highlight=False)


@main.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--format", "run_format", type=click.Choice(["otlp", "tau-bench", "tau2-bench", "messages"]), default="otlp", show_default=True,
    help="otlp: OTLP/JSON export requests; tau-bench / tau2-bench: a benchmark's recorded runs; messages: runs as OpenAI"
    " chat transcripts (docs/collector.md); all but otlp are sent as GenAI traces.",
)  # fmt: skip
@click.option(
    "--tools", "tools_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Tool definitions (OpenAI function format) the runs were given, for formats whose runs do not carry them.",
)  # fmt: skip
@click.option(
    "--service-name", default=None, help="service.name of imported runs (default: each run's agent, else the format's name)."
)
@click.option(
    "--agent-name", default=None, help="gen_ai.agent.name of imported runs (default: each run's agent, else the file's name)."
)
@click.option("--model", default=None, help="gen_ai.request.model of imported runs, when the file does not say.")
@config_option
@json_option
def import_(
    file: Path, run_format: str, tools_path: Path | None, service_name: str | None, agent_name: str | None,
    model: str | None, config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """Load runs you already have through the collector: OTLP/JSON (one export request per line, or one
    document), or τ-bench / τ²-bench results or chat transcripts turned into the traces an instrumented agent sends."""
    from tracefix.collectors.agent_runs import RunFormatError, trace_requests
    from tracefix.collectors.run_formats import read_runs
    from tracefix.collectors.importer import ImportFailed, import_file, import_requests

    settings = settings_from(config_path)
    host = settings.collector.host if settings.collector.host not in ("0.0.0.0", "::") else "127.0.0.1"
    if not settings.collector.http_port:
        raise click.ClickException("the OTLP/HTTP receiver is disabled ([collector] http_port = 0)")
    endpoint = f"http://{host}:{settings.collector.http_port}"
    try:
        if run_format == "otlp":
            if tools_path is not None:
                raise click.ClickException("--tools applies to --format tau-bench, tau2-bench or messages")
            report = import_file(file, endpoint, settings.collector.token)
        else:
            runs = list(read_runs(file, run_format, tools_path))
            requests = trace_requests(
                runs, service_name, agent_name, model, default_service=run_format, default_agent=file.stem
            )
            report = import_requests(enumerate(requests, start=1), endpoint, settings.collector.token, unit="run")
    except (ImportFailed, RunFormatError) as error:
        raise click.ClickException(str(error)) from None
    summary = {
        "requests": report.requests,
        "spans": report.spans,
        "logs": report.logs,
        "rejected": report.rejected,
        "errors": report.errors,
    }
    if as_json:
        print_json(summary)
    else:
        what = "requests" if run_format == "otlp" else "runs"
        click.echo(
            f"imported {report.requests} {what}: {report.spans} spans, {report.logs} log records, "
            f"{report.rejected} rejected"
        )
        for error in report.errors:
            click.echo(f"  {error}", err=True)
    if report.errors and not report.requests:
        sys.exit(1)


# The command groups of their own modules, under `tracefix`.
main.add_command(cli_analysis.capabilities)
main.add_command(cli_analysis.trajectories)
main.add_command(cli_analysis.relabel)
main.add_command(cli_analysis.discover)
main.add_command(cli_analysis.agents)
main.add_command(cli_training.envs)
main.add_command(cli_training.train)
main.add_command(cli_adapters.adapters)


if __name__ == "__main__":
    main()
