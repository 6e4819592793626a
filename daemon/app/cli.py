"""The `tracefix` command line: a thin client of the daemon and its API."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from urllib.parse import quote
from typing import Any

import click
import orjson

from daemon.core.progress import checkpoints_text, grpo_added_text, progress_text
from daemon.core.settings import RECIPES, ConfigError, Settings, load_settings

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


def _log_to_stderr() -> None:
    """INFO lines of the service itself; the clients it uses log only their warnings (one line per
    HTTP request to the router would bury what matters)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _serve(config_path: Path | None) -> None:
    from daemon.app.service import Daemon
    from daemon.store.store import StoreError

    settings = _settings(config_path)
    _log_to_stderr()
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


@main.command(name="router")
@config_option
def router_(config_path: Path | None) -> None:
    """Run the router in the foreground: the OpenAI-compatible API serving the base model and the live adapters."""
    from router.routing import RoutingError
    from router.server import serve
    from trainer.model import ModelUnavailable
    from trainer.precision import UnsupportedDtype

    settings = _settings(config_path)
    _log_to_stderr()
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

    from dashboard.launch import streamlit_argv

    settings = _settings(config_path)
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

    from daemon.app import supervisor

    settings = _settings(config_path)
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

    from daemon.app.supervisor import log_directory, tail

    path = log_directory(_settings(config_path)) / f"{name}.log"
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
    from daemon.app import demo as guided

    try:
        status = guided.run(
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
    from daemon.app.client import ApiError, DaemonClient, DaemonUnavailable

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
    for line in _llm_lines(data["llm"]) if data.get("llm") else []:
        console.print(line, markup=False, highlight=False)


def _client_call(config_path: Path | None, method: str, path: str, body: Any = None, **params: Any) -> Any:
    from daemon.app.client import ApiError, DaemonClient, DaemonUnavailable

    client = DaemonClient(_settings(config_path))
    try:
        if method == "GET":
            return client.get(path, **{key: value for key, value in params.items() if value is not None})
        return client.post(path, body)
    except (DaemonUnavailable, ApiError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()


MISSING = "—"  # a statistic without data (ER+ when no successful run needed the capability)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _rate(value: float | None) -> str:
    return MISSING if _missing(value) else f"{value:.2f}"


def _interval(low: float | None, high: float | None) -> str:
    return "" if _missing(low) or _missing(high) else f" [{low:.2f}–{high:.2f}]"


def _rank(value: int | None) -> str:
    return MISSING if _missing(value) else str(value)


@main.command()
@config_option
@json_option
@click.option("--window", default=None, help="Statistics window to show (default: the selection window).")
@click.option("--examples", default=3, show_default=True, type=click.IntRange(0, 50), help="Failed runs shown as evidence per selected capability.")
def capabilities(config_path: Path | None, as_json: bool, window: str | None, examples: int) -> None:
    """Per-capability gap statistics, selection and trigger state, with evidence for the selected ones."""
    data = _client_call(config_path, "GET", "/api/capabilities")
    items, diagnosis = data["items"], data.get("diagnosis")
    if as_json:
        for item in items:
            if item["selected"] and examples:
                item["evidence"] = _evidence(config_path, item["name"], examples)["items"]
        _print_json({"items": items, "diagnosis": diagnosis})
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    settings = _settings(config_path)
    window = window or settings.analysis.selection_window
    table = Table(title=f"capabilities (window: {window})")
    for column in ("rank", "capability", "state", "ER+ (succ.)", "ER- (fail.)", "Δ", "coverage", "failures", "failure rate"):
        table.add_column(column)
    for item in items:
        stats = item["windows"].get(window) or {}
        style = "bold red" if item["selected"] else None
        table.add_row(
            _rank(item["rank"]),
            item["name"],
            item["state"],
            _rate(stats.get("er_plus")) + _interval(stats.get("er_plus_low"), stats.get("er_plus_high")),
            _rate(stats.get("er_minus")) + _interval(stats.get("er_minus_low"), stats.get("er_minus_high")),
            _rate(stats.get("delta")),
            _rate(stats.get("coverage")),
            f"{stats['lacking_failure']}/{stats['needed_failure']}" if stats else MISSING,
            _rate(stats.get("failure_rate")) + _interval(stats.get("failure_rate_low"), stats.get("failure_rate_high")),
            style=style,
        )
    console = Console()
    console.print(table)
    if diagnosis:  # plain text: its [llm] and [[llm.custom]] are settings, not console markup
        console.print(Text(diagnosis["message"], style="yellow"))
    for item in items:
        for track in item.get("tracks") or []:  # each agent's own loop of the capability
            if track["selected"] or track["state"] != "healthy":
                console.print(f"[bold]{item['name']}[/bold] for {track['agent']} {track['state']}: {escape(str(track['state_reason']))}")
        if item["selected"] and examples:
            _print_evidence(console, config_path, item["name"], examples)
        request = item.get("open_training_request")
        if request:
            console.print(
                f"  training request #{request['request_id']} {request['status']} ({request['source']}, "
                f"{request['created_at']}): {request['reason']}"
            )


def _evidence(config_path: Path | None, capability: str, examples: int) -> dict[str, Any]:
    """A page of failed runs labeled LACKING for the capability (with the labeler's reason and spans)."""
    return _client_call(config_path, "GET", "/api/trajectories", capability=capability, label="LACKING", outcome="failure", limit=examples)


def _print_evidence(console: Any, config_path: Path | None, capability: str, examples: int) -> None:
    data = _evidence(config_path, capability, examples)
    from rich.markup import escape

    for row in data["items"]:
        spans = ", ".join(row.get("span_ids") or []) or "no span"
        console.print(f"  e.g. {escape(row['trajectory_id'])}: {escape(row['reason'] or '')} [dim](evidence: {spans})[/dim]", soft_wrap=True)
    if data["total"] > len(data["items"]):
        console.print(f"  … {data['total']} failed runs LACKING it: tracefix trajectories --capability {capability} --label LACKING")


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


@main.group()
def envs() -> None:
    """Training environments: list families, sample an instance, check a family on a tool set, validate it
    against the base model."""


def _tools(config_path: Path | None, tools_file: Path | None, service: str | None) -> list:
    from daemon.pipeline.synthesis import stored_definitions, with_state_changing
    from trainer.environment import load_tools

    settings = _settings(config_path).capabilities
    if tools_file is not None:
        try:
            document = orjson.loads(tools_file.read_bytes())
        except orjson.JSONDecodeError as error:
            raise click.ClickException(f"{tools_file}: not JSON ({error})") from None
        definitions = document.get("tools", document) if isinstance(document, dict) else document
        if not isinstance(definitions, list):
            raise click.ClickException(f"{tools_file}: expected a list of tool definitions or {{\"tools\": [...]}}")
        definitions = [with_state_changing(definition, settings) for definition in definitions]
    else:
        data = _client_call(config_path, "GET", "/api/tools", service=service)
        definitions = stored_definitions(data["items"], settings)
        if not definitions:
            raise click.ClickException("the daemon has seen no tool definitions yet; pass --tools FILE")
    try:
        return load_tools(definitions)
    except ValueError as error:
        raise click.ClickException(str(error)) from None


def _environment(capability: str, tools: list, difficulty: int):  # type: ignore[no-untyped-def]
    from trainer.environment import Environment
    from trainer.families import find_family, load_families

    try:
        family = find_family(load_families(), capability)
        if difficulty not in family.levels:
            raise click.ClickException(f"{family.name} has difficulty levels {list(family.levels)}")
        return Environment(family, tools, difficulty)
    except ValueError as error:
        raise click.ClickException(str(error)) from None


tools_option = click.option(
    "--tools", "tools_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Tool definitions (JSON list, OpenAI or flat shape); default: those the daemon has seen.",
)  # fmt: skip
service_option = click.option("--service", default=None, help="With the daemon's tools: this agent (service.name).")
difficulty_option = click.option("--difficulty", default=1, show_default=True, type=int)


@envs.command(name="list")
@config_option
@json_option
def envs_list(config_path: Path | None, as_json: bool) -> None:
    """The registered environment families (plugins: the configuration cannot change them, but a
    broken --config is still an error, as for every command)."""
    _settings(config_path)
    from trainer.families import load_families

    families = [
        {
            "name": family.name,
            "capability": family.capability,
            "version": family.version,
            "levels": list(family.levels),
            "rewards": family.rewards,
            "description": family.description,
        }
        for family in load_families().values()
    ]
    if as_json:
        _print_json(families)
        return
    for family in families:
        rewards = ", ".join(f"{name} {value:g}" for name, value in family["rewards"].items())
        click.echo(f"{family['capability']} (v{family['version']}, levels {family['levels']}): {rewards}")


@envs.command(name="sample")
@click.argument("capability")
@click.option("--seed", default=0, show_default=True, type=int)
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_sample(
    capability: str, seed: int, tools_file: Path | None, service: str | None, difficulty: int,
    config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """Print one instance: its opening messages and a replay of its ground-truth solution."""
    from trainer.environment import rollout, solution_policy

    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    instance = environment.instance(seed)
    replay = rollout(instance, solution_policy(instance))
    data = {
        "spec": environment.spec(),
        "seed": seed,
        "hint": environment.instance(seed).hint(),
        "messages": replay.messages,
        "reward": replay.reward,
    }
    if as_json:
        _print_json(data)
        return
    click.echo(f"{capability} seed {seed} (difficulty {difficulty}), solution reward {replay.reward:g}")
    for message, own in zip(replay.messages, replay.from_policy):
        who = "policy" if own else "env"
        content = message.get("content") or ""
        if message["role"] == "system":
            content = content[:300] + (" …" if len(content) > 300 else "")
        click.echo(f"[{who}] {message['role']}: {content}")


@envs.command(name="check")
@click.argument("capability")
@click.option("--seeds", default=100, show_default=True, type=click.IntRange(1, 100_000))
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_check(
    capability: str, seeds: int, tools_file: Path | None, service: str | None, difficulty: int,
    config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """The solution must score 1.0 on every seed; no-op and random policies must score low."""
    from trainer.checks import check

    report = check(_environment(capability, _tools(config_path, tools_file, service), difficulty), seeds)
    if as_json:
        _print_json(report.to_dict())
    else:
        verdict = "PASS" if report.passed else "FAIL"
        click.echo(
            f"{verdict} {capability} on {seeds} seeds: solution min {report.solution_min:g} mean "
            f"{report.solution_mean:g}; no-op mean {report.noop_mean:g}; random mean {report.random_mean:g} "
            f"(must stay under {0.3:g})"
        )
        for error in report.errors[:5]:
            click.echo(f"  {error}", err=True)
    if not report.passed:
        sys.exit(1)


@envs.command(name="validate")
@click.argument("capability")
@click.option("--seeds", default=None, type=click.IntRange(1, 100_000), help="Groups (default: [validation] seeds).")
@click.option(
    "--group-size", default=None, type=click.IntRange(2, 1000), help="Rollouts per group (default: [validation] group_size)."
)
@click.option("--model", "model_name", default=None, help="Base model (default: [model] name).")
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_validate(
    capability: str, seeds: int | None, group_size: int | None, model_name: str | None, tools_file: Path | None,
    service: str | None, difficulty: int, config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """The validation gate, in the foreground: can the base model's rewards on this environment teach?"""
    from trainer.model import ModelUnavailable
    from trainer.precision import UnsupportedDtype
    from trainer.validate_job import run_gate

    settings = _settings(config_path)
    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    model = settings.model.model_dump()
    model["name"] = model_name or model["name"]
    model["cache_dir"] = settings.model_cache_dir
    gate = settings.validation.model_dump()
    gate["seeds"] = seeds or gate["seeds"]
    gate["group_size"] = group_size or gate["group_size"]
    try:
        report = run_gate(environment.family, environment.tools, model, gate, environment.difficulty)
    except (ModelUnavailable, UnsupportedDtype) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        _print_json(report)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{capability}: {report['model']}, {gate['seeds']} groups of {gate['group_size']}")
        for column in ("difficulty", "hints", "mean", "std", "groups with variance", "verdict"):
            table.add_column(column)
        for attempt in report["attempts"]:
            table.add_row(
                str(attempt["difficulty"]), f"{attempt['hint_share']:.0%}", f"{attempt['mean']:.3f}",
                f"{attempt['std']:.3f}", f"{attempt['variance_groups']:.0%}", attempt["verdict"],
            )  # fmt: skip
        console = Console()
        console.print(table)
        if report["passed"]:
            console.print(f"PASS at difficulty {report['difficulty']} ({report['remedy'] or 'no remedy needed'})")
        else:
            console.print(f"REJECTED: the base model's rewards cannot teach on any remedy tried "
                          f"({report['rollouts']} rollouts, {report['seconds']:g} s)")  # fmt: skip
    if not report["passed"]:
        sys.exit(1)


@main.command()
@click.argument("capability")
@click.option("--recipe", default=None, type=click.Choice(["auto", *RECIPES]), help="Training recipe (default: [training] recipe).")
@click.option("--steps", default=None, type=click.IntRange(0, 100_000), help="GRPO steps (default: [training] steps; 0 = warm start only).")
@click.option("--warm-start", "warm_start", default=None, type=click.IntRange(0, 100_000), help="Demonstrations for the warm start (default: [training]).")
@click.option("--eval-seeds", default=None, type=click.IntRange(1, 100_000), help="Held-out seeds (default: [training] eval_seeds).")
@click.option("--model", "model_name", default=None, help="Base model (default: [model] name).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None, help="Run directory (default: <store dir>/runs/cli-CAPABILITY).")
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def train(
    capability: str, recipe: str | None, steps: int | None, warm_start: int | None, eval_seeds: int | None, model_name: str | None,
    output: Path | None, tools_file: Path | None, service: str | None, difficulty: int, config_path: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Train, evaluate and save one adapter in the foreground (the daemon does the same on its own for
    every gap it detects). Re-running with the same --output resumes from its checkpoints."""
    from daemon.pipeline.training_runner import job_settings, train_config
    from trainer.model import ModelUnavailable
    from trainer.train_job import run_training

    settings = _settings(config_path)
    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    request = {
        "run_id": None, "capability": capability, "version": 1, "family": environment.family.name,
        "difficulty": environment.difficulty, "tools": [tool.to_openai() for tool in environment.tools],
        "training": train_config(settings), **job_settings(settings),
    }  # fmt: skip
    if recipe is not None:
        request["training"]["recipe"] = recipe
    if steps is not None:
        request["training"]["steps"] = steps
    if warm_start is not None:
        request["training"]["warm_start_examples"] = warm_start
    if eval_seeds is not None:
        request["evaluation"]["seeds"] = eval_seeds
    if model_name:
        request["model"]["name"] = model_name
    run_dir = output or settings.data_dir / "runs" / f"cli-{capability}"
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), TextColumn("{task.fields[status]}"), disable=as_json) as bar:  # fmt: skip
        task = bar.add_task(f"training {capability}", total=max(request["training"]["steps"], 1), status="warm start / loading")

        def progress(record: dict[str, Any]) -> None:
            phase = record.get("phase", "grpo")
            if phase == "warm_start":
                bar.update(task, description=f"warm start {capability}", total=record["max_steps"], completed=record["step"],
                           status=f"loss {record['loss']:.4f}")  # fmt: skip
            elif phase == "evaluation":
                bar.update(task, description=f"evaluating {capability}", status=record["part"])
            elif phase == "recipe":
                bar.update(task, description=f"recipe {record['recipe']}", status=progress_text(record))
            elif phase == "checkpoint":
                bar.update(task, status=progress_text(record))
            else:
                status = (f"reward {record['mean_reward']:.2f}  success {record['success_rate']:.0%}  "
                          f"zero-variance groups {record['zero_variance_groups']}/{record['groups']}  loss {record['loss']:.4f}")  # fmt: skip
                bar.update(task, description=f"training {capability}", total=max(request["training"]["steps"], 1),
                           completed=record["step"], status=status)  # fmt: skip

        try:
            result = run_training(request, run_dir, progress)
        except (ModelUnavailable, ValueError, FileExistsError) as error:
            raise click.ClickException(str(error)) from None
    if as_json:
        _print_json(result)
        return
    target = result["evaluation"]["target"]
    click.echo(
        f"{result['verdict']}: success {target['adapter']['success_rate']:.2f} {target['adapter']['success_interval']} "
        f"vs base {target['base']['success_rate']:.2f} {target['base']['success_interval']} on "
        f"{target['base']['seeds']} held-out seeds"
    )
    for reason in result["evaluation"]["reasons"]:
        click.echo(f"  {reason}")
    click.echo(f"recipe: {result['training']['recipe']} (trained on {result['device']})")
    for trial in result["training"]["tried"]:
        if "validation" in trial:
            click.echo(f"  {trial['recipe']}: validation success {trial['validation']['success_rate']:.2f}")
        if chosen := checkpoints_text(trial):
            click.echo(f"  {chosen}")
    if added := grpo_added_text(result["evaluation"].get("grpo_added")):
        click.echo(added)
    click.echo(f"adapter: {result['adapter']}" if result["adapter"] else "no adapter saved")


@main.group()
def agents() -> None:
    """The agents that send runs: each one's counts, and its profile (what its policy requires before a change)."""


@agents.command(name="list")
@config_option
@json_option
def agents_list(config_path: Path | None, as_json: bool) -> None:
    """Every agent with its runs by outcome, and the [[capabilities.agents]] overrides not applied."""
    data = _client_call(config_path, "GET", "/api/agents")
    if as_json:
        _print_json(data)
        return
    for item in data["items"]:
        name = item["service_name"] + (f" ({item['agent_name']})" if item.get("agent_name") else "")
        click.echo(f"{name}: {item['trajectories']} runs ({item['success']} succeeded, {item['failure']} failed, {item['unknown']} unknown)")
    for reason in data.get("refused") or []:
        click.echo(f"refused: {reason}", err=True)


@agents.command(name="show")
@click.argument("name")
@config_option
@json_option
def agents_show(name: str, config_path: Path | None, as_json: bool) -> None:
    """One agent's profile: each rule its policy has, has not, or leaves undecided, with the evidence."""
    profile = _client_call(config_path, "GET", f"/api/agents/{quote(name, safe='')}/profile")
    if as_json:
        _print_json(profile)
        return
    click.echo(f"{profile['agent']}: observed on {profile['observed_runs']} successful runs that changed state")
    wording = {True: "yes", False: "no", None: "undecided"}
    for rule, value in profile["rules"].items():
        click.echo(f"  {rule}: {wording[value['value']]}  ({value['source']}: {value['evidence']})")
    for kind in ("state_changing_tools", "handoff_tools"):
        listed = profile.get(kind)
        click.echo(f"  {kind}: {', '.join(listed) if listed is not None else 'by the [capabilities] name patterns'}")
    for reason in profile.get("refused") or []:
        click.echo(f"refused: {reason}", err=True)


@main.group()
def adapters() -> None:
    """Adapter versions: list them, show one with its evaluation, approve, reject or roll back."""


def _gain(evaluation: dict[str, Any]) -> str:
    target = evaluation.get("target") if isinstance(evaluation, dict) else None
    if not target:
        return "—"
    return f"{target['base']['success_rate']:.2f} → {target['adapter']['success_rate']:.2f}"


@adapters.command(name="list")
@click.option("--capability", default=None)
@click.option("--state", default=None)
@config_option
@json_option
def adapters_list(capability: str | None, state: str | None, config_path: Path | None, as_json: bool) -> None:
    """Every adapter version, newest first."""
    items = _client_call(config_path, "GET", "/api/adapters", capability=capability, state=state)["items"]
    if as_json:
        _print_json(items)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "adapter", "state", "held-out success (base → adapter)", "created")
    for item in items:
        table.add_row(
            str(item["adapter_id"]), f"{item['capability']}@v{item['version']}", item["state"],
            _gain(item["evaluation"]), str(item["created_at"])[:19],
        )  # fmt: skip
    Console().print(table if items else "no adapters yet")


@adapters.command(name="show")
@click.argument("adapter_id", type=int)
@config_option
@json_option
def adapters_show(adapter_id: int, config_path: Path | None, as_json: bool) -> None:
    """One adapter version with its evaluation report and its audit trail."""
    item = _client_call(config_path, "GET", f"/api/adapters/{adapter_id}")
    item["audit"] = _client_call(config_path, "GET", "/api/audit", adapter_id=adapter_id)["items"]
    if as_json:
        _print_json(item)
        return
    evaluation = item["evaluation"] or {}
    click.echo(f"{item['capability']}@v{item['version']}  {item['state']}  {item['path']}")
    if item.get("last_error"):
        click.echo(f"last error: {item['last_error']}")
    click.echo(f"held-out success (base → adapter): {_gain(evaluation)}")
    for other in evaluation.get("interference", []):
        click.echo(f"  {other['environment']}: {other['base']['success_rate']:.2f} → {other['adapter']['success_rate']:.2f}")
    for entry in item["audit"]:
        click.echo(f"{str(entry['decided_at'])[:19]}  {entry['actor']}: {entry['action']} ({entry['from_state']} → {entry['to_state']}) {entry['reason']}")


def _decide(config_path: Path | None, adapter_id: int, action: str, reason: str, as_json: bool) -> None:
    result = _client_call(config_path, "POST", f"/api/adapters/{adapter_id}/{action}", {"reason": reason})
    if as_json:
        _print_json(result)
        return
    for decision in result["decisions"]:
        click.echo(f"adapter {decision['adapter_id']}: {decision['from_state']} → {decision['to_state']}")


reason_option = click.option("--reason", required=True, help="Why; recorded in the audit log.")


@adapters.command(name="approve")
@click.argument("adapter_id", type=int)
@click.option("--reason", default="", help="Why; recorded in the audit log.")
@config_option
@json_option
def adapters_approve(adapter_id: int, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Approve a candidate: the daemon loads it into the router and makes it live."""
    _decide(config_path, adapter_id, "approve", reason, as_json)


@adapters.command(name="reject")
@click.argument("adapter_id", type=int)
@reason_option
@config_option
@json_option
def adapters_reject(adapter_id: int, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Reject a candidate (or an approved adapter not yet live)."""
    _decide(config_path, adapter_id, "reject", reason, as_json)


@adapters.command(name="rollback")
@click.argument("adapter_id", type=int)
@reason_option
@config_option
@json_option
def adapters_rollback(adapter_id: int, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Take a live adapter out of service; the version it replaced goes live again."""
    _decide(config_path, adapter_id, "rollback", reason, as_json)


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
    from collectors.agent_runs import RunFormatError, trace_requests
    from collectors.run_formats import read_runs
    from collectors.importer import ImportFailed, import_file, import_requests

    settings = _settings(config_path)
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
        _print_json(summary)
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


if __name__ == "__main__":
    main()
