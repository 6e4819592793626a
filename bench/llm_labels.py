"""LLM labels off the critical path: how long imported runs wait for their rule labels with the LLM
labeler off and on, and how many trajectories a minute the LLM judges at the configured concurrency.

For each of off and on, a fresh daemon (its own DuckDB file) is started and N τ-bench runs (the
excerpt in tests/fixtures/taubench, repeated as further trials) are sent with `tracefix import`
(the real collector over loopback). Measured:

- seconds from the start of the import until every run has its rule labels in the statistics
  (every rule capability counts all N runs), off and on: on should not be slower;
- with the LLM on (`--llm-url`, any OpenAI-compatible endpoint: the tracefix router, vLLM, a hosted
  API): from the first call until every (run, custom capability) pair is judged, or `--llm-seconds`
  pass: pairs judged, pairs left in ERROR, calls made, pairs and calls per minute.

Usage:
  python bench/llm_labels.py --llm-url http://127.0.0.1:8000/v1 [--model base] [-n 100]
      [--concurrency 4] [--calls-per-minute 0] [--llm-runs 1] [--capability NAME=DESCRIPTION ...]
      [--llm-seconds 600] [--analysis-interval 1] [--repeats 3] [--json]

The rule-label timings are medians of `--repeats` off/on pairs (alternated); the judging is followed
in the first "on" run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import RunningDaemon, free_port, make_daemon  # noqa: E402

RUNS = REPO / "tests" / "fixtures" / "taubench" / "gpt-4o-airline-excerpt.json"
TOOLS = REPO / "tests" / "fixtures" / "taubench" / "airline-tools.json"
CAPABILITY = (
    "policy_adherence",
    "Grants or refuses what the user asks exactly as the airline's written policy says (fares, changes, refunds, baggage).",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def runs_file(directory: Path, count: int) -> Path:
    """`count` runs: the excerpt's runs in turn, each copy a trial of its own (so a trajectory of its own)."""
    source = json.loads(RUNS.read_text())
    runs = [{**source[index % len(source)], "trial": 1000 + index} for index in range(count)]
    path = directory / "runs.json"
    path.write_text(json.dumps(runs))
    return path


def start_daemon(directory: Path, args: argparse.Namespace, llm_on: bool) -> RunningDaemon:
    llm: dict[str, Any] = {"enabled": llm_on}
    if llm_on:
        llm.update(
            base_url=args.llm_url, model=args.model, runs=args.llm_runs, concurrency=args.concurrency,
            calls_per_minute=args.calls_per_minute, timeout_s=args.timeout,
        )  # fmt: skip
    daemon = make_daemon(
        directory, analysis={"interval_s": args.analysis_interval}, llm=llm, router={"port": free_port()}
    )  # the router a --llm-url may name is not the daemon's to manage
    if llm_on:
        custom = "".join(
            f'\n[[llm.custom]]\nname = {json.dumps(name)}\ndescription = {json.dumps(description)}\n'
            for name, description in args.capability
        )
        daemon.config_path.write_text(daemon.config_path.read_text() + custom)
    return daemon.start()


def import_runs(daemon: RunningDaemon, path: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "import", str(path), "--format", "tau-bench", "--tools", str(TOOLS),
               "--json", "--config", str(daemon.config_path)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"import failed ({done.returncode}): {done.stderr or done.stdout}")
    return json.loads(done.stdout)


def rule_labeled(daemon: RunningDaemon, custom: set[str], count: int) -> bool:
    """Every rule capability's latest statistics count all `count` runs."""
    items = [item for item in daemon.get("/api/capabilities")["items"] if item["name"] not in custom]
    counted = [sum((item["windows"].get("all") or {}).get(key) or 0 for key in ("n_success", "n_failure", "n_unknown"))
               for item in items]  # fmt: skip
    return bool(items) and min(counted) >= count


def measure(args: argparse.Namespace, llm_on: bool, follow_judging: bool = True) -> dict[str, Any]:
    custom = {name for name, _ in args.capability} if llm_on else set()
    with tempfile.TemporaryDirectory(prefix="llm-labels-") as directory:
        path = runs_file(Path(directory), args.n)
        (Path(directory) / "daemon").mkdir()
        daemon = start_daemon(Path(directory) / "daemon", args, llm_on)
        try:
            started = time.perf_counter()
            report = import_runs(daemon, path)
            imported = time.perf_counter() - started
            deadline = time.monotonic() + args.rules_timeout
            while not rule_labeled(daemon, custom, args.n):
                if time.monotonic() > deadline:
                    raise SystemExit(f"rule labels not in after {args.rules_timeout:g} s")
                time.sleep(0.1)
            result: dict[str, Any] = {
                "import_seconds": round(imported, 2),
                "seconds_to_rule_labels": round(time.perf_counter() - started, 2),
                "imported": report["requests"],
            }
            log(f"llm {'on' if llm_on else 'off'}: {args.n} runs imported in {imported:.1f} s, rule labels after "
                f"{result['seconds_to_rule_labels']:.1f} s")  # fmt: skip
            if llm_on and follow_judging:
                result.update(judge(daemon, args.n * len(custom), args.llm_seconds))
            return result
        finally:
            daemon.stop()


def judge(daemon: RunningDaemon, pairs: int, limit_s: float) -> dict[str, Any]:
    """Follow /api/status's llm block until every pair is judged (or in ERROR) or `limit_s` pass."""
    first_call = last_change = None
    done = 0
    deadline = time.monotonic() + limit_s
    llm: dict[str, Any] = {}
    while time.monotonic() < deadline:
        llm = daemon.status()["llm"]
        now = time.monotonic()
        if first_call is None and (llm["calls"] or llm["in_flight"]):
            first_call = now
        if llm["judged"] + llm["errors"] != done:
            done, last_change = llm["judged"] + llm["errors"], now
        if done >= pairs and not llm["in_flight"]:
            break
        time.sleep(0.2)
    seconds = (last_change or time.monotonic()) - (first_call or time.monotonic())
    per_minute = (lambda count: round(count * 60 / seconds, 2) if seconds > 0 else None)  # noqa: E731
    log(f"judged {llm['judged']} of {pairs} pairs ({llm['errors']} in ERROR) with {llm['calls']} calls in {seconds:.1f} s; "
        f"last error: {(llm['last_error'] or {}).get('message')}")  # fmt: skip
    return {
        "pairs": pairs,
        "judged": llm["judged"],
        "errors": llm["errors"],
        "calls": llm["calls"],
        "judging_seconds": round(seconds, 2),
        "pairs_per_minute": per_minute(llm["judged"] + llm["errors"]),
        "calls_per_minute": per_minute(llm["calls"]),
        "complete": done >= pairs,
        "last_error": (llm["last_error"] or {}).get("message"),
    }


def capability(text: str) -> tuple[str, str]:
    name, _, description = text.partition("=")
    if not name or not description:
        raise argparse.ArgumentTypeError("a capability is NAME=DESCRIPTION")
    return name.strip(), description.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm-url", required=True, help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="base", help="model name sent with each request")
    parser.add_argument("-n", type=int, default=100, help="runs imported")
    parser.add_argument("--concurrency", type=int, default=4, help="[llm] concurrency")
    parser.add_argument("--calls-per-minute", type=int, default=0, help="[llm] calls_per_minute (0 = unlimited)")
    parser.add_argument("--llm-runs", type=int, default=1, help="[llm] runs: labeling runs per trajectory")
    parser.add_argument("--timeout", type=float, default=120, help="[llm] timeout_s")
    parser.add_argument("--capability", type=capability, action="append", help="a [[llm.custom]] entry, NAME=DESCRIPTION")
    parser.add_argument("--llm-seconds", type=float, default=600, help="stop following the judging after this")
    parser.add_argument("--rules-timeout", type=float, default=600, help="give up waiting for the rule labels after this")
    parser.add_argument("--analysis-interval", type=float, default=1.0, help="[analysis] interval_s")
    parser.add_argument("--repeats", type=int, default=3, help="off/on pairs for the rule-label timings (medians); the first 'on' follows the judging")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    args.capability = args.capability or [CAPABILITY]

    offs, ons = [], []
    for repeat in range(max(1, args.repeats)):  # alternated, so a drift of the machine's speed hits both
        offs.append(measure(args, llm_on=False))
        ons.append(measure(args, llm_on=True, follow_judging=repeat == 0))
    off = {"seconds_to_rule_labels": [item["seconds_to_rule_labels"] for item in offs],
           "median_seconds_to_rule_labels": statistics.median(item["seconds_to_rule_labels"] for item in offs)}  # fmt: skip
    on = {**ons[0], "seconds_to_rule_labels": [item["seconds_to_rule_labels"] for item in ons],
          "median_seconds_to_rule_labels": statistics.median(item["seconds_to_rule_labels"] for item in ons)}  # fmt: skip
    on["on_over_off"] = round(on["median_seconds_to_rule_labels"] / off["median_seconds_to_rule_labels"], 3)
    result = {
        "runs": args.n, "llm_url": args.llm_url, "model": args.model, "capabilities": [name for name, _ in args.capability],
        "llm_runs": args.llm_runs, "concurrency": args.concurrency, "calls_per_minute": args.calls_per_minute,
        "analysis_interval_s": args.analysis_interval, "cpus": os.cpu_count(), "python": platform.python_version(),
        "llm_off": off, "llm_on": on,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
