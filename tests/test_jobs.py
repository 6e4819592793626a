"""What the model subprocesses have in common (trainer/jobs.py), in real processes: the memory limit
each sets for itself, and the device a training job picks."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tracefix.trainer.model import ModelUnavailable, training_device


def _limit_in_a_fresh_process(memory_mb: int, device: str) -> list[str]:
    code = (
        "import resource; from trainer.jobs import limit_memory; "
        f"applied = limit_memory({memory_mb}, {device!r}); print(applied, resource.getrlimit(resource.RLIMIT_AS)[0])"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout.split()


def test_a_cpu_job_runs_under_its_address_space_limit_and_a_gpu_job_under_none() -> None:
    assert _limit_in_a_fresh_process(700, "cpu") == ["700", str(700 * 1024 * 1024)]
    # The CUDA driver reserves host address space beyond any such limit when it starts: none is set.
    assert _limit_in_a_fresh_process(700, "cuda") == ["None", str(resource.getrlimit(resource.RLIMIT_AS)[0])]


def test_the_training_device_is_the_gpu_only_where_cuda_has_one() -> None:
    import torch

    assert training_device("cpu") == "cpu"
    if torch.cuda.is_available():
        assert training_device("auto") == training_device("cuda") == "cuda"
    else:
        assert training_device("auto") == "cpu"
        with pytest.raises(ModelUnavailable, match=r"device = 'cuda'.*sees no usable GPU"):
            training_device("cuda")


def test_a_torch_allocation_beyond_the_limit_fails_the_job_as_out_of_memory_with_the_size_asked() -> None:
    code = (
        "import sys, torch; from trainer.jobs import limit_memory, run_job; limit_memory(4000); "
        "sys.exit(run_job('training', lambda: torch.ones(2**33, dtype=torch.uint8), '[training] memory_mb'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        "training failed: out of memory under the [training] memory_mb limit (you tried to allocate 8589934592 bytes"
    ), done.stderr


def test_any_other_runtime_error_fails_the_job_with_its_traceback_and_reason() -> None:
    code = "import sys; from trainer.jobs import run_job; sys.exit(run_job('training', lambda: (_ for _ in ()).throw(RuntimeError('shape mismatch'))))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1] == "training failed: RuntimeError: shape mismatch", done.stderr


def test_a_model_job_waits_passively_on_shared_cores_unless_the_environment_names_a_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracefix.daemon.pipeline.model_subprocess import ModelSubprocess

    def policy_seen() -> str:
        log = tmp_path / "job.log"
        # `python -m` with a module that prints a variable of its environment to stderr (the job's log).
        assert ModelSubprocess().run("tests.print_environment", ["OMP_WAIT_POLICY"], log, timeout_s=60) == 0
        return log.read_text().strip()

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert policy_seen() == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert policy_seen() == "ACTIVE"
