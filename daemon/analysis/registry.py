"""The daemon's capability registry: the plugins, then the capabilities only the LLM labels
([[llm.custom]]), then your evaluators' verdicts ([[capabilities.evaluations]]).

It composes the capability model (capabilities.py) with the labelers built on it (llm_labeler.py,
evaluation_labels.py), so the model never imports the labelers that depend on it.
"""

from __future__ import annotations

import logging

from tracefix.daemon.analysis.capabilities import CapabilityRegistry, load_registry
from tracefix.daemon.analysis.evaluation_labels import label_with_evaluations
from tracefix.daemon.analysis.llm_labeler import llm_capabilities
from tracefix.daemon.core.settings import CapabilitySettings, LLMSettings

log = logging.getLogger(__name__)


def build_registry(settings: CapabilitySettings, llm: LLMSettings | None = None) -> CapabilityRegistry:
    """Every capability plugin, then the LLM-labeled ones from config, then the evaluation mappings;
    a broken plugin or [llm] section is reported in `errors`, not fatal."""
    registry = load_registry(settings)
    if llm is not None and llm.enabled:
        builtin = {capability.name: capability.description for capability in registry if capability.builtin}
        try:
            for capability in llm_capabilities(llm, builtin):
                registry.add(capability)
        except Exception as error:  # a bad [llm] section must not take the daemon down
            message = f"LLM capabilities failed to load: {error}"
            log.error(message)
            registry.errors.append(message)
    elif llm is not None and llm.custom:
        names = ", ".join(capability.name for capability in llm.custom)
        message = f"capabilities declared in [[llm.custom]] are not labeled while [llm] enabled = false: {names}"
        log.warning(message)
        registry.errors.append(message)
    if settings.evaluations:
        label_with_evaluations(registry, settings.evaluations)
    return registry
