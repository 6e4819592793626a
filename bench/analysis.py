"""Benchmark of capability analysis: labeling throughput, full statistics recompute, incremental pass.

Dataset: `--distinct` trajectories from the demo agent's generator (examples/traffic.py) are sent
over OTLP/HTTP to a real daemon, which stores and assembles them; the daemon is stopped and the
stored rows (spans, logs, trajectories, messages, tool calls, outcomes) are replicated in SQL
with fresh ids until `--trajectories` exist (~10 spans each). Replication keeps the content
realistic and makes a 100k-trajectory store in seconds instead of the ~10 minutes the SDK
clients need to send it.

Then, in this process, on that DuckDB file (the daemon's code, no daemon):
- labeling: every trajectory labeled by the six rule labelers (trajectories/s);
- statistics: a full recompute over all labels, for the windows 'all' and '24h' (seconds);
- incremental: 1,000 new trajectories arrive; one analysis pass labels them and recomputes.

Prints one JSON line. Usage: python bench/analysis.py [--trajectories 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import duckdb  # noqa: E402

from tracefix.daemon.analysis.analyzer import Analyzer  # noqa: E402
from tracefix.daemon.analysis.capabilities import load_registry  # noqa: E402
from tracefix.daemon.core.settings import load_settings  # noqa: E402
from tracefix.daemon.store.store import Store  # noqa: E402
from examples.traffic import generate, send  # noqa: E402
from tests.conftest import make_daemon  # noqa: E402

# Tables copied per replica, with the id columns that must stay unique.
_REPLICATED = {
    "spans": ("trace_id",),
    "logs": ("log_id", "trace_id"),
    "trace_trajectories": ("trace_id", "trajectory_id"),
    "trajectories": ("trajectory_id",),
    "messages": ("trajectory_id", "trace_id"),
    "tool_calls": ("trajectory_id", "trace_id"),
    "trajectory_tools": ("trajectory_id",),
    "outcomes": ("trajectory_id",),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_seed_store(directory: Path, distinct: int, seed: int) -> Path:
    daemon = make_daemon(directory, analysis={"interval_s": 3600}, assembler={"interval_s": 0.2}).start()
    try:
        plans = generate(distinct, seed=seed, failure_rate=0.4)
        started = time.perf_counter()
        summary = send(plans, daemon.http_url, "http/protobuf", "log")
        daemon.wait_assembled(timeout_s=600)
        log(f"sent and assembled {distinct} trajectories ({summary.spans} spans) in {time.perf_counter() - started:.1f} s")
    finally:
        daemon.stop()
    return daemon.db_path


def replicate(path: Path, copies: int, batch: int) -> None:
    """Copy the original rows `copies - 1` times, ids suffixed by the copy number, one statement per table."""
    connection = duckdb.connect(str(path))
    for table, id_columns in _REPLICATED.items():
        columns = [row[0] for row in connection.execute(f"SELECT * FROM {table} LIMIT 0").description]
        select = []
        for column in columns:
            if column in id_columns:
                select.append(f"{column} || '~' || copy")
            elif column in ("updated_batch", "ingest_batch"):
                select.append(f"{batch}")
            else:
                select.append(column)
        connection.execute(
            f"INSERT INTO {table} SELECT {', '.join(select)} FROM {table}, range(1, {copies}) AS copies(copy)"
        )
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--distinct", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="tracefix-bench-analysis-"))
    path = build_seed_store(directory, args.distinct, args.seed)

    copies = max(1, args.trajectories // args.distinct)
    started = time.perf_counter()
    replicate(path, copies, batch=10_000)
    log(f"replicated to {copies * args.distinct} trajectories in {time.perf_counter() - started:.1f} s")

    settings = load_settings(environ={})
    settings.store.path = path
    settings.analysis.label_batch = 20_000
    store = Store(settings.store)
    registry = load_registry(settings.capabilities)
    analyzer = Analyzer(store, registry, settings.analysis, settings.capabilities)
    counts = store.counts()
    log(f"store: {counts['trajectories']} trajectories, {counts['spans']} spans, {store.database_bytes() / 1e6:.0f} MB")

    started = time.perf_counter()
    labeled = 0
    while done := analyzer.label_pass():
        labeled += done
    labeling_s = time.perf_counter() - started
    log(f"labeled {labeled} trajectories in {labeling_s:.1f} s")

    recompute = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        analyzer.stats_pass()
        recompute.append(time.perf_counter() - started)
    log(f"full statistics recompute: {[round(value, 3) for value in recompute]} s")

    # Incremental: 1,000 new trajectories arrive (copies with fresh ids, newest batch); one pass.
    incremental = []
    for repeat in range(args.repeats):
        fresh = _add_new_trajectories(store, copies + repeat, 1_000)
        started = time.perf_counter()
        result = analyzer.run_pass()
        incremental.append(time.perf_counter() - started)
        assert result.labeled == fresh, (result.labeled, fresh)
    log(f"incremental pass over 1,000 new trajectories: {[round(value, 3) for value in incremental]} s")
    store.close()

    print(
        json.dumps(
            {
                "benchmark": "analysis",
                "trajectories": counts["trajectories"],
                "spans": counts["spans"],
                "distinct_trajectories": args.distinct,
                "labels_per_trajectory": len(registry.names()),
                "labeling_trajectories_per_s": round(labeled / labeling_s),
                "stats_recompute_s_median": round(statistics.median(recompute), 3),
                "stats_recompute_s": [round(value, 3) for value in recompute],
                "incremental_1000_s_median": round(statistics.median(incremental), 3),
                "incremental_1000_s": [round(value, 3) for value in incremental],
                "targets": {"stats_recompute_s": 5.0, "labeling_trajectories_per_s": 2000, "incremental_1000_s": 1.0},
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "duckdb": duckdb.__version__},
            }
        )
    )


def _add_new_trajectories(store: Store, copy: int, count: int) -> int:
    """Insert `count` new trajectories (copies of existing ones, newest batch); returns how many."""
    with store.transaction() as tx:
        batch = tx.execute("SELECT max(updated_batch) + 1 FROM trajectories").fetchone()[0]
        tx.execute(
            "CREATE TEMP TABLE new_ids AS SELECT trajectory_id AS x FROM trajectories ORDER BY trajectory_id LIMIT ?",
            [count],
        )
        for table, id_columns in _REPLICATED.items():
            if "trajectory_id" not in [row[0] for row in tx.execute(f"SELECT * FROM {table} LIMIT 0").description]:
                continue
            columns = [row[0] for row in tx.execute(f"SELECT * FROM {table} LIMIT 0").description]
            select = [
                f"{c} || '+{copy}'" if c in id_columns else (str(batch) if c == "updated_batch" else c) for c in columns
            ]
            tx.execute(
                f"INSERT INTO {table} SELECT {', '.join(select)} FROM {table} WHERE trajectory_id IN (SELECT x FROM new_ids)"
            )
        tx.execute("DROP TABLE new_ids")
    return count


if __name__ == "__main__":
    main()
