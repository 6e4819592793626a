"""The whole improvement loop, measured: runs `tracefix demo --auto-approve` unattended in a fresh
data directory (its own ports, the shared model cache) and renders what the run measured as the
markdown section of docs/performance.md.

    python bench/demo_loop.py --minutes 40 --after 32                  # a run, printed
    python bench/demo_loop.py --minutes 40 --after 32 --write          # … and written into docs/performance.md
    python bench/demo_loop.py --minutes 90 --after 24 --adapters 2     # two capabilities' adapters, composed
    python bench/demo_loop.py --from-report .tracefix/bench-demo/report.json --write

What it shows: the capability with the biggest gap for the base model and its statistics, the
held-out success of base vs adapter on that capability's environment, when each stage happened, and
the example agent's task failure and the capability's lacking rate before vs after promotion, with
95 % intervals, over the same panel of seeded user goals; per goal and period, how many
conversations reached each step of the goal's reference solution and where the others broke.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.demo.narrator import number_text, share_text  # noqa: E402
from tracefix.daemon.core.progress import grpo_added_text, reference_name, retention_text  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- demo_loop:begin -->", "<!-- demo_loop:end -->"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_demo(arguments: argparse.Namespace) -> Path:
    """One unattended `tracefix demo`; returns the path of its report."""
    output = Path(arguments.output).resolve()
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    cache = Path(arguments.cache).resolve()
    config = output / "demo.toml"
    config.write_text(
        f'[store]\npath = "{output / "data" / "tracefix.duckdb"}"\n'
        f"[collector]\nhttp_port = {free_port()}\ngrpc_port = {free_port()}\n[api]\nport = {free_port()}\n"
        f"[router]\nport = {free_port()}\n[dashboard]\nport = {free_port()}\n"
        f'[model]\ncache_dir = "{cache}"\n'
    )
    report = output / "report.json"
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "demo", "--config", str(config), "--auto-approve", "--minutes", str(arguments.minutes),
               "--after", str(arguments.after), "--adapters", str(arguments.adapters), "--report", str(report),
               *(["--fast"] if arguments.fast else [])]  # fmt: skip
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, check=False)
    print(f"demo finished in {time.monotonic() - started:.0f} s with exit status {done.returncode}", file=sys.stderr)
    if done.returncode != 0 or not report.exists():
        raise SystemExit(f"the demo did not write its report (exit status {done.returncode})")
    return report


def _rate(record: dict[str, Any] | None) -> str:
    if not record or not record.get("total"):
        return "–"
    low, high = record["interval"]
    return f"{record['rate']:.2f} [{low:.2f}, {high:.2f}] ({record['count']}/{record['total']})"


def _next_action(evaluation: dict[str, Any]) -> str:
    base, adapter, difference = evaluation["base"]["matched"], evaluation["adapter"]["matched"], evaluation["difference"]
    low, high = difference["interval"]
    return (
        f"base {base['rate']:.2f} [{base['interval'][0]:.2f}, {base['interval'][1]:.2f}] → adapter {adapter['rate']:.2f} "
        f"[{adapter['interval'][0]:.2f}, {adapter['interval'][1]:.2f}] of {evaluation['turns']} turns (paired {difference['rate']:+.2f} "
        f"[{low:+.2f}, {high:+.2f}], McNemar p {difference['mcnemar_p']:.2f}); the call alone: base {evaluation['base']['call']['rate']:.2f} → "
        f"{evaluation['adapter']['call']['rate']:.2f}, its tool: {evaluation['base']['call_tool']['rate']:.2f} → "
        f"{evaluation['adapter']['call_tool']['rate']:.2f}; learned from {evaluation['learned_from']} conversations"
    )


def _score(score: dict[str, Any]) -> str:
    low, high = score["success_interval"]
    return f"{score['success_rate']:.2f} [{low:.2f}, {high:.2f}] on {score['seeds']} seeds, mean reward {score['mean_reward']:.2f}"


def render(report: dict[str, Any], command: str) -> str:
    """The markdown section for docs/performance.md."""
    lines = [BEGIN, "### Measured by `bench/demo_loop.py`", "", "```", command, "```", ""]
    training = report["settings"]["training"]
    lines += [
        f"Run of {report['seconds'] / 60:.1f} min (`--fast`: {report['settings']['fast']}, traffic {report['settings']['policy']} at "
        f"{report['settings']['rate']} conversations/s); training: warm start {training['warm_start_examples']} demonstrations × "
        f"{training['warm_start_epochs']} epochs, {training.get('warm_start_batch', 4)} per update, at learning rate "
        f"{training['warm_start_learning_rate']:g}"
        f"{'' if training.get('warm_start_opening_gradient', True) else ', its gradient stopped at the opening'}, recipe {training.get('recipe', 'sft+grpo')} with {training['steps']} GRPO steps of "
        f"{training['groups_per_step']} × {training['group_size']} rollouts ({training.get('num_iterations', 1)} passes each), "
        f"{training['eval_seeds']} held-out seeds; "
        f"the model-driven traffic {'waits' if report['settings'].get('hold_while_training') else 'goes on'} while an adapter trains.",
        "",
        "| what | measured |",
        "|---|---|",
    ]
    for name, stats in report["selected"].items():
        lines.append(
            f"| gap selected: `{name}` | Δ {number_text(stats.get('delta'))}, coverage {number_text(stats.get('coverage'))}: "
            f"LACKING in {share_text(stats.get('er_minus'))} of failed runs that need it vs {share_text(stats.get('er_plus'))} of successful ones |"
        )
    for name, evaluation in report["candidates"].items():
        if evaluation.get("kind") == "next_action":
            lines.append(f"| generalist `{name}`, next action on {evaluation['conversations']} held-out successful conversations | {_next_action(evaluation)} |")
            continue
        target = evaluation["target"]
        lines.append(f"| held-out, `{name}` | {reference_name(evaluation)} {_score(target['base'])} → adapter {_score(target['adapter'])} |")
        if added := grpo_added_text(evaluation.get("grpo_added")):
            lines.append(f"| what GRPO added, `{name}` | {added} |")
        if kept := retention_text(evaluation):
            lines.append(f"| what `{name}` kept of its generalist | {kept} |")
    panel = report.get("panel") or {}
    for period, record in (report.get("success") or {}).items():
        if record.get("total"):
            lines.append(f"| task success on the panel ({panel.get('goals', '?')} goals), {period} | {_rate(record)} |")
    for pair in report.get("paired") or []:
        lines.append(
            f"| task success, {pair['to']} vs {pair['from']}, paired on {pair['goals']} goals (first conversation of each) | "
            f"{pair['before']} → {pair['after']} goals met: {pair['difference']:+.2f} [{pair['interval'][0]:+.2f}, {pair['interval'][1]:+.2f}], "
            f"McNemar p {pair['mcnemar_p']:.2f} |"
        )
    for check in report.get("learned_from") or []:
        lines.append(
            f"| what `{check['adapter']}` learned from | {check['learned_from']} successful conversations ({check['held_out']} more held out); "
            f"panel conversations among them: {check['panel_conversations']}; naming a panel customer (id and name): "
            f"{check['panel_customers']}; naming a panel reservation: {check['panel_reservations']} (panel seeds 0–{len(check['panel_seeds']) - 1}, "
            f"the flows' from {check['flow_seeds_from']}) |"
        )
    failure, lacking = report.get("failure", {}), report.get("lacking", {})
    lines.append(f"| model-driven task failure, before → after | {_rate(failure.get('before'))} → {_rate(failure.get('after'))} |")
    if lacking:
        capability = report["capability"]
        lines.append(f"| `{capability}` lacking on live traffic, before → after | {_rate(lacking.get('before'))} → {_rate(lacking.get('after'))} |")
    if failure.get("canary"):  # reports from before the canary was counted apart have none
        lines.append(
            f"| during the canary (a share routed to the adapter): task failure, `{report.get('capability')}` lacking | "
            f"{_rate(failure.get('canary'))}, {_rate(lacking.get('canary'))} |"
        )
    for period, record in failure.items():  # with more than one adapter: each one's canary and live period
        if period not in ("before", "canary", "after"):
            lines.append(f"| model-driven task failure, {period} | {_rate(record)} |")
    for capability, rates in (report.get("lacking_by_capability") or {}).items():
        if capability != report.get("capability"):
            lines.append(f"| `{capability}` lacking on live traffic, before → after | {_rate(rates.get('before'))} → {_rate(rates.get('after'))} |")
    own = report.get("agent_stats") or {}
    for name in report.get("lives") or list(report["selected"])[:1]:
        stats = (own.get("items") or {}).get(name)
        if stats:
            lines.append(
                f"| `{name}` in the model-driven agent's own runs (`{own['agent']}`) | LACKING in {share_text(stats.get('er_minus'))} of "
                f"its {stats['needed_failure']} failed runs that need it vs {share_text(stats.get('er_plus'))} of its "
                f"{stats['needed_success']} successful ones |"
            )
    lines += goal_steps_table(report.get("goal_steps") or {})
    lines += ["", "| at | stage |", "|---|---|"]
    for event in report["timeline"]:
        line = stage(event["line"]).replace("|", "\\|")
        lines.append(f"| {event['seconds'] / 60:.1f} min | {line} |")
    lines.append(END)
    return "\n".join(lines)


STAGE_WIDTH = 120


def stage(line: str) -> str:
    """A timeline line as the section shows it: what happened, without its details after " — " (the
    tables above hold the numbers), at most STAGE_WIDTH characters."""
    return textwrap.shorten(line.partition(" — ")[0], STAGE_WIDTH, placeholder=" …")


def goal_steps_table(periods: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per goal and period: how many conversations reached each step of the goal's reference
    solution, and where the rest broke (the first missed step and the capability it needed)."""
    lines = ["", "| goal | period | conversations | reaching each step | first missed step (capability): conversations |", "|---|---|---|---|---|"]
    for period, rows in periods.items():
        for row in rows:
            total = row["conversations"]
            reaching = " → ".join(f"{step} {count}/{total}" for step, count in zip(row["steps"], row["reaching"], strict=True))
            breaks = ", ".join(f"{item['step']} ({item['capability']}): {item['count']}" for item in row["breaks"]) or "none"
            lines.append(f"| {row['goal']} | {period} | {total} | {reaching} | {breaks} |")
    return lines if len(lines) > 3 else []


def write(section: str, document: Path) -> None:
    text = document.read_text()
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        text = head + section + rest.partition(END)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    document.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=40, help="the demo's time limit")
    parser.add_argument("--after", type=int, default=32, help="model-driven conversations to measure after the adapter goes live")
    parser.add_argument("--adapters", type=int, default=1, help="adapters to take live, one capability after another, before 'after'")
    parser.add_argument("--fast", action="store_true", help="the demo's smaller settings")
    parser.add_argument("--output", default=".tracefix/bench-demo", help="the run's data directory (emptied first)")
    parser.add_argument("--cache", default=".tracefix/models", help="the converted model cache to share")
    parser.add_argument("--from-report", type=Path, help="render an existing report instead of running the demo")
    parser.add_argument("--write", action="store_true", help="replace the measured section of docs/performance.md")
    arguments = parser.parse_args()
    report_path = arguments.from_report or run_demo(arguments)
    report = json.loads(report_path.read_text())
    # The command that produced the report: its own settings when it names them (older reports do not).
    ran = {"minutes": arguments.minutes, "after": arguments.after, "adapters": arguments.adapters, "fast": arguments.fast}
    ran.update({key: report["settings"][key] for key in ran if report.get("settings", {}).get(key) is not None})
    command = "python bench/demo_loop.py " + " ".join([
        f"--minutes {ran['minutes']:g}", f"--after {ran['after']}", *([f"--adapters {ran['adapters']}"] if ran["adapters"] != 1 else []),
        *(["--fast"] if ran["fast"] else []),
    ])  # fmt: skip
    section = render(report, command)
    print(section)
    if arguments.write:
        write(section, REPO / "docs" / "performance.md")


if __name__ == "__main__":
    main()
