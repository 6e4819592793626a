"""Every state of tracefix's state machines, named once.

One ``StrEnum`` per machine. A member is the string stored today (in DuckDB, in result.json, in the
gate's current.json, in the router's table) and compares equal to it, hashes as it and serialises
as it (json, orjson, f-strings, DuckDB parameters), so the database, the files and the API read the
same as before. The sets the code asks about (the pipeline's states, a run's final statuses, an
adapter's legal moves) are built here from the members. ``tests/test_states.py`` reads every module
of the packages and fails on a bare state string used as a state anywhere else.

    capability track:  healthy → watching → gap_detected → environment → training → evaluating
                       → candidate → live, and cooldown (capability_states.state)
    training request:  open → taken → done (training_requests.status)
    environment:       checked → validating → validated | rejected, or failed (environments.status)
    training run:      queued → running → candidate | rejected_by_eval | failed (training_runs.status)
    adapter:           candidate → approved → canary → live → retired, rejected, rolled_back
                       (adapters.state, audit_log.from_state / to_state; daemon/promotion/lifecycle.py)
    served version:    canary → live → retiring (the router's table, each adapter's role)
    gate:              trained → serving, or failed (<data dir>/gates/current.json)
"""

from __future__ import annotations

from enum import StrEnum


class CapabilityState(StrEnum):
    """A capability's track (``capability_states``), in the order a gap moves through them: the
    trigger's (healthy, watching, gap_detected, cooldown), then the pipeline's, which follow its
    environment, its training run and its adapter."""

    HEALTHY = "healthy"
    WATCHING = "watching"
    GAP_DETECTED = "gap_detected"
    ENVIRONMENT = "environment"
    TRAINING = "training"
    EVALUATING = "evaluating"
    CANDIDATE = "candidate"
    LIVE = "live"
    COOLDOWN = "cooldown"


# In the order above: the furthest track along the pipeline speaks for its capability.
CAPABILITY_STATES = tuple(CapabilityState)
# The states later stages own: the trigger leaves a track in them alone.
PIPELINE_STATES = frozenset({
    CapabilityState.GAP_DETECTED, CapabilityState.ENVIRONMENT, CapabilityState.TRAINING, CapabilityState.EVALUATING,
    CapabilityState.CANDIDATE, CapabilityState.LIVE,
})  # fmt: skip


class RequestStatus(StrEnum):
    """A training request (``training_requests``): open until a run of its environment takes it,
    done when that run ends."""

    OPEN = "open"
    TAKEN = "taken"
    DONE = "done"


class EnvironmentStatus(StrEnum):
    """An environment (``environments``): checked (its checks passed; it waits for the validation
    gate), failed (its checks or the gate's run failed), validating, then validated (the base's
    rewards can teach) or rejected (they cannot, on every remedy tried)."""

    CHECKED = "checked"
    FAILED = "failed"
    VALIDATING = "validating"
    VALIDATED = "validated"
    REJECTED = "rejected"


class RunStatus(StrEnum):
    """A training run (``training_runs``). A run stopped with the daemon goes back to queued."""

    QUEUED = "queued"
    RUNNING = "running"
    CANDIDATE = "candidate"
    REJECTED_BY_EVAL = "rejected_by_eval"
    FAILED = "failed"


# A run in one of these has finished (its request is done).
RUN_FINISHED = frozenset({RunStatus.CANDIDATE, RunStatus.REJECTED_BY_EVAL, RunStatus.FAILED})


class TrainingVerdict(StrEnum):
    """A training job's verdict on its adapter (``result.json``, ``daemon.core.contracts``): the
    status its run ends in."""

    CANDIDATE = RunStatus.CANDIDATE.value
    REJECTED_BY_EVAL = RunStatus.REJECTED_BY_EVAL.value


class AdapterState(StrEnum):
    """An adapter in the promotion lifecycle (``adapters``, ``audit_log``; daemon/promotion/lifecycle.py)."""

    CANDIDATE = "candidate"
    APPROVED = "approved"
    CANARY = "canary"
    LIVE = "live"
    RETIRED = "retired"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


# The legal moves of an adapter, from each state.
ADAPTER_TRANSITIONS: dict[AdapterState, frozenset[AdapterState]] = {
    AdapterState.CANDIDATE: frozenset({AdapterState.APPROVED, AdapterState.REJECTED}),
    AdapterState.APPROVED: frozenset({AdapterState.CANARY, AdapterState.LIVE, AdapterState.REJECTED}),
    AdapterState.CANARY: frozenset({AdapterState.LIVE, AdapterState.ROLLED_BACK}),
    AdapterState.LIVE: frozenset({AdapterState.RETIRED, AdapterState.ROLLED_BACK}),
    AdapterState.RETIRED: frozenset({AdapterState.LIVE}),  # restored when the version that replaced it is rolled back
    AdapterState.REJECTED: frozenset(),
    AdapterState.ROLLED_BACK: frozenset(),
}
# The moves a person (or the watch) must say why for.
NEEDS_REASON = frozenset({AdapterState.REJECTED, AdapterState.ROLLED_BACK})
# The states of an adapter the router serves, canaries first.
SERVING_STATES = (AdapterState.CANARY, AdapterState.LIVE)


class ServingRole(StrEnum):
    """An adapter version loaded in the router (its routing table's ``role``): a canary on a share
    of its capability's traffic, live on the rest, retiring once replaced (unloaded when its last
    request ends)."""

    CANARY = "canary"
    LIVE = "live"
    RETIRING = "retiring"


class GateStatus(StrEnum):
    """The token-level gate's last training (``<data dir>/gates/current.json``): trained, then
    serving once the router routes with it; or failed (not retried until the live set changes)."""

    TRAINED = "trained"
    SERVING = "serving"
    FAILED = "failed"
