"""Training runs and the adapters they produce, in the daemon's DuckDB file.

A run trains one capability's environment into adapter version N of that capability:
queued → running → candidate | rejected_by_eval | failed. A run stopped with the daemon goes back
to queued and resumes from its checkpoints. Only a candidate run writes an adapter row; adapter
versions are immutable once written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from daemon.store.sql import Tables

RUN_STATES = ("queued", "running", "candidate", "rejected_by_eval", "failed")
_JSON_COLUMNS = ("config", "result", "evaluation", "tools", "validation", "checks", "baseline")


def _decoded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        for column in _JSON_COLUMNS:
            if isinstance(row.get(column), str):
                row[column] = orjson.loads(row[column])
    return rows


class RunStore(Tables):
    """Training runs, their environments and the adapters they produce: every statement on those tables."""

    # -- what to train -------------------------------------------------------------------------

    def environment_to_train(self, validation_enabled: bool, warm_start: bool) -> dict[str, Any] | None:
        """The oldest environment ready for training that has no run yet: validated; or rejected by
        the gate only because the base is too weak, when a warm start is configured; or checked,
        when validation is off."""
        rows = _decoded(
            self.store.query(
                "SELECT e.* FROM environments e WHERE NOT EXISTS "
                "(SELECT 1 FROM training_runs r WHERE r.environment_id = e.environment_id) "
                "AND (e.status = 'validated' OR (e.status = 'checked' AND NOT ?) OR (e.status = 'rejected' AND ?)) "
                "ORDER BY e.environment_id",
                [validation_enabled, warm_start],
            )
        )
        for row in rows:
            if row["status"] != "rejected" or _too_weak(row.get("validation")):
                return row
        return None

    def create_run(self, environment: dict[str, Any], config: dict[str, Any], directory_root: str) -> dict[str, Any]:
        """A queued run for `environment` as the capability's next adapter version."""
        with self.store.transaction() as tx:
            version = tx.execute(
                "SELECT coalesce(max(version), 0) + 1 FROM training_runs WHERE capability = ?", [environment["capability"]]
            ).fetchall()[0][0]
            run_id = tx.execute(
                "INSERT INTO training_runs (capability, environment_id, request_id, version, status, directory, config, created_at) "
                "VALUES (?, ?, ?, ?, 'queued', '', ?, now()) RETURNING run_id",
                [environment["capability"], environment["environment_id"], environment["request_id"], version, orjson.dumps(config).decode()],
            ).fetchall()[0][0]
            tx.execute("UPDATE training_runs SET directory = ? WHERE run_id = ?", [f"{directory_root}/run-{run_id}", run_id])
            if environment["request_id"] is not None:
                tx.execute("UPDATE training_requests SET status = 'taken' WHERE request_id = ?", [environment["request_id"]])
        return self.run(run_id)  # type: ignore[return-value]

    def next_queued(self) -> dict[str, Any] | None:
        rows = _decoded(self.store.query("SELECT * FROM training_runs WHERE status = 'queued' ORDER BY run_id LIMIT 1"))
        return rows[0] if rows else None

    def requeue_running(self) -> int:
        """Runs a stopped or killed daemon left running go back to the queue (they resume)."""
        with self.store.transaction() as tx:
            return len(tx.execute("UPDATE training_runs SET status = 'queued' WHERE status = 'running' RETURNING run_id").fetchall())

    # -- run state -----------------------------------------------------------------------------

    def set_run_status(self, run_id: int, from_status: str, status: str, result: dict[str, Any] | None = None, error: str | None = None) -> bool:
        """Compare-and-set: False when the run is no longer in `from_status`."""
        if status not in RUN_STATES:
            raise ValueError(f"unknown run state {status!r}")
        finished = status in ("candidate", "rejected_by_eval", "failed")
        with self.store.transaction() as tx:
            changed = tx.execute(
                "UPDATE training_runs SET status = ?, result = coalesce(?, result), error = ?, "
                "started_at = CASE WHEN ? = 'running' THEN coalesce(started_at, now()) ELSE started_at END, "
                "finished_at = CASE WHEN ? THEN now() ELSE NULL END WHERE run_id = ? AND status = ? RETURNING request_id",
                [status, None if result is None else orjson.dumps(result).decode(), error, status, finished, run_id, from_status],
            ).fetchall()
            if changed and finished and changed[0][0] is not None:
                tx.execute("UPDATE training_requests SET status = 'done' WHERE request_id = ?", [changed[0][0]])
        return bool(changed)

    def add_candidate(self, run: dict[str, Any], path: str, manifest_sha256: str, result: dict[str, Any]) -> int | None:
        """Register the run's adapter as a candidate and finish the run as ``candidate`` in one
        transaction, so no reader sees the adapter of a run still marked running (or the reverse).
        None when the run is no longer running."""
        with self.store.transaction() as tx:
            changed = tx.execute(
                "UPDATE training_runs SET status = 'candidate', result = ?, error = NULL, finished_at = now() "
                "WHERE run_id = ? AND status = 'running' RETURNING request_id",
                [orjson.dumps(result).decode(), run["run_id"]],
            ).fetchall()
            if not changed:
                return None
            if changed[0][0] is not None:
                tx.execute("UPDATE training_requests SET status = 'done' WHERE request_id = ?", [changed[0][0]])
            return tx.execute(
                "INSERT INTO adapters (capability, version, run_id, environment_id, path, manifest_sha256, state, evaluation, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'candidate', ?, now()) RETURNING adapter_id",
                [run["capability"], run["version"], run["run_id"], run["environment_id"], path, manifest_sha256,
                 orjson.dumps(result["evaluation"]).decode()],
            ).fetchall()[0][0]  # fmt: skip

    def replay_cases(self, capability: str, limit: int = 20) -> list[dict[str, Any]]:
        """The openings (first system and user message) of failed trajectories labelled LACKING for
        the capability: what the evaluation replays against base and adapter."""
        ids = [
            row["trajectory_id"]
            for row in self.store.query(
                "SELECT DISTINCT l.trajectory_id FROM labels l JOIN trajectory_outcomes o USING (trajectory_id) "
                "WHERE l.capability = ? AND l.label = 'LACKING' AND o.outcome = 'failure' ORDER BY l.trajectory_id LIMIT ?",
                [capability, limit],
            )
        ]
        if not ids:
            return []
        openings: dict[str, dict[str, Any]] = {}
        for row in self.store.query(
            "SELECT trajectory_id, role, content FROM messages WHERE list_contains(?, trajectory_id) "
            "AND role IN ('system', 'user') ORDER BY trajectory_id, position",
            [ids],
        ):
            case = openings.setdefault(row["trajectory_id"], {"trajectory_id": row["trajectory_id"]})
            case.setdefault(row["role"], row["content"])
        return [case for case in openings.values() if case.get("user")]

    # -- reads ---------------------------------------------------------------------------------

    def environment(self, environment_id: int) -> dict[str, Any] | None:
        rows = _decoded(self.store.query("SELECT * FROM environments WHERE environment_id = ?", [environment_id]))
        return rows[0] if rows else None

    def run(self, run_id: int) -> dict[str, Any] | None:
        rows = _decoded(self.store.query("SELECT * FROM training_runs WHERE run_id = ?", [run_id]))
        return rows[0] if rows else None

    def runs(self, capability: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return _decoded(
            self.store.query(
                "SELECT * FROM training_runs WHERE ? IS NULL OR capability = ? ORDER BY run_id DESC LIMIT ?",
                [capability, capability, limit],
            )
        )

    def adapter(self, adapter_id: int) -> dict[str, Any] | None:
        rows = _decoded(self.store.query("SELECT * FROM adapters WHERE adapter_id = ?", [adapter_id]))
        return rows[0] if rows else None

    def adapters(self, capability: str | None = None, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return _decoded(
            self.store.query(
                "SELECT * FROM adapters WHERE (? IS NULL OR capability = ?) AND (? IS NULL OR state = ?) "
                "ORDER BY adapter_id DESC LIMIT ?",
                [capability, capability, state, state, limit],
            )
        )

    # -- promotion: adapter states and their audit log --------------------------------------------

    def audit(self, adapter_id: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM audit_log WHERE ? IS NULL OR adapter_id = ? ORDER BY audit_id DESC LIMIT ?",
            [adapter_id, adapter_id, limit],
        )

    def live_adapter(self, capability: str, other_than: int) -> dict[str, Any] | None:
        """The capability's newest live version other than `other_than`."""
        rows = self.store.query(
            "SELECT * FROM adapters WHERE capability = ? AND state = 'live' AND adapter_id <> ? ORDER BY version DESC LIMIT 1",
            [capability, other_than],
        )
        return rows[0] if rows else None

    def retired_before(self, capability: str, version: int) -> dict[str, Any] | None:
        """The newest retired version of the capability older than `version` (what a rollback restores)."""
        rows = self.store.query(
            "SELECT * FROM adapters WHERE capability = ? AND state = 'retired' AND version < ? ORDER BY version DESC LIMIT 1",
            [capability, version],
        )
        return rows[0] if rows else None

    def has_served(self) -> bool:
        """Whether any version was ever handed to the router."""
        return bool(self.store.query("SELECT 1 FROM adapters WHERE state IN ('canary', 'live', 'retired', 'rolled_back') LIMIT 1"))

    def transition(
        self, adapter_id: int, to_state: str, reason: str, actor: str, action: str,
        check: Callable[[str], None], columns: dict[str, Any],
    ) -> tuple[str, str] | None:
        """Move an adapter to `to_state` and record it in the audit log, in one transaction.

        `check(from_state)` raises when the move is illegal (the lifecycle's rules); `columns` are set
        on the adapter row with it. Returns (from_state, capability), or None when there is no such adapter.
        """
        with self.store.transaction() as tx:
            rows = tx.execute("SELECT state, capability FROM adapters WHERE adapter_id = ?", [adapter_id]).fetchall()
            if not rows:
                return None
            from_state, capability = rows[0]
            check(from_state)
            assignments = "".join(f", {column} = ?" for column in columns)
            tx.execute(
                f"UPDATE adapters SET state = ?, state_reason = ?, last_error = NULL, updated_at = now(){assignments} WHERE adapter_id = ?",
                [to_state, reason, *columns.values(), adapter_id],
            )
            tx.execute(
                "INSERT INTO audit_log (decided_at, actor, action, adapter_id, capability, from_state, to_state, reason) "
                "VALUES (now(), ?, ?, ?, ?, ?, ?, ?)",
                [actor, action, adapter_id, capability, from_state, to_state, reason],
            )
        return from_state, capability

    def record_error(self, adapter_id: int, error: str) -> None:
        with self.store.transaction() as tx:
            tx.execute("UPDATE adapters SET last_error = ?, updated_at = now() WHERE adapter_id = ?", [error, adapter_id])


def _too_weak(validation: Any) -> bool:
    """The gate rejected the environment only because the base earned too little reward."""
    attempts = validation.get("attempts") if isinstance(validation, dict) else None
    return bool(attempts) and all(attempt.get("verdict") == "too_weak" for attempt in attempts)
