"""`tracefix demo`: the whole improvement loop on one machine, narrated.

It starts the stack (`tracefix up`: daemon, router, dashboard), runs the example airline agent
(`examples/airline`) against the router at a steady rate, with its traces going to the collector,
and follows the daemon's API: trajectories collected, capabilities selected (Δ, coverage), the
environment and its validation, training progress, the candidate with its evaluation, the approval
(yours in the dashboard, or `--auto-approve`), the canary, and the live failure rate before and
after, with intervals. One status table redrawn in place, one line per event; the processes' own
logs stay in `<data dir>/logs` (`tracefix logs NAME`).

The demo's settings are defaults layered under yours: a key set in `--config` or in a
TRACEFIX_<SECTION>_<KEY> variable wins. `--fast` uses smaller settings for a quick look.
"""

from __future__ import annotations

from examples.demo.run import run

__all__ = ["run"]
