"""The environment of the model jobs the daemon starts (training, validation).

They share the machine's cores with each other and with the daemon: a training job's intra-op
threads beside a router that is generating. PyTorch's CPU build runs its intra-op threads on
OpenMP, whose threads by default spin at each barrier for a while, waiting on a core that another
process holds; ``OMP_WAIT_POLICY=PASSIVE`` lets a waiting thread sleep. On two cores with one or two
of them busy, a teacher-forced next-action pass (a targeted run's retention check) takes far less
time so, and little more with the cores free (``bench/shared_cores.py``; docs/performance.md,
"Model jobs on shared cores"). The router is left as it is: it decodes a few rows at a time, where
a sleeping thread wakes late for each small step. A policy set in the environment is kept.

A job reports its progress itself (its progress.jsonl); its stderr is kept for what went wrong, so
the Hugging Face libraries' progress bars (loading weights, preparing a dataset) are off in it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WAIT_POLICY = "PASSIVE"
NO_PROGRESS_BARS = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")  # transformers reads the hub's


def model_process_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with OpenMP's wait policy passive and the libraries'
    progress bars off, unless it says otherwise."""
    environment = dict(os.environ if environ is None else environ)
    environment.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    for variable in NO_PROGRESS_BARS:
        environment.setdefault(variable, "1")
    return environment
