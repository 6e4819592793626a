"""What training is built from: training requests, the environments synthesised for them, and the
tools agents declare or are seen calling."""

from __future__ import annotations

from typing import Any

import orjson

from tracefix.daemon.core import tracks
from tracefix.daemon.core.states import EnvironmentStatus, RequestStatus
from tracefix.daemon.store.sql import Tables


class EnvironmentStore(Tables):
    """Training requests, environments and tool definitions: every statement on those tables."""

    def open_training_request(self, capability: str) -> dict[str, Any] | None:
        rows = self.store.query(
            "SELECT * FROM training_requests WHERE capability = ? AND status IN (?, ?) "
            "ORDER BY request_id DESC LIMIT 1",
            [capability, RequestStatus.OPEN, RequestStatus.TAKEN],
        )
        return rows[0] if rows else None

    def create_training_request(
        self, capability: str, source: str, reason: str, requested_by: str | None, stats: str | None
    ) -> dict[str, Any]:
        with self.store.transaction() as tx:
            request_id = tx.execute(
                "INSERT INTO training_requests (capability, created_at, source, status, reason, requested_by, stats) "
                "VALUES (?, now(), ?, ?, ?, ?, ?) RETURNING request_id",
                [capability, source, RequestStatus.OPEN, reason, requested_by, stats],
            ).fetchall()[0][0]
        return self.store.query("SELECT * FROM training_requests WHERE request_id = ?", [request_id])[0]

    def training_requests(self, status: str | None = None) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM training_requests WHERE ? IS NULL OR status = ? ORDER BY request_id DESC", [status, status]
        )

    def lacking_service(self, track: str) -> str | None:
        """The agent a track's environment is built for: the track's own (``daemon.core.tracks``), or
        for a bare capability the agent whose failed runs lack it most often."""
        agent = tracks.agent_of(track)
        if agent is not None:
            return self.service_of(agent)
        rows = self.store.query(
            "SELECT t.service_name FROM labels l JOIN trajectories t USING (trajectory_id) "
            "JOIN trajectory_outcomes o USING (trajectory_id) "
            "WHERE l.capability = ? AND l.label = 'LACKING' AND o.outcome = 'failure' "
            "GROUP BY t.service_name ORDER BY count(*) DESC, t.service_name LIMIT 1",
            [track],
        )
        return rows[0]["service_name"] if rows else None

    def service_of(self, agent: str) -> str:
        """The service.name a track's (made-safe) agent name stands for; the name itself when no
        service that sent runs makes it."""
        services = self.store.query("SELECT DISTINCT service_name FROM trajectories ORDER BY 1")
        return next((row["service_name"] for row in services if tracks.safe(row["service_name"]) == agent), agent)

    def instructions_of(self, agent: str, limit: int = 8) -> list[str]:
        """The distinct system instructions of the (made-safe) agent's newest runs, newest first."""
        rows = self.store.query(
            "SELECT content FROM (SELECT m.content, max(t.updated_batch) AS newest FROM messages m "
            "JOIN trajectories t USING (trajectory_id) WHERE t.service_name = ? AND m.role = 'system' "
            "AND coalesce(m.content, '') <> '' GROUP BY m.content) ORDER BY newest DESC LIMIT ?",
            [self.service_of(agent), limit],
        )
        return [row["content"] for row in rows]

    def requests_without_environment(self) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT r.* FROM training_requests r WHERE r.status = ? AND NOT EXISTS "
            "(SELECT 1 FROM environments e WHERE e.request_id = r.request_id) ORDER BY r.request_id",
            [RequestStatus.OPEN],
        )

    def add_environment(
        self,
        capability: str,
        spec: dict[str, Any],
        service: str | None,
        tools: list[dict[str, Any]],
        request_id: int | None,
        status: str,
        checks: dict[str, Any],
    ) -> int:
        with self.store.transaction() as tx:
            return tx.execute(
                "INSERT INTO environments (capability, family, family_version, difficulty, service_name, tools_hash, "
                "tools, request_id, status, checks, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now()) "
                "RETURNING environment_id",
                [
                    capability, spec["family"], spec["version"], spec["difficulty"], service, spec["tools_hash"],
                    orjson.dumps(tools).decode(), request_id, status, orjson.dumps(checks).decode(),
                ],
            ).fetchall()[0][0]

    def environments(self, capability: str | None = None) -> list[dict[str, Any]]:
        items = self.store.query(
            "SELECT * FROM environments WHERE ? IS NULL OR capability = ? ORDER BY environment_id DESC",
            [capability, capability],
        )
        for item in items:
            item["tools"] = orjson.loads(item["tools"])
            item["checks"] = orjson.loads(item["checks"])
            if item.get("validation"):
                item["validation"] = orjson.loads(item["validation"])
        return items

    def environment_to_validate(self) -> dict[str, Any] | None:
        """The oldest environment that passed its checks and waits for the validation gate."""
        rows = self.store.query("SELECT * FROM environments WHERE status = ? ORDER BY environment_id LIMIT 1", [EnvironmentStatus.CHECKED])
        if not rows:
            return None
        rows[0]["tools"] = orjson.loads(rows[0]["tools"])
        return rows[0]

    def set_environment_status(
        self, environment_id: int, from_status: str, status: str, validation: dict[str, Any] | None = None
    ) -> bool:
        """Move an environment from `from_status` to `status`, with the gate's report when one is given.
        Compare-and-set: False (and nothing written) when it is no longer in `from_status`."""
        report = None if validation is None else orjson.dumps(validation).decode()
        with self.store.transaction() as tx:
            return bool(
                tx.execute(
                    "UPDATE environments SET status = ?, validation = coalesce(?, validation), "
                    "validated_at = CASE WHEN ? IS NULL THEN validated_at ELSE now() END "
                    "WHERE environment_id = ? AND status = ? RETURNING environment_id",
                    [status, report, report, environment_id, from_status],
                ).fetchall()
            )

    def requeue_validating(self) -> int:
        """Environments a stopped or killed daemon left `validating` wait for the gate again."""
        with self.store.transaction() as tx:
            return len(tx.execute(
                "UPDATE environments SET status = ? WHERE status = ? RETURNING environment_id",
                [EnvironmentStatus.CHECKED, EnvironmentStatus.VALIDATING],
            ).fetchall())  # fmt: skip

    def tool_definitions(self, service: str | None = None) -> list[dict[str, Any]]:
        """Declared tools per agent; without a service, those of the agent seen with the most tools."""
        if service is None:
            rows = self.store.query(
                "SELECT service_name FROM tool_definitions GROUP BY service_name ORDER BY count(*) DESC, service_name LIMIT 1"
            )
            if not rows:
                return []
            service = rows[0]["service_name"]
        items = self.store.query(
            "SELECT service_name, tool_name, description, parameters, first_seen, last_seen FROM tool_definitions "
            "WHERE service_name = ? ORDER BY tool_name",
            [service],
        )
        for item in items:
            item["parameters"] = orjson.loads(item["parameters"]) if item["parameters"] else None
        return items

    def tool_results(self, service: str | None, per_tool: int = 200) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Per tool of `service`'s agent (all agents when None), the (arguments, result) of its latest
        `per_tool` successful calls whose arguments and result are JSON: what its tools really return."""
        rows = self.store.query(
            "SELECT tool_name, arguments, result FROM ("
            "  SELECT c.tool_name, c.arguments, c.result, row_number() OVER "
            "    (PARTITION BY c.tool_name ORDER BY c.start_time_unix_nano DESC, c.trajectory_id, c.position) AS recent "
            "  FROM tool_calls c JOIN trajectories t USING (trajectory_id) "
            "  WHERE (? IS NULL OR t.service_name = ?) AND c.error IS NULL AND c.result IS NOT NULL"
            ") WHERE recent <= ? ORDER BY tool_name, recent",
            [service, service, per_tool],
        )
        results: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        for row in rows:
            try:
                arguments, result = orjson.loads(row["arguments"] or "{}"), orjson.loads(row["result"])
            except orjson.JSONDecodeError:
                continue  # a result in prose has no shape to learn
            if isinstance(arguments, dict):
                results.setdefault(row["tool_name"], []).append((arguments, result))
        return results

    # -- inferred tool schemas -----------------------------------------------------------------

    def observed_arguments(self, service_name: str, limit_per_tool: int = 500) -> list[tuple[str, str]]:
        """Recent (tool, arguments) pairs of one agent, to infer schemas when it declares none."""
        return self.store.cursor.execute(
            """
            SELECT tool_name, arguments FROM (
                SELECT c.tool_name, c.arguments,
                       row_number() OVER (PARTITION BY c.tool_name ORDER BY t.updated_batch DESC) AS n
                FROM tool_calls c JOIN trajectories t USING (trajectory_id)
                WHERE t.service_name = ? AND c.arguments IS NOT NULL
            ) WHERE n <= ?
            """,
            [service_name, limit_per_tool],
        ).fetchall()
