"""Gate retraining: whenever the set of live adapters changes, train a token-level gate for exactly
that set (in a subprocess, like training) and switch the router to routing mode ``gate`` with it.

The router falls back to classifier routing by itself the moment a version the gate mixes retires,
so between a swap and the new gate nothing is routed through stale weights. The state of the last
gate (its adapters, weights, report or error) is kept in ``<data dir>/gates/current.json``; a failed
gate is not retried until the live set changes again, and a router restarted in classifier mode is
put back on the current gate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from tracefix.daemon.promotion.lifecycle import Promotion, served_name
from tracefix.daemon.store.runs import RunStore
from tracefix.daemon.promotion.router_client import RouterAdmin, RouterError
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.states import AdapterState, GateStatus
from tracefix.daemon.pipeline.model_subprocess import ModelSubprocess, Stopped, TimedOut, error_tail
from tracefix.trainer.jobs import write_atomically

log = logging.getLogger(__name__)


class GateRunner:
    def __init__(self, promotion: Promotion, runs: RunStore, settings: Settings, router: RouterAdmin) -> None:
        self.promotion = promotion
        self.runs = runs
        self.settings = settings
        self.router = router
        self.directory = settings.data_dir / "gates"
        self.subprocess = ModelSubprocess()
        self._pass_lock = threading.Lock()

    @property
    def state_path(self) -> Path:
        return self.directory / "current.json"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        self.subprocess.stop()

    def run_pass(self) -> dict[str, Any] | None:
        """Train a gate for a live set that has none, or put the router back on the current one."""
        if not self.settings.gate.enabled or self.subprocess.stopping.is_set():
            return None
        if not self._pass_lock.acquire(blocking=False):
            return None
        try:
            live = sorted(self.promotion.in_state(AdapterState.LIVE), key=served_name)
            names = [served_name(adapter) for adapter in live]
            state = self.state()
            if not names:
                return None
            if state.get("adapters") != names:
                state = self._train(live, names)
            if state.get("status") in (GateStatus.TRAINED, GateStatus.SERVING):
                state = self._serve(state)
            return state
        finally:
            self._pass_lock.release()

    def _request(self, live: list[dict[str, Any]]) -> dict[str, Any]:
        gate, model = self.settings.gate, self.settings.model
        adapters = []
        for adapter in live:
            environment = self.runs.environment(adapter["environment_id"]) or {}
            adapters.append({
                "name": served_name(adapter), "path": adapter["path"], "family": environment.get("family", adapter["capability"]),
                "difficulty": environment.get("difficulty", 1), "tools": environment.get("tools") or [],
            })  # fmt: skip
        cache_dir = self.settings.model_cache_dir
        return {
            "model": {**model.model_dump(mode="json"), "cache_dir": str(cache_dir)},
            "adapters": adapters, "examples_per_adapter": gate.examples_per_adapter, "steps": gate.steps,
            "lr": gate.lr, "balance_weight": gate.balance_weight, "memory_mb": gate.memory_mb,
        }  # fmt: skip

    def _train(self, live: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"gate-{time.strftime('%Y%m%dT%H%M%S')}-{len(names)}"
        request, output, errors = stem.with_suffix(".request.json"), stem.with_suffix(".safetensors"), stem.with_suffix(".log")
        request.write_text(json.dumps(self._request(live), indent=2))
        log.info("training a gate for %s", ", ".join(names))
        state: dict[str, Any] = {"adapters": names, "path": str(output), "started_at": time.time()}
        try:
            returncode = self.subprocess.run(
                "tracefix.trainer.gate_job", ["--request", str(request), "--output", str(output)], errors, self.settings.gate.timeout_s
            )
        except Stopped:
            return self.state()  # trained again after a restart
        except TimedOut as error:
            returncode, state["error"] = -1, f"gate training {error}"
        if returncode != 0:
            state |= {"status": GateStatus.FAILED, "error": state.get("error") or f"gate training exited with {returncode}: {error_tail(errors)}"}
            log.warning("gate for %s failed: %s", ", ".join(names), state["error"])
        else:
            state |= {"status": GateStatus.TRAINED, "report": json.loads(output.with_suffix(".json").read_text())}
        write_atomically(self.state_path, state)
        return state

    def _serve(self, state: dict[str, Any]) -> dict[str, Any]:
        """Routing mode gate with the current weights, unless the router is on them already."""
        try:
            table = self.router.routing()
            if table.get("mode") == "gate" and (table.get("gate") or {}).get("path") == state["path"]:
                return state
            self.router.set_routing("gate", gate=state["path"])
        except RouterError as error:  # down, or its live set is not there yet: the next pass retries
            state["router_error"] = str(error)
            return state
        state = {**state, "status": GateStatus.SERVING, "router_error": None, "serving_since": time.time()}
        write_atomically(self.state_path, state)
        log.info("router routes with the gate for %s", ", ".join(state["adapters"]))
        return state
