"""The synthesize job: for each open training request, build the capability's environment from the
tools of the request's agent (the agent of its track, ``daemon.core.tracks``), check it, and store
its spec.

Checked means: the ground-truth solution scores 1.0 on every seed and no-op/random policies stay
under the floor. Validation against the base model's rollouts (the paper's 0.3–0.6 mean-reward
gate) needs the model and belongs to the trainer.
"""

from __future__ import annotations

import logging
from typing import Any

from tracefix.daemon.analysis.capabilities import CapabilityRegistry
from tracefix.daemon.core import tracks
from tracefix.daemon.core.settings import CapabilitySettings
from tracefix.daemon.core.states import CapabilityState, EnvironmentStatus
from tracefix.daemon.store.store import AnalysisStore
from tracefix.trainer.checks import check
from tracefix.trainer.environment import Environment, load_tools
from tracefix.trainer.families import find_family, load_families
from tracefix.trainer.result_shapes import learn

log = logging.getLogger(__name__)

MIN_RESULTS = 3  # stored results of a tool before its result shape is learned from them


def with_state_changing(definition: Any, settings: CapabilitySettings) -> Any:
    """The definition marked state-changing (or not) as [capabilities] says, unless it says itself:
    the environments then agree with the labelers on which tools are writes."""
    if not isinstance(definition, dict) or "state_changing" in definition:
        return definition
    body = definition.get("function", definition)
    name = body.get("name") if isinstance(body, dict) else None
    return {**definition, "state_changing": settings.changes_state(name)} if isinstance(name, str) else definition


def stored_definitions(
    rows: list[dict[str, Any]], settings: CapabilitySettings, results: dict[str, list[tuple[dict[str, Any], Any]]] | None = None
) -> list[dict[str, Any]]:
    """Tool definitions from the daemon's `tool_definitions` rows (store or `/api/tools`), marked; a
    tool with at least MIN_RESULTS stored results carries the ``result_shape`` learned from them."""
    definitions = []
    for row in rows:
        definition = {"name": row["tool_name"], "description": row["description"], "parameters": row["parameters"] or {}}
        samples = (results or {}).get(row["tool_name"], [])
        if len(samples) >= MIN_RESULTS:
            definition["result_shape"] = learn(samples)
        definitions.append(with_state_changing(definition, settings))
    return definitions


class Synthesizer:
    def __init__(
        self, store: AnalysisStore, registry: CapabilityRegistry, settings: CapabilitySettings | None = None, seeds: int = 50
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings or CapabilitySettings()
        self.seeds = seeds
        self.families = load_families()

    def environment_for(self, track: str, definitions: list[dict[str, Any]]) -> Environment:
        """The family of the track's capability (its configured environment_family, else the one that
        trains it) on these tool definitions, at the family's first level; a ValueError says why there
        is none."""
        capability = tracks.capability_of(track)
        wanted = self.registry[capability].environment_family if capability in self.registry else None
        family = find_family(self.families, capability, wanted)
        if not definitions:
            raise ValueError("no tool definitions seen")
        return Environment(family, load_tools(definitions), family.levels[0])

    def run_pass(self) -> list[int]:
        """Build and store an environment for every open request that has none; returns their ids."""
        created = []
        for request in self.store.requests_without_environment():
            capability = request["capability"]
            service = self.store.lacking_service(capability)
            definitions = stored_definitions(self.store.tool_definitions(service), self.settings, self.store.tool_results(service))
            try:
                environment = self.environment_for(capability, definitions)
            except ValueError as error:
                created.append(self._store_failure(request, capability, service, definitions, str(error)))
                continue
            report = check(environment, self.seeds)
            status = EnvironmentStatus.CHECKED if report.passed else EnvironmentStatus.FAILED
            environment_id = self.store.add_environment(
                capability, environment.spec(), service, definitions, request["request_id"], status, report.to_dict()
            )
            state = self.store.states().get(capability)
            if state is not None and report.passed and not self.store.transition(
                    capability, state["state"], CapabilityState.ENVIRONMENT,
                    f"environment {environment_id} ({environment.family.name} on {service}'s {len(definitions)} tools) checked "
                    f"on {self.seeds} seeds", state["consecutive"], state["last_pass_id"],
                ):  # fmt: skip
                log.warning("capability %s moved on while environment %d was built", capability, environment_id)
            log.info("environment %d for %s: %s", environment_id, capability, status)
            created.append(environment_id)
        return created

    def _store_failure(
        self, request: dict, capability: str, service: str | None, definitions: list, reason: str
    ) -> int:
        spec = {"family": tracks.capability_of(capability), "version": "-", "difficulty": 0, "tools_hash": "-"}
        return self.store.add_environment(
            capability, spec, service, definitions, request["request_id"], EnvironmentStatus.FAILED, {"passed": False, "errors": [reason]}
        )
