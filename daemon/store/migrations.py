"""Versioned schema migrations, applied in order at start; each runs in its own transaction.

Append new migrations at the end; never edit one that has shipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


# JSON-bearing columns are VARCHAR: DuckDB's json_* functions read them directly, and skipping the
# VARCHAR->JSON cast keeps the ingest path at bulk-append speed.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "spans and logs",
        """
        CREATE TABLE spans (
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            parent_span_id VARCHAR,
            trace_state VARCHAR,
            name VARCHAR NOT NULL,
            kind UTINYINT NOT NULL,
            start_time_unix_nano UBIGINT NOT NULL,
            end_time_unix_nano UBIGINT NOT NULL,
            status_code UTINYINT NOT NULL,
            status_message VARCHAR,
            service_name VARCHAR NOT NULL,
            scope_name VARCHAR,
            scope_version VARCHAR,
            conversation_id VARCHAR,
            resource_attributes VARCHAR NOT NULL,
            attributes VARCHAR NOT NULL,
            events VARCHAR NOT NULL,
            links VARCHAR NOT NULL,
            truncated BOOLEAN NOT NULL,
            ingest_batch BIGINT NOT NULL,
            received_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (trace_id, span_id)
        );
        CREATE TABLE logs (
            log_id VARCHAR PRIMARY KEY,
            trace_id VARCHAR,
            span_id VARCHAR,
            time_unix_nano UBIGINT NOT NULL,
            observed_time_unix_nano UBIGINT NOT NULL,
            severity_number INTEGER NOT NULL,
            severity_text VARCHAR,
            event_name VARCHAR,
            body VARCHAR,
            service_name VARCHAR NOT NULL,
            scope_name VARCHAR,
            conversation_id VARCHAR,
            resource_attributes VARCHAR NOT NULL,
            attributes VARCHAR NOT NULL,
            truncated BOOLEAN NOT NULL,
            ingest_batch BIGINT NOT NULL,
            received_at TIMESTAMPTZ NOT NULL
        );
        """,
    ),
    Migration(
        2,
        "trajectories, messages, tool calls, tool definitions, outcomes",
        """
        CREATE TABLE trace_trajectories (
            trace_id VARCHAR PRIMARY KEY,
            trajectory_id VARCHAR NOT NULL
        );
        CREATE TABLE trajectories (
            trajectory_id VARCHAR PRIMARY KEY,
            conversation_id VARCHAR,
            service_name VARCHAR NOT NULL,
            agent_name VARCHAR,
            trace_ids VARCHAR[] NOT NULL,
            root_name VARCHAR,
            start_time_unix_nano UBIGINT NOT NULL,
            end_time_unix_nano UBIGINT NOT NULL,
            n_spans INTEGER NOT NULL,
            n_llm_calls INTEGER NOT NULL,
            n_tool_calls INTEGER NOT NULL,
            n_tool_errors INTEGER NOT NULL,
            dialects VARCHAR[] NOT NULL,
            tool_names VARCHAR[] NOT NULL,
            updated_batch BIGINT NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE messages (
            trajectory_id VARCHAR NOT NULL,
            position INTEGER NOT NULL,
            role VARCHAR NOT NULL,
            content VARCHAR NOT NULL,
            tool_calls VARCHAR NOT NULL,
            tool_call_id VARCHAR,
            name VARCHAR,
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            updated_batch BIGINT NOT NULL,  -- the trajectory's; lets reads of new rows skip old row groups
            PRIMARY KEY (trajectory_id, position)
        );
        CREATE TABLE tool_calls (
            trajectory_id VARCHAR NOT NULL,
            position INTEGER NOT NULL,
            tool_name VARCHAR NOT NULL,
            call_id VARCHAR,
            arguments VARCHAR,
            result VARCHAR,
            error VARCHAR,
            source VARCHAR NOT NULL,
            message_position INTEGER,
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            start_time_unix_nano UBIGINT NOT NULL,
            updated_batch BIGINT NOT NULL,
            PRIMARY KEY (trajectory_id, position)
        );
        CREATE TABLE tool_definitions (
            service_name VARCHAR NOT NULL,
            tool_name VARCHAR NOT NULL,
            description VARCHAR NOT NULL,
            parameters VARCHAR,
            first_seen TIMESTAMPTZ NOT NULL,
            last_seen TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (service_name, tool_name)
        );
        CREATE TABLE trajectory_tools (
            trajectory_id VARCHAR NOT NULL,
            tool_name VARCHAR NOT NULL,
            description VARCHAR NOT NULL,
            parameters VARCHAR,
            updated_batch BIGINT NOT NULL,
            PRIMARY KEY (trajectory_id, tool_name)
        );
        -- One row per piece of outcome evidence; trajectory_outcomes picks by precedence.
        CREATE TABLE outcomes (
            trajectory_id VARCHAR NOT NULL,
            source VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL,
            reward DOUBLE,
            detail VARCHAR,
            evidence_id VARCHAR NOT NULL,
            observed_time_unix_nano UBIGINT NOT NULL,
            recorded_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (trajectory_id, source, evidence_id)
        );
        CREATE TABLE feedback (
            feedback_id VARCHAR PRIMARY KEY,
            trajectory_id VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL,
            reward DOUBLE,
            comment VARCHAR,
            author VARCHAR,
            recorded_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE assembler_state (
            id INTEGER PRIMARY KEY,
            last_span_batch BIGINT NOT NULL,
            last_log_batch BIGINT NOT NULL
        );
        INSERT INTO assembler_state VALUES (1, 0, 0);
        -- Precedence of DESIGN.md section 3: feedback, then evaluation events, then root-span
        -- attributes; within a source the latest evidence wins. 'unknown' when none applies.
        CREATE VIEW trajectory_outcomes AS
        WITH evidence AS (
            SELECT trajectory_id, 'feedback' AS source, outcome, reward, comment AS detail,
                   epoch_ns(recorded_at) AS observed, 0 AS rank
            FROM feedback
            UNION ALL
            SELECT trajectory_id, source, outcome, reward, detail, observed_time_unix_nano,
                   CASE source WHEN 'evaluation' THEN 1 ELSE 2 END
            FROM outcomes
        ),
        ranked AS (
            SELECT *, row_number() OVER (
                PARTITION BY trajectory_id ORDER BY rank, observed DESC
            ) AS choice
            FROM evidence
        )
        SELECT t.trajectory_id,
               coalesce(r.outcome, 'unknown') AS outcome,
               r.reward,
               r.source AS outcome_source,
               r.detail AS outcome_detail,
               t.end_time_unix_nano
        FROM trajectories t LEFT JOIN ranked r ON r.trajectory_id = t.trajectory_id AND r.choice = 1;
        """,
    ),
    Migration(
        3,
        "labels, capability statistics, trigger states and training requests",
        """
        CREATE TABLE labels (
            trajectory_id VARCHAR NOT NULL,
            capability VARCHAR NOT NULL,
            labeler VARCHAR NOT NULL,
            labeler_version VARCHAR NOT NULL,
            run INTEGER NOT NULL,
            label VARCHAR NOT NULL CHECK (label IN ('NA', 'PRESENT', 'LACKING', 'ERROR')),  -- ERROR: no usable verdict
            reason VARCHAR NOT NULL,
            span_ids VARCHAR[] NOT NULL,
            confidence DOUBLE NOT NULL,
            labeled_batch BIGINT NOT NULL,
            labeled_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (trajectory_id, capability, labeler, run)
        );
        CREATE TABLE capability_stats (
            pass_id BIGINT NOT NULL,
            computed_at TIMESTAMPTZ NOT NULL,
            window_name VARCHAR NOT NULL,
            capability VARCHAR NOT NULL,
            n_success INTEGER NOT NULL,
            n_failure INTEGER NOT NULL,
            n_unknown INTEGER NOT NULL,
            needed_success INTEGER NOT NULL,
            needed_failure INTEGER NOT NULL,
            lacking_success INTEGER NOT NULL,
            lacking_failure INTEGER NOT NULL,
            er_plus DOUBLE,
            er_plus_low DOUBLE,
            er_plus_high DOUBLE,
            er_minus DOUBLE,
            er_minus_low DOUBLE,
            er_minus_high DOUBLE,
            delta DOUBLE,
            coverage DOUBLE,
            failure_rate DOUBLE,
            failure_rate_low DOUBLE,
            failure_rate_high DOUBLE,
            runs INTEGER NOT NULL,
            runs_selected INTEGER NOT NULL,
            selected BOOLEAN NOT NULL,
            rank INTEGER,
            PRIMARY KEY (pass_id, window_name, capability)
        );
        CREATE TABLE capability_states (
            capability VARCHAR PRIMARY KEY,
            state VARCHAR NOT NULL,
            since TIMESTAMPTZ NOT NULL,
            consecutive INTEGER NOT NULL,
            reason VARCHAR NOT NULL,
            cooldown_until TIMESTAMPTZ,
            last_pass_id BIGINT NOT NULL
        );
        CREATE SEQUENCE transition_ids;
        CREATE TABLE capability_transitions (
            transition_id BIGINT PRIMARY KEY DEFAULT nextval('transition_ids'),
            transitioned_at TIMESTAMPTZ NOT NULL,
            capability VARCHAR NOT NULL,
            from_state VARCHAR NOT NULL,
            to_state VARCHAR NOT NULL,
            reason VARCHAR NOT NULL,
            stats VARCHAR
        );
        CREATE SEQUENCE training_request_ids;
        CREATE TABLE training_requests (
            request_id BIGINT PRIMARY KEY DEFAULT nextval('training_request_ids'),
            capability VARCHAR NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            source VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            reason VARCHAR NOT NULL,
            requested_by VARCHAR,
            stats VARCHAR
        );
        """,
    ),
    Migration(
        4,
        "environments",
        """
        CREATE SEQUENCE environment_ids;
        CREATE TABLE environments (
            environment_id BIGINT PRIMARY KEY DEFAULT nextval('environment_ids'),
            capability VARCHAR NOT NULL,
            family VARCHAR NOT NULL,
            family_version VARCHAR NOT NULL,
            difficulty INTEGER NOT NULL,
            service_name VARCHAR,
            tools_hash VARCHAR NOT NULL,
            tools VARCHAR NOT NULL,
            request_id BIGINT,
            status VARCHAR NOT NULL,  -- checked | failed (base-model validation comes with the trainer)
            checks VARCHAR NOT NULL,
            created_at TIMESTAMPTZ NOT NULL
        );
        """,
    ),
    Migration(
        5,
        "environment validation",
        # status becomes: checked (waits for the gate) | failed (checks or the gate's run failed) |
        # validating | validated (the base's rewards can teach) | rejected (they cannot, on every
        # remedy tried; the attempts are in validation)
        """
        ALTER TABLE environments ADD COLUMN validation VARCHAR;  -- the gate's report, or the error of its run
        ALTER TABLE environments ADD COLUMN validated_at TIMESTAMPTZ;
        """,
    ),
    Migration(
        6,
        "training runs and adapters",
        """
        CREATE SEQUENCE run_ids;
        CREATE TABLE training_runs (
            run_id BIGINT PRIMARY KEY DEFAULT nextval('run_ids'),
            capability VARCHAR NOT NULL,
            environment_id BIGINT NOT NULL,
            request_id BIGINT,
            version INTEGER NOT NULL,  -- the adapter version this run produces
            status VARCHAR NOT NULL,  -- queued | running | candidate | rejected_by_eval | failed
            directory VARCHAR NOT NULL,  -- checkpoints, progress.jsonl, result.json, the adapter
            config VARCHAR NOT NULL,  -- the TrainConfig, JSON
            result VARCHAR,  -- result.json: verdict, evaluation report, training summary
            error VARCHAR,
            created_at TIMESTAMPTZ NOT NULL,
            started_at TIMESTAMPTZ,
            finished_at TIMESTAMPTZ,
            UNIQUE (capability, version)
        );
        CREATE SEQUENCE adapter_ids;
        CREATE TABLE adapters (
            adapter_id BIGINT PRIMARY KEY DEFAULT nextval('adapter_ids'),
            capability VARCHAR NOT NULL,
            version INTEGER NOT NULL,
            run_id BIGINT NOT NULL,
            environment_id BIGINT NOT NULL,
            path VARCHAR NOT NULL,
            manifest_sha256 VARCHAR NOT NULL,
            state VARCHAR NOT NULL,  -- candidate (the promotion lifecycle moves it on)
            evaluation VARCHAR NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            UNIQUE (capability, version)
        );
        """,
    ),
    Migration(
        7,
        "adapter lifecycle and audit log",
        """
        ALTER TABLE adapters ADD COLUMN state_reason VARCHAR;
        ALTER TABLE adapters ADD COLUMN last_error VARCHAR;  -- why the router did not take it (retried)
        ALTER TABLE adapters ADD COLUMN updated_at TIMESTAMPTZ;
        CREATE SEQUENCE audit_ids;
        CREATE TABLE audit_log (
            audit_id BIGINT PRIMARY KEY DEFAULT nextval('audit_ids'),
            decided_at TIMESTAMPTZ NOT NULL,
            actor VARCHAR NOT NULL,  -- the token's name, or the daemon job that decided
            action VARCHAR NOT NULL,
            adapter_id BIGINT NOT NULL,
            capability VARCHAR NOT NULL,
            from_state VARCHAR NOT NULL,
            to_state VARCHAR NOT NULL,
            reason VARCHAR NOT NULL
        );
        """,
    ),
    Migration(
        8,
        "canary and live watch",
        """
        -- Since when routed traffic counts for the adapter (canary start, then live start), and the
        -- failure rate it is judged against: the canary's control arm, then the pre-promotion rate.
        ALTER TABLE adapters ADD COLUMN routed_since_ns UBIGINT;
        ALTER TABLE adapters ADD COLUMN baseline VARCHAR;
        """,
    ),
    Migration(
        9,
        "generalist runs",
        """
        -- A generalist learns from the agent's successful trajectories, not from an environment; a
        -- targeted run may start from the agent's generalist (the adapter it continues).
        ALTER TABLE training_runs ALTER COLUMN environment_id DROP NOT NULL;
        ALTER TABLE adapters ALTER COLUMN environment_id DROP NOT NULL;
        ALTER TABLE training_runs ADD COLUMN kind VARCHAR DEFAULT 'targeted';  -- targeted | generalist
        ALTER TABLE training_runs ADD COLUMN agent VARCHAR;  -- a generalist's agent (service.name)
        ALTER TABLE training_runs ADD COLUMN starts_from BIGINT;  -- the adapter whose weights it starts from
        -- The trajectories a generalist run learned from (train) and was scored on (held_out).
        CREATE TABLE run_trajectories (
            run_id BIGINT NOT NULL,
            trajectory_id VARCHAR NOT NULL,
            part VARCHAR NOT NULL,  -- train | held_out
            PRIMARY KEY (run_id, trajectory_id)
        );
        """,
    ),
    Migration(
        10,
        "agent profiles",
        """
        -- What each agent's policy requires before a change (daemon/analysis/profile.py), as last
        -- derived: a change of its fingerprint relabels the agent's runs.
        CREATE TABLE agent_profiles (
            agent VARCHAR PRIMARY KEY,
            fingerprint VARCHAR NOT NULL,
            profile VARCHAR NOT NULL,  -- JSON: the rules with their evidence
            derived_at TIMESTAMPTZ NOT NULL
        );
        """,
    ),
    Migration(
        11,
        "one loop per agent",
        """
        -- Statistics per agent (its service.name) beside those over all agents (agent ''): each
        -- agent's selection drives its own tracks (daemon/core/tracks.py), named
        -- <capability>.<agent> in capability_states and every table after it. The key grows, so the
        -- table is rebuilt; the agent goes last, where the statistics query writes it.
        CREATE TABLE capability_stats_by_agent (
            pass_id BIGINT NOT NULL,
            computed_at TIMESTAMPTZ NOT NULL,
            window_name VARCHAR NOT NULL,
            capability VARCHAR NOT NULL,
            n_success INTEGER NOT NULL,
            n_failure INTEGER NOT NULL,
            n_unknown INTEGER NOT NULL,
            needed_success INTEGER NOT NULL,
            needed_failure INTEGER NOT NULL,
            lacking_success INTEGER NOT NULL,
            lacking_failure INTEGER NOT NULL,
            er_plus DOUBLE,
            er_plus_low DOUBLE,
            er_plus_high DOUBLE,
            er_minus DOUBLE,
            er_minus_low DOUBLE,
            er_minus_high DOUBLE,
            delta DOUBLE,
            coverage DOUBLE,
            failure_rate DOUBLE,
            failure_rate_low DOUBLE,
            failure_rate_high DOUBLE,
            runs INTEGER NOT NULL,
            runs_selected INTEGER NOT NULL,
            selected BOOLEAN NOT NULL,
            rank INTEGER,
            agent VARCHAR NOT NULL,
            PRIMARY KEY (pass_id, window_name, capability, agent)
        );
        INSERT INTO capability_stats_by_agent SELECT *, '' FROM capability_stats;
        DROP TABLE capability_stats;
        ALTER TABLE capability_stats_by_agent RENAME TO capability_stats;
        -- A capability resting in healthy or watching over all agents starts again per agent; one
        -- further on (its environment, its runs, its adapters) keeps its bare name: its adapters
        -- serve every agent, as they did.
        DELETE FROM capability_states WHERE state IN ('healthy', 'watching');
        """,
    ),
)
