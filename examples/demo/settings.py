"""The demo's settings: its defaults, layered under the user's config file and environment."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from tracefix.daemon.core.settings import ENV_PREFIX, Settings, load_settings

# Demo defaults: analysis often enough to watch, a gate and training sized for the CPU, a canary
# that decides on a few dozen conversations.
SCRIPTED_FLOWS = "airline-scripted-flows"  # service.name of the scripted flows beside the model-driven agent
DEMO: dict[str, dict[str, Any]] = {
    "analysis": {"interval_s": 10.0, "min_failures": 12},
    # The gate runs (and on SmolLM2-135M finds the base too weak for the airline tools, which the
    # warm start remedies); a small one, since its verdict does not change what happens next.
    "validation": {"seeds": 2, "group_size": 4, "hint_shares": [], "timeout_s": 1800},
    # The warm start teaches what the 135M model lacks; a few GRPO steps follow it (with dynamic
    # sampling, the default), and the run's report measures what they added on the same held-out
    # seeds. One pass over the demonstrations with more GRPO steps made a weaker adapter and no gain
    # from GRPO (docs/history/performance-log-2026.md, Run 12); more steps or rollouts per step did
    # not add more either (bench/grpo_settings.py). The adapter is the last step's (keep_best off):
    # the report shows what those steps added, where keep_best could hand back the warm start
    # unchanged. 48 held-out seeds: with the opening shared across rows the evaluation plays them in
    # the time 24 took before (docs/history/performance-log-2026.md), and the paired comparison sees
    # twice the seeds. The warm start's gradient is the exact one (the default): stopped at the
    # agent's opening, an update is 1.46x faster on two cores, but GRPO from that warm start added
    # less on validation seeds (median -0.06 over three draws against +0.04;
    # docs/history/performance-log-2026.md, "The gradient stopped at the opening"), and with a
    # batch's cache carried from turn to turn the evaluation and the rollouts give back most of the
    # time the exact gradient takes.
    "training": {
        "recipe": "sft+grpo", "steps": 3, "group_size": 4, "groups_per_step": 2, "micro_batch": 2, "num_iterations": 2,
        "learning_rate": 2e-4, "warm_start_examples": 96, "warm_start_epochs": 2,
        "eval_seeds": 48, "eval_interference": False, "save_steps": 2, "keep_best": False, "threads": 2,
    },  # fmt: skip
    # The router gets one thread; the trainer both, since the model-driven traffic holds while it trains.
    "model": {"max_new_tokens": 96, "threads": 1},
    "promotion": {"interval_s": 5.0, "canary_fraction": 0.5, "canary_min_trajectories": 10, "watch_min_trajectories": 30},
    # The generalist learns from the scripted flows' successful conversations (the same tools: a
    # stronger policy serving part of the traffic), never from the panel's own conversations, and is
    # scored on 16 of them held out.
    "generalist": {
        "min_trajectories": 12, "min_failure_rate": 0.5, "min_successes": 48, "max_conversations": 48, "held_out": 16, "epochs": 2,
        "exclude_conversations": ["airline-panel-"],
    },  # fmt: skip
    # Each agent is its own loop (daemon/core/tracks.py). The scripted flows are a policy the router
    # does not serve: their runs are evidence and successes to learn from, never trained for.
    "capabilities": {"agents": [{"name": SCRIPTED_FLOWS, "train": False}]},
}
FAST: dict[str, dict[str, Any]] = {
    "analysis": {"interval_s": 5.0, "min_failures": 10},
    "validation": {"enabled": False},
    "training": {"warm_start_examples": 16, "eval_seeds": 8, "eval_margin": 0.1},
    "model": {"max_new_tokens": 64},
    "promotion": {"canary_min_trajectories": 8, "watch_min_trajectories": 16},
    "generalist": {"min_successes": 16, "max_conversations": 16, "held_out": 4, "epochs": 1},
}


def layered_settings(config_path: Path | None, fast: bool, environ: dict[str, str] | None = None) -> tuple[Settings, dict[str, str]]:
    """The demo's settings and the TRACEFIX_* variables that carry them to the child processes:
    a demo default is used only where neither the config file nor the environment sets the key."""
    environ = dict(os.environ if environ is None else environ)
    configured = tomllib.loads(Path(config_path).read_text()) if config_path else {}
    layers = [DEMO, FAST] if fast else [DEMO]
    added: dict[str, str] = {}
    for layer in layers:
        for section, values in layer.items():
            for key, value in values.items():
                variable = f"{ENV_PREFIX}{section}_{key}".upper()
                if key in configured.get(section, {}) or variable in environ:
                    continue
                added[variable] = json.dumps(value) if isinstance(value, (list, dict)) else str(value).lower() if isinstance(value, bool) else str(value)
    environ.update(added)
    return load_settings(config_path, environ), added

