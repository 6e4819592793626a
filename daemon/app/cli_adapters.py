"""`tracefix adapters`: list, show, approve, reject and roll back adapter versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracefix.daemon.app.cli_common import client_call, config_option, json_option, print_json


@click.group()
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
    items = client_call(config_path, "GET", "/api/adapters", capability=capability, state=state)["items"]
    if as_json:
        print_json(items)
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
    item = client_call(config_path, "GET", f"/api/adapters/{adapter_id}")
    item["audit"] = client_call(config_path, "GET", "/api/audit", adapter_id=adapter_id)["items"]
    if as_json:
        print_json(item)
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
    result = client_call(config_path, "POST", f"/api/adapters/{adapter_id}/{action}", {"reason": reason})
    if as_json:
        print_json(result)
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
