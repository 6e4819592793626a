"""`tracefix demo`'s process: the stack started, the traffic and the narration until the run ends."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from examples.demo.narrator import Narrator, lacking_text, success_text
from examples.demo.panel import PANEL_BATCH, PANEL_BATCHES, Tally, Traffic
from examples.demo.settings import layered_settings
from tracefix.daemon.app.client import DaemonClient
from tracefix.daemon.app.supervisor import loopback


def run(
    config_path: Path | None, fast: bool, auto_approve: bool, minutes: float | None, policy: str, rate: float,
    say: Callable[[str], None], after: int = 0, report: Path | None = None, hold_while_training: bool = True, adapters: int = 1,
) -> int:  # fmt: skip
    """`tracefix demo`: returns the exit status. With `after`, it ends once that many model-driven
    conversations have finished after `adapters` adapters went live (each selected capability's in
    turn, routed together); with `report`, what the run measured
    (events with their times, the gap, the candidate's evaluation, before vs after) is written
    there as JSON. With `hold_while_training`, the model-driven conversations wait while a
    training run runs."""
    import signal

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from tracefix.daemon.app import supervisor

    started = time.monotonic()  # the demo's clock: its timeline counts from the command, processes' start included
    settings, variables = layered_settings(config_path, fast)
    os.environ.update(variables)  # the children read the demo's settings from the environment
    names = [name for name in supervisor.NAMES if name != "dashboard" or _has_streamlit()]
    stack = supervisor.Supervisor(supervisor.children(settings, config_path, names), say)

    def on_signal(signum: int, _frame: object) -> None:
        stack.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    say("starting daemon, router and dashboard (the first start converts the embedded model) …")
    try:
        stack.start()
    except supervisor.StartFailed as error:
        say(f"tracefix demo failed: {error}")
        return 1
    dashboard = settings.dashboard
    dashboard_url = f"http://{loopback(dashboard.host)}:{dashboard.port}"
    tally = Tally()
    traffic = Traffic(settings, tally, policy, rate)
    client = DaemonClient(settings)
    narrator = Narrator(
        client, tally, auto_approve, dashboard_url, say, traffic.hold if hold_while_training else None,
        settings.training.warm_start_examples > 0, adapters, started,
    )  # fmt: skip
    deadline = time.monotonic() + minutes * 60 if minutes else None
    console = Console(stderr=True)
    if not stack.stopping.is_set():
        traffic.start()
        narrator.event("started", f"the example airline deployment is running ({policy}); watch it all at {dashboard_url}")

    def table() -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column()
        for key, value in narrator.rows.items():
            grid.add_row(key, value)
        if traffic.error:
            grid.add_row("agent", f"[yellow]{traffic.error}[/yellow]")
        if deadline is not None:
            grid.add_row("time left", f"{max(0, deadline - time.monotonic()) / 60:.1f} min")
        return grid

    watcher = threading.Thread(target=stack.watch, name="demo-supervisor", daemon=True)
    watcher.start()
    with Live(table(), console=console, refresh_per_second=2, transient=False) as live:
        narrator.say = lambda line: live.console.print(line, soft_wrap=True)  # whole lines, also in a log file
        failed_polls: set[str] = set()
        while not stack.stopping.wait(2):
            try:
                narrator.poll()
            except Exception as error:  # a narration bug must not stop the deployment it narrates
                if repr(error) not in failed_polls:
                    failed_polls.add(repr(error))
                    live.console.print(f"narration skipped a poll: {error!r}", soft_wrap=True)
            live.update(table())
            if deadline is not None and time.monotonic() > deadline:
                break
            if after and len(tally.after) >= after:
                what = "the adapter" if adapters == 1 else f"{adapters} adapters"
                live.console.print(f"{len(tally.after)} model-driven conversations since {what} went live: done", soft_wrap=True)
                break
    traffic.stopping.set()
    say("stopping …")
    traffic.join(120)  # its conversations in flight finish and their spans go out before the collector stops
    numbered = " · ".join(f"{period} {tally.failure_rate(outcomes)}" for period, outcomes in tally.outcomes.items() if period not in ("before", "canary", "after"))
    say(
        f"model-driven failure rate before the adapter: {tally.failure_rate(tally.before)}; after: {tally.failure_rate(tally.after)}"
        f" (during the canary: {tally.failure_rate(tally.canary)})" + (f"; one adapter after another: {numbered}" if numbered else "")
    )
    if not stack.stopping.is_set():  # the daemon is still up: read its labels of the same conversations
        measured = narrator.measured()
        say(success_text(measured))
        if line := lacking_text(measured):
            say(line)
        if report is not None:
            document = {
                "settings": {
                    "fast": fast, "policy": policy, "rate": rate, "hold_while_training": hold_while_training,
                    "minutes": minutes, "after": after, "adapters": adapters, "training": settings.training.model_dump(mode="json"),
                },
                "seconds": round(time.monotonic() - narrator.started, 1), "timeline": narrator.timeline,
                "selected": narrator.selected, "candidates": narrator.candidates, "live": narrator.live, "lives": narrator.lives,
                "panel": {"batches": PANEL_BATCHES, "goals": PANEL_BATCHES * PANEL_BATCH},
                **measured,
            }  # fmt: skip
            Path(report).write_text(json.dumps(document, indent=2))
            say(f"report written to {report}")
    stack.stop()
    client.close()
    return 0



def _has_streamlit() -> bool:
    import importlib.util

    return importlib.util.find_spec("streamlit") is not None
