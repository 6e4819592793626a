"""Labels, the statistics computed from them, and the capability states the trigger moves on them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import duckdb
import orjson
import pyarrow as pa

from tracefix.daemon.core import tracks
from tracefix.daemon.core.semconv import EVALUATION_EVENT
from tracefix.daemon.core.states import CapabilityState
from tracefix.daemon.store.sql import Tables, dicts, insert_rows

# Capability state moves come from several daemon jobs (trigger, synthesis, validation, training,
# promotion); they are serialised in process, since the daemon is DuckDB's only writer.
_STATE_MOVES = threading.Lock()

# `current` is the capability registry's (capability, labeler, labeler_version) triples: statistics
# and staleness only ever consider the labels of the labeler a capability has now.
_CURRENT = "current_labelers"


def _with_current(cursor: duckdb.DuckDBPyConnection, current: Sequence[tuple[str, str, str]]) -> None:
    table = pa.table(
        {
            "capability": [row[0] for row in current],
            "labeler": [row[1] for row in current],
            "labeler_version": [row[2] for row in current],
        },
        schema=pa.schema([("capability", pa.string()), ("labeler", pa.string()), ("labeler_version", pa.string())]),
    )
    cursor.register(_CURRENT, table)


def _wilson(successes: str, total: str, prefix: str) -> str:
    """SQL for a Wilson 95 % interval of successes/total, as columns <prefix>_low and <prefix>_high."""
    z2 = "3.8414588206941254"  # 1.959963984540054 squared
    p = f"({successes}::DOUBLE / {total})"
    center = f"(({p} + {z2} / (2 * {total})) / (1 + {z2} / {total}))"
    half = f"(sqrt({z2}) * sqrt({p} * (1 - {p}) / {total} + {z2} / (4 * {total} * {total})) / (1 + {z2} / {total}))"
    return (
        f"CASE WHEN {total} > 0 THEN greatest(0, {center} - {half}) END AS {prefix}_low, "
        f"CASE WHEN {total} > 0 THEN least(1, {center} + {half}) END AS {prefix}_high"
    )


class Thresholds(NamedTuple):
    """The selection rule's thresholds ([analysis] settings of the same names)."""

    min_delta: float
    min_coverage: float
    min_failures: int
    consistency: float


# The statistics of one pass over the pass tables (pass_trajectories, pass_labels, pass_windows):
# per window, agent and capability, the counts, ER+ and ER− with Wilson intervals, Δ, coverage, and
# the selection by the paper's rule (per run for LLM labelers, with their consistency). Every
# trajectory counts for all agents together (agent '') and, with $per_agent, for its own agent.
_STATS_SELECT = f"""
                WITH windowed AS (
                    SELECT w.window_name, t.agent, t.trajectory_id, t.outcome
                    FROM pass_trajectories t JOIN pass_windows w ON t.ended >= w.start_ns
                ),
                traj AS (
                    SELECT window_name, '' AS agent, trajectory_id, outcome FROM windowed
                    UNION ALL
                    SELECT window_name, agent, trajectory_id, outcome FROM windowed WHERE $per_agent
                ),
                totals AS (
                    SELECT window_name, agent, count(*) FILTER (WHERE outcome = 'failure') AS failed
                    FROM traj GROUP BY window_name, agent
                ),
                per_run AS (
                    SELECT traj.window_name, traj.agent, l.capability, l.run, l.trajectory_id, l.label, l.multi, traj.outcome
                    FROM pass_labels l JOIN traj USING (trajectory_id)
                ),
                voted AS (
                    SELECT window_name, agent, capability, trajectory_id, outcome, label FROM per_run WHERE NOT multi
                    UNION ALL
                    SELECT window_name, agent, capability, trajectory_id, any_value(outcome), mode(label)
                    FROM per_run WHERE multi GROUP BY window_name, agent, capability, trajectory_id
                ),
                counts AS (
                    SELECT window_name, agent, capability,
                        count(*) FILTER (WHERE outcome = 'success') AS n_success,
                        count(*) FILTER (WHERE outcome = 'failure') AS n_failure,
                        count(*) FILTER (WHERE outcome = 'unknown') AS n_unknown,
                        count(*) FILTER (WHERE outcome = 'success' AND label <> 'NA') AS needed_success,
                        count(*) FILTER (WHERE outcome = 'failure' AND label <> 'NA') AS needed_failure,
                        count(*) FILTER (WHERE outcome = 'success' AND label = 'LACKING') AS lacking_success,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING') AS lacking_failure
                    FROM voted GROUP BY window_name, agent, capability
                ),
                run_selection AS (
                    SELECT window_name, agent, capability, run,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING')::DOUBLE
                            / nullif(count(*) FILTER (WHERE outcome = 'failure' AND label <> 'NA'), 0)
                        - coalesce(count(*) FILTER (WHERE outcome = 'success' AND label = 'LACKING')::DOUBLE
                            / nullif(count(*) FILTER (WHERE outcome = 'success' AND label <> 'NA'), 0), 0)
                            AS delta,
                        count(*) FILTER (WHERE outcome = 'failure' AND label = 'LACKING') AS lacking_failure
                    FROM per_run WHERE multi GROUP BY window_name, agent, capability, run
                ),
                runs AS (
                    SELECT r.window_name, r.agent, r.capability, count(*) AS runs,
                        count(*) FILTER (
                            WHERE r.delta >= $min_delta AND r.lacking_failure::DOUBLE / nullif(t.failed, 0) >= $min_coverage
                        ) AS runs_selected
                    FROM run_selection r JOIN totals t USING (window_name, agent) GROUP BY r.window_name, r.agent, r.capability
                ),
                rates AS (
                    SELECT c.*, r.runs AS multi_runs, r.runs_selected AS multi_selected,
                        lacking_success::DOUBLE / nullif(needed_success, 0) AS er_plus,
                        lacking_failure::DOUBLE / nullif(needed_failure, 0) AS er_minus,
                        lacking_failure::DOUBLE / nullif(t.failed, 0) AS coverage,
                        needed_failure::DOUBLE / nullif(needed_success + needed_failure, 0) AS failure_rate
                    FROM counts c JOIN totals t USING (window_name, agent) LEFT JOIN runs r USING (window_name, agent, capability)
                ),
                gaps AS (
                    SELECT *, er_minus - coalesce(er_plus, 0) AS delta,
                        coalesce(er_minus - coalesce(er_plus, 0) >= $min_delta AND coverage >= $min_coverage, false)
                            AS gap
                    FROM rates
                ),
                voted_runs AS (
                    -- A single-run labeler is one run that selects when its labels show the gap.
                    SELECT *, coalesce(multi_runs, 1) AS runs,
                        coalesce(multi_selected, CASE WHEN gap THEN 1 ELSE 0 END) AS runs_selected
                    FROM gaps
                ),
                decided AS (
                    SELECT *,
                        gap AND needed_failure >= $min_failures AND runs_selected >= ceil($consistency * runs)
                            AS selected
                    FROM voted_runs
                )
                SELECT $pass_id AS pass_id, now() AS computed_at, window_name, capability,
                    n_success, n_failure, n_unknown, needed_success, needed_failure, lacking_success, lacking_failure,
                    er_plus, {_wilson("lacking_success", "needed_success", "er_plus")},
                    er_minus, {_wilson("lacking_failure", "needed_failure", "er_minus")},
                    delta, coverage,
                    failure_rate, {_wilson("needed_failure", "(needed_success + needed_failure)", "failure_rate")},
                    runs, runs_selected, selected,
                    CASE WHEN selected
                        THEN row_number() OVER (PARTITION BY window_name, agent, selected ORDER BY coverage DESC, capability)
                    END AS rank,
                    agent
                FROM decided
"""


class LabelStore(Tables):
    """The SQL of labeling, statistics and the trigger, on a Store's connection."""

    def trajectories_to_label(
        self, current: Sequence[tuple[str, str, str]], limit: int, after_batch: int = -1
    ) -> list[str]:
        """Trajectories missing a current label for some capability, or reassembled since labeling.

        With `after_batch`, only trajectories assembled after that batch are considered (the
        caller knows everything older is labeled), which keeps incremental passes cheap.
        """
        cursor = self.store.cursor
        _with_current(cursor, current)
        rows = cursor.execute(
            f"""
            WITH candidates AS (SELECT trajectory_id, updated_batch FROM trajectories WHERE updated_batch > ?),
            fresh AS (
                SELECT l.trajectory_id, count(DISTINCT l.capability) AS labeled
                FROM labels l
                JOIN {_CURRENT} c USING (capability, labeler, labeler_version)
                JOIN candidates t USING (trajectory_id)
                WHERE l.labeled_batch >= t.updated_batch
                GROUP BY l.trajectory_id
            )
            SELECT t.trajectory_id FROM candidates t LEFT JOIN fresh f USING (trajectory_id)
            WHERE coalesce(f.labeled, 0) < (SELECT count(*) FROM {_CURRENT})
            ORDER BY t.updated_batch, t.trajectory_id
            LIMIT ?
            """,
            [after_batch, limit],
        ).fetchall()
        cursor.unregister(_CURRENT)
        return [row[0] for row in rows]

    def unjudged(
        self, capability: str, labeler: str, version: str, limit: int, taken: Sequence[str] = ()
    ) -> tuple[list[tuple[str, int]], int]:
        """One capability's trajectories without a label of this labeler version, or reassembled since,
        newest first: up to `limit` (trajectory id, updated batch) not in `taken`, and how many there are
        in all (`taken` included)."""
        cursor = self.store.cursor
        unjudged = """
            FROM trajectories t WHERE NOT EXISTS (
                SELECT 1 FROM labels l WHERE l.trajectory_id = t.trajectory_id AND l.capability = $capability
                AND l.labeler = $labeler AND l.labeler_version = $version AND l.labeled_batch >= t.updated_batch
            )
        """
        which = {"capability": capability, "labeler": labeler, "version": version}
        total = cursor.execute(f"SELECT count(*) {unjudged}", which).fetchall()[0][0]
        rows = cursor.execute(
            f"SELECT t.trajectory_id, t.updated_batch {unjudged} "
            "AND t.trajectory_id NOT IN (SELECT unnest($taken::VARCHAR[])) "
            "ORDER BY t.updated_batch DESC, t.trajectory_id LIMIT $limit",
            {**which, "taken": list(taken), "limit": limit},
        ).fetchall()
        return [(row[0], row[1]) for row in rows], total

    def errored(self, capability: str, labeler: str, version: str, before: Any, limit: int) -> list[str]:
        """Trajectories with an ERROR label from this labeler version, labeled before `before`."""
        rows = self.store.cursor.execute(
            "SELECT DISTINCT trajectory_id FROM labels WHERE capability = ? AND labeler = ? AND labeler_version = ? "
            "AND label = 'ERROR' AND labeled_at < ? ORDER BY trajectory_id LIMIT ?",
            [capability, labeler, version, before, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def errored_count(self, capability: str, labeler: str, version: str) -> int:
        """How many trajectories have an ERROR label from this labeler version (each waits for its retry)."""
        return self.store.cursor.execute(
            "SELECT count(DISTINCT trajectory_id) FROM labels WHERE capability = ? AND labeler = ? "
            "AND labeler_version = ? AND label = 'ERROR'",
            [capability, labeler, version],
        ).fetchall()[0][0]

    def last_assembled_batch(self) -> int:
        return self.store.cursor.execute("SELECT coalesce(max(updated_batch), 0) FROM trajectories").fetchall()[0][0]

    def labeling_inputs(self, trajectory_ids: list[str], evaluations: bool = False) -> dict[str, Any]:
        """Everything labelers read for these trajectories, fetched in a handful of bulk queries.

        With `evaluations`, also their gen_ai.evaluation.result span events and log records
        ("evaluation_spans", "evaluation_logs"), for the labelers of [[capabilities.evaluations]].
        """
        cursor = self.store.cursor
        trajectories = dicts(
            cursor.execute(
                "SELECT t.trajectory_id, t.service_name, t.updated_batch, t.start_time_unix_nano, "
                "t.end_time_unix_nano, o.outcome FROM trajectories t "
                "JOIN trajectory_outcomes o USING (trajectory_id) "
                "WHERE t.trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                [trajectory_ids],
            )
        )
        # Rows carry their trajectory's batch: the filter lets DuckDB skip older row groups.
        oldest = min((row["updated_batch"] for row in trajectories), default=0)
        ids = [oldest, trajectory_ids]
        found = self._evaluation_events(trajectories) if evaluations else {"evaluation_spans": [], "evaluation_logs": []}
        return {
            **found,
            "trajectories": trajectories,
            "messages": cursor.execute(
                "SELECT trajectory_id, position, role, content, tool_calls, tool_call_id, span_id FROM messages "
                "WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "ORDER BY trajectory_id, position",
                ids,
            ).fetchall(),
            "tool_calls": cursor.execute(
                "SELECT trajectory_id, position, tool_name, call_id, arguments, result, error, message_position, span_id "
                "FROM tool_calls WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "ORDER BY trajectory_id, position",
                ids,
            ).fetchall(),
            "trajectory_tools": cursor.execute(
                "SELECT trajectory_id, tool_name, description, parameters FROM trajectory_tools "
                "WHERE updated_batch >= ? AND trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                ids,
            ).fetchall(),
            "agent_tools": cursor.execute(
                "SELECT service_name, tool_name, description, parameters FROM tool_definitions "
                "WHERE service_name IN (SELECT unnest(?::VARCHAR[]))",
                [sorted({row["service_name"] for row in trajectories})],
            ).fetchall(),
        }

    def _evaluation_events(self, trajectories: list[dict[str, Any]]) -> dict[str, list[tuple]]:
        """The gen_ai.evaluation.result span events and log records of these trajectories, as stored.

        Spans: (trajectory_id, span_id, end_time_unix_nano, events); the time range of the
        trajectories lets DuckDB skip row groups of older spans. Log records, which may come at any
        time after the run: (trajectory_id, span_id, time_unix_nano, attributes, body), joined by
        trace, or by conversation when they carry no trace (as assembly joins them).
        """
        if not trajectories:
            return {"evaluation_spans": [], "evaluation_logs": []}
        cursor = self.store.cursor
        ids = [row["trajectory_id"] for row in trajectories]
        first = min(row["start_time_unix_nano"] for row in trajectories)
        last = max(row["end_time_unix_nano"] for row in trajectories)
        spans = cursor.execute(
            "SELECT m.trajectory_id, s.span_id, s.end_time_unix_nano, s.events FROM spans s "
            "JOIN trace_trajectories m USING (trace_id) "
            "WHERE s.start_time_unix_nano BETWEEN ? AND ? AND contains(s.events, ?) "
            "AND m.trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
            "ORDER BY m.trajectory_id, s.start_time_unix_nano, s.span_id",
            [first, last, EVALUATION_EVENT, ids],
        ).fetchall()
        logs = cursor.execute(
            "SELECT coalesce(m.trajectory_id, l.conversation_id) AS trajectory_id, l.span_id, l.time_unix_nano, "
            "l.attributes, l.body FROM logs l LEFT JOIN trace_trajectories m USING (trace_id) "
            "WHERE l.event_name = ? AND (m.trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
            "OR (l.trace_id IS NULL AND l.conversation_id IN (SELECT unnest(?::VARCHAR[])))) "
            "ORDER BY trajectory_id, l.time_unix_nano, l.log_id",
            [EVALUATION_EVENT, ids, ids],
        ).fetchall()
        return {"evaluation_spans": spans, "evaluation_logs": logs}

    def replace_labels(self, trajectory_ids: list[str], labelers: Sequence[tuple[str, str]], rows: list[tuple]) -> None:
        """Swap in new labels for these trajectories (for the given capability/labeler pairs) atomically."""
        with self.store.transaction() as tx:
            pairs = pa.table({"capability": [p[0] for p in labelers], "labeler": [p[1] for p in labelers]})
            tx.register("relabeled", pairs)
            tx.execute(
                "DELETE FROM labels WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND (capability, labeler) IN (SELECT (capability, labeler) FROM relabeled)",
                [trajectory_ids],
            )
            tx.unregister("relabeled")
            insert_rows(tx, "labels", rows)

    def forget_labels(self, capability: str | None = None) -> int:
        """Delete labels (of one capability, or all) so the next pass relabels without re-ingesting."""
        with self.store.transaction() as tx:
            if capability is None:
                return tx.execute("DELETE FROM labels").fetchall()[0][0]
            return tx.execute("DELETE FROM labels WHERE capability = ?", [capability]).fetchall()[0][0]

    def forget_agent_labels(self, agents: Sequence[str], capabilities: Sequence[str]) -> int:
        """Delete these agents' labels of these capabilities (their profile changed): the next pass labels them again."""
        with self.store.transaction() as tx:
            return tx.execute(
                "DELETE FROM labels WHERE capability IN (SELECT unnest(?::VARCHAR[])) AND trajectory_id IN "
                "(SELECT trajectory_id FROM trajectories WHERE service_name IN (SELECT unnest(?::VARCHAR[])))",
                [list(capabilities), list(agents)],
            ).fetchall()[0][0]

    def recent_trajectory_ids(self, agent: str, outcome: str | None, limit: int) -> list[str]:
        """The agent's newest trajectories (of one outcome, or any), newest first."""
        rows = self.store.cursor.execute(
            "SELECT t.trajectory_id FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) "
            "WHERE t.service_name = ? AND (? IS NULL OR o.outcome = ?) ORDER BY t.updated_batch DESC, t.trajectory_id LIMIT ?",
            [agent, outcome, outcome, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def successes_of(self, agent: str) -> int:
        """How many successful runs the agent (service) has sent."""
        return self.store.cursor.execute(
            "SELECT count(*) FROM trajectories t JOIN trajectory_outcomes o USING (trajectory_id) WHERE t.service_name = ? AND o.outcome = 'success'",
            [agent],
        ).fetchall()[0][0]

    def services(self) -> list[str]:
        """Every agent (service) that sent trajectories."""
        return [row[0] for row in self.store.cursor.execute("SELECT DISTINCT service_name FROM trajectories ORDER BY 1").fetchall()]

    def agent_profiles(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Each agent's profile as last derived: agent -> (fingerprint, profile)."""
        rows = self.store.cursor.execute("SELECT agent, fingerprint, profile FROM agent_profiles").fetchall()
        return {agent: (fingerprint, orjson.loads(profile)) for agent, fingerprint, profile in rows}

    def save_agent_profile(self, agent: str, fingerprint: str, profile: dict[str, Any]) -> None:
        with self.store.transaction() as tx:
            tx.execute(
                "INSERT OR REPLACE INTO agent_profiles (agent, fingerprint, profile, derived_at) VALUES (?, ?, ?, now())",
                [agent, fingerprint, orjson.dumps(profile).decode()],
            )

    def compute_stats(
        self, current: Sequence[tuple[str, str, str]], windows: Sequence[tuple[str, int | None]], thresholds: Thresholds
    ) -> int:
        """Recompute every capability's statistics for each (window name, start ns) and store them as one pass.

        Returns the pass id. Per run (LLM labelers repeat labeling), the paper's selection rule is
        evaluated; a capability is selected when the majority-vote labels pass it and at least
        `consistency` of the runs pass it too.
        """
        pass_id = self.store.cursor.execute("SELECT coalesce(max(pass_id), 0) + 1 FROM capability_stats").fetchall()[0][0]
        with self.store.transaction() as tx:
            self._stats(tx, current, windows, thresholds, pass_id, store=True)
        return pass_id

    def scoped_stats(
        self, agent: str, current: Sequence[tuple[str, str, str]], windows: Sequence[tuple[str, int | None]], thresholds: Thresholds
    ) -> list[dict[str, Any]]:
        """The same statistics over one agent's trajectories only (its ``service.name`` or
        ``gen_ai.agent.name``), computed now and not stored: rows shaped like capability_stats',
        with pass_id 0. Another policy's runs (scripted flows, another agent) then lend it no contrast."""
        with self.store.transaction() as tx:
            return self._stats(tx, current, windows, thresholds, 0, agent=agent)

    @staticmethod
    def _stats(
        tx: duckdb.DuckDBPyConnection,
        current: Sequence[tuple[str, str, str]],
        windows: Sequence[tuple[str, int | None]],
        thresholds: Thresholds,
        pass_id: int,
        agent: str | None = None,
        store: bool = False,
    ) -> list[dict[str, Any]]:
        """Compute a pass's statistics from its pass tables (trajectories of `agent` only when
        given): inserted into capability_stats with `store`, else returned as rows."""
        _with_current(tx, current)
        # Outcomes and current labels once per pass.
        # Where an agent's generalist is live, the agent's runs count from when it went live: the
        # selection of targeted adapters runs on the generalist's own traffic, not on the base's.
        scope = (
            "JOIN trajectories t USING (trajectory_id) "
            "LEFT JOIN (SELECT r.agent, max(a.routed_since_ns) AS since FROM adapters a JOIN training_runs r USING (run_id) "
            "WHERE r.kind = 'generalist' AND a.state = 'live' GROUP BY r.agent) g ON g.agent = t.service_name "
            "WHERE (g.since IS NULL OR t.start_time_unix_nano >= g.since)"
        )
        if agent:
            scope += " AND (t.service_name = $agent OR t.agent_name = $agent)"
        tx.execute(
            "CREATE OR REPLACE TEMP TABLE pass_trajectories AS "
            f"SELECT o.trajectory_id, o.outcome, o.end_time_unix_nano AS ended, t.service_name AS agent FROM trajectory_outcomes o {scope}",
            {"agent": agent} if agent else None,
        )
        # `multi`: the capability's labeler repeats runs (LLM); single-run labels need no vote.
        tx.execute(
            f"CREATE OR REPLACE TEMP TABLE pass_labels AS "
            f"SELECT l.capability, l.run, l.trajectory_id, l.label, max(l.run) OVER (PARTITION BY l.capability) > 0 AS multi "
            f"FROM labels l JOIN {_CURRENT} c USING (capability, labeler, labeler_version) WHERE l.label <> 'ERROR'"
        )
        tx.register(
            "pass_windows",
            pa.table(
                {"window_name": [w[0] for w in windows], "start_ns": [w[1] or 0 for w in windows]},
                schema=pa.schema([("window_name", pa.string()), ("start_ns", pa.int64())]),
            ),
        )
        # All windows in one query: each trajectory appears once per window it falls in.
        # A stored pass holds every agent's own rows beside those over all agents.
        parameters = {**thresholds._asdict(), "pass_id": pass_id, "per_agent": store}
        cursor = tx.execute(("INSERT INTO capability_stats " if store else "") + _STATS_SELECT, parameters)
        rows: list[dict[str, Any]] = []
        if not store:
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        tx.unregister("pass_windows")
        tx.execute("DROP TABLE pass_trajectories")
        tx.execute("DROP TABLE pass_labels")
        tx.unregister(_CURRENT)
        return rows

    def stats(self, pass_id: int | None = None, agent: str | None = "") -> list[dict[str, Any]]:
        """The statistics of one pass (the latest by default): over all agents (agent ''), one agent's
        own, or (None) every agent's own rows."""
        return self.store.query(
            "SELECT * FROM capability_stats WHERE pass_id = coalesce(?, (SELECT max(pass_id) FROM capability_stats)) "
            "AND (agent = ? OR (? IS NULL AND agent <> '')) ORDER BY window_name, agent, capability",
            [pass_id, agent, agent],
        )

    def track_stats(self, track: str, window_name: str) -> dict[str, Any] | None:
        """A track's row of the latest pass (``daemon.core.tracks``): its agent's own statistics of the
        capability, or those over all agents for a bare capability."""
        agent = tracks.agent_of(track)
        rows = self.store.query(
            "SELECT * FROM capability_stats WHERE capability = ? AND window_name = ? "
            "AND pass_id = (SELECT max(pass_id) FROM capability_stats) AND (agent <> '') = ? ORDER BY agent",
            [tracks.capability_of(track), window_name, agent is not None],
        )
        return next((row for row in rows if agent is None or tracks.safe(row["agent"]) == agent), None)

    def stats_history(self, capability: str, window_name: str, limit: int = 200, agent: str = "") -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM (SELECT * FROM capability_stats WHERE capability = ? AND window_name = ? AND agent = ? "
            "ORDER BY pass_id DESC LIMIT ?) ORDER BY pass_id",
            [capability, window_name, agent, limit],
        )

    # -- trigger -------------------------------------------------------------------------------

    def states(self) -> dict[str, dict[str, Any]]:
        return {row["capability"]: row for row in self.store.query("SELECT * FROM capability_states")}

    def transition(
        self,
        capability: str,
        from_state: str,
        to_state: str,
        reason: str,
        consecutive: int,
        pass_id: int,
        stats: str | None = None,
        cooldown_until: Any = None,
    ) -> bool:
        """Move a capability from `from_state` to a state, recording the transition (a no-op move only
        updates counters). Compare-and-set: when another job has moved the capability since the caller
        read `from_state`, nothing is written and False is returned. Moves take turns: two
        concurrent DuckDB transactions updating the same row would fail with a write conflict."""
        with _STATE_MOVES, self.store.transaction() as tx:
            current = tx.execute("SELECT state FROM capability_states WHERE capability = ?", [capability]).fetchall()
            if current and current[0][0] != from_state:
                return False
            tx.execute(
                "INSERT INTO capability_states VALUES (?, ?, now(), ?, ?, ?, ?) ON CONFLICT (capability) DO UPDATE SET "
                "state = excluded.state, since = CASE WHEN capability_states.state = excluded.state "
                "THEN capability_states.since ELSE excluded.since END, consecutive = excluded.consecutive, "
                "reason = excluded.reason, cooldown_until = excluded.cooldown_until, last_pass_id = excluded.last_pass_id",
                [capability, to_state, consecutive, reason, cooldown_until, pass_id],
            )
            if from_state != to_state:
                tx.execute(
                    "INSERT INTO capability_transitions (transitioned_at, capability, from_state, to_state, reason, stats) "
                    "VALUES (now(), ?, ?, ?, ?, ?)",
                    [capability, from_state, to_state, reason, stats],
                )
        return True

    def start_cooldown(self, capability: str, reason: str, hours: float, now: datetime | None = None) -> None:
        """Rest a capability after a promotion, a rejection or a rollback: no new trigger for `hours`."""
        now = now or datetime.now(timezone.utc)
        state = self.states().get(capability, {"state": CapabilityState.HEALTHY, "last_pass_id": 0})
        self.transition(capability, state["state"], CapabilityState.COOLDOWN, reason, 0, state["last_pass_id"], None, now + timedelta(hours=hours))

    def transitions(self, capability: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM capability_transitions WHERE ? IS NULL OR capability = ? ORDER BY transition_id DESC LIMIT ?",
            [capability, capability, limit],
        )
