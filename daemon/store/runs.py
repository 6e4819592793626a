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

from tracefix.daemon.core import tracks
from tracefix.daemon.core.generalist import PREFIX as GENERALIST_PREFIX
from tracefix.daemon.core.states import RUN_FINISHED, AdapterState, EnvironmentStatus, RequestStatus, RunStatus
from tracefix.daemon.store.environments import EnvironmentStore
from tracefix.daemon.store.sql import Tables

_JSON_COLUMNS = ("config", "result", "evaluation", "tools", "validation", "checks", "baseline")


def _decoded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        for column in _JSON_COLUMNS:
            if isinstance(row.get(column), str):
                row[column] = orjson.loads(row[column])
    return rows


# Trained first among the ready environments: carrying a goal's steps through in sequence is what an
# agent that gets each step right still lacks (a generalist that stops before the change, say).
FIRST = ("multi_step_completion",)

class RunStore(Tables):
    """Training runs, their environments and the adapters they produce: every statement on those tables."""

    # -- what to train -------------------------------------------------------------------------

    def environment_to_train(
        self, validation_enabled: bool, warm_start: bool, waiting: Callable[[dict[str, Any]], bool] = lambda environment: False
    ) -> dict[str, Any] | None:
        """The oldest environment ready for training that has no run yet — those of ``FIRST`` before
        the others: validated; or rejected by the gate only because the base is too weak, when a
        warm start is configured; or checked, when validation is off. One for which
        `waiting(environment)` holds (its agent's generalist is on its way, say) is left for later."""
        rows = _decoded(
            self.store.query(
                "SELECT e.* FROM environments e WHERE NOT EXISTS "
                "(SELECT 1 FROM training_runs r WHERE r.environment_id = e.environment_id) "
                "AND (e.status = ? OR (e.status = ? AND NOT ?) OR (e.status = ? AND ?)) "
                "ORDER BY list_contains(?::VARCHAR[], split_part(e.capability, '.', 1)) DESC, e.environment_id",
                [EnvironmentStatus.VALIDATED, EnvironmentStatus.CHECKED, validation_enabled, EnvironmentStatus.REJECTED, warm_start,
                 list(FIRST)],  # fmt: skip
            )
        )
        for row in rows:
            if (row["status"] != EnvironmentStatus.REJECTED or _too_weak(row.get("validation"))) and not waiting(row):
                return row
        return None

    def generalists(self, state: str | None = None) -> list[dict[str, Any]]:
        """Generalist adapters (newest first), in `state` when given."""
        return _decoded(
            self.store.query(
                "SELECT * FROM adapters WHERE starts_with(capability, ?) AND (? IS NULL OR state = ?) ORDER BY adapter_id DESC",
                [GENERALIST_PREFIX, state, state],
            )
        )

    def create_run(
        self, environment: dict[str, Any], config: dict[str, Any], directory_root: str, starts_from: int | None = None
    ) -> dict[str, Any]:
        """A queued run for `environment` as the capability's next adapter version (starting from the
        weights of adapter `starts_from`, the agent's generalist, when given)."""
        with self.store.transaction() as tx:
            version = tx.execute(
                "SELECT coalesce(max(version), 0) + 1 FROM training_runs WHERE capability = ?", [environment["capability"]]
            ).fetchall()[0][0]
            run_id = tx.execute(
                "INSERT INTO training_runs (capability, environment_id, request_id, version, status, directory, config, created_at, starts_from) "
                "VALUES (?, ?, ?, ?, ?, '', ?, now(), ?) RETURNING run_id",
                [environment["capability"], environment["environment_id"], environment["request_id"], version, RunStatus.QUEUED,
                 orjson.dumps(config).decode(), starts_from],  # fmt: skip
            ).fetchall()[0][0]
            tx.execute("UPDATE training_runs SET directory = ? WHERE run_id = ?", [f"{directory_root}/run-{run_id}", run_id])
            if environment["request_id"] is not None:
                tx.execute("UPDATE training_requests SET status = ? WHERE request_id = ?", [RequestStatus.TAKEN, environment["request_id"]])
        return self.run(run_id)  # type: ignore[return-value]

    def create_generalist_run(
        self, capability: str, agent: str, config: dict[str, Any], directory_root: str, train: list[str], held_out: list[str]
    ) -> dict[str, Any]:
        """A queued generalist run for `agent` as its generalist's next version, with the trajectories it
        learns from (`train`) and is scored on (`held_out`) recorded beside it."""
        with self.store.transaction() as tx:
            version = tx.execute("SELECT coalesce(max(version), 0) + 1 FROM training_runs WHERE capability = ?", [capability]).fetchall()[0][0]
            run_id = tx.execute(
                "INSERT INTO training_runs (capability, environment_id, request_id, version, status, directory, config, created_at, kind, agent) "
                "VALUES (?, NULL, NULL, ?, ?, '', ?, now(), 'generalist', ?) RETURNING run_id",
                [capability, version, RunStatus.QUEUED, orjson.dumps(config).decode(), agent],
            ).fetchall()[0][0]
            tx.execute("UPDATE training_runs SET directory = ? WHERE run_id = ?", [f"{directory_root}/run-{run_id}", run_id])
            parts = [[run_id, trajectory_id, "train"] for trajectory_id in train] + [[run_id, trajectory_id, "held_out"] for trajectory_id in held_out]
            if parts:
                tx.executemany("INSERT INTO run_trajectories VALUES (?, ?, ?)", parts)
        return self.run(run_id)  # type: ignore[return-value]

    def run_trajectories(self, run_id: int) -> dict[str, list[str]]:
        """The trajectories a generalist run learned from and was scored on: {"train": [...], "held_out": [...]}."""
        parts: dict[str, list[str]] = {"train": [], "held_out": []}
        for row in self.store.query("SELECT trajectory_id, part FROM run_trajectories WHERE run_id = ? ORDER BY trajectory_id", [run_id]):
            parts.setdefault(row["part"], []).append(row["trajectory_id"])
        return parts

    def generalist_busy(self, capability: str) -> str | None:
        """Why no new generalist run starts for `capability` now (a run queued or running, or a version
        waiting for approval, in canary or live), or None."""
        rows = self.store.query(
            "SELECT 'run ' || run_id || ' is ' || status AS why FROM training_runs WHERE capability = ? AND status IN (?, ?) "
            "UNION ALL SELECT 'v' || version || ' is ' || state FROM adapters WHERE capability = ? AND state IN (?, ?, ?, ?) "
            "LIMIT 1",
            [capability, RunStatus.QUEUED, RunStatus.RUNNING,
             capability, AdapterState.CANDIDATE, AdapterState.APPROVED, AdapterState.CANARY, AdapterState.LIVE],  # fmt: skip
        )
        return rows[0]["why"] if rows else None

    def agent_outcomes(self, agent: str, last: int) -> tuple[int, int]:
        """(failed, with an outcome) among the agent's `last` most recent trajectories with a known outcome."""
        rows = self.store.query(
            "SELECT count(*) FILTER (WHERE outcome = 'failure') AS failures, count(*) AS total FROM ("
            "SELECT o.outcome FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) "
            "WHERE (t.service_name = ? OR t.agent_name = ?) AND o.outcome IN ('success', 'failure') "
            "ORDER BY t.end_time_unix_nano DESC LIMIT ?)",
            [agent, agent, last],
        )
        return int(rows[0]["failures"]), int(rows[0]["total"])

    def agent_names(self) -> list[str]:
        """Every service that sent trajectories with a known outcome."""
        rows = self.store.query(
            "SELECT DISTINCT t.service_name FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) "
            "WHERE o.outcome IN ('success', 'failure') ORDER BY 1"
        )
        return [row["service_name"] for row in rows]

    def successes_with_tools_of(self, agent: str, exclude_conversations: list[str], limit: int) -> list[str]:
        """Successful trajectories an agent's generalist may learn from, newest first, one per distinct
        first user turn: the agent's own, and any other service's whose tools are the agent's (the
        same names offered), but none whose conversation id starts with one of `exclude_conversations`."""
        rows = self.store.query(
            "WITH offered AS (SELECT trajectory_id, list(tool_name ORDER BY tool_name) AS names FROM trajectory_tools GROUP BY trajectory_id), "
            "own AS (SELECT list(DISTINCT tt.tool_name ORDER BY tt.tool_name) AS names FROM trajectory_tools tt "
            "JOIN trajectories t USING (trajectory_id) WHERE t.service_name = ? OR t.agent_name = ?), "
            "first_user AS (SELECT trajectory_id, min_by(content, position) AS turn FROM messages WHERE role = 'user' GROUP BY trajectory_id), "
            "eligible AS (SELECT t.trajectory_id, t.end_time_unix_nano, f.turn FROM trajectories t "
            "JOIN trajectory_outcomes o USING (trajectory_id) JOIN first_user f USING (trajectory_id) "
            "LEFT JOIN offered USING (trajectory_id) "
            "WHERE o.outcome = 'success' AND EXISTS (SELECT 1 FROM messages m WHERE m.trajectory_id = t.trajectory_id AND m.role = 'assistant') "
            "AND (t.service_name = ? OR t.agent_name = ? OR offered.names = (SELECT names FROM own)) "
            "AND NOT coalesce(list_bool_or(list_transform(?::VARCHAR[], lambda p: starts_with(coalesce(t.conversation_id, ''), p))), false)) "
            "SELECT trajectory_id FROM (SELECT *, row_number() OVER (PARTITION BY turn ORDER BY end_time_unix_nano DESC, trajectory_id) AS n FROM eligible) "
            "WHERE n = 1 ORDER BY end_time_unix_nano DESC, trajectory_id LIMIT ?",
            [agent, agent, agent, agent, exclude_conversations, limit],
        )
        return [row["trajectory_id"] for row in rows]

    def next_queued(self) -> dict[str, Any] | None:
        rows = _decoded(self.store.query("SELECT * FROM training_runs WHERE status = ? ORDER BY run_id LIMIT 1", [RunStatus.QUEUED]))
        return rows[0] if rows else None

    def requeue_running(self) -> int:
        """Runs a stopped or killed daemon left running go back to the queue (they resume)."""
        with self.store.transaction() as tx:
            return len(tx.execute(
                "UPDATE training_runs SET status = ? WHERE status = ? RETURNING run_id", [RunStatus.QUEUED, RunStatus.RUNNING]
            ).fetchall())  # fmt: skip

    # -- run state -----------------------------------------------------------------------------

    def set_run_status(self, run_id: int, from_status: str, status: str, result: dict[str, Any] | None = None, error: str | None = None) -> bool:
        """Compare-and-set: False when the run is no longer in `from_status`."""
        if status not in frozenset(RunStatus):
            raise ValueError(f"unknown run state {status!r}")
        finished = status in RUN_FINISHED
        with self.store.transaction() as tx:
            changed = tx.execute(
                "UPDATE training_runs SET status = ?, result = coalesce(?, result), error = ?, "
                "started_at = CASE WHEN ? THEN coalesce(started_at, now()) ELSE started_at END, "
                "finished_at = CASE WHEN ? THEN now() ELSE NULL END WHERE run_id = ? AND status = ? RETURNING request_id",
                [status, None if result is None else orjson.dumps(result).decode(), error, status == RunStatus.RUNNING, finished, run_id,
                 from_status],  # fmt: skip
            ).fetchall()
            if changed and finished and changed[0][0] is not None:
                tx.execute("UPDATE training_requests SET status = ? WHERE request_id = ?", [RequestStatus.DONE, changed[0][0]])
        return bool(changed)

    def add_candidate(self, run: dict[str, Any], path: str, manifest_sha256: str, result: dict[str, Any]) -> int | None:
        """Register the run's adapter as a candidate and finish the run as ``candidate`` in one
        transaction, so no reader sees the adapter of a run still marked running (or the reverse).
        None when the run is no longer running."""
        with self.store.transaction() as tx:
            changed = tx.execute(
                "UPDATE training_runs SET status = ?, result = ?, error = NULL, finished_at = now() "
                "WHERE run_id = ? AND status = ? RETURNING request_id",
                [RunStatus.CANDIDATE, orjson.dumps(result).decode(), run["run_id"], RunStatus.RUNNING],
            ).fetchall()
            if not changed:
                return None
            if changed[0][0] is not None:
                tx.execute("UPDATE training_requests SET status = ? WHERE request_id = ?", [RequestStatus.DONE, changed[0][0]])
            return tx.execute(
                "INSERT INTO adapters (capability, version, run_id, environment_id, path, manifest_sha256, state, evaluation, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, now()) RETURNING adapter_id",
                [run["capability"], run["version"], run["run_id"], run["environment_id"], path, manifest_sha256, AdapterState.CANDIDATE,
                 orjson.dumps(result["evaluation"]).decode()],
            ).fetchall()[0][0]  # fmt: skip

    def replay_cases(self, track: str, limit: int = 20) -> list[dict[str, Any]]:
        """The openings (first system and user message) of failed trajectories labelled LACKING for
        the track's capability, of its agent (``daemon.core.tracks``; any agent's for a bare
        capability): what the evaluation replays against base and adapter."""
        agent = tracks.agent_of(track)
        service = EnvironmentStore(self.store).service_of(agent) if agent is not None else None
        ids = [
            row["trajectory_id"]
            for row in self.store.query(
                "SELECT DISTINCT l.trajectory_id FROM labels l JOIN trajectory_outcomes o USING (trajectory_id) "
                "JOIN trajectories t USING (trajectory_id) WHERE l.capability = ? AND l.label = 'LACKING' "
                "AND o.outcome = 'failure' AND (? IS NULL OR t.service_name = ?) ORDER BY l.trajectory_id LIMIT ?",
                [tracks.capability_of(track), service, service, limit],
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
            "SELECT * FROM adapters WHERE capability = ? AND state = ? AND adapter_id <> ? ORDER BY version DESC LIMIT 1",
            [capability, AdapterState.LIVE, other_than],
        )
        return rows[0] if rows else None

    def retired_before(self, capability: str, version: int) -> dict[str, Any] | None:
        """The newest retired version of the capability older than `version` (what a rollback restores)."""
        rows = self.store.query(
            "SELECT * FROM adapters WHERE capability = ? AND state = ? AND version < ? ORDER BY version DESC LIMIT 1",
            [capability, AdapterState.RETIRED, version],
        )
        return rows[0] if rows else None

    def has_served(self) -> bool:
        """Whether any version was ever handed to the router."""
        served = [AdapterState.CANARY, AdapterState.LIVE, AdapterState.RETIRED, AdapterState.ROLLED_BACK]
        return bool(self.store.query("SELECT 1 FROM adapters WHERE state IN (?, ?, ?, ?) LIMIT 1", served))

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
