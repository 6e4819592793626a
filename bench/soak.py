"""A soak: the whole stack under steady load for a long while, and whether it holds.

A real daemon and a real `tracefix router` (the configured model, SmolLM2-135M by default) run
together for `--minutes`: traces arrive at a steady rate (the seeded example agent with two planted
gaps, OTLP/HTTP), the analysis labels them and selects the gaps, the daemon synthesises an
environment and trains an adapter on it (small settings, so a run fits in the soak), and chat
completions are served at a steady rate through the router. Every `--sample-s` the resident memory
of each process (the daemon, the router, any training or validation job the daemon started) is
recorded, and the daemon's split into what DuckDB's buffer manager holds (its /metrics; a cache
bounded by [store] memory_limit) and the rest.

What it reports: per process, resident memory at the start, after the first quarter and at the end,
and the slope over the last half (MB per 10 minutes: a plateau is near 0); requests and spans sent,
acknowledged and failed; the spans stored against those acknowledged (none may be missing); the
training runs started and finished.

    python bench/soak.py --minutes 20 --json .tracefix/soak.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.traffic import SERVICE_NAME, generate, send  # noqa: E402
from tests.conftest import RunningDaemon, free_port, make_daemon  # noqa: E402

GAPS = "precondition_verification=0.7:0.05,error_recovery=0.6:0.05"
PROMPTS = ["I need to cancel reservation R-1001.", "Can I add a bag to my booking?", "My flight was cancelled, what now?"]


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Load:
    """Traces and chat completions at steady rates, counted."""

    def __init__(self, daemon: RunningDaemon, router_url: str, traces_per_s: float, requests_per_s: float) -> None:
        self.daemon, self.router_url = daemon, router_url
        self.traces_per_s, self.requests_per_s = traces_per_s, requests_per_s
        self.stop = threading.Event()
        self.counts = {"batches": 0, "spans_sent": 0, "spans_acknowledged": 0, "spans_failed": 0, "requests": 0, "requests_failed": 0}
        self.errors: list[str] = []
        self.trace_ids: list[str] = []

    def traces(self) -> None:
        batch = 0
        while not self.stop.is_set():
            started = time.monotonic()
            plans = generate(10, seed=10_000 + batch, gaps=GAPS)
            summary = send(plans, self.daemon.http_url, "http/protobuf", "log", gaps=GAPS)
            self.counts["batches"] += 1
            self.counts["spans_sent"] += summary.spans
            self.counts["spans_acknowledged"] += summary.exported_spans or 0
            self.counts["spans_failed"] += summary.spans - (summary.exported_spans or 0)
            self.trace_ids += [plan.trace_id for plan in plans]
            batch += 1
            self.stop.wait(max(0.0, 10 / self.traces_per_s - (time.monotonic() - started)))

    def requests(self) -> None:
        index = 0
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                body = {
                    "model": "base", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
                    "metadata": {"conversation_id": f"soak-{index}", "agent": SERVICE_NAME},
                }  # fmt: skip
                try:
                    answer = client.post(f"{self.router_url}/v1/chat/completions", json=body)
                    if answer.status_code != 200:
                        raise RuntimeError(f"{answer.status_code}: {answer.text[:200]}")
                except Exception as error:  # every failure is counted and kept
                    self.counts["requests_failed"] += 1
                    self.errors.append(f"request {index}: {error}")
                self.counts["requests"] += 1
                index += 1
                self.stop.wait(max(0.0, 1 / self.requests_per_s - (time.monotonic() - started)))


def rss_mb(process: psutil.Process) -> float:
    try:
        return process.memory_info().rss / 2**20
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def duckdb_mb(daemon_url: str) -> float | None:
    """What the daemon's DuckDB buffer manager holds (its /metrics), in MB; None when unreadable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{daemon_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "tracefix_database_memory_bytes":
            return round(family.samples[0].value / 2**20, 1)
    return None


def sample(daemon: psutil.Process, router: psutil.Process, at_s: float, daemon_url: str) -> dict[str, Any]:
    """Resident memory of each process; the daemon's also split into DuckDB's buffer manager (a
    cache bounded by [store] memory_limit) and the rest."""
    jobs = [child for child in daemon.children(recursive=True) if "trainer." in " ".join(_cmdline(child))]
    resident, duckdb = rss_mb(daemon), duckdb_mb(daemon_url)
    return {
        "at_s": round(at_s, 1), "daemon": round(resident, 1),
        "daemon_duckdb": duckdb, "daemon_without_duckdb": None if duckdb is None else round(resident - duckdb, 1),
        "router": round(rss_mb(router), 1),
        "jobs": round(sum(rss_mb(job) for job in jobs), 1), "job_names": sorted({_job_name(job) for job in jobs}),
    }  # fmt: skip


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _job_name(process: psutil.Process) -> str:
    return next((part for part in _cmdline(process) if part.startswith("trainer.")), "?")


def slope_per_10_min(samples: list[dict[str, Any]], key: str) -> float | None:
    """Least-squares slope of `key` over the last half of the samples, in MB per 10 minutes."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return None
    xs, ys = [item["at_s"] for item in half], [item[key] for item in half]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    variance = sum((x - mean_x) ** 2 for x in xs)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / variance * 600, 1) if variance else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--traces-per-s", type=float, default=2.0)
    parser.add_argument("--requests-per-s", type=float, default=0.5)
    parser.add_argument("--sample-s", type=float, default=15.0)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", type=Path, default=REPO / ".tracefix" / "models")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        daemon = make_daemon(
            Path(directory),
            analysis={"interval_s": 10.0, "min_failures": 10},
            model={"name": args.model, "cache_dir": str(args.cache), "threads": 1, "max_new_tokens": 32},
            router={"port": free_port(), "routing": "classifier"},
            training={"enabled": True, "warm_start_examples": 4, "steps": 1, "group_size": 2, "groups_per_step": 1, "eval_seeds": 4},
        ).start()  # fmt: skip
        router_url = f"http://127.0.0.1:{daemon.sections['router']['port']}"
        router_log = (Path(directory) / "router.log").open("ab")
        router = subprocess.Popen(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(daemon.config_path)], cwd=REPO, stdout=router_log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while True:
                assert router.poll() is None, "the router exited:\n" + (Path(directory) / "router.log").read_text()[-3000:]
                try:
                    if httpx.get(f"{router_url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the router did not start"
                time.sleep(1)
            log(f"daemon and router up; load for {args.minutes:g} minutes")
            load = Load(daemon, router_url, args.traces_per_s, args.requests_per_s)
            threads = [threading.Thread(target=load.traces, daemon=True), threading.Thread(target=load.requests, daemon=True)]
            for thread in threads:
                thread.start()
            processes = psutil.Process(daemon.process.pid), psutil.Process(router.pid)  # type: ignore[union-attr]
            samples, started = [], time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                samples.append(sample(*processes, time.monotonic() - started, daemon.api_url))
                log(f"{samples[-1]} · {load.counts}")
                time.sleep(args.sample_s)
            load.stop.set()
            for thread in threads:
                thread.join(180)
            daemon.wait_assembled(timeout_s=300)
            runs = daemon.get("/api/runs")["items"]
        finally:
            router.terminate()
            router.wait(60)
            daemon.stop()
        stored = dict(daemon.query(f"SELECT trace_id, count(*) FROM spans WHERE service_name = '{SERVICE_NAME}' GROUP BY trace_id"))
    acknowledged_traces = len(load.trace_ids)
    missing = [trace_id for trace_id in load.trace_ids if trace_id not in stored]
    report = {
        "minutes": args.minutes, "traces_per_s": args.traces_per_s, "requests_per_s": args.requests_per_s, **load.counts,
        "spans_stored": sum(stored.values()), "traces_sent": acknowledged_traces, "traces_missing": len(missing),
        "request_errors": load.errors[:20],
        "runs": [{"run_id": run["run_id"], "capability": run["capability"], "status": run["status"]} for run in runs],
        "memory": {
            key: {
                "start": samples[0][key], "quarter": samples[len(samples) // 4][key], "end": samples[-1][key],
                "max": max(item[key] for item in samples), "slope_last_half_mb_per_10min": slope_per_10_min(samples, key),
            }
            for key in ("daemon", "daemon_duckdb", "daemon_without_duckdb", "router", "jobs")
            if all(item[key] is not None for item in samples)
        },
        "samples": samples,
    }  # fmt: skip
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(json.dumps({key: value for key, value in report.items() if key != "samples"}, indent=2))
    return 0 if not missing and not load.counts["requests_failed"] and not load.counts["spans_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
