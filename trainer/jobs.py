"""What the model subprocesses the daemon starts (validation, training) have in common: reading
their request, bounding their memory, dying with the daemon, and writing results atomically."""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class RequestError(ValueError):
    """The request file cannot be used; the message says what is wrong with it."""


def read_request(path: Path, required: Sequence[str]) -> dict[str, Any]:
    """The request object, with every key in ``required`` present."""
    try:
        request = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(f"cannot read request {path}: {error}") from None
    if not isinstance(request, dict):
        raise RequestError(f"request {path} is not a JSON object")
    missing = [key for key in required if key not in request]
    if missing:
        raise RequestError(f"request {path} lacks {', '.join(missing)}")
    return request


def limit_memory(memory_mb: int | None, device: str = "cpu") -> int | None:
    """RLIMIT_AS, set before the model is loaded: an oversized one fails here instead of swapping
    the host. Returns the limit set, in MB.

    Not on a GPU: the CUDA driver reserves host address space beyond the GPU's memory when it
    starts (about twice it, as reported for recent drivers), so under a limit that fits the host it
    fails to start and torch falls back to the CPU with no more than a warning. None is returned
    then."""
    if not memory_mb or device != "cpu":
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    return memory_mb


def exit_with_parent() -> None:
    """A daemon killed without stopping this process must not leave a model run behind it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(data, indent=2))
    os.replace(staging, path)


def allocation_failed(error: BaseException) -> bool:
    """Whether ``error`` is torch's own failure to allocate: a RuntimeError, not a MemoryError
    (``DefaultCPUAllocator: can't allocate memory`` under the address-space limit,
    ``torch.OutOfMemoryError`` on a GPU)."""
    return type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error)


def out_of_memory(error: RuntimeError, memory_setting: str) -> str | None:
    """What a torch allocation that failed says, or None for any other error."""
    if not allocation_failed(error):
        return None
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if type(error).__name__ == "OutOfMemoryError":
        return f"out of GPU memory: {message}"
    asked = message[message.find("you tried") :] if "you tried" in message else message
    return f"out of memory under the {memory_setting} limit ({asked})"


def quiet_deprecations() -> None:
    """Not PEFT's and TRL's use of the names transformers deprecated for `activation_checkpointing`:
    theirs to change, and on every run it would bury what a job's stderr is kept for."""
    warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning)


def run_job(what: str, body: Callable[[], None], memory_setting: str = "memory_mb") -> int:
    """Run a job's body and turn its failure into an exit status with the reason as the last line
    of stderr (which the daemon records): 0 done, 1 failed."""
    from tracefix.trainer.model import ModelUnavailable

    quiet_deprecations()
    try:
        body()
    except MemoryError:
        print(f"{what} failed: out of memory under the {memory_setting} limit", file=sys.stderr)
        return 1
    except RuntimeError as error:
        if (reason := out_of_memory(error, memory_setting)) is None:
            traceback.print_exc()
            reason = f"{type(error).__name__}: {error}"
        print(f"{what} failed: {reason}", file=sys.stderr)
        return 1
    except (RequestError, ModelUnavailable, ValueError, OSError) as error:
        print(f"{what} failed: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # unexpected: keep the traceback for diagnosis, the reason last
        traceback.print_exc()
        print(f"{what} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0
