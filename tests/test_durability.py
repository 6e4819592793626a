"""Durability: a request is acknowledged only once its spans are committed, so a SIGKILL loses nothing
that was acknowledged, and a restart reopens the same database and keeps accepting."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, make_daemon

from otlp_builders import JSON, json_bytes, post, simple_json_trace, span_count

BUILDERS = Path(__file__).with_name("otlp_builders.py")
SPANS_PER_BATCH = 40


def _acknowledged(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    acks = {}
    for line in path.read_text().splitlines():
        trace_id, count = line.split()
        acks[trace_id] = int(count)
    return acks


def test_every_acknowledged_span_survives_sigkill_mid_stream(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, writer={"max_wait_ms": 2}).start()
    stop_file = tmp_path / "stop"
    acks = {"http": tmp_path / "acks-http", "grpc": tmp_path / "acks-grpc"}
    targets = {"http": f"{daemon.http_url}/v1/traces", "grpc": daemon.grpc_endpoint}
    writers = [
        subprocess.Popen(
            [sys.executable, str(BUILDERS), transport, targets[transport], str(acks[transport]), str(stop_file), str(SPANS_PER_BATCH)],
            cwd=REPO,
        )
        for transport in ("http", "grpc")
    ]
    try:
        deadline = time.monotonic() + 30
        while min(len(_acknowledged(path)) for path in acks.values()) < 15:
            assert time.monotonic() < deadline, "the writers did not get 15 acknowledgements each"
            assert all(writer.poll() is None for writer in writers), "a writer process died"
            time.sleep(0.05)

        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        time.sleep(0.3)  # the writers keep trying against a dead daemon
    finally:
        stop_file.touch()
        for writer in writers:
            writer.wait(30)
    acknowledged = {**_acknowledged(acks["http"]), **_acknowledged(acks["grpc"])}
    assert len(acknowledged) >= 30

    daemon.start()
    status = daemon.status()
    assert status["healthy"] is True
    assert status["database"]["path"] == str(daemon.db_path)
    assert status["counts"]["spans"] >= sum(acknowledged.values())
    # The restarted daemon takes new traffic and assembles what was committed before the kill.
    _, _, document = simple_json_trace(2, service_name="after-restart")
    assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
    assembled = daemon.wait_assembled()
    daemon.stop()

    stored = dict(daemon.query("SELECT trace_id, count(DISTINCT span_id) FROM spans GROUP BY trace_id"))
    lost = {trace_id: (count, stored.get(trace_id, 0)) for trace_id, count in acknowledged.items() if stored.get(trace_id) != count}
    assert lost == {}, f"acknowledged spans lost after SIGKILL (acknowledged, stored): {lost}"
    assert daemon.query("SELECT count(*) FROM spans WHERE service_name = 'after-restart'") == [(2,)]
    assert assembled["counts"]["trajectories"] == len(stored)
    assert daemon.query("SELECT count(*) FROM trajectories") == [(len(stored),)]


def test_restart_after_sigterm_reopens_the_same_database_and_keeps_accepting(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path).start()
    for _ in range(3):
        _, _, document = simple_json_trace(4)
        assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
    before = daemon.wait_assembled()

    daemon.stop(signal.SIGTERM)
    daemon.start()

    after = daemon.status()
    assert after["database"]["path"] == before["database"]["path"]
    assert after["database"]["schema_version"] == before["database"]["schema_version"]
    assert after["counts"] == before["counts"]
    assert after["counts"]["spans"] == 12
    assert after["ingest"]["committed_batch"] == before["ingest"]["committed_batch"]
    _, _, document = simple_json_trace(4)
    assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
    assert span_count(daemon) == 16
    assert daemon.wait_assembled()["counts"]["trajectories"] == 4
    daemon.stop()


def test_sigterm_runs_the_drain_closes_the_database_and_exits_cleanly(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path).start()
    _, _, document = simple_json_trace(3)
    assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200

    returncode = daemon.stop(signal.SIGTERM)

    # The drain (receivers, scheduler, writer, then the store) logs its end; closing DuckDB checkpoints
    # the write-ahead log into the file.
    assert "tracefix daemon stopped" in daemon.log_path.read_text()
    wal = daemon.db_path.with_name(daemon.db_path.name + ".wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert returncode == 0
    assert daemon.query("SELECT count(*) FROM spans") == [(3,)]


def test_second_daemon_on_the_same_database_exits_with_a_message_instead_of_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = make_daemon(tmp_path / "first").start()
    try:
        second = make_daemon(tmp_path / "second", store={"path": str(first.db_path)})
        completed = subprocess.run(
            [sys.executable, "-m", "tracefix.daemon.app.cli", "daemon", "--config", str(second.config_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert completed.returncode != 0
        assert "another tracefix daemon" in completed.stderr
        assert "Traceback" not in completed.stderr
        assert first.status()["healthy"] is True
    finally:
        first.stop()


@pytest.mark.slow  # needs root: it mounts a tmpfs of its own (run by hand with -m slow)
def test_a_full_disk_refuses_exports_retryably_loses_nothing_acknowledged_and_recovers(tmp_path: Path) -> None:
    """The store on a 16 MB tmpfs, filled up by a file beside it: exports get 503 with Retry-After
    (OTLP exporters retry it) while nothing fits, every acknowledged span is stored, and ingest
    takes traffic again once the file is removed, without a restart."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"mounting a tmpfs needs root: {mounted.stderr}"
    try:
        daemon = make_daemon(tmp_path, store={"path": str(disk / "tracefix.duckdb")}, writer={"max_wait_ms": 2}).start()
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (shutil.disk_usage(disk).free - 3 * 2**20))  # about 3 MB left
        acknowledged, refused = [], []
        try:
            while len(refused) < 3 and len(acknowledged) < 2000:
                trace_id, _, document = simple_json_trace(20, service_name="filling")
                for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
                    span["attributes"].append({"key": "payload", "value": {"stringValue": "x" * 2000}})
                answer = post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON)
                (acknowledged if answer.status_code == 200 else refused).append((trace_id, answer))
            assert refused, "the disk never filled up"
            for _, answer in refused:
                assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
                assert "No space left on device" in answer.json()["message"]
            filler.unlink()
            trace_id, _, document = simple_json_trace(3, service_name="after-space-returned")
            assert post(f"{daemon.http_url}/v1/traces", json_bytes(document), JSON).status_code == 200
            daemon.wait_assembled(timeout_s=60)
        finally:
            daemon.stop()
        stored = dict(daemon.query("SELECT trace_id, count(*) FROM spans GROUP BY trace_id"))
        assert all(stored.get(trace_id) == 20 for trace_id, _ in acknowledged), "an acknowledged trace was lost"
        assert stored.get(trace_id) == 3
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
