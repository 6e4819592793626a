"""`tracefix capabilities`, `trajectories`, `relabel`, `discover` and `agents`: what the daemon found."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from tracefix.daemon.app.cli_common import (
    client_call, config_option, interval_text, json_option, MISSING, print_json, rank_text, rate_text, settings_from,
)
from tracefix.daemon.core.states import CapabilityState


@click.command()
@config_option
@json_option
@click.option("--window", default=None, help="Statistics window to show (default: the selection window).")
@click.option("--examples", default=3, show_default=True, type=click.IntRange(0, 50), help="Failed runs shown as evidence per selected capability.")
def capabilities(config_path: Path | None, as_json: bool, window: str | None, examples: int) -> None:
    """Per-capability gap statistics, selection and trigger state, with evidence for the selected ones."""
    data = client_call(config_path, "GET", "/api/capabilities")
    items, diagnosis = data["items"], data.get("diagnosis")
    if as_json:
        for item in items:
            if item["selected"] and examples:
                item["evidence"] = _evidence(config_path, item["name"], examples)["items"]
        print_json({"items": items, "diagnosis": diagnosis})
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    settings = settings_from(config_path)
    window = window or settings.analysis.selection_window
    table = Table(title=f"capabilities (window: {window})")
    for column in ("rank", "capability", "state", "ER+ (succ.)", "ER- (fail.)", "Δ", "coverage", "failures", "failure rate"):
        table.add_column(column)
    for item in items:
        stats = item["windows"].get(window) or {}
        style = "bold red" if item["selected"] else None
        table.add_row(
            rank_text(item["rank"]),
            item["name"],
            item["state"],
            rate_text(stats.get("er_plus")) + interval_text(stats.get("er_plus_low"), stats.get("er_plus_high")),
            rate_text(stats.get("er_minus")) + interval_text(stats.get("er_minus_low"), stats.get("er_minus_high")),
            rate_text(stats.get("delta")),
            rate_text(stats.get("coverage")),
            f"{stats['lacking_failure']}/{stats['needed_failure']}" if stats else MISSING,
            rate_text(stats.get("failure_rate")) + interval_text(stats.get("failure_rate_low"), stats.get("failure_rate_high")),
            style=style,
        )
    console = Console()
    console.print(table)
    if diagnosis:  # plain text: its [llm] and [[llm.custom]] are settings, not console markup
        console.print(Text(diagnosis["message"], style="yellow"))
    for item in items:
        for track in item.get("tracks") or []:  # each agent's own loop of the capability
            if track["selected"] or track["state"] != CapabilityState.HEALTHY:
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
    return client_call(config_path, "GET", "/api/trajectories", capability=capability, label="LACKING", outcome="failure", limit=examples)


def _print_evidence(console: Any, config_path: Path | None, capability: str, examples: int) -> None:
    data = _evidence(config_path, capability, examples)
    from rich.markup import escape

    for row in data["items"]:
        spans = ", ".join(row.get("span_ids") or []) or "no span"
        console.print(f"  e.g. {escape(row['trajectory_id'])}: {escape(row['reason'] or '')} [dim](evidence: {spans})[/dim]", soft_wrap=True)
    if data["total"] > len(data["items"]):
        console.print(f"  … {data['total']} failed runs LACKING it: tracefix trajectories --capability {capability} --label LACKING")


@click.command()
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
    data = client_call(
        config_path, "GET", "/api/trajectories",
        capability=capability, label=label, outcome=outcome, service=service, limit=limit, offset=offset,
    )  # fmt: skip
    if as_json:
        print_json(data)
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


@click.command()
@config_option
@click.option("--capability", default=None, help="Only this capability (default: all).")
def relabel(config_path: Path | None, capability: str | None) -> None:
    """Drop stored labels so the next analysis pass labels again (after a detector change)."""
    data = client_call(config_path, "POST", "/api/relabel", {"capability": capability})
    click.echo(f"removed {data['labels_removed']} labels; the next analysis pass relabels")


@click.command()
@config_option
@json_option
@click.option("--samples", default=4, show_default=True, type=click.IntRange(1, 20))
def discover(config_path: Path | None, as_json: bool, samples: int) -> None:
    """Propose new capabilities from contrasted failed and successful runs, with the [llm] endpoint."""
    data = client_call(config_path, "POST", "/api/capabilities/discover", {"samples": samples})
    if as_json:
        print_json(data)
        return
    for proposal in data["capabilities"]:
        click.echo(f"{proposal['name']}: {proposal['description']}")
    click.echo(data["hint"], err=True)


@click.group()
def agents() -> None:
    """The agents that send runs: each one's counts, and its profile (what its policy requires before a change)."""


@agents.command(name="list")
@config_option
@json_option
def agents_list(config_path: Path | None, as_json: bool) -> None:
    """Every agent with its runs by outcome, and the [[capabilities.agents]] overrides not applied."""
    data = client_call(config_path, "GET", "/api/agents")
    if as_json:
        print_json(data)
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
    profile = client_call(config_path, "GET", f"/api/agents/{quote(name, safe='')}/profile")
    if as_json:
        print_json(profile)
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
